"""Issue 29's "at least 50x the reference runner in the same run": the reference runner (Hermes
Agent's ``batch_runner.py``, PyPI ``hermes-agent==0.19.0``) and trajforge's batch on the same
scripted workload, alternating in one invocation, and the ratios.

    make bench-ref && .venv/bin/python benchmarks/reference_runner.py --samples 60 --rounds 2

The workload is batch_throughput.py's: the scripted OpenAI-compatible endpoint of ``_endpoint.py``
in a process of its own, 200 ms per call, and per sample 3 model calls of which 2 call the
``terminal`` tool with ``{"command": "echo hi"}`` (the name and argument of Hermes's terminal tool
too). Each round runs, on the same endpoint and dataset ({"prompt": "task i"} rows):

* **reference**: ``batch_runner.py`` from ``.venv-ref`` (``make bench-ref``), through
  ``_reference_launch.py``: a toolset distribution with the ``terminal`` toolset alone (its
  ``terminal`` and ``process`` tools), the ``local`` terminal backend, ``--base_url`` the loopback
  endpoint, a placeholder key, ``--num_workers 4 --batch_size 1`` by default (see below). Its HOME,
  HERMES_HOME (a config.yaml), TMPDIR, working directory and terminal cwd are inside this run's
  scratch directory, and its environment is built from nothing (PATH, LANG and those), so it
  never sees the user's home, keys or config.
* **trajforge**: batch_throughput.py's own run (its ``_run``): bwrap sandboxes, the batch defaults
  for workers and concurrency, sandbox reuse on.

Hermes's ``local`` backend runs the commands on the host with no isolation (a login ``bash`` per
worker for a snapshot, then a ``bash -c`` per command), trajforge in a bwrap sandbox each: the
comparison does not favour trajforge there.

**The reference's configuration.** Hermes runs ``--num_workers`` processes (a
``multiprocessing.Pool``), each one prompt at a time with a fresh ``AIAgent``; ``--batch_size`` only
groups prompts into pool tasks. Measured on this 2-core machine (2026-12-04, the settings below
otherwise, load average 1.0-2.8): 2 workers 1.8 trajectories/s (32 samples), 3 workers 2.2 (32), **4
workers 2.7 (32) and 3.0 (64)**, 6 workers 3.1 (64) at 20% more CPU per trajectory, 8 workers 2.2
(32). It is CPU-bound, about 0.5 CPU-s per trajectory, so 4 (also its own default) is the
best-effort setting here; ``--ref-batch-size 1`` keeps every worker busy to the end.
``model.context_length`` is set in its config.yaml, which spares it part of its probing of the
endpoint at each agent's start (ollama ``/api/tags``, llama.cpp ``/props``, ``/version``, LM
Studio ``/api/v1/models``: 404s on loopback, not model calls).

**Nothing leaves the machine.** Left alone, on its first run Hermes pip-installed ``edge-tts``
(with aiohttp, yarl, multidict, ...) into its own virtualenv, from each pool worker, trying PyPI (a
DNS lookup, then HTTPS connections; here the files came from the machine's local package index):
its "lazy installs" are on by default, and (it appears) the TTS tool's availability check asked
for one although only the terminal toolset is enabled. Here they are off twice
(``HERMES_DISABLE_LAZY_INSTALLS=1`` and ``security.allow_lazy_installs: false``), pip gets no
index (``PIP_NO_INDEX=1``), and the launcher's audit hook writes down and refuses any name lookup
or connection beyond loopback: the table's "net" column counts them (0 expected; none seen). Its
other start-up subprocesses (``file``, ``python3 -m pip --version``, ``uname -p``) make no
connection. Its terminal backend writes one
shell snapshot per worker process to TMPDIR (``/tmp`` when unset, never removed): TMPDIR is in
the scratch directory.

**Checked, per run**: the trajectories written (Hermes: ``data/<run>/trajectories.jsonl``;
trajforge: ``trajectories.jsonl`` of its run directory), that each holds 2 tool results whose
output is ``hi`` (the commands ran) and a final answer, and the endpoint's count of chat calls
(``/_scripted/stats``) against 3 per sample.

**Printed** per run: trajectories/s on the runner's own clock (Hermes: its ``duration_seconds``,
from its start of processing, pool start included; trajforge: the session's) and over the whole
wall time with start-up; CPU per trajectory of this process and everything under it (a cpuacct
cgroup, as root: ``TreeCpu``), of the whole machine (/proc/stat) and of the machine minus the
endpoint process; the mean time of one sample (Hermes: workers x duration / completed, by Little's
law; trajforge: its mean sample latency). Then the ratios of the medians: trajforge's throughput
over the reference's, and the reference's CPU per trajectory over trajforge's. The machine figures
count whatever else runs on the machine. ``--trajforge-samples`` gives trajforge a larger dataset
(its 64 rollouts at once finish a 60-sample run in one wave, mostly start-up).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _endpoint import (  # noqa: E402
    CALLS,
    Endpoint,
    TreeCpu,
    load_average,
    machine_cpu,
    process_cpu,
    scripted_endpoint,
    write_prompts,
)
from batch_throughput import _run as trajforge_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REF_PYTHON = ROOT / ".venv-ref" / "bin" / "python"
LAUNCH = Path(__file__).parent / "_reference_launch.py"
DISTRIBUTION = "trajforge_terminal_alone"
TOOL_CALLS = CALLS - 1
HERMES_CONFIG = """\
security:
  allow_lazy_installs: false
model:
  context_length: 131072
"""


def chat_calls(endpoint: Endpoint) -> int:
    """The chat completions the scripted endpoint has answered so far."""
    url = endpoint.base_url.removesuffix("/v1") + "/_scripted/stats"
    with urllib.request.urlopen(url, timeout=10) as response:
        return int(orjson.loads(response.read()).get("requests", 0))


# -- the reference ----------------------------------------------------------------------------


def ran_echo_hi(result: Any) -> bool:
    """A terminal result (a JSON object, or its text) says that ``echo hi`` ran: output hi, exit 0."""
    if isinstance(result, str):
        result = json.loads(result)
    return (
        isinstance(result, dict)
        and str(result.get("output")).strip() == "hi"
        and result.get("exit_code") == 0
    )


def hermes_tool_results(conversation: list[dict[str, Any]]) -> list[Any]:
    """A Hermes trajectory's tool results: the ``content`` of the ``<tool_response>`` JSON of each
    "tool" turn."""
    results = []
    for turn in conversation:
        if turn.get("from") == "tool":
            body = turn["value"].removeprefix("<tool_response>").removesuffix("</tool_response>")
            results.append(json.loads(body).get("content"))
    return results


def check_hermes(path: Path, n: int) -> dict[str, Any]:
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []

    def ok(row: dict[str, Any]) -> bool:
        results = hermes_tool_results(row["conversations"])
        return (
            row.get("completed") is True
            and row.get("api_calls") == CALLS
            and len(results) == TOOL_CALLS
            and all(ran_echo_hi(r) for r in results)
            and row["conversations"][-1]["value"].endswith("done")
        )

    indices = {row.get("prompt_index") for row in rows}
    return {
        "written": len(rows),
        "verified": sum(ok(row) for row in rows),
        "distinct_prompts": len(indices),
        "expected": n,
    }


def hermes_env(home: Path, net_log: Path) -> dict[str, str]:
    """Hermes's whole environment: nothing of ours (keys, HOME, config) goes in."""
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(home),
        "HERMES_HOME": str(home / ".hermes"),
        "TMPDIR": str(home / "tmp"),
        "TERMINAL_ENV": "local",
        "TERMINAL_CWD": str(home / "work"),
        # no runtime pip installs (it installed edge-tts from PyPI on its first run otherwise)
        "HERMES_DISABLE_LAZY_INSTALLS": "1",
        "PIP_NO_INDEX": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "TF_REF_NET_LOG": str(net_log),
        "TF_REF_DISTRIBUTION": DISTRIBUTION,
    }


def reference_run(
    args: argparse.Namespace, endpoint: Endpoint, dataset: Path, n: int, name: str
) -> dict[str, Any]:
    home = endpoint.tmp / name
    for sub in ("work", "tmp", "run", ".hermes"):
        (home / sub).mkdir(parents=True)
    (home / ".hermes" / "config.yaml").write_text(HERMES_CONFIG)
    net_log = home / "net.log"
    net_log.touch()
    cmd = [
        str(REF_PYTHON),
        str(LAUNCH),
        f"--dataset_file={dataset}",
        f"--batch_size={args.ref_batch_size}",
        f"--run_name={name}",
        f"--distribution={DISTRIBUTION}",
        "--model=scripted",
        "--api_key=unused-placeholder",
        f"--base_url={endpoint.base_url}",
        f"--num_workers={args.ref_workers}",
        "--max_turns=10",
    ]
    log = home / "batch_runner.log"
    calls0, load = chat_calls(endpoint), load_average()
    with TreeCpu() as tree, log.open("wb") as out:
        tree0 = tree.seconds()
        machine0, server0, t0 = machine_cpu(), process_cpu(endpoint.pid), time.perf_counter()
        done = subprocess.run(
            cmd,
            cwd=home / "run",
            env=hermes_env(home, net_log),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=args.ref_timeout,
        )
        wall = time.perf_counter() - t0
        machine, server = machine_cpu() - machine0, process_cpu(endpoint.pid) - server0
        tree1 = tree.seconds()
    calls = chat_calls(endpoint) - calls0
    run_dir = home / "run" / "data" / name
    stats_file = run_dir / "statistics.json"
    duration = orjson.loads(stats_file.read_bytes())["duration_seconds"] if stats_file.exists() else None
    check = check_hermes(run_dir / "trajectories.jsonl", n)
    completed = check["verified"]
    ours = tree1 - tree0 if tree0 is not None and tree1 is not None else None
    return {
        "system": "reference",
        "run": name,
        "load_at_start": load,
        "samples": n,
        "completed": completed,
        "check": check,
        "exit_code": done.returncode,
        "chat_calls": calls,
        "network_attempts": net_log.read_text().splitlines(),
        "wall_s_incl_startup": round(wall, 2),
        "own_clock_s": duration,
        "trajectories_per_s": round(completed / duration, 3) if duration else None,
        "trajectories_per_s_incl_startup": round(completed / wall, 3),
        "cpu_s_per_trajectory": per(ours, completed),
        "machine_cpu_s_per_trajectory": per(machine, completed),
        "machine_minus_endpoint_cpu_s_per_trajectory": per(machine - server, completed),
        "mean_sample_s": round(args.ref_workers * duration / completed, 3)
        if duration and completed
        else None,
        "log": str(log),
    }


def per(seconds: float | None, n: int) -> float | None:
    return round(seconds / n, 5) if seconds is not None and n else None


# -- trajforge --------------------------------------------------------------------------------


def check_trajforge(path: Path, n: int) -> dict[str, Any]:
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []

    def ok(row: dict[str, Any]) -> bool:
        messages = row.get("messages") or []
        results = [m.get("content") for m in messages if m.get("role") == "tool"]
        return (
            row.get("status") == "completed"
            and len(results) == TOOL_CALLS
            and all(ran_echo_hi(r) for r in results)
            and messages[-1].get("content") == "done"
        )

    return {"written": len(rows), "verified": sum(ok(row) for row in rows), "expected": n}


def trajforge_side(
    args: argparse.Namespace, endpoint: Endpoint, dataset: Path, n: int, name: str
) -> dict[str, Any]:
    settings = argparse.Namespace(
        sandbox=args.sandbox,
        concurrency=args.concurrency,
        workers=args.workers,
        sandbox_start=None,
        sandbox_agent=args.sandbox_agent,
        no_fsync=False,
        profile=None,
        latency=args.latency,
        samples=n,
    )
    calls0, load = chat_calls(endpoint), load_average()
    t0 = time.perf_counter()
    result = trajforge_run(settings, dataclasses.replace(endpoint, dataset=dataset), name, reuse=True)
    wall = time.perf_counter() - t0
    calls = chat_calls(endpoint) - calls0
    check = check_trajforge(endpoint.tmp / "data" / name / "trajectories.jsonl", n)
    completed = check["verified"]
    return {
        "system": "trajforge",
        "run": name,
        "load_at_start": load,
        "samples": n,
        "completed": completed,
        "check": check,
        "status_counts": result["status_counts"],
        "chat_calls": calls,
        "network_attempts": None,  # not guarded: its sandboxes have no network (no --network)
        "wall_s_incl_startup": round(wall, 2),
        "trajectories_per_s": result["trajectories_per_s"],
        "trajectories_per_s_incl_startup": round(completed / wall, 3),
        # _run divides by the samples asked for; every one completed when the check passes
        "cpu_s_per_trajectory": result["cpu_s_per_trajectory"],
        "machine_cpu_s_per_trajectory": result["machine_cpu_s_per_trajectory"],
        "machine_minus_endpoint_cpu_s_per_trajectory": result["machine_minus_endpoint_cpu_s_per_trajectory"],
        "mean_sample_s": result["mean_sample_s"],
        "sandboxes": result["sandboxes"],
    }


# -- the report -------------------------------------------------------------------------------


def net(attempts: list[str] | None) -> str:
    return "-" if attempts is None else str(len(attempts))


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def table(runs: list[dict[str, Any]]) -> str:
    head = (
        "| system | run | load at start | samples | completed (checked) | chat calls (expected) | net | "
        "traj/s | traj/s incl. start-up | our CPU ms/traj (cgroup) | machine ms/traj | "
        "machine - endpoint ms/traj | s per sample |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in runs:
        lines.append(
            f"| {r['system']} | {r['run']} | {r['load_at_start']:.2f} | {r['samples']} | {r['completed']} | "
            f"{r['chat_calls']} ({CALLS * r['samples']}) | {net(r['network_attempts'])} | "
            f"{r['trajectories_per_s']} | {r['trajectories_per_s_incl_startup']} | "
            f"{ms(r['cpu_s_per_trajectory'])} | {ms(r['machine_cpu_s_per_trajectory'])} | "
            f"{ms(r['machine_minus_endpoint_cpu_s_per_trajectory'])} | {r['mean_sample_s']} |"
        )
    return "\n".join(lines)


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def ratios(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    ref = [r for r in runs if r["system"] == "reference"]
    ours = [r for r in runs if r["system"] == "trajforge"]
    out: dict[str, float | None] = {}
    for key in ("trajectories_per_s", "trajectories_per_s_incl_startup"):
        a, b = median_of(ours, key), median_of(ref, key)
        out[f"{key}: trajforge / reference"] = round(a / b, 1) if a and b else None
    for key in (
        "cpu_s_per_trajectory",
        "machine_cpu_s_per_trajectory",
        "machine_minus_endpoint_cpu_s_per_trajectory",
    ):
        a, b = median_of(ref, key), median_of(ours, key)
        out[f"{key}: reference / trajforge"] = round(a / b, 1) if a and b else None
    return out


def problems(runs: list[dict[str, Any]]) -> list[str]:
    """What says a run did not do the whole workload (or tried the network)."""
    found = []
    for r in runs:
        if r["completed"] != r["samples"]:
            found.append(
                f"{r['run']}: {r['completed']} of {r['samples']} samples completed and checked {r['check']}"
            )
        if r["chat_calls"] != CALLS * r["samples"]:
            found.append(f"{r['run']}: {r['chat_calls']} chat calls, expected {CALLS * r['samples']}")
        if r["network_attempts"]:
            found.append(f"{r['run']}: refused network attempts {r['network_attempts'][:5]}")
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=60, help="samples per run (the reference: ~3/s here)")
    p.add_argument(
        "--trajforge-samples", type=int, default=None, help="trajforge's samples (default: --samples)"
    )
    p.add_argument("--rounds", type=int, default=2, help="reference then trajforge, this many times")
    p.add_argument("--latency", type=float, default=0.2, help="seconds per model call")
    p.add_argument("--ref-workers", type=int, default=4, help="the reference's --num_workers")
    p.add_argument("--ref-batch-size", type=int, default=1, help="the reference's --batch_size")
    p.add_argument("--ref-timeout", type=float, default=1800, help="seconds before a reference run is killed")
    p.add_argument("--sandbox", default="bwrap", help="trajforge's sandbox")
    p.add_argument("--concurrency", type=int, default=None, help="trajforge's (default: the batch default)")
    p.add_argument(
        "--sandbox-agent",
        default=None,
        choices=("auto", "native"),
        help="trajforge's (default: the batch default)",
    )
    p.add_argument("--workers", type=int, default=None, help="trajforge's (default: the batch default)")
    p.add_argument("--json", default=None, help="also write every run's figures to this file")
    args = p.parse_args()
    if not REF_PYTHON.exists():
        raise SystemExit(f"no reference runner at {REF_PYTHON}: run `make bench-ref` first")
    n_ours = args.trajforge_samples or args.samples

    runs: list[dict[str, Any]] = []
    with scripted_endpoint(args.latency, prefix="tf-ref-bench-", tool_calls=TOOL_CALLS) as endpoint:
        ref_data = write_prompts(endpoint.tmp / "reference.jsonl", args.samples)
        our_data = write_prompts(endpoint.tmp / "trajforge.jsonl", n_ours)
        for i in range(args.rounds):
            runs.append(reference_run(args, endpoint, ref_data, args.samples, f"reference-{i}"))
            print(f"reference-{i}: {runs[-1]['trajectories_per_s']} traj/s", file=sys.stderr, flush=True)
            runs.append(trajforge_side(args, endpoint, our_data, n_ours, f"trajforge-{i}"))
            print(f"trajforge-{i}: {runs[-1]['trajectories_per_s']} traj/s", file=sys.stderr, flush=True)
        bad = problems(runs)
        for r in runs:  # the end of the reference's own output, while the scratch directory lasts
            if bad and "log" in r:
                r["log_tail"] = Path(r["log"]).read_text(errors="replace")[-4000:]
    ratio = ratios(runs)
    report = {"runs": runs, "ratios_of_medians": ratio, "problems": bad}
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    for r in runs:
        if r.get("log_tail"):
            print(f"--- the end of {r['run']}'s output ---\n{r['log_tail']}\n")
    print(table(runs))
    print()
    for key, value in ratio.items():
        verdict = "" if value is None else (" (>= 50x)" if value >= 50 else " (< 50x)")
        print(f"{key}: {value}{verdict}")
    for line in bad:
        print(f"PROBLEM {line}")
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
