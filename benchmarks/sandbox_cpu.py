"""The sandbox side of a trajectory, alone: CPU per trajectory of two short commands and a reset.

What the batch benchmarks call "the sandbox side" (our cgroup minus the host), measured without
a model or a scheduler: one bwrap sandbox factory with reuse on, and per trajectory ``create``
(a reset sandbox from the idle pool), two ``exec("echo hi")``, ``close`` (the reset). CPU is the
whole tree's (a cpuacct cgroup of our own, as root: this process, bwrap, the exec agent, the
shell and its commands) and the machine's (/proc/stat); both are printed per trajectory with the
load average before and after. Single operations follow: one ``exec`` on a warm sandbox, one
reset (create + close of a reused sandbox), one fresh build + destroy.

``--baseline-src DIR`` runs the same measurement, in the same invocation, on another checkout's
``src/`` (e.g. a ``git worktree`` of the commit before a change) in a subprocess, alternating
with this one ``--rounds`` times, and prints the ratio. (``--compare-agents``, the python exec
agent against the native one, went with the python agent in issue 40: docs/benchmarks.md keeps its
figures as history.)

    .venv/bin/python benchmarks/sandbox_cpu.py --trajectories 300
    .venv/bin/python benchmarks/sandbox_cpu.py --baseline-src /tmp/before/src --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _endpoint import TreeCpu, load_average, machine_cpu, own_cpu  # noqa: E402


async def _measure(trajectories: int, commands: int, command: str, agent: str) -> dict[str, Any]:
    from trajforge.sandbox import SandboxConfig, create_sandbox_factory

    root = tempfile.mkdtemp(prefix="tf-sbcpu-")
    out: dict[str, Any] = {"load_before": load_average()}
    # The cgroup first: a process started before it (the warm sandbox's agent) would stay outside.
    with TreeCpu() as tree:
        factory = create_sandbox_factory(SandboxConfig(kind="bwrap", reuse=True, root_dir=root, agent=agent))
        async with factory:

            async def trajectory() -> None:
                sb = await factory.create("bench")
                for _ in range(commands):
                    res = await sb.exec(command)
                    assert res.exit_code == 0, res
                await sb.close()

            for _ in range(20):  # warm: the sandbox is built, the agent and bash pages are in
                await trajectory()
            t0, m0, w0, h0 = tree.seconds(), machine_cpu(), time.perf_counter(), own_cpu()
            for _ in range(trajectories):
                await trajectory()
            t1, m1, w1, h1 = tree.seconds(), machine_cpu(), time.perf_counter(), own_cpu()
            out["trajectory_ms_tree"] = _per(t0, t1, trajectories)
            # this process alone (the host's exec client, the factory): not the sandbox side
            out["trajectory_ms_host"] = 1000 * (h1 - h0) / trajectories
            sandbox = _per(t0, t1, trajectories)
            out["trajectory_ms_sandbox_side"] = (
                None if sandbox is None else sandbox - out["trajectory_ms_host"]
            )
            out["trajectory_ms_machine"] = 1000 * (m1 - m0) / trajectories
            out["trajectory_ms_wall"] = 1000 * (w1 - w0) / trajectories

            sb = await factory.create("bench-exec")
            await sb.exec(command)
            n = trajectories * commands
            t0, m0 = tree.seconds(), machine_cpu()
            for _ in range(n):
                await sb.exec(command)
            t1, m1 = tree.seconds(), machine_cpu()
            await sb.close()
            out["exec_ms_tree"] = _per(t0, t1, n)
            out["exec_ms_machine"] = 1000 * (m1 - m0) / n

            t0, m0 = tree.seconds(), machine_cpu()
            for _ in range(trajectories):
                sb = await factory.create("bench-reset")
                await sb.close()
            t1, m1 = tree.seconds(), machine_cpu()
            out["reset_ms_tree"] = _per(t0, t1, trajectories)
            out["reset_ms_machine"] = 1000 * (m1 - m0) / trajectories
            out["stats"] = factory.stats.counts()
        fresh = create_sandbox_factory(SandboxConfig(kind="bwrap", reuse=False, root_dir=root, agent=agent))
        builds = max(10, trajectories // 10)
        t0, m0 = tree.seconds(), machine_cpu()
        for _ in range(builds):
            sb = await fresh.create("bench-build")
            await sb.exec(command)
            await sb.close()
        t1, m1 = tree.seconds(), machine_cpu()
    out["build_exec_destroy_ms_tree"] = _per(t0, t1, builds)
    out["build_exec_destroy_ms_machine"] = 1000 * (m1 - m0) / builds
    out["load_after"] = load_average()
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


def _per(t0: float | None, t1: float | None, n: int) -> float | None:
    return None if t0 is None or t1 is None else 1000 * (t1 - t0) / n


def _rounded(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return round(statistics.median(kept), 3) if kept else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trajectories", type=int, default=300)
    p.add_argument("--commands", type=int, default=2, help="commands per trajectory")
    p.add_argument("--command", default="echo hi")
    p.add_argument("--baseline-src", default=None, help="another checkout's src/ to measure alongside")
    p.add_argument("--rounds", type=int, default=1, help="alternations with the baseline")
    p.add_argument(
        "--agent",
        choices=("auto", "native"),
        default="native",
        help="the sandboxes' exec agent (both: exec_agent.c; an older --baseline-src gets it too)",
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child or args.baseline_src is None:
        result = asyncio.run(_measure(args.trajectories, args.commands, args.command, args.agent))
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
        return
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "baseline": []}
    me = [sys.executable, __file__, "--child", "--trajectories", str(args.trajectories)]
    me += ["--commands", str(args.commands), "--command", args.command]
    this_src = str(Path(__file__).resolve().parents[1] / "src")
    variants = [("baseline", args.baseline_src, args.agent), ("this", this_src, args.agent)]
    for _ in range(args.rounds):
        for name, src, agent in variants:
            env = dict(os.environ, PYTHONPATH=src)
            done = subprocess.run(
                [*me, "--agent", agent], env=env, capture_output=True, text=True, check=True
            )
            runs[name].append(orjson.loads(done.stdout[done.stdout.index("{") :]))
    keys = [k for k in runs["this"][0] if k.endswith(("_tree", "_machine", "_wall"))]
    summary = {name: {k: _rounded([r[k] for r in rs]) for k in keys} for name, rs in runs.items()}
    ratios = {
        k: round(summary["baseline"][k] / summary["this"][k], 2)
        for k in keys
        if summary["this"][k] and summary["baseline"][k]
    }
    print(
        orjson.dumps(
            {"runs": runs, "medians": summary, "baseline_over_this": ratios}, option=orjson.OPT_INDENT_2
        ).decode()
    )


if __name__ == "__main__":
    main()
