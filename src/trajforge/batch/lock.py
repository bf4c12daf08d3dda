"""One run per run directory: an exclusive ``flock`` held for the whole run."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trajforge.batch.errors import RunError
from trajforge.batch.writer import writing

LOCK_FILE = ".lock"


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the run directory for the whole run (released by the kernel
    even on ``kill -9``); the lock file names the holder's pid for the next one's message."""
    with writing(run_dir / LOCK_FILE):
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _take(fd, run_dir)
        with writing(run_dir / LOCK_FILE):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _take(fd: int, run_dir: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        raise RunError(
            f"another trajforge batch (pid {holder}) is running on {run_dir}; wait for it or "
            "stop it before starting another"
        ) from None
