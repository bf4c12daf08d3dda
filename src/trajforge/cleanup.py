"""Cleanups that a cancellation must not cut short.

A task is cancelled at any ``await``: a rollout at its deadline, an ``env eval`` stopped, a
trainer's rollout producer shut down, ``asyncio.run`` cancelling what is left. When that ``await``
is inside a cleanup -- a sandbox's close, which resets it for the next rollout or removes it --
the cleanup stops half-way: the sandbox is neither reset nor removed, and its tmpfs, directory and
processes stay until the process exits or the next run sweeps them. :func:`finish` runs such a
cleanup to its end whatever cancellations arrive meanwhile, then lets the cancellation through.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


async def finish(cleanup: Awaitable[T]) -> T:
    """Await ``cleanup`` to its end, even if the caller is cancelled (once or many times) while it
    runs; then re-raise that cancellation, or return its result when there was none. An error of
    the cleanup propagates; after a cancellation it is logged and the cancellation wins (what the
    caller's caller waits for: ``asyncio.timeout``, a task group)."""
    task = asyncio.ensure_future(cleanup)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # the cleanup itself was cancelled, not (only) its caller
                raise
            cancelled = True  # ours, even when the cleanup ended in the same turn of the loop
        except BaseException:
            break  # the cleanup failed: raised below
    if cancelled:
        failed = None if task.cancelled() else task.exception()
        if failed is not None:
            log.warning("a cleanup failed while its task was being cancelled: %r", failed)
        raise asyncio.CancelledError
    return task.result()
