"""Forking sandboxes from a template against building each from scratch, side by side in one run.

The starting state is a "repository with its dependencies installed": ``--files`` files of
``--file-kb`` KiB (5,000 x 10 KiB = 50 MB by default) written by a command in the sandbox. Three
ways to get ``--children`` sandboxes in that state, each measured with all of them alive:

- ``scratch``: build each sandbox and run the setup in it (what every rollout paid before);
- ``fork (overlay)``: prepare a template once, then ``create(template=...)`` per child (root);
- ``fork (copy)``: the same with overlays turned off (what a non-root host gets).

Per way: wall time per sandbox, CPU of the whole tree per sandbox (a cpuacct cgroup of our own,
as root), and the memory the live sandboxes hold (``Shmem``: tmpfs pages, and ``MemTotal -
MemAvailable``, both as deltas), with the load average. Then a GRPO group end to end: an env whose
``prepare_sandbox`` writes the same tree, ``Rollouts.group(item, children)`` with and without its
``template_key`` (a scripted model: one command, then the answer).

    .venv/bin/python benchmarks/sandbox_fork.py
    .venv/bin/python benchmarks/sandbox_fork.py --files 5000 --file-kb 10 --children 16
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _endpoint import TreeCpu, load_average  # noqa: E402

from trajforge.envs import BaseEnv, RolloutBackends, Rollouts  # noqa: E402
from trajforge.sandbox import SandboxConfig, create_sandbox_factory  # noqa: E402
from trajforge.sandbox import factory as factory_module  # noqa: E402
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn  # noqa: E402
from trajforge.tools.builtin import default_registry  # noqa: E402


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        out[name] = int(rest.split()[0]) * 1024
    return out


def setup_command(files: int, kb: int) -> str:
    """Writes the tree with one python process (a loop of shell commands would measure forks)."""
    return (
        "python3 -c 'import os\n"
        f"for i in range({files}):\n"
        '    d = "repo/pkg%03d" % (i // 100)\n'
        "    os.makedirs(d, exist_ok=True)\n"
        f'    open("%s/mod%05d.py" % (d, i), "wb").write(os.urandom({kb * 1024}))\n'
        "' && echo ok"
    )


async def _ways(args: argparse.Namespace, root: str) -> dict[str, Any]:
    command = setup_command(args.files, args.file_kb)

    async def setup(sb: Any) -> None:
        res = await sb.exec(command, timeout=600)
        assert res.output.endswith("ok\n"), res

    results: dict[str, Any] = {}
    for way in ("scratch", "fork (overlay)", "fork (copy)"):
        factory_module_can = factory_module.can_overlay
        if way == "fork (copy)":
            factory_module.can_overlay = lambda: False  # type: ignore[assignment]
        try:
            factory = create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=root))
            with TreeCpu() as tree:  # around the factory: its sandboxes are gone before the cgroup
                await factory.check()
                mem0, load0 = meminfo(), load_average()
                async with factory:
                    cpu0, t0 = tree.seconds(), time.perf_counter()
                    template_s = None
                    if way == "scratch":
                        boxes = []
                        for i in range(args.children):
                            sb = await factory.create(f"scratch-{i}")
                            await setup(sb)
                            boxes.append(sb)
                    else:
                        template = await factory.template("repo", setup=setup)
                        template_s = time.perf_counter() - t0
                        boxes = [
                            await factory.create(f"fork-{i}", template=template) for i in range(args.children)
                        ]
                    wall, cpu1 = time.perf_counter() - t0, tree.seconds()
                    check = await boxes[-1].exec("find repo -type f | wc -l; du -sm repo | cut -f1")
                    mem1 = meminfo()
                    for sb in boxes:
                        await sb.close()
                per_box = (wall - (template_s or 0.0)) / args.children
                results[way] = {
                    "load_before": load0,
                    "load_after": load_average(),
                    "template_s": None if template_s is None else round(template_s, 3),
                    "wall_s_per_sandbox": round(per_box, 4),
                    "wall_s_total": round(wall, 3),
                    "cpu_s_total": None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 3),
                    "shmem_mib_alive": round((mem1["Shmem"] - mem0["Shmem"]) / 2**20, 1),
                    "used_mib_alive": round((mem0["MemAvailable"] - mem1["MemAvailable"]) / 2**20, 1),
                    "files_and_mib_seen": check.output.split(),
                    "stats": factory.stats.counts(),
                }
        finally:
            factory_module.can_overlay = factory_module_can  # type: ignore[assignment]
    return results


class RepoEnv(BaseEnv):
    """An env whose every item starts from the prepared tree."""

    name: ClassVar[str] = "bench_repo"
    description: ClassVar[str] = "benchmark env"
    command: ClassVar[str] = ""

    def generate(self, index: int, *, split: str) -> dict[str, Any]:
        return {"id": f"r{index}", "prompt": "count"}

    async def prepare_sandbox(self, item: dict[str, Any], sandbox: Any) -> None:
        res = await sandbox.exec(self.command, timeout=600)
        assert res.output.endswith("ok\n"), res

    async def compute_reward(self, item: Any, result: Any, ctx: Any) -> float:
        return 1.0


class TemplatedRepoEnv(RepoEnv):
    name: ClassVar[str] = "bench_repo_templated"

    def template_key(self, item: dict[str, Any]) -> str:
        return str(item["id"])


def _policy(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
    if len(messages) <= 2:
        return tool_turn(("terminal", {"command": "find repo -type f | wc -l; echo x > repo/mine"}))
    return answer("done")


async def _group(args: argparse.Namespace, root: str) -> dict[str, Any]:
    RepoEnv.command = setup_command(args.files, args.file_kb)
    out: dict[str, Any] = {}
    for name, env in (("without template_key", RepoEnv()), ("with template_key", TemplatedRepoEnv())):
        env.config = env.config.model_copy(update={"max_concurrent_rollouts": args.children})
        load0 = load_average()
        with TreeCpu() as tree:  # around the factory: its sandboxes are gone before the cgroup
            factory = create_sandbox_factory(SandboxConfig(kind="bwrap", reuse=True, root_dir=root))
            async with factory:
                await factory.check()
                rollouts = Rollouts(env, RolloutBackends(ScriptedModel(_policy), factory, default_registry()))
                cpu0, t0 = tree.seconds(), time.perf_counter()
                group = await rollouts.group(env.generate(0, split="train"), args.children)
                wall, cpu1 = time.perf_counter() - t0, tree.seconds()
            out[name] = {
                "load_before": load0,
                "wall_s": round(wall, 3),
                "cpu_s": None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 3),
                "completed": sum(e.status == "completed" for e in group),
                "stats": factory.stats.counts(),
            }
    a, b = out["without template_key"], out["with template_key"]
    out["speedup_wall"] = round(a["wall_s"] / b["wall_s"], 2)
    if a["cpu_s"] and b["cpu_s"]:
        out["cpu_ratio"] = round(a["cpu_s"] / b["cpu_s"], 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=5000)
    p.add_argument("--file-kb", type=int, default=10)
    p.add_argument("--children", type=int, default=16)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="tf-fork-") as root:
        result = {
            "files": args.files,
            "file_kb": args.file_kb,
            "children": args.children,
            "ways": asyncio.run(_ways(args, root)),
            "grpo_group": asyncio.run(_group(args, root)),
        }
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
