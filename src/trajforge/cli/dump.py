"""``kill -USR1 <pid>``: print where a running ``trajforge`` is, to its stderr, and carry on.

A command that seems stuck (a run waiting on an endpoint, a sandbox that does not answer, a
shutdown that does not finish) is a question for its stacks: which thread is where, and which
asyncio tasks are waiting on what. The handler prints both and returns; the process goes on as
before. It is installed for every command because a hang is never planned for, and it costs one
signal handler.
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import threading
from types import FrameType
from typing import TextIO


def install() -> None:
    """Install the SIGUSR1 handler (main thread only; a no-op where signals cannot be set)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGUSR1"):
        return
    signal.signal(signal.SIGUSR1, _dump)


def _dump(_signum: int, _frame: FrameType | None) -> None:
    out = sys.stderr
    try:
        out.write("\n--- trajforge: SIGUSR1, the stacks of every thread ---\n")
        out.flush()
        faulthandler.dump_traceback(file=out, all_threads=True)
        _dump_tasks(out)
        out.write("--- end of dump ---\n")
        out.flush()
    except (OSError, ValueError):  # stderr closed: nothing to print to, keep running
        pass


def _dump_tasks(out: TextIO) -> None:
    """The pending asyncio tasks of the main thread's running loop, each with its stack."""
    import asyncio  # here: a --help stays free of asyncio's import

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # the handler interrupted code outside the loop
        return
    tasks = asyncio.all_tasks(loop)
    print(f"--- {len(tasks)} asyncio task(s) pending ---", file=out)
    for task in tasks:
        task.print_stack(limit=12, file=out)
