"""What ``/proc`` says about a process: alive, the same one (start time), its group's members,
and an awaitable exit for a process that is not our child (pidfd).

A pid alone does not name a process across a manager restart: pids are reused. A pid plus its
start time (``/proc/PID/stat`` field 22, clock ticks since boot) does, so every check here takes
both and a reused pid reads as "gone".
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

_PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of ``/proc/PID/stat`` (after the command name, which may hold spaces)."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when there is no such pid."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def alive(pid: int, ticks: int | None) -> bool:
    """True when ``pid`` runs and is the process that started at ``ticks`` (zombies are dead)."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in {"Z", "X"}:
        return False
    return ticks is None or int(fields[19]) == ticks


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is ``pgid``."""
    out = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and fields[0] not in {"Z", "X"} and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


def cmdline(pid: int) -> list[str]:
    """A process's argv as the kernel shows it to everyone (``/proc/PID/cmdline``)."""
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0") if part]


async def wait_exit(pid: int, ticks: int | None, timeout: float | None) -> bool:
    """Wait until the process is gone (a pidfd becomes readable on exit, child of ours or not);
    True when it is gone, False at ``timeout``."""
    if not alive(pid, ticks):
        return True
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        if not alive(pid, ticks):  # the pid was reused between the check and the open
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(done), timeout)
        return done.done() or not alive(pid, ticks)
    finally:
        loop.remove_reader(fd)
        os.close(fd)
