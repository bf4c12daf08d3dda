"""What a verifier program that runs *inside* the sandbox, beside the code it judges, does to keep
that code out of its result (used by :mod:`swe_runner` and :mod:`tb_verify`).

These programs are copied into the finished rollout's sandbox and run with the sandbox's system
``python3 -I -S`` (standard library only, Python 3.8+), after every process the rollout left has
been killed, so nothing of the model's is running when they start. They then:

- **make themselves non-dumpable** (``prctl(PR_SET_DUMPABLE, 0)``): the code under test runs as
  the same uid, and without Yama any same-uid process may ``ptrace`` another or read its
  ``/proc/PID/mem``, unless that process is non-dumpable (then only CAP_SYS_PTRACE may, which
  nothing in the sandbox has);
- **become a child subreaper** (``PR_SET_CHILD_SUBREAPER``): every process the code under test
  starts, even one that double-forks and calls ``setsid``, stays a descendant, so
  :func:`kill_descendants` finds and kills them all before a result is written;
- **take the nonce** from a file they delete at once: it exists only in their own memory;
- **sign their result** with it (:func:`sign`: HMAC-SHA256 over the result's bytes). The nonce
  itself is never printed, so a process that reads the output file afterwards learns only the
  MAC of the genuine result and cannot make one for another.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import hmac
import os
import signal

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


def harden() -> None:
    """Non-dumpable and a child subreaper, or OSError (the caller then gives no result at all)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for option, value in ((PR_SET_DUMPABLE, 0), (PR_SET_CHILD_SUBREAPER, 1)):
        if libc.prctl(option, value, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl({option}, {value}) failed: {os.strerror(err)}")


def take_nonce(path: str) -> bytes:
    """The nonce in ``path``, which is deleted before anything else runs."""
    with open(path, "rb") as fh:
        nonce = fh.read().strip()
    os.unlink(path)
    if len(nonce) < 32:
        raise ValueError("the nonce file holds fewer than 32 bytes")
    return nonce


def sign(nonce: bytes, payload: str) -> str:
    return hmac.new(nonce, payload.encode(), hashlib.sha256).hexdigest()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return "?"


def children() -> list[int]:
    """Our live (not zombie) child processes."""
    pids: set[int] = set()
    me = os.getpid()
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as fh:
                pids.update(int(x) for x in fh.read().split())
    except OSError:  # no CONFIG_PROC_CHILDREN: look at every process's parent
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat", "rb") as fh:
                        ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid == me:
                    pids.add(int(name))
    return sorted(p for p in pids if _state(p) not in ("Z", "X"))


def reap() -> None:
    """Collect every child that has already exited (zombies write nothing)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_descendants() -> int:
    """SIGKILL every descendant until none is left; how many processes were killed. Orphans of
    the killed are re-parented to us (we are a subreaper), so the loop sees them next round."""
    killed = 0
    while True:
        reap()
        kids = children()
        if not kids:
            return killed
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        for pid in kids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
