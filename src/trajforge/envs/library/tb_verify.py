"""``terminal_bench``'s verifier wrapper: runs a task's ``tests/test.sh`` and reports what it
found, signed (copied into the sandbox and run there, standard library only).

A Harbor test.sh runs programs the model wrote and then writes ``/logs/verifier/reward.txt``;
those programs run with the test's own uid and are its descendants, so no uid, Landlock domain
or mount tells them from test.sh. What does tell them apart is exec, and this wrapper builds the
verdict on it:

- the verdict files are anonymous memory files (``memfd_create``) that this wrapper holds: no path
  reaches them. ``reward.txt`` and ``reward.json`` in the fresh verifier directory are links to
  ``/proc/self/fd/N``, and test.sh's bash gets the files as those descriptors;
- the guard (``tb_guard.c``, preloaded into that bash only) makes them close-on-exec and bash
  non-dumpable before test.sh starts: ``echo 1 > /logs/verifier/reward.txt`` in test.sh (or in a
  subshell of it, or ``python3 score.py > ...``, whose redirection test.sh's shell opens) reaches
  the file, while a program test.sh execs finds no descriptor N, cannot open bash's through
  ``/proc``, cannot ptrace it. Removing or replacing the links, making them read-only or putting a
  directory there only keeps test.sh's own write from arriving (a verdict missing: 0);
- the verdict is read from the wrapper's own descriptors, never from the path, and only when
  test.sh finished normally: killed by a signal, stopped, timed out, or with a process it started
  still alive when it exited (every descendant is then killed: we are a child subreaper, and
  non-dumpable, :mod:`trusted_proc`), the report says so and the host scores 0.

What this does not cover: a program whose output test.sh redirects into the verdict holds that
file while it runs; another process the tests started before could take the descriptor from it
(it is an ordinary program) and write, and must then be gone before test.sh exits, or it is a
survivor and the reward 0. docs/security.md has the table of what each verifier trusts.

Usage: ``python3 -I -S tb_verify.py NONCE_FILE VERIFIER_DIR TIMEOUT_S TEST_SH`` (the guard,
``tb_guard.so``, beside it); prints
``TRAJFORGE-TB-VERDICT <hmac> <json>`` with guard ("ok" or why not), exit_code, signal, stopped,
timed_out, survivors, others (processes of the same uid outside the wrapper's tree: the
rollout's, if the env kept them), the verdict files' text (null: never written) and whether
their links were still in place.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import sys
import time

if __package__:  # imported as part of trajforge (its tests, the type checker)
    from trajforge.envs.library import trusted_proc
else:  # the copy in the sandbox: the verifier puts trusted_proc.py beside it
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import trusted_proc  # type: ignore[no-redef]

MARKER = "TRAJFORGE-TB-VERDICT"
REWARD_FILES = ("reward.txt", "reward.json")
MAX_REWARD_BYTES = 64 * 1024
# Where test.sh's bash holds the verdict files (close-on-exec there: see tb_guard.c), and the
# descriptor its guard says "ok" on. High numbers: a test.sh's own ``exec 3>&1`` keeps working.
VERDICT_FDS = {"reward.txt": 100, "reward.json": 101}
READY_FD = 102
GUARD_VAR = "TF_VERDICT_GUARD"
GUARD_NAME = "tb_guard.so"
_GUARD_WAIT_S = 30.0  # how long the guard may take to say it took (the loader, on a loaded machine)


def _ancestors() -> set[int]:
    out, pid = set(), os.getpid()
    while pid > 1:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                pid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return out


def others() -> int:
    """Live processes of our uid that are neither us, our ancestors nor our descendants."""
    mine, uid = _ancestors(), os.getuid()
    count = 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in mine or int(name) == 1:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid == uid and trusted_proc._state(int(name)) not in (
                "Z",
                "X",
                "?",
            ):
                count += 1
        except OSError:
            continue
    return count


def verdict_files(directory: str) -> dict[str, int]:
    """The verdict files: anonymous, held only by us (close-on-exec here), with the links test.sh
    writes through in ``directory``."""
    fds = {}
    for name, slot in VERDICT_FDS.items():
        fds[name] = os.memfd_create(name, os.MFD_CLOEXEC)
        os.symlink(f"/proc/self/fd/{slot}", os.path.join(directory, name))
    return fds


def read_verdict(fd: int) -> str | None:
    """What test.sh wrote into a verdict file, from our own descriptor (None: nothing)."""
    if os.fstat(fd).st_size == 0:
        return None
    return os.pread(fd, MAX_REWARD_BYTES, 0).decode(errors="replace")


def link_intact(directory: str, name: str) -> bool:
    try:
        return os.readlink(os.path.join(directory, name)) == f"/proc/self/fd/{VERDICT_FDS[name]}"
    except OSError:
        return False


def start_tests(test_sh: str, files: dict[str, int], guard: str) -> tuple[int, int]:
    """Fork and exec ``bash TEST_SH`` with the verdict files at their slots and the guard
    preloaded: (its pid, the read end of the guard's ready pipe)."""
    ready_r, ready_w = os.pipe()
    env = dict(os.environ)
    env["LD_PRELOAD"] = guard
    env[GUARD_VAR] = " ".join(str(n) for n in (*VERDICT_FDS.values(), READY_FD))
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child execs or exits)
        try:
            for number in (signal.SIGPIPE, signal.SIGXFSZ):  # ignored by python, not by tests
                signal.signal(number, signal.SIG_DFL)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            for name, slot in VERDICT_FDS.items():
                os.dup2(files[name], slot)
            os.dup2(ready_w, READY_FD)
            keep = {0, 1, 2, READY_FD, *VERDICT_FDS.values()}
            for fd in [int(n) for n in os.listdir("/proc/self/fd")]:
                if fd not in keep:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            os.execvpe("bash", ["bash", test_sh], env)
        finally:
            os._exit(127)
    os.close(ready_w)
    return pid, ready_r


def await_guard(pid: int, ready: int) -> str:
    """``ok`` once test.sh's guard said it took; otherwise why not (bash is then killed)."""
    got, deadline = b"", time.monotonic() + _GUARD_WAIT_S
    try:
        while b"\n" not in got:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([ready], [], [], left)[0]:
                why = "it did not answer"
                break
            chunk = os.read(ready, 64)
            if not chunk:
                why = "it did not load or failed (bash gave no sign)"
                break
            got += chunk
        else:
            if got.strip() == b"ok":
                return "ok"
            why = f"it answered {got[:40]!r}"
    finally:
        os.close(ready)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    return f"the verdict guard did not take in test.sh's shell: {why}"


def _wait(pid: int, deadline: float) -> tuple[int | None, int | None, int | None, bool]:
    """Wait for test.sh: (exit code, signal that ended it, signal that stopped it, timed out),
    reaping meanwhile every orphan its processes leave to us (we are their subreaper): a zombie
    still answers ``kill -0``, so a test that stops a daemon and waits for it to be gone would
    otherwise wait forever. A stopped (or stopped and continued) test.sh is killed: nothing the
    tests legitimately do stops it, and a process that can stop it can race its verdict."""
    flags = os.WNOHANG | os.WUNTRACED | os.WCONTINUED
    while True:
        try:
            got, status = os.waitpid(-1, flags)
        except ChildProcessError:  # cannot happen while test.sh is ours; be safe anyway
            got, status = 0, 0
        if got == pid:
            if os.WIFEXITED(status):
                return os.WEXITSTATUS(status), None, None, False
            if os.WIFSIGNALED(status):
                return None, os.WTERMSIG(status), None, False
            stopped = os.WSTOPSIG(status) if os.WIFSTOPPED(status) else signal.SIGCONT
            _kill_and_reap(pid)
            return None, None, stopped, False
        if got:
            continue
        if time.monotonic() > deadline:
            _kill_and_reap(pid)
            return None, None, None, True
        time.sleep(0.02)


def _kill_and_reap(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    while True:
        try:
            if os.waitpid(pid, 0)[0] == pid:
                return
        except ChildProcessError:
            return


def main(argv: list[str]) -> int:
    nonce_file, verifier_dir, timeout_s, test_sh = argv
    guard = os.path.join(os.path.dirname(os.path.abspath(__file__)), GUARD_NAME)
    trusted_proc.harden()
    nonce = trusted_proc.take_nonce(nonce_file)
    before = others()
    shutil.rmtree(verifier_dir, ignore_errors=True)
    if os.path.lexists(verifier_dir):
        os.unlink(verifier_dir)
    os.makedirs(verifier_dir)
    files = verdict_files(verifier_dir)
    pid, ready = start_tests(test_sh, files, guard)
    guarded = await_guard(pid, ready)
    if guarded == "ok":
        code, killed_by, stopped, timed_out = _wait(pid, time.monotonic() + float(timeout_s))
    else:
        _kill_and_reap(pid)
        code, killed_by, stopped, timed_out = None, None, None, False
    trusted_proc.reap()
    survivors = len(trusted_proc.children())
    killed = trusted_proc.kill_descendants()
    verdict = {
        "guard": guarded,
        "exit_code": code,
        "signal": killed_by,
        "stopped": stopped,
        "timed_out": timed_out,
        "survivors": killed if timed_out or stopped else max(survivors, 0),
        "others": others(),
        "others_before": before,
        "files": {name: read_verdict(fd) for name, fd in files.items()},
        "links": {name: link_intact(verifier_dir, name) for name in files},
    }
    payload = json.dumps(verdict)
    line = memoryview(f"\n{MARKER} {trusted_proc.sign(nonce, payload)} {payload}\n".encode())
    while line:
        line = line[os.write(1, line) :]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
