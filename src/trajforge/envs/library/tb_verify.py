"""``terminal_bench``'s verifier wrapper: runs a task's ``tests/test.sh`` and reports what it
found, signed (copied into the sandbox and run there, standard library only).

A Harbor test.sh runs programs the model wrote and then writes ``/logs/verifier/reward.txt``;
those programs run with the test's own rights, so any of them can write the reward file too (no
uid or Landlock domain can tell them from test.sh: both are inherited by everything test.sh
starts). What this wrapper makes sure of, as far as the kernel allows:

- the reward directory is made fresh right before test.sh starts (nothing planted survives);
- it is non-dumpable and a child subreaper (:mod:`trusted_proc`): every process test.sh starts
  stays its descendant, however it daemonizes, and none can read or trace it;
- when test.sh exits, every descendant still alive is counted and killed, and the host then
  scores 0 (it could have rewritten the reward after test.sh wrote it);
- it reads the reward files itself, after that kill, and signs what it read: nothing of the
  model's is left running to change them before the host sees them.

Usage: ``python3 -I -S tb_verify.py NONCE_FILE VERIFIER_DIR TIMEOUT_S TEST_SH``; prints
``TRAJFORGE-TB-VERDICT <hmac> <json>`` with exit_code, timed_out, survivors, others (processes
of the same uid outside the wrapper's tree: the rollout's, if the env kept them) and the reward
files' text.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
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


def read_reward(directory: str, name: str) -> str | None:
    path = os.path.join(directory, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not os.path.isfile(f"/proc/self/fd/{fd}"):
            return "<not a regular file>"
        return os.read(fd, MAX_REWARD_BYTES).decode(errors="replace")
    finally:
        os.close(fd)


def _wait(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Wait for test.sh (True: it timed out and was killed), reaping meanwhile every orphan its
    processes leave to us (we are their subreaper): a zombie still answers ``kill -0``, so a
    test that stops a daemon and waits for it to be gone would otherwise wait forever."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # cannot happen while test.sh is ours; be safe anyway
            pid, status = 0, 0
        if pid == proc.pid:
            proc.returncode = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
            return False
        if pid:
            continue
        if time.monotonic() > deadline:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.02)


def main(argv: list[str]) -> int:
    nonce_file, verifier_dir, timeout_s, test_sh = argv
    trusted_proc.harden()
    nonce = trusted_proc.take_nonce(nonce_file)
    before = others()
    shutil.rmtree(verifier_dir, ignore_errors=True)
    if os.path.lexists(verifier_dir):
        os.unlink(verifier_dir)
    os.makedirs(verifier_dir)
    proc = subprocess.Popen(["bash", test_sh], stdin=subprocess.DEVNULL)
    timed_out = _wait(proc, time.monotonic() + float(timeout_s))
    trusted_proc.reap()
    survivors = len(trusted_proc.children())
    killed = trusted_proc.kill_descendants()
    verdict = {
        "exit_code": None if timed_out else proc.returncode,
        "timed_out": timed_out,
        "survivors": max(survivors, 0) if not timed_out else killed,
        "others": others(),
        "others_before": before,
        "files": {name: read_reward(verifier_dir, name) for name in REWARD_FILES},
    }
    payload = json.dumps(verdict)
    line = memoryview(f"\n{MARKER} {trusted_proc.sign(nonce, payload)} {payload}\n".encode())
    while line:
        line = line[os.write(1, line) :]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
