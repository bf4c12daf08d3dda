"""Host memory while reward code reads what a rollout left: each scenario runs in a process of its
own and prints one JSON line. Peak memory is the kernel's high-water mark of this process's RSS
(``VmHWM``), reset before each measured step (``/proc/self/clear_refs``), so what a warm-up did
cannot hide what the step does.

A sparse file costs the sandbox no disk (``truncate -s 1G``), but a host that reads it whole holds
its full size in memory: 4 concurrent rollouts with a 1 GB file each cost the unbounded reader
4-5 GB. A safety net (``RLIMIT_AS``) keeps a regression from taking the machine down with it.

Usage: ``python bounded_probe.py SCENARIO ROOT_DIR`` (SCENARIO: sparse_rollouts | big_output).
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
from typing import Any

from trajforge.envs import RolloutBackends, Rollouts, VerifierContext
from trajforge.envs.library.tiny_tasks import TinyTasksConfig, TinyTasksEnv
from trajforge.sandbox import SandboxConfig, SandboxLimits, close_factory, create_sandbox_factory
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools.builtin import default_registry

GB = 1_000_000_000


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def reset_peak() -> float:
    """Start a new high-water mark here; returns the RSS now (MiB)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_mb("VmRSS")


def peak_mb() -> float:
    return _status_mb("VmHWM")


def safety_net(extra_bytes: int) -> None:
    """Cap this process's address space at what it maps now plus ``extra_bytes``."""
    with open("/proc/self/status") as f:
        size_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    cap = size_kb * 1024 + extra_bytes
    resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))


def leave_sparse_file(path: str, size: int) -> Any:
    """A policy: the rollout makes the file its task asks for, as a sparse file of ``size`` bytes."""

    def policy(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
        if any(m.get("role") == "tool" for m in messages):
            return answer("done")
        return tool_turn(("terminal", {"command": f"truncate -s {size} {path}"}))

    return policy


async def _group(env: TinyTasksEnv, factory: Any, size: int, n: int) -> list[dict[str, Any]]:
    item = env.generate(0, split="eval")
    model = ScriptedModel(leave_sparse_file(item["metadata"]["path"], size))
    episodes = await Rollouts(env, RolloutBackends(model, factory, default_registry())).group(item, n)
    return [{"reward": e.reward.value, "reason": e.reward.reason, "error": e.reward.error} for e in episodes]


async def sparse_rollouts(root: str) -> dict[str, Any]:
    """4 concurrent write_file rollouts, each leaving its answer file as a 1 GB sparse file, judged
    by the shipped checker with the default read limit; then the control: one rollout with a
    200 MB sparse file and the limit raised above it (the measurement does see a whole read)."""
    safety_net(8 << 30)
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=root, reuse=True))
    try:
        env = TinyTasksEnv(TinyTasksConfig(families=["write_file"], enabled_toolsets=["terminal"]))
        warm = await _group(env, factory, 10, 4)  # every code path once: imports, pools, sandboxes
        base = peak_mb()
        defended = await _group(env, factory, GB, 4)
        after = peak_mb()
        control: list[dict[str, Any]] = []
        try:
            raised = TinyTasksEnv(
                TinyTasksConfig(
                    families=["write_file"], enabled_toolsets=["terminal"], max_read_bytes=1 << 30
                )
            )
            control = await _group(raised, factory, 200_000_000, 1)
        except Exception as exc:  # the field did not exist before the fix
            control = [{"error": repr(exc)}]
        return {
            "warm": warm,
            "defended": defended,
            "control": control,
            "base_mb": base,
            "growth_mb": after - base,
            "control_growth_mb": peak_mb() - base,
        }
    finally:
        await close_factory(factory)


async def big_output(root: str) -> dict[str, Any]:
    """A verifier command whose stdout is 10 GB (sparse: the sandbox pays nothing for it)."""
    limits = SandboxLimits(file_size_mb=16_384)
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=root, limits=limits))
    sb = await factory.create("big-output")
    try:
        ctx = VerifierContext(sb)
        small = await ctx.exec(["echo", "hello"])  # warm
        safety_net(3 << 30)
        base = reset_peak()
        out: dict[str, Any] = {"small": small.stdout.decode()}
        cmd = "python3 -c 'import os; os.lseek(1, 10 << 30, 0); os.write(1, b\"x\")'"
        try:
            res = await ctx.exec(cmd, timeout=60)
            out["result"] = {"exit_code": res.exit_code, "stdout_bytes": len(res.stdout)}
        except BaseException as exc:
            out["error"] = {"type": type(exc).__name__, "message": str(exc)[:500]}
        out["growth_mb"] = peak_mb() - base
        # the sandbox is still usable afterwards, and the scratch file of the big output is gone
        out["after"] = (await ctx.exec(f"find {sb.scratch_dir} -size +1M | wc -l; echo ok")).text
        return out
    finally:
        await sb.close()
        await close_factory(factory)


SCENARIOS = {"sparse_rollouts": sparse_rollouts, "big_output": big_output}

if __name__ == "__main__":
    print(json.dumps(asyncio.run(SCENARIOS[sys.argv[1]](sys.argv[2]))))
