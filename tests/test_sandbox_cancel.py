"""A sandbox start cancelled at any point leaves no process behind.

A session cancels its sandbox's start when the rollout ends before the sandbox is needed (the
model's first call fails with a 401, a sample times out, a run is stopped). Whatever point the
start had reached -- the layout made, bubblewrap spawned, the exec agent not yet greeting -- the
cancellation must kill what was spawned: a sandbox left running is a process per failed sample
that nothing accounts for.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def _children() -> set[int]:
    """Our direct children that are still running (zombies excluded)."""
    me = str(os.getpid())
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[1] == me and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def _mounts_under(root: Path) -> list[str]:
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    return [m for m in mounts if m.startswith(str(root))]


async def _settled_children(before: set[int], wait_s: float = 5.0) -> set[int]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    # the kernel's process table is polled: no event says when a killed child is gone
    while (left := _children() - before) and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return left


async def test_a_cancelled_start_leaves_no_sandbox_process(factory: Any, tmp_path: Path) -> None:
    warm = await factory.create("warm")  # the factory's one-time probe, out of the measured starts
    await warm.close()
    before = _children()
    cancelled_while_starting = 0
    for delay_ms in range(0, 120, 4):
        task = asyncio.ensure_future(factory.create(f"c{delay_ms}"))
        await asyncio.sleep(delay_ms / 1000)
        if task.done():
            await (task.result()).close()
            continue
        spawned = bool(_children() - before)
        task.cancel()
        try:
            sandbox = await task
        except asyncio.CancelledError:
            cancelled_while_starting += spawned
        else:  # the start had just finished when the cancel came: a sandbox to close, as a session does
            await sandbox.close()
        left = await _settled_children(before)
        assert not left, f"cancelled after {delay_ms} ms, still running: {sorted(left)}"
    # the loop did cancel starts that had already spawned bubblewrap (else it proved nothing)
    assert cancelled_while_starting >= 1
    assert not _mounts_under(tmp_path), "a cancelled start left a mount"
    assert not [p.name for p in (tmp_path / "sb").iterdir() if p.is_dir() and p.name[0] == "c"]


@pytest.mark.parametrize("reuse", [True, False], ids=["reset", "removed"])
async def test_a_cancelled_close_still_resets_or_removes_its_sandbox(tmp_path: Path, reuse: bool) -> None:
    """A rollout cancelled while its sandbox closes (its deadline, a stopped run) must not cut the
    close short: a reset or removal stopped half-way left the sandbox's tmpfs mounted, its
    directory and its bwrap running, owned by nobody (before the fix: every cancel in the first
    millisecond of a close). A reset cut short removes the sandbox; the closing task still ends
    cancelled, and the next rollout gets a clean sandbox."""
    from trajforge.sandbox import close_factory, create_sandbox_factory
    from trajforge.sandbox.types import SandboxConfig

    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=str(tmp_path / "sb"), reuse=reuse))
    before = _children()
    cancelled_while_closing = 0
    try:
        for delay_us in range(0, 3000, 250):
            sandbox = await factory.create(f"c{delay_us}")
            await sandbox.exec("echo hi > here.txt; sleep 30 &")  # a file and a process to remove
            closing = asyncio.ensure_future(sandbox.close())
            await asyncio.sleep(delay_us / 1e6)
            if closing.done():
                await closing
                continue
            closing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await closing
            cancelled_while_closing += 1
            if reuse:  # the reset ran to its end: the next rollout gets the sandbox, clean
                again = await factory.create("next")
                assert (await again.exec("ls; ps -e -o comm= | grep -c sleep")).output == "0\n"
                await again.close()
        if reuse:  # each reset cut short removed its sandbox, and says so
            assert factory.stats.discarded == {"reset cut short (CancelledError)": cancelled_while_closing}
    finally:
        await close_factory(factory)
    assert cancelled_while_closing >= 3  # the cancels did land in closes (else this proved nothing)
    assert not await _settled_children(before)
    assert not _mounts_under(tmp_path), "a cancelled close left a mount"
    assert not list((tmp_path / "sb").iterdir()), "a cancelled close left a sandbox directory"


def _holding_fds_under(root: Path) -> list[int]:
    """Processes (anyone's children, orphans included) with an open fd under ``root``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd).startswith(str(root)) for fd in (proc / "fd").iterdir()):
                found.append(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return found


def _describe(pids: list[int]) -> list[str]:
    """Each process: pid, parent, command line and open fds, for a failure to be read."""
    out = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
            fds = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError as exc:
            out.append(f"{pid}: {exc}")
            continue
        me = " (this process)" if pid == os.getpid() else ""
        out.append(f"{pid}{me} ppid {stat[1]}: {argv} fds {fds}")
    return out


async def test_a_cancelled_first_create_leaves_no_bwrap_of_its_probe(tmp_path: Path) -> None:
    """A factory's first create runs a probe sandbox. Cancelled while bwrap was setting up its
    child, that child (pid 1 of the new namespace, waiting on an eventfd for its killed parent and
    not yet bound to die with it) slept on forever, an orphan of init (before the fix: 2 of 80
    starts cancelled 0-40 ms in). bwrap now leads a process group, killed whole."""
    from trajforge.sandbox import close_factory, create_sandbox_factory
    from trajforge.sandbox.types import SandboxConfig

    cancelled = 0
    for step in range(48):
        root = tmp_path / f"r{step}"
        factory = create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=str(root)))
        creating = asyncio.ensure_future(factory.create("x"))
        await asyncio.sleep(step * 0.00025 + 0.002)
        if creating.done():
            await (creating.result()).close()
        else:
            creating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                started = await creating  # the start had just finished: closed, as a session does
                await started.close()
            cancelled += 1
        await close_factory(factory)
    assert cancelled >= 10
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while (left := _holding_fds_under(tmp_path)) and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    assert not left, f"processes still hold the sandboxes' directories: {_describe(left)}"
