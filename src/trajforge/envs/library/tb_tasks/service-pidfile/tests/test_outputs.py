import os
import signal
import subprocess
import sys
import time


def workers():
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if any(c.endswith(b"worker.py") for c in cmd) and int(pid) != os.getpid():
            try:
                state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                out.append(int(pid))
    return out


if sys.argv[1:] == ["--kill-all"]:
    for pid in workers():
        os.kill(pid, signal.SIGKILL)
    sys.exit(0)


def svc(*args):
    p = subprocess.run(
        ["bash", "/app/svc.sh", *args], capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL
    )
    return p.returncode, p.stdout.strip()


def until(check, what):
    deadline = time.time() + 10
    while not check():
        assert time.time() < deadline, what
        time.sleep(0.05)


assert svc("status") == (3, "stopped")
assert svc("start")[0] == 0
until(lambda: len(workers()) == 1, "one worker after start")
pid = int(open("/app/run/worker.pid").read().strip())
assert workers() == [pid], (workers(), pid)
until(lambda: os.path.exists("/app/run/heartbeat"), "heartbeat")
assert svc("status") == (0, f"running {pid}")
assert svc("start")[0] == 0
time.sleep(0.3)
assert workers() == [pid], workers()
assert svc("stop")[0] == 0
assert workers() == [], workers()
assert not os.path.exists("/app/run/worker.pid")
assert svc("status") == (3, "stopped")
assert svc("stop")[0] == 0
with open("/app/run/worker.pid", "w") as fh:
    fh.write("999999\n")
assert svc("status") == (3, "stopped")
assert svc("start")[0] == 0
until(lambda: len(workers()) == 1, "one worker after a stale pidfile")
assert svc("status")[0] == 0
assert svc("stop")[0] == 0
assert workers() == []
