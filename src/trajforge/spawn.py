"""Start a child process from asyncio such that cancelling the start cannot hang.

``asyncio.create_subprocess_exec`` cancelled while it connects the child's pipes waits forever in
the CPython 3.11 we run on (python/cpython#103847, #125502): the transport's exit waiters are
only woken once every pipe is connected, and the cancelled connect never finishes. trajforge
cancels process starts routinely -- a session whose first model call fails (a 401) cancels its
sandbox's start, a run stopped at its deadline cancels whatever is starting -- so on Python 3.11
a ``trajforge run`` with a wrong key could hang for good (CI saw it). :func:`spawn` lets the start
finish out of the cancellation's reach, then kills the child it no longer wants and re-raises: the
caller is cancelled as asked, within the time a start takes, and no process is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

from trajforge.cleanup import finish

_REAP_S = 10.0
"""How long a killed, unwanted child is waited for before it is left to the OS."""


async def spawn(*argv: str, **kwargs: Any) -> asyncio.subprocess.Process:
    """``asyncio.create_subprocess_exec(*argv, **kwargs)``, safe to cancel at any point."""
    start = asyncio.ensure_future(asyncio.create_subprocess_exec(*argv, **kwargs))
    try:
        return await asyncio.shield(start)
    except asyncio.CancelledError:
        await _discard(start, group=bool(kwargs.get("start_new_session")))
        raise


def kill_process(proc: asyncio.subprocess.Process, *, group: bool) -> None:
    """SIGKILL ``proc``, and with ``group`` (it was started with ``start_new_session``) every
    process of its group: what it forked that has not left the group dies with it."""
    if proc.returncode is not None:  # reaped: its pid, and so its group's id, may be reused
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()


async def _discard(start: asyncio.Future[asyncio.subprocess.Process], *, group: bool) -> None:
    """Let a start the caller gave up on finish (repeated cancellations included), then kill and
    reap its child (its process group with ``group``)."""
    with contextlib.suppress(Exception, asyncio.CancelledError):  # the caller is cancelled anyway
        await finish(start)
    if start.cancelled() or start.exception() is not None:
        return  # nothing was started
    proc = start.result()
    kill_process(proc, group=group)
    with contextlib.suppress(TimeoutError, asyncio.CancelledError):
        await asyncio.wait_for(proc.wait(), _REAP_S)
