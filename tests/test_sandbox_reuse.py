"""Sandbox reuse: a reset sandbox must be indistinguishable from a fresh one, or be discarded.

Everything here runs the real bubblewrap backend; "fresh" is checked from inside (what the next
rollout can observe) and from the host (processes, directories, cgroup).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import trajforge
from trajforge.sandbox import SandboxBrokenError, SandboxConfig, SandboxLimits, create_sandbox_factory
from trajforge.sandbox.factory import ReuseStats

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]


def _factory(tmp_path: Path, **kw):
    return create_sandbox_factory(
        SandboxConfig(kind="bwrap", reuse=True, command_timeout_s=20, root_dir=str(tmp_path / "sb"), **kw)
    )


def _host_processes(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


# A rollout that leaves every kind of state behind it: files (also unreadable ones), scratch
# files, session cwd/env, background processes (plain, nohup, setsid, double-forked), a System V
# shared memory segment.
_MESS = (
    "mkdir -p sub/locked && echo secret > sub/locked/f && chmod 000 sub/locked && "
    "echo scratch > /tmp/left && export LEAK=1 && cd sub && "
    "(sleep 1031 &) ; nohup sleep 1031 >/dev/null 2>&1 & setsid sleep 1031 & "
    "ipcmk -M 4096 >/dev/null; echo done"
)


async def test_reset_sandbox_is_reused_and_looks_fresh(tmp_path):
    async with _factory(tmp_path) as factory:
        first = await factory.create("a")
        agent_pid = first.agent.pid
        mess = await first.exec(_MESS)
        assert mess.output.strip().endswith("done")
        assert _host_processes("sleep\x001031")
        await first.close()

        assert _host_processes("sleep\x001031") == []  # reset killed them all, at once
        second = await factory.create("b")
        assert second.agent.pid == agent_pid  # the same sandbox, not a new one
        assert factory.stats.created == 1 and factory.stats.reused == 1
        seen = await second.exec(
            'ls -A; ls -A /tmp | grep -v trajforge-session; echo "[$LEAK]"; pwd; ipcs -m | grep -c 0x'
        )
        assert seen.output.split("\n")[:3] == ["[]", "/workspace", "0"], seen.output
        ps = await second.exec("ps -eo comm= | sort | uniq -c")
        assert "sleep" not in ps.output
        await second.close()


@pytest.mark.parametrize("depth", [400, 3000])  # 3000: paths far beyond PATH_MAX (4096)
async def test_a_tree_deeper_than_the_agent_walks_is_reset_or_refused_never_a_crash(tmp_path, depth):
    """The reset walks and removes whatever the commands left. A tree it cannot remove makes it
    refuse, and the sandbox is discarded: paths longer than the kernel takes (the agent walks with
    explicit stacks, so depth alone never crashes it). Either way the next rollout starts clean, and
    the reason, which names a 4 KiB path, is cut to a readable length in the statistics."""
    make = (
        "python3 -c \"import os\nfor base in ('/workspace', '/tmp'):\n os.chdir(base)\n"
        f" for _ in range({depth}): os.mkdir('d'); os.chdir('d')\n"
        " open('bottom', 'w').write('x'); os.symlink('/etc', 'link')\"; echo made"
    )
    async with _factory(tmp_path) as factory:
        first = await factory.create("deep")
        assert (await first.exec(make)).output.strip() == "made"
        await first.close()
        second = await factory.create("after")
        seen = await second.exec("ls -A /workspace; ls -A /tmp | grep -v trajforge-session; echo end")
        assert seen.output == "end\n", seen.output
        assert factory.stats.created + factory.stats.reused == 2
        if factory.stats.reused == 0:  # refused: counted with its reason
            assert sum(factory.stats.discarded.values()) == 1, factory.stats.discarded
            assert all(len(why) <= ReuseStats.MAX_REASON_CHARS for why in factory.stats.discarded)
        await second.close()


async def test_commands_cannot_reach_into_the_agent(tmp_path):
    """The agent that performs the reset is uid 0 when we are root (and the commands' uid in a
    user namespace); either way it is non-dumpable, so a command cannot trace it or read its
    memory to make it lie."""
    async with _factory(tmp_path) as factory:
        sb = await factory.create("a")
        out = await sb.exec("cat /proc/$PPID/environ >/dev/null 2>&1 && echo READABLE || echo DENIED")
        assert out.output == "DENIED\n"
        own = await sb.exec("sleep 5 & cat /proc/$!/environ >/dev/null && echo READABLE; kill $!")
        assert own.output.startswith("READABLE")  # the check itself works on a plain process
        await sb.close()


async def test_old_handle_cannot_reach_the_next_rollout(tmp_path):
    async with _factory(tmp_path) as factory:
        first = await factory.create("a")
        await first.close()
        second = await factory.create("b")
        assert second.resident is first.resident
        for call in (first.exec("echo hi"), first.read_bytes("x"), first.write_bytes("x", b"1")):
            with pytest.raises(RuntimeError, match="closed"):
                await call
        await second.close()


async def test_cwd_and_setup_files_on_a_reused_sandbox(tmp_path):
    start = tmp_path / "start"
    (start / "pkg").mkdir(parents=True)
    (start / "pkg" / "mod.py").write_text("VALUE = 7\n")
    async with _factory(tmp_path) as factory:
        warm = await factory.create("warm")
        await warm.exec("echo old > old.txt")
        await warm.close()
        sb = await factory.create("row", cwd=str(start))
        assert factory.stats.reused == 1
        await sb.write_bytes("notes/a.txt", b"hello")
        out = await sb.exec(
            "ls -A; cat pkg/mod.py; echo more >> pkg/mod.py && echo writable; cat notes/a.txt"
        )
        assert out.output == "notes\npkg\nVALUE = 7\nwritable\nhello", out.output
        await sb.close()
    assert (start / "pkg" / "mod.py").read_text() == "VALUE = 7\n"  # the original is untouched


@pytest.mark.parametrize("jobs", [3, 16, 17, 60])  # at most 16: a kill each; more: kill(-1)
async def test_a_reset_kills_every_process_left_however_many(tmp_path, jobs):
    """The reset kills a few processes one by one (``kill(-1)`` walks every process of the host)
    and many at once: either way none survives into the next sample, setsid ones included."""
    async with _factory(tmp_path) as factory:
        sb = await factory.create("a")
        half, secs = jobs // 2, 1100 + jobs  # a duration of its own: tests run side by side
        started = await sb.exec(
            f"for i in $(seq {half}); do sleep {secs} & done; "
            f"for i in $(seq {jobs - half}); do setsid sleep {secs} & done; sleep 0.2; "
            "ps -eo comm= | grep -c '^sleep$'"
        )
        assert started.output.strip() == str(jobs), started.output
        assert len(_host_processes(f"sleep\x00{secs}")) == jobs
        await sb.close()
        assert _host_processes(f"sleep\x00{secs}") == []
        again = await factory.create("b")
        ps = await again.exec("ps -eo comm= | grep -c '^sleep$'")
        assert ps.output.strip() == "0", ps.output
        assert factory.stats.reused == 1, factory.stats
        await again.close()


async def test_restored_workdir_mode_and_fork_bomb(tmp_path):
    async with _factory(tmp_path, limits=SandboxLimits(max_processes=48)) as factory:
        sb = await factory.create("bomb")
        await sb.exec("chmod 000 /workspace /tmp; :(){ :|:& };:", timeout=2)
        await sb.close()
        again = await factory.create("next")
        out = await again.exec("touch ok && ls; ps -e | wc -l")
        lines = out.output.split()
        assert lines[0] == "ok" and int(lines[1]) <= 6, out.output  # bwrap, agent, bash, ps, wc + header
        assert factory.stats.reused == 1, factory.stats
        await again.close()


async def test_a_dead_agent_means_a_fresh_sandbox(tmp_path, kill_agent):
    async with _factory(tmp_path) as factory:
        sb = await factory.create("a")
        old_root = sb.layout.root
        await kill_agent(sb)  # the sandbox dies under the rollout
        with pytest.raises(SandboxBrokenError):
            await sb.exec("echo back")
        await sb.close()
        assert factory.stats.discarded == {"the exec agent is not running": 1}
        assert not old_root.exists()
        fresh = await factory.create("b")
        assert factory.stats.created == 2 and factory.stats.reused == 0
        await fresh.close()


async def test_max_uses_and_max_idle(tmp_path):
    async with _factory(tmp_path) as factory:
        factory.max_uses = 2
        pids = []
        for name in "abc":
            sb = await factory.create(name)
            pids.append(sb.agent.pid)
            await sb.close()
        assert pids[0] == pids[1] != pids[2]
        assert factory.stats.discarded == {"reached max_uses": 1}

        factory.max_uses, factory.max_idle = 100, 1
        a, b = await factory.create("a"), await factory.create("b")
        await a.close()
        await b.close()  # the pool is full: b is destroyed, not kept
        assert len(factory._idle) == 1 and not b.layout.root.exists()


async def test_aclose_and_forgotten_factory_remove_idle_sandboxes(tmp_path):
    factory = _factory(tmp_path)
    sb = await factory.create("a")
    await sb.exec("sleep 1032 >/dev/null 2>&1 &")
    root, cgroup_dirs, pid = sb.layout.root, list(sb.cgroup.dirs.values()), sb.agent.pid
    await sb.close()
    assert root.exists() and _alive(pid)  # idle, waiting for the next rollout
    await factory.aclose()
    assert not root.exists() and not any(d.exists() for d in cgroup_dirs)
    assert not _alive(pid) and _host_processes("sleep\x001032") == []
    with pytest.raises(RuntimeError, match="closed"):
        await factory.create("late")

    forgotten = _factory(tmp_path / "f")
    sb = await forgotten.create("b")
    root = sb.layout.root
    await sb.close()
    del forgotten, sb
    gc.collect()  # the finalizer removes what nobody closed
    assert not root.exists()


async def test_reuse_off_builds_every_sandbox(tmp_path):
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=str(tmp_path / "sb")))
    a = await factory.create("a")
    root = a.layout.root
    await a.close()
    assert not root.exists()
    b = await factory.create("b")
    await b.close()
    assert factory.stats.created == 2 and factory.stats.reused == 0


async def test_local_backend_never_reuses(tmp_path):
    factory = create_sandbox_factory(SandboxConfig(kind="local", reuse=True, root_dir=str(tmp_path / "sb")))
    a = await factory.create("a")
    root = a.layout.root
    await a.close()
    assert not root.exists() and factory.stats.created == 1
    await factory.aclose()


async def test_concurrent_rollouts_on_reused_sandboxes_stay_apart(tmp_path):
    async with _factory(tmp_path) as factory:

        async def rollout(i: int) -> str:
            sb = await factory.create(f"r{i}")
            try:
                out = await sb.exec(f"cat marker 2>/dev/null || echo fresh; echo {i} > marker; ls /tmp")
                return out.output
            finally:
                await sb.close()

        outputs = []
        for _ in range(3):
            outputs += await asyncio.gather(*(rollout(i) for i in range(4)))
        assert all(o.startswith("fresh\n") for o in outputs), outputs
        assert factory.stats.reused >= 8


def test_discard_reasons_are_bounded_in_length_and_number():
    """A model that makes every reset fail with a reason of its choosing (a path it names) cannot
    grow the run's statistics: long reasons are cut, and distinct ones past a limit share a key."""
    stats = ReuseStats()
    stats.discard("cannot restore /: /" + "d/" * 3000 + " changed")
    for i in range(3 * ReuseStats.MAX_REASONS):
        stats.discard(f"cannot restore /: /planted-{i} changed")
    assert len(stats.discarded) == ReuseStats.MAX_REASONS + 1
    assert all(len(why) <= ReuseStats.MAX_REASON_CHARS for why in stats.discarded)
    assert sum(stats.discarded.values()) == 1 + 3 * ReuseStats.MAX_REASONS  # every discard counted
    assert stats.discarded[ReuseStats.OTHER_REASONS] == 2 * ReuseStats.MAX_REASONS + 1
    assert any(why.endswith(" changed") and " ... " in why for why in stats.discarded)


async def test_reset_guard_refuses_outside_a_bwrap_pid_namespace(tmp_path):
    # reset() kills with kill(-1): the guard is what keeps it from reaching host processes. The
    # local backend's agent runs in the host's pid namespace: its reset refuses, and nothing dies.
    factory = create_sandbox_factory(SandboxConfig(kind="local", root_dir=str(tmp_path)))
    sb = await factory.create("guard")
    bystander = await asyncio.create_subprocess_exec("sleep", "1044")
    try:
        assert await sb.resident.agent.reset() == "not started as a reusable sandbox in its own pid namespace"
        with pytest.raises(TimeoutError):  # still running: the refused reset killed nothing
            async with asyncio.timeout(0.3):
                await bystander.wait()
    finally:
        bystander.kill()
        await bystander.wait()
        await sb.close()


async def test_a_cancelled_command_means_the_sandbox_is_not_reused(tmp_path):
    """A rollout cancelled mid-command (sample deadline) leaves the agent busy: the sandbox is
    discarded at once rather than reset behind a command that is still running."""
    async with _factory(tmp_path) as factory:
        sb = await factory.create("a")
        task = asyncio.create_task(sb.exec("sleep 1034", timeout=30))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await sb.close()  # no reset attempt: it would wait behind the still-running command
        assert factory.stats.discarded == {"a command was interrupted mid-call": 1}
        assert _host_processes("sleep\x001034") == []


_UNPRIVILEGED_SCRIPT = """
import asyncio, json, sys
from trajforge.sandbox import SandboxConfig, create_sandbox_factory

async def main(root):
    out = {}
    async with create_sandbox_factory(SandboxConfig(kind="bwrap", reuse=True, root_dir=root)) as f:
        a = await f.create("a")
        probe = "for d in / /dev /dev/shm /run; do [ -w $d ] && echo $d; done"
        out["writable"] = (await a.exec(probe)).output.split()
        await a.exec("echo x > /dev/shm/leak; mkdir /run/leakdir && echo y > /run/leakdir/f; echo z > /leakroot")
        await a.close()
        b = await f.create("b")
        out["after"] = (await b.exec("ls -A /dev/shm /run /")).output
        await b.exec("chmod 700 /run")
        await b.close()
        out["stats"] = f.stats.counts()
    print(json.dumps(out))

asyncio.run(main(sys.argv[1]))
"""


def _run_unprivileged(*argv: str, cwd: str) -> subprocess.CompletedProcess[str]:
    """Run the system python3 as ``nobody`` on this checkout's code and packages."""
    paths = [
        str(Path(trajforge.__file__).parents[1]),
        *(p for p in sys.path if p.endswith("site-packages")),
    ]
    env = {"PATH": "/usr/bin:/bin", "HOME": cwd, "PYTHONPATH": os.pathsep.join(paths)}
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", *argv]
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_unprivileged_user_namespace_reset_restores_writable_tmpfs():
    """Not root (the usual case on a workstation): bwrap runs in a user namespace, where the tmpfs
    mounts /, /dev, /dev/shm and /run are writable by the commands. What they add is removed at
    reset; what they change (a mode) makes the sandbox be discarded."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs root (to become an unprivileged user), setpriv and /usr/bin/python3")
    work = tempfile.mkdtemp(prefix="tf-unpriv-")
    try:
        os.chmod(work, 0o777)
        probe = _run_unprivileged("-c", "import trajforge.sandbox, pydantic", cwd=work)
        if probe.returncode != 0:
            pytest.skip(f"the system python3 cannot import this checkout as nobody: {probe.stderr[-200:]}")
        script = Path(work) / "check.py"
        script.write_text(_UNPRIVILEGED_SCRIPT)
        done = _run_unprivileged(str(script), str(Path(work) / "sb"), cwd=work)
        assert done.returncode == 0, done.stderr[-2000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert "/dev/shm" in out["writable"] and "/run" in out["writable"], out
    for leftover in ("leak", "leakdir", "leakroot"):
        assert leftover not in out["after"].split(), out["after"]
    assert out["stats"] == {"created": 1, "reused": 1, "discarded: cannot restore /: /run changed": 1}


async def test_a_create_waits_for_a_reset_in_flight_instead_of_building(tmp_path):
    """A sample that ends hands its sandbox on while the reset still runs: a create that starts
    meanwhile takes it when the reset is done (a few ms) instead of building one (~30 ms of CPU)."""
    async with _factory(tmp_path) as factory:
        sb = await factory.create("first")
        await sb.exec("echo hi")
        closing = asyncio.ensure_future(sb.close())
        await asyncio.sleep(0)  # the close has started its reset
        assert factory._resetting == 1
        nxt = await factory.create("second")
        await closing
        assert factory.stats.counts() == {"created": 1, "reused": 1}
        assert (await nxt.exec("echo fine")).output == "fine\n"
        await nxt.close()
