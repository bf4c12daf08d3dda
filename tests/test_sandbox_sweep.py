"""What a ``kill -9``'d run leaves behind (sandbox directories, cgroups) is removed by the next
factory; what belongs to live processes, or is not provably ours, is never touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from trajforge.sandbox import SandboxConfig, create_sandbox_factory
from trajforge.sandbox import sweep as sweep_module
from trajforge.sandbox.cgroup import CGROUP_ROOT

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

_VICTIM = """
import asyncio, sys
from trajforge.sandbox import SandboxConfig, create_sandbox_factory

async def main():
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=sys.argv[1], reuse=True))
    busy = await factory.create("busy")
    await busy.exec("echo data > file; sleep 1035 >/dev/null 2>&1 &")
    idle = await factory.create("idle")
    await idle.close()  # waits in the idle pool
    print(busy.layout.root, busy.layout.work, idle.layout.root, *busy.cgroup.dirs.values(), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def _sleepers() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/cmdline").read_bytes() == b"sleep\x001035\x00":
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _run_and_kill_victim(root: Path) -> tuple[Path, Path, Path, list[Path]]:
    """A process that makes a busy and an idle sandbox, then dies by SIGKILL (no cleanup runs)."""
    victim = subprocess.Popen([sys.executable, "-c", _VICTIM, str(root)], stdout=subprocess.PIPE)
    assert victim.stdout is not None
    busy, work, idle, *cgroups = victim.stdout.readline().decode().split()
    victim.kill()
    victim.wait()
    return Path(busy), Path(work), Path(idle), [Path(c) for c in cgroups]


def _existing(*paths: Path) -> list[Path]:
    return [p for p in paths if p.exists()]


async def test_leftovers_of_a_killed_run_are_swept_by_the_next_factory(tmp_path):
    root = tmp_path / "sb"
    busy, work, idle, cgroups = _run_and_kill_victim(root)
    assert _existing(work / "file", idle, *cgroups) == [work / "file", idle, *cgroups]

    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=str(root)))
    live = await factory.create("live")  # the first create sweeps
    try:
        assert _existing(busy, idle, *cgroups) == []
        assert _sleepers() == []
        other = create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=str(root)))
        second = await other.create("second")  # sweeps too, and must leave the live one alone
        assert _existing(live.layout.root) == [live.layout.root]
        assert (await live.exec("echo alive")).output == "alive\n"
        await second.close()
    finally:
        await live.close()


def test_sweep_trusts_only_its_own_records(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    forged = {
        "pid": dead.pid,
        "start": 1,
        "cgroups": [str(CGROUP_ROOT / "pids"), "/etc", str(CGROUP_ROOT / "pids" / "trajforge-0123456789ab")],
    }
    assert sweep_module._our_cgroups(forged["cgroups"]) == [CGROUP_ROOT / "pids" / "trajforge-0123456789ab"]

    mine, foreign, unmarked = (tmp_path / name for name in ("mine", "foreign", "unmarked"))
    for d in (mine, foreign, unmarked):
        d.mkdir()
    (mine / "owner.json").write_bytes(orjson.dumps(forged))
    (foreign / "owner.json").write_bytes(orjson.dumps(forged))
    if os.geteuid() == 0:
        os.chown(foreign / "owner.json", 12345, 12345)  # written by someone else: not trusted
    assert sweep_module.sweep_stale(tmp_path) == (1 if os.geteuid() == 0 else 2)
    assert not mine.exists() and unmarked.exists()
    assert foreign.exists() == (os.geteuid() == 0)


def test_a_recycled_pid_is_not_the_owner(tmp_path):
    me = os.getpid()
    (tmp_path / "a").mkdir()
    start = sweep_module.process_start(me)
    (tmp_path / "a" / "owner.json").write_bytes(orjson.dumps({"pid": me, "start": start, "cgroups": []}))
    assert sweep_module.sweep_stale(tmp_path) == 0  # we are alive
    (tmp_path / "a" / "owner.json").write_bytes(orjson.dumps({"pid": me, "start": start - 1, "cgroups": []}))
    assert sweep_module.sweep_stale(tmp_path) == 1  # same pid, another process: its owner is gone
