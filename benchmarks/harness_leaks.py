"""Does any tool result of a batch show the harness? (issue 39)

Runs ``--samples`` rows through ``trajforge batch`` (``run_batch``: bwrap sandboxes, reuse on, the
default exec agent) against a scripted OpenAI endpoint on loopback. Row ``i`` names a workload of
the fidelity suite (tests/fidelity.py), or, every ``len(WORKLOADS) + 1``-th row, the introspection
probes below; the endpoint issues that workload's commands as ``terminal`` calls, one per turn, then
answers. Every tool result of every sample in the run's output is then scanned for what names the
harness: its paths (``/run/trajforge``, the session directory, the host's sandbox root), its
variables (``__tf_*``, ``TF_LIMIT_*``, ``TF_AGENT_*``), its trap and loop (``builtin eval``, the
snapshot), its name. Prints the counts as JSON, with each hit (sample, command, the line) when
there are any; exits 1 then.

    .venv/bin/python benchmarks/harness_leaks.py --samples 1000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import fidelity  # noqa: E402
from trajforge.batch.config import load_config  # noqa: E402
from trajforge.batch.progress import PlainProgress  # noqa: E402
from trajforge.batch.runner import run_batch  # noqa: E402
from trajforge.testing.policies import count_assistant_turns  # noqa: E402
from trajforge.testing.replies import Reply, ToolCallSpec  # noqa: E402
from trajforge.testing.scripted_server import ScriptedServer  # noqa: E402

KEY_VAR = "TF_LEAKS_KEY"
# Every way a command lists its shell's and its box's state: nothing of the harness may show.
PROBES = fidelity.Workload(
    "introspection",
    "the shell's and the box's state, listed",
    (
        "set; declare -p; declare -f; declare -F; compgen -v; compgen -A function",
        "trap -p; alias -p; env; export -p; shopt -p; set +o; jobs -l",
        'echo "$0|$BASH_SOURCE|${FUNCNAME[*]}|$LINENO|$BASH_EXECUTION_STRING"; nosuch_command; wait %3; return',
        "ps -ef; ps aux; top -bn1 | head -20; mount; df -a; cat /proc/self/mountinfo",
        "tr '\\0' ' ' < /proc/$$/cmdline; tr '\\0' ' ' < /proc/$PPID/cmdline; tr '\\0' ' ' < /proc/1/cmdline",
        "ls -la / /run /tmp /dev /dev/shm; find / -maxdepth 2 -name '*agent*' 2>&1 | head",
        "if then",
    ),
    r".",
)
WORKLOADS = (*fidelity.WORKLOADS, PROBES)
# What names the harness. The sandbox root on the host (tempfile's trajforge-sandboxes-UID) is added
# at run time.
PATTERNS = [
    r"__tf",
    r"TF_LIMIT",
    r"TF_AGENT",
    r"/run/trajforge",
    r"\.trajforge-session",
    r"trajforge",
    r"snapshot\.sh",
    r"builtin eval",
    r"memfd:bash",
]


def _workload(body: dict[str, Any]) -> fidelity.Workload:
    first = next(m for m in body["messages"] if m.get("role") == "user")
    text = first["content"] if isinstance(first["content"], str) else str(first["content"])
    name = text.split()[1]
    return next(w for w in WORKLOADS if w.name == name)


def policy(body: dict[str, Any]) -> Reply:
    """The workload's next command as a ``terminal`` call, then an answer."""
    workload = _workload(body)
    step = count_assistant_turns(body)
    if step < len(workload.calls):
        args = {"command": workload.calls[step], "timeout": int(workload.timeout)}
        return Reply(reasoning=f"step {step + 1}", tool_calls=[ToolCallSpec("terminal", args)])
    return Reply(content="done", reasoning="finished")


def _tool_results(record: dict[str, Any]) -> list[tuple[str, str]]:
    """(command, result text) of every tool call of one output line."""
    messages = record.get("messages") or []
    commands: dict[str, str] = {}
    found = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            try:
                args = orjson.loads(call["function"]["arguments"])
            except (KeyError, orjson.JSONDecodeError):
                args = {}
            commands[call.get("id", "")] = str(args.get("command", ""))
        if message.get("role") == "tool":
            content = message.get("content")
            text = content if isinstance(content, str) else orjson.dumps(content).decode()
            found.append((commands.get(message.get("tool_call_id", ""), ""), text))
    return found


def _output(text: str) -> str:
    """The command's output in a ``terminal`` result (JSON with ``output``), else the text."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    return str(value.get("output", "")) if isinstance(value, dict) else text


async def _main(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="tf-leaks-"))
    rows = [{"prompt": f"workload {WORKLOADS[i % len(WORKLOADS)].name} #{i}"} for i in range(args.samples)]
    dataset = work / "rows.jsonl"
    dataset.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    os.environ[KEY_VAR] = "unused"
    started = time.monotonic()
    async with ScriptedServer(policy) as server:
        cfg = load_config(
            None,
            {
                "dataset": dataset,
                "run_name": "leaks",
                "output_dir": work / "data",
                "model": "scripted",
                "base_url": server.base_url,
                "api_key_env": KEY_VAR,
                "toolsets": ["terminal"],
                "sandbox": "bwrap",
                **({"sandbox_agent": args.sandbox_agent} if args.sandbox_agent else {}),
                **({"concurrency": args.concurrency} if args.concurrency else {}),
                "require_reasoning": False,
                "progress": "plain",
            },
        )
        summary = await run_batch(cfg, progress=PlainProgress("leaks", every_s=30))
    wall = time.monotonic() - started
    patterns = [*PATTERNS, re.escape(tempfile.gettempdir().rstrip("/") + "/trajforge-sandboxes")]
    scan = re.compile("|".join(patterns))
    samples = results = did_its_job = 0
    undone: dict[str, int] = {}
    hits: list[dict[str, Any]] = []
    per_workload: dict[str, int] = {}
    for path in sorted((work / "data" / "leaks").glob("*.jsonl")):
        if path.name.startswith(("failed", "statistics")):
            continue
        for line in path.read_bytes().splitlines():
            record = orjson.loads(line)
            if "messages" not in record:
                continue
            samples += 1
            prompt = next((m.get("content") for m in record["messages"] if m.get("role") == "user"), "")
            name = str(prompt).split()[1] if prompt else "?"
            outputs = []
            for command, text in _tool_results(record):
                results += 1
                outputs.append(_output(text))
                per_workload[name] = per_workload.get(name, 0) + 1
                for match in scan.finditer(text):
                    start = text.rfind("\n", 0, match.start()) + 1
                    end = text.find("\n", match.end())
                    hits.append({"workload": name, "command": command[:120], "line": text[start:end][:300]})
            workload = next((w for w in WORKLOADS if w.name == name), None)
            if workload is not None and re.search(workload.expect, "".join(outputs)):
                did_its_job += 1
            else:
                undone[name] = undone.get(name, 0) + 1
    report = {
        "samples_asked": args.samples,
        "samples_scanned": samples,
        "tool_results_scanned": results,
        "patterns": patterns,
        "hits": len(hits),
        "samples_whose_workload_did_its_job": did_its_job,
        "samples_that_did_not_by_workload": undone,
        "examples": hits[:20],
        "status_counts": summary.statistics["status_counts"],
        "sandboxes": summary.statistics.get("sandboxes"),
        "wall_s": round(wall, 1),
        "load_average_end": round(os.getloadavg()[0], 2),
        "tool_results_per_workload": per_workload,
        "run_dir": str(work / "data" / "leaks"),
    }
    print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    return 1 if hits or samples < args.samples else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=None, help="default: the batch default")
    p.add_argument("--sandbox-agent", default=None, choices=("auto", "native"))
    args = p.parse_args()
    sys.exit(asyncio.run(_main(args)))


if __name__ == "__main__":
    main()
