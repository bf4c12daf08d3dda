"""Batch factory throughput against a latency-bound scripted endpoint.

The endpoint runs in a SEPARATE process (``python -m trajforge.testing.server_cli``) with
200 ms latency per call; every sample makes 3 model calls and 2 ``terminal`` calls in its own
sandbox. Prints trajectories/s; CPU seconds per trajectory of this process and everything under it
(workers, sandboxes, their commands: a cpuacct cgroup, as root; ``getrusage`` misses the
sandboxes, it is printed too); the whole machine's CPU per trajectory (/proc/stat: also kernel work and the
endpoint) and the endpoint process's own share of it; and the ratio to the latency-bound ideal
``concurrency / (calls x latency)``.

The same settings are then run again with ``--no-sandbox-reuse`` (a new sandbox per sample, as
before reuse existed) as the baseline of this run, and the speed-up is printed.

    .venv/bin/python benchmarks/batch_throughput.py --samples 1200 --sandbox bwrap
    .venv/bin/python benchmarks/batch_throughput.py --samples 1200 --sandbox local --workers 2 --no-baseline
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _endpoint import (  # noqa: E402
    CALLS,
    KEY_VAR,
    Endpoint,
    TreeCpu,
    load_average,
    machine_cpu,
    own_cpu,
    process_cpu,
    scripted_endpoint,
    start_server,
)

from trajforge.batch.config import load_config  # noqa: E402
from trajforge.batch.progress import PlainProgress  # noqa: E402
from trajforge.batch.runner import run_batch  # noqa: E402

# The names batch_ray.py and env_ray.py import from here.
_machine_cpu, _process_cpu, _start_server = machine_cpu, process_cpu, start_server


def _run(args: argparse.Namespace, endpoint: Endpoint, name: str, reuse: bool) -> dict:
    server, tmp = endpoint.pid, endpoint.tmp
    cfg = load_config(
        None,
        {
            "dataset": endpoint.dataset,
            "run_name": name,
            "output_dir": tmp / "data",
            "model": "scripted",
            "base_url": endpoint.base_url,
            "api_key_env": KEY_VAR,
            "toolsets": ["terminal"],
            "sandbox": args.sandbox,
            "sandbox_reuse": reuse,
            "sandbox_start": args.sandbox_start,
            **({"sandbox_agent": args.sandbox_agent} if args.sandbox_agent else {}),
            "concurrency": args.concurrency,
            "workers": args.workers,
            "fsync": False if args.no_fsync else None,
            "progress": "plain",
        },
    )
    with TreeCpu() as tree:
        tree0 = tree.seconds()
        cpu0, machine0, server0, t0 = own_cpu(), machine_cpu(), process_cpu(server), time.perf_counter()
        if args.profile:
            import cProfile

            prof = cProfile.Profile()
            summary = prof.runcall(asyncio.run, run_batch(cfg, progress=PlainProgress(name, every_s=5)))
            prof.dump_stats(f"{args.profile}.{name}")
        else:
            summary = asyncio.run(run_batch(cfg, progress=PlainProgress(name, every_s=5)))
        wall, rusage = time.perf_counter() - t0, own_cpu() - cpu0
        machine, endpoint = machine_cpu() - machine0, process_cpu(server) - server0
        tree1 = tree.seconds()
    ours = tree1 - tree0 if tree0 is not None and tree1 is not None else None
    stats = summary.statistics
    rate = stats["session"]["throughput_per_s"]
    ideal = cfg.concurrency * cfg.workers / (CALLS * args.latency)
    n = max(args.samples, 1)
    return {
        "sandbox": args.sandbox,
        "sandbox_reuse": reuse,
        "workers": cfg.workers,
        "concurrency_per_worker": cfg.concurrency,
        "samples": args.samples,
        "status_counts": stats["status_counts"],
        "sandboxes": stats["sandboxes"],
        "wall_s_incl_startup": round(wall, 2),
        "trajectories_per_s": rate,
        # this process and everything under it (workers, sandboxes, their commands), from a cgroup
        "cpu_s_per_trajectory": round(ours / n, 4) if ours is not None else None,
        "getrusage_cpu_s_per_trajectory": round(rusage / n, 4),  # what "our CPU" was before: no sandboxes
        "machine_cpu_s_per_trajectory": round(machine / n, 4),
        "endpoint_cpu_s_per_trajectory": round(endpoint / n, 4),
        "machine_minus_endpoint_cpu_s_per_trajectory": round((machine - endpoint) / n, 4),
        "machine_busy_fraction": round(machine / (wall * (os.cpu_count() or 1)), 3),
        "ideal_per_s": round(ideal, 1),
        "ratio_to_ideal": round(rate / ideal, 3),
        "latency_p50_s": stats["latency_s"]["p50"],
        "mean_sample_s": stats["latency_s"]["mean"],
        "mean_model_s": round(stats["model_time_s"] / n, 3),
        "mean_tool_s": round(stats["tool_time_s"] / n, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=1200)
    p.add_argument("--latency", type=float, default=0.2)
    p.add_argument("--sandbox", default="bwrap")
    p.add_argument("--concurrency", type=int, default=None, help="default: the batch default")
    p.add_argument(
        "--sandbox-start", default=None, choices=("eager", "lazy"), help="default: the batch default"
    )
    p.add_argument("--workers", type=int, default=None, help="default: the batch default")
    p.add_argument(
        "--sandbox-agent", default=None, choices=("auto", "native"), help="default: the batch default"
    )
    p.add_argument("--no-fsync", action="store_true")
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the baseline run (same settings, --no-sandbox-reuse: a new sandbox per sample)",
    )
    p.add_argument("--profile", default=None, help="write cProfiles of the parent to PROFILE.<run>")
    p.add_argument(
        "--compare-src",
        default=None,
        help="another checkout's src/ (e.g. `git archive COMMIT src | tar -x -C /tmp/before`): the same "
        "run on it and on this one, alternating --rounds times, each in a process of its own, with the "
        "load average at each start and the medians' ratios (implies --no-baseline)",
    )
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    if args.compare_src:
        _compare(args)
        return

    with scripted_endpoint(args.latency, prefix="tf-bench-", prompts=args.samples) as endpoint:
        results = {"default": _run(args, endpoint, "default", reuse=True)}
        if not args.no_baseline:
            results["baseline_no_reuse"] = _run(args, endpoint, "baseline", reuse=False)
            results["speedup_vs_baseline"] = round(
                results["default"]["trajectories_per_s"] / results["baseline_no_reuse"]["trajectories_per_s"],
                2,
            )
    print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())


def _compare(args: argparse.Namespace) -> None:
    import statistics
    import subprocess

    argv = [
        sys.executable,
        __file__,
        "--no-baseline",
        "--samples",
        str(args.samples),
        "--latency",
        str(args.latency),
    ]
    argv += ["--sandbox", args.sandbox]
    if args.sandbox_start:
        argv += ["--sandbox-start", args.sandbox_start]
    for flag, value in (("--concurrency", args.concurrency), ("--workers", args.workers)):
        if value is not None:
            argv += [flag, str(value)]
    this_src = str(Path(__file__).resolve().parents[1] / "src")
    agent = ["--sandbox-agent", args.sandbox_agent] if args.sandbox_agent else []
    variants = [("compare", args.compare_src, agent), ("this", this_src, agent)]
    runs: dict[str, list[dict]] = {"compare": [], "this": []}
    for _ in range(args.rounds):
        for name, src, extra in variants:
            load = load_average()
            done = subprocess.run(
                [*argv, *extra],
                env=dict(os.environ, PYTHONPATH=src),
                capture_output=True,
                text=True,
                check=True,
            )
            run = orjson.loads(done.stdout[done.stdout.index("{") :])["default"]
            run["load_at_start"] = float(load)
            runs[name].append(run)
    keys = ("trajectories_per_s", "cpu_s_per_trajectory", "getrusage_cpu_s_per_trajectory")
    medians = {
        name: {k: statistics.median(r[k] for r in rs if r[k] is not None) for k in keys}
        for name, rs in runs.items()
    }
    print(orjson.dumps({"runs": runs, "medians": medians}, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
