"""The fidelity suite: what a real task runs, run in the bwrap sandbox and in the docker backend
(the reference for "a Linux box": a Debian container of the same release as this host, tests/
docker_engine.py), and compared call by call: exit codes and output equal, or the difference
written down here with its reason (``Workload.differs``).

Why: a model trained on rollouts from a sandbox that lacks what a box has (a writable /dev/shm,
a user name, ``/sys``) learns that multiprocessing, pytest-xdist or ``whoami`` are broken, and
one that sees the harness (its paths, its variables) learns a shell that does not exist. The
workloads are what SWE and Terminal-Bench tasks run: process pools, pytest with ``-n 2``,
``make -j2``, sqlite, git with hooks, a virtualenv and a pip install, a server on localhost and
curl, job control across calls, ``timeout``, ``flock``, FIFOs, a pty (``script``), ``tmux``,
``ps``/``top``, the identity and limits of the box, unicode file names, a sparse file, ...

Used by tests/test_fidelity.py (run in both backends, compare, and check that
docs/fidelity.md is this module's table) and benchmarks/harness_leaks.py (the workloads'
commands through ``trajforge batch``). Stdlib and trajforge only.

    python tests/fidelity.py table         # docs/fidelity.md, as the test expects it
    python tests/fidelity.py run [NAME..]  # run (bwrap, and docker where the tests' engine runs)
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[1] / "docs" / "fidelity.md"
# trajforge as root (the tests' usual case, and the docker backend's only one): each sandbox has a
# uid of its own and one capped tmpfs. Unprivileged, bwrap runs the commands as the invoking user in
# a user namespace, on the host's file system: three workloads then expect what that mode gives.
AS_ROOT = os.geteuid() == 0


@dataclass(frozen=True)
class Workload:
    """One task-like job: its commands, each one tool call in one session (state carries over)."""

    name: str
    what: str  # one line for the table
    calls: tuple[str, ...]
    expect: str  # a regular expression the calls' joined output must match, in every backend
    differs: str = ""  # why bwrap and docker answer differently; "" when they must not
    shows: tuple[str, str] = ("", "")  # where they differ: what bwrap and docker answer, in short
    timeout: float = 60.0


def _py(code: str) -> str:
    """``python3 - <<EOF`` with ``code``: a script of several lines as one command."""
    return "python3 - <<'PY'\n" + code.strip("\n") + "\nPY"


_PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"
[project]
name = "tfpkg"
version = "1.0"
"""

WORKLOADS: tuple[Workload, ...] = (
    # -- processes in parallel: what needs /dev/shm (POSIX semaphores, shared memory) -------------
    Workload(
        "multiprocessing-pool",
        "the issue's line: `multiprocessing.Pool(2).map`",
        ('python3 -c "import multiprocessing as m; print(m.Pool(2).map(abs, [-1, -2]))"',),
        r"^\[1, 2\]\n$",
    ),
    Workload(
        "multiprocessing-primitives",
        "Process, Queue, Lock, Event, Value, Manager across processes",
        (
            _py("""
import multiprocessing as mp
def work(q, lock, ev, v):
    with lock:
        v.value += 1
    ev.wait(5)
    q.put(v.value)
if __name__ == "__main__":
    q, lock, ev, v = mp.Queue(), mp.Lock(), mp.Event(), mp.Value("i", 0)
    ps = [mp.Process(target=work, args=(q, lock, ev, v)) for _ in range(3)]
    [p.start() for p in ps]
    ev.set()
    print(sorted(q.get(timeout=10) for _ in ps)[-1], [p.join() or p.exitcode for p in ps])
    with mp.Manager() as m:
        d = m.dict(a=1)
        print(dict(d))
"""),
        ),
        r"^3 \[0, 0, 0\]\n\{'a': 1\}\n$",
    ),
    Workload(
        "futures-process-pool",
        "`concurrent.futures.ProcessPoolExecutor`",
        (
            'python3 -c "from concurrent.futures import ProcessPoolExecutor as P; '
            'print(list(P(2).map(pow, [2, 3], [5, 2])))"',
        ),
        r"^\[32, 9\]\n$",
    ),
    Workload(
        "futures-thread-pool",
        "`concurrent.futures.ThreadPoolExecutor`",
        (
            "python3 -c \"from concurrent.futures import ThreadPoolExecutor as T; print(sum(T(4).map(len, ['ab'] * 8)))\"",
        ),
        r"^16\n$",
    ),
    Workload(
        "posix-shared-memory",
        "`multiprocessing.shared_memory` written by one process, read by another",
        (
            _py("""
from multiprocessing import Process, shared_memory
def child(name):
    s = shared_memory.SharedMemory(name)
    s.buf[:5] = b"hello"
    s.close()
if __name__ == "__main__":
    s = shared_memory.SharedMemory(create=True, size=16)
    p = Process(target=child, args=(s.name,)); p.start(); p.join()
    print(bytes(s.buf[:5]).decode())
    s.close(); s.unlink()
"""),
        ),
        r"^hello\n$",
    ),
    Workload(
        "dev-shm",
        "`/dev/shm`: a writable tmpfs, 1777 (as root; unprivileged, a 1777 directory of the host's)",
        (
            "stat -c '%a %U' /dev/shm; findmnt -no FSTYPE /dev/shm; echo x > /dev/shm/f && cat /dev/shm/f && rm /dev/shm/f",
        ),
        r"^1777 root\ntmpfs\nx\n$" if AS_ROOT else r"^1777 \S+\n\S+\nx\n$",
    ),
    Workload(
        "sysv-ipc",
        "System V shared memory and semaphores (`ipcmk`, `ipcs`)",
        (
            "ipcmk -M 4096 >/dev/null && ipcmk -S 2 >/dev/null && ipcs -m | grep -c '^0x'; ipcs -s | grep -c '^0x'",
        ),
        r"^1\n1\n$",
    ),
    # -- test runners and builds --------------------------------------------------------------------
    Workload(
        "pytest-xdist",
        "pytest with `-n 2` (pytest-xdist) on four tests",
        (
            "mkdir -p t && for i in 1 2 3 4; do printf 'def test_%s():\\n    assert %s\\n' $i $i > t/test_$i.py; done",
            "python3 -m pytest -q -n 2 -p no:cacheprovider t 2>&1 | tail -1 | sed 's/ in [0-9.]*s.*//'",
        ),
        r"4 passed\n$",
    ),
    Workload(
        "pytest-failure",
        "pytest reporting a failing assertion",
        (
            "printf 'def test_x():\\n    x = 2\\n    assert x == 3\\n' > test_f.py",
            "python3 -m pytest -q -p no:cacheprovider test_f.py 2>&1 | grep -E '^(E |FAILED)'; echo ${PIPESTATUS[0]}",
        ),
        r"E       assert 2 == 3\nFAILED test_f.py::test_x - assert 2 == 3\n1\n$",
    ),
    Workload(
        "make-parallel",
        "`make -j2` over four targets",
        (
            "printf 'all: a b c d\\n%%:\\n\\tsleep 0.2; echo $@ > $@\\n' > Makefile && make -s -j2 && cat a b c d",
        ),
        r"^a\nb\nc\nd\n$",
    ),
    # -- data and version control -------------------------------------------------------------------
    Workload(
        "sqlite3-cli",
        "the `sqlite3` shell on a database file",
        ("sqlite3 db.sqlite 'create table t(x); insert into t values (1), (2); select sum(x) from t;'",),
        r"^3\n$",
    ),
    Workload(
        "sqlite-wal",
        "Python's sqlite3 in WAL mode with two connections (shared memory of the -shm file)",
        (
            _py("""
import sqlite3
a = sqlite3.connect("w.db"); print(a.execute("pragma journal_mode=wal").fetchone()[0])
a.execute("create table t(x)"); a.execute("insert into t values (1)"); a.commit()
b = sqlite3.connect("w.db"); print(b.execute("select count(*) from t").fetchone()[0])
"""),
        ),
        r"^wal\n1\n$",
    ),
    Workload(
        "git-hooks",
        "a git repository with a pre-commit hook",
        (
            "git init -q repo && cd repo && git config user.email t@example.com && git config user.name t",
            "printf '#!/bin/sh\\necho hook ran\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit",
            "echo x > f && git add f && git commit -q -m first && git log --format=%s && git status --short | wc -l",
        ),
        r"hook ran\nfirst\n0\n$",
    ),
    Workload(
        "venv-pip-wheel",
        "a wheel built here, a virtualenv, `pip install` of it (offline), activated across calls",
        (
            "mkdir -p pkg/tfpkg && echo 'VALUE = 42' > pkg/tfpkg/__init__.py && cat > pkg/pyproject.toml <<'EOF'\n"
            + _PYPROJECT
            + "EOF",
            "cd pkg && python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w ../dist . 2>&1 | grep -v -i warn; ls ../dist",
            "cd .. && python3 -m venv v && v/bin/pip install -q --no-index --disable-pip-version-check dist/*.whl && echo installed",
            "source v/bin/activate",
            "python -c \"import tfpkg, sys; print(tfpkg.VALUE, sys.prefix.endswith('/v'))\"; deactivate; command -v python || echo gone",
        ),
        r"tfpkg-1\.0-py3-none-any\.whl\ninstalled\n42 True\ngone\n$",
        timeout=180,
    ),
    # -- servers, jobs, signals ---------------------------------------------------------------------
    Workload(
        "server-and-curl",
        "an HTTP server on localhost in the background, `curl` to it, then stopped",
        (
            "echo hello > index.txt; python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 &",
            "for i in $(seq 50); do curl -s http://127.0.0.1:8765/index.txt && break; sleep 0.1; done",
            "kill %1; wait %1; echo $?",
        ),
        r"^hello\n143\n$",
    ),
    Workload(
        "job-control-across-calls",
        "`sleep 100 &`, then `jobs`, then `kill %1; wait %1` in later calls",
        ("sleep 100 &", "jobs", "kill %1; wait %1; echo status $?", "jobs; echo none left"),
        r"^\[1\]\+  Running +sleep 100 &\nstatus 143\nnone left\n$",
    ),
    Workload(
        "background-result",
        "a background job's exit status collected by `wait` in a later call",
        ("(sleep 0.3; exit 3) &", "wait %1; echo $?"),
        r"^3\n$",
    ),
    Workload(
        "timeout",
        "`timeout` ending a command, with TERM and with KILL",
        ("timeout 0.5 sleep 5; echo $?; bash -c 'timeout -s KILL 0.5 sleep 5; echo $?' 2>/dev/null",),
        r"^124\n137\n$",
    ),
    Workload(
        "signals-and-traps",
        "a trap on USR1 caught, a child killed by TERM",
        ("trap 'echo caught' USR1; kill -USR1 $$; trap - USR1; sleep 5 & kill $!; wait $!; echo $?",),
        r"^caught\n143\n$",
    ),
    Workload(
        "flock",
        "`flock`: a held lock refuses a second holder",
        (
            "flock -n /tmp/lk -c 'flock -n /tmp/lk -c \"echo inner\" || echo busy'; flock /tmp/lk -c 'echo got it'",
        ),
        r"^busy\ngot it\n$",
    ),
    Workload(
        "mkfifo",
        "a named pipe between a background writer and a reader",
        ("mkfifo p && (echo through > p &) && cat p",),
        r"^through\n$",
    ),
    Workload(
        "script-pty",
        "`script` (bsdutils) giving a command a terminal",
        ("script -qec 'tty >/dev/null && echo has a tty; stty size' /dev/null | tr -d '\\r'",),
        r"^has a tty\n\d+ \d+\n$",
    ),
    Workload(
        "tmux",
        "a detached `tmux` session driven by `send-keys` and read by `capture-pane`",
        (
            "tmux new-session -d -s w -x 80 -y 24 && tmux send-keys -t w 'echo from-tmux' Enter && sleep 1 "
            "&& tmux capture-pane -p -t w | grep -c '^from-tmux'",
            "tmux ls -F '#{session_name}'; tmux kill-server; echo stopped",
        ),
        r"^1\nw\nstopped\n$",
    ),
    Workload(
        "stdin",
        "a command reading stdin gets end-of-file at once",
        ('cat; read -r x; echo "read $?"',),
        r"^read 1\n$",
    ),
    # -- the shell's session across calls -------------------------------------------------------------
    Workload(
        "session-across-calls",
        "cwd, exported and plain variables, functions, aliases kept from call to call",
        (
            "mkdir -p a/b && cd a/b && export FOO=bar && PLAIN=p && greet() { echo hi $1; } && alias say='echo said'",
            'pwd; echo "$FOO $PLAIN"; greet you; say it; env | grep -c ^PLAIN=',
        ),
        r"^/workspace/a/b\nbar p\nhi you\nsaid it\n0\n$",
    ),
    Workload(
        "exit-status",
        "`$?` of the last call seen by the next, as in a terminal",
        ("false", "echo $?"),
        r"^1\n$",
    ),
    # -- what the box is ------------------------------------------------------------------------------
    Workload(
        "ps",
        "`ps` listing the command's own processes",
        (
            'sleep 30 & for i in $(seq 100); do [ "$(ps -o comm= -p $!)" = sleep ] && break; sleep 0.05; done; '
            "ps -o comm= -p $!; ps -e -o args= | grep -c '^sleep 30$'; kill $!",
        ),
        r"^sleep\n1\n$",
    ),
    Workload("top", "`top -bn1`", ("top -bn1 | head -1 | cut -d' ' -f1",), r"^top\n$"),
    Workload(
        "nproc",
        "`nproc`, `os.cpu_count()`, the CPUs the command may use",
        ('nproc; python3 -c "import os; print(os.cpu_count() == len(os.sched_getaffinity(0)))"',),
        r"^\d+\nTrue\n$",
    ),
    Workload(
        "proc-cpuinfo",
        "`/proc/cpuinfo` and `/proc/meminfo`",
        (
            "[ $(grep -c ^processor /proc/cpuinfo) -ge 1 ] && grep -c '^MemTotal:' /proc/meminfo && free -m | head -1 | tr -s ' '",
        ),
        r"^1\n total used free shared buff/cache available\n$",
    ),
    Workload(
        "ulimit",
        "`ulimit -a`: the sandbox's file size and CPU time; the rest as the engine's and the host's",
        ("ulimit -a",),
        r"file size +\(blocks, -f\) 1048576\n(.|\n)*cpu time +\(seconds, -t\) 600\n",
    ),
    Workload(
        "locale",
        "`locale`: C.UTF-8 everywhere",
        ("locale | sort; locale -a | grep -i -c '^c.utf-*8$'",),
        r"^LANG=C\.UTF-8\n(.|\n)*\nLC_ALL=C\.UTF-8\n(.|\n)*\n1\n$",
    ),
    Workload(
        "date",
        "`date` in UTC and in another zone",
        ("date -u -d @0 '+%F %T %Z'; TZ=UTC0 date -d @86400 '+%F %T'",),
        r"^1970-01-01 00:00:00 UTC\n1970-01-02 00:00:00\n$",
    ),
    Workload(
        "unicode-file-names",
        "file names in UTF-8",
        (
            "touch 'héllo wörld ✓.txt' 日本語.md && ls | sort && "
            "python3 -c \"import os; print(sorted(n for n in os.listdir('.')))\"",
        ),
        r"^héllo wörld ✓\.txt\n日本語\.md\n\['héllo wörld ✓\.txt', '日本語\.md'\]\n$",
    ),
    Workload(
        "sparse-file",
        "a 1 GB sparse file: its size, its blocks, one MiB written in the middle",
        (
            "truncate -s 1G sparse.img && stat -c %s sparse.img && du -k sparse.img | cut -f1 && "
            "dd if=/dev/zero of=sparse.img bs=1M count=1 seek=512 conv=notrunc status=none && du -k sparse.img | cut -f1",
        ),
        r"^1073741824\n0\n1024\n$",
    ),
    Workload(
        "disk",
        "the file systems of the workdir, `/tmp` and `/dev/shm`: one capped tmpfs (as root)",
        (
            "findmnt -no FSTYPE /workspace; findmnt -no FSTYPE /tmp; df -k --output=size /workspace /tmp /dev/shm | tail -n +2 | sort -u | wc -l",
        ),
        r"^tmpfs\ntmpfs\n1\n$" if AS_ROOT else r"^\S+\n\S+\n\d\n$",
    ),
    Workload(
        "tar-gzip-find",
        "`tar`, `gzip`, `find | xargs`",
        (
            "mkdir -p d/e && echo a > d/a && echo b > d/e/b && tar czf d.tgz d && tar tzf d.tgz | sort && "
            "find d -type f | sort | xargs cat",
        ),
        r"^d/\nd/a\nd/e/\nd/e/b\na\nb\n$",
    ),
    Workload(
        "pipelines",
        "pipes, redirections, here-documents, process substitution",
        (
            "seq 200000 | sort -rn | head -2; cat <<EOF | tr a-z A-Z\nhere\nEOF\ndiff <(echo a) <(echo a) && echo same",
        ),
        r"^200000\n199999\nHERE\nsame\n$",
    ),
    Workload(
        "python-subprocess",
        "Python starting processes (`subprocess`, `os.fork`)",
        (
            "python3 -c \"import subprocess, os; print(subprocess.run(['sh', '-c', 'echo \\$0'], "
            "capture_output=True, text=True).stdout.strip()); pid = os.fork(); os._exit(7) if pid == 0 else "
            'print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))"',
        ),
        r"^sh\n7\n$",
    ),
    Workload(
        "memory",
        "a 300 MB allocation",
        ('python3 -c "b = bytearray(300 * 1024 * 1024); print(len(b) >> 20)"',),
        r"^300\n$",
    ),
    Workload(
        "umask-and-modes",
        "the umask and the modes of new files",
        ("umask; touch f; mkdir dd; stat -c '%a %n' f dd",),
        r"^0022\n644 f\n755 dd\n$",
    ),
    Workload(
        "devices",
        "`/dev`: null, zero, urandom, full, tty, ptmx",
        (
            "head -c 16 /dev/urandom | wc -c; head -c 2 /dev/zero | od -An -tx1; echo x > /dev/full; ls -d /dev/null /dev/tty /dev/ptmx /dev/pts",
        ),
        r"^16\n 00 00\n.*No space left on device\n/dev/null\n/dev/ptmx\n/dev/pts\n/dev/tty\n$",
    ),
    Workload(
        "loopback",
        "a TCP server and client on 127.0.0.1, and `localhost` resolved",
        (
            _py("""
import socket, threading
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
def serve():
    c, _ = s.accept(); c.sendall(c.recv(4).upper()); c.close()
threading.Thread(target=serve).start()
c = socket.create_connection(s.getsockname()); c.sendall(b"ping"); print(c.recv(4).decode())
print(socket.gethostbyname("localhost"))
"""),
        ),
        r"^PING\n127\.0\.0\.1\n$",
    ),
    Workload(
        "hostname",
        "the host name, `/etc/hostname` and `/etc/hosts` agreeing",
        ("hostname; cat /etc/hostname; getent hosts \"$(hostname)\" | awk '{print $2}'",),
        r"^sandbox\nsandbox\n(sandbox\n)?$",
        shows=("`sandbox` three times", "`sandbox` twice: `getent hosts` finds nothing"),
        differs=(
            "a container without a network has no line for its own name in `/etc/hosts` (the engine "
            "writes it with the container's address); the sandbox's has `127.0.1.1 sandbox`, as "
            "Debian's installer writes it"
        ),
    ),
    Workload(
        "os-and-python",
        "the distribution, the kernel, Python's version",
        (
            '. /etc/os-release && echo "$ID $VERSION_CODENAME" && uname -s && python3 -c "import sys; print(sys.version_info[:2])"',
        ),
        r"^debian \w+\nLinux\n\(3, \d+\)\n$",
    ),
    Workload(
        "home-and-environment",
        "`$HOME`, `$PWD`, `$SHELL`, `$TMPDIR`, `~`",
        ('echo "$HOME $PWD $SHELL $TMPDIR" ~; cd ~ && pwd',),
        r"^/workspace /workspace /bin/bash /tmp /workspace\n/workspace\n$",
    ),
    # -- where the sandbox is not a box, on purpose -----------------------------------------------------
    Workload(
        "identity",
        "who the commands run as",
        (
            "whoami; id -u | sed 's/^[1-9][0-9]*$/non-root/'; python3 -c \"import getpass; print(getpass.getuser())\"",
        ),
        r"^(user|root)\n(non-root|0)\n(user|root)\n$" if AS_ROOT else r"^(\S+)\nnon-root\n\1\n$",
        shows=("`user`, a uid > 0", "`root`, uid 0"),
        differs=(
            "under bwrap commands run as an unprivileged uid of their own (a fresh one per sandbox when "
            "trajforge runs as root), named `user` in the sandbox's `/etc/passwd`: they cannot reach the "
            "agent or another sandbox; in docker they are root in the container (Harbor tasks expect it)"
        ),
    ),
    Workload(
        "environment",
        "the variables a command starts with",
        ("env | grep -v -E '^(_|SHLVL|OLDPWD|PWD)=' | sort",),
        r"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n",
        shows=("the sandbox's start environment", "the same and `HOSTNAME=sandbox`"),
        differs="the engine exports `HOSTNAME` into every container (bash sets it as a shell variable in both)",
    ),
    Workload(
        "root-only-writes",
        "writing where only root may (`/etc`), and `apt-get install`",
        ("touch /etc/tf-test 2>/dev/null; echo $?; apt-get install -y -q cowsay >/dev/null 2>&1; echo $?",),
        r"^[01]\n100\n$",
        shows=("`touch /etc/...` fails (1); apt-get 100", "`touch /etc/...` succeeds (0); apt-get 100"),
        differs=(
            "`/etc` and `/usr` are the host's, read-only, under bwrap, and commands are not root; a "
            "container's own `/etc` is root's to write. `apt-get install` fails in both, for want of root "
            "under bwrap and of a network in docker (exit 100 either way)"
        ),
    ),
    Workload(
        "file-system-root",
        "what `/` holds",
        ("ls /",),
        r"\btmp\n(.|\n)*\bworkspace\n",
        shows=("11 entries: `bin dev etc lib lib64 proc run sbin tmp usr workspace`", "the image's 20"),
        differs=(
            "bwrap shows the host's `/usr` and `/etc` and the sandbox's own directories only (no `/home`, "
            "`/root`, `/var`, `/opt`, `/srv`, `/mnt`, `/media`, `/boot`, `/sys`); a container has the "
            "image's whole tree"
        ),
    ),
    Workload(
        "sys",
        "`/sys` and `lscpu`, which reads it",
        ("ls /sys >/dev/null 2>&1; echo $?; lscpu >/dev/null 2>&1; echo $?",),
        r"^[02]\n[01]\n$",
        shows=("no `/sys` (2); `lscpu` fails (1)", "`/sys` (0); `lscpu` works (0)"),
        differs=(
            "bwrap mounts no `/sys`: the host's devices, its cgroup tree (every other sandbox's included) and "
            "firmware stay hidden. `nproc`, `os.cpu_count()`, `/proc/cpuinfo` and `free` answer without it; "
            "`lscpu` does not. Docker mounts a read-only `/sys` with some paths masked"
        ),
    ),
    Workload(
        "no-network",
        "the internet, unreachable",
        ("curl -sS -m 5 -o /dev/null http://example.com; echo $?",),
        r"\n(6|7)\n$",
    ),
)


def by_name() -> dict[str, Workload]:
    return {w.name: w for w in WORKLOADS}


# -- running ---------------------------------------------------------------------------------------


Answer = tuple[int | None, str]  # one call's exit code and output


async def run_workload(factory: Any, workload: Workload) -> list[Answer]:
    """The workload's calls in one sandbox of ``factory``, in order; closed after."""
    sandbox = await factory.create(f"fidelity-{workload.name}")
    try:
        answers: list[Answer] = []
        for command in workload.calls:
            result = await sandbox.exec(command, timeout=workload.timeout)
            answers.append((result.exit_code, result.output))
        return answers
    finally:
        await sandbox.close()


async def run_all(
    factory: Any, workloads: tuple[Workload, ...] = WORKLOADS, at_once: int = 4
) -> dict[str, list[Answer]]:
    """Every workload in ``factory``, ``at_once`` at a time (they are independent)."""
    gate = asyncio.Semaphore(at_once)

    async def one(workload: Workload) -> tuple[str, list[Answer]]:
        async with gate:
            return workload.name, await run_workload(factory, workload)

    return dict(await asyncio.gather(*(one(w) for w in workloads)))


def joined(answers: list[Answer]) -> str:
    return "".join(output for _, output in answers)


def problems(workload: Workload, answers: list[Answer]) -> list[str]:
    """What is wrong with one backend's answers: an unmet expectation (the workload did not do its
    job), a call that failed (other than the ones whose exit code is the point)."""
    found = []
    if not re.search(workload.expect, joined(answers)):
        found.append(f"output does not match {workload.expect!r}: {joined(answers)[-600:]!r}")
    for (code, output), command in zip(answers, workload.calls, strict=True):
        if code is None:
            found.append(f"timed out: {command[:80]!r}: {output[-300:]!r}")
    return found


# -- the table ---------------------------------------------------------------------------------------

_HEAD = """# Fidelity: the sandbox against a Linux box

Generated by `python tests/fidelity.py table` from `tests/fidelity.py`; `tests/test_fidelity.py`
checks that this file is that table, runs every workload in the bwrap sandbox and in the docker
backend (the reference for "a Linux box": a Debian container of this host's release, its tools
installed by `tests/docker_engine.py`, the same ones `make system-deps` installs here), and fails
when a workload does not do its job in either, or when their answers (exit code and output of each
call) differ where no reason is written below, or agree where one is.

A workload is one session: each command is one tool call, so state (cwd, variables, functions,
background jobs) carries from call to call as in a terminal. "does its job": its output matches
what the workload expects (`Workload.expect`, the same in both backends); "the same answers": exit
code and output of every call equal in docker. Last full run (2026-12-05, `pytest
tests/test_fidelity.py` with the docker engine, all passed): every workload does its job in both backends; 45 answer
alike, 6 differ, each for the reason written in its row.

| workload | what it runs | calls | bwrap | docker | why they differ |
|---|---|---|---|---|---|
"""

_TAIL = """
## What else differs, and why

Known, and not a workload's answer:

- **The shell is `bash` reading commands, not a terminal.** `$-` is `hBs` (no `i`, `m`), there is
  no prompt, history or job-control messages (`[1] 1234`), as with `bash -c`. A command runs as
  `bash -c` would run it: errors read `bash: line N: ...` with N its own line; `$0` is `bash`;
  `$BASH_SOURCE` and `$FUNCNAME` are empty; `$BASH_EXECUTION_STRING` is the command. Three
  differences from `bash -c` are bash's own: a syntax error names `eval` where `bash -c` says
  `-c` (`bash: eval: line 1: syntax error ...`); `set -x` traces with `++` (one level deeper, as
  a sourced file did before); `$?` at a command's start is the previous command's status (a
  terminal's, where `bash -c` starts at 0). `shopt expand_aliases` is on, so aliases work across
  calls. A function's `$BASH_SOURCE` is `main` (`bash -c`: `environment`).
- **`exit`, a `set -e` failure or a `set -u` error end the shell** as they end `bash -c`: the call
  reports the exit code and a note (apart from the output: `ExecResult.notes`; the model reads it
  after the output, in brackets), and the next command runs in a new shell with the session as
  it was after the last call that finished (the harness keeps no trap in the shell to catch them:
  a command would see it in `trap -p`). Such an error ends the shell with status 1 where `bash -c`
  exits 127.
- **What a command can find of the harness by looking for it**: its parent is a process named
  `exec-agent` (the sandbox's pid 1 is `bwrap`, with `setpriv`'s options); `/proc/$$/fd` shows its
  shell's channel (a socket), its output (a deleted FIFO under `/run/trajforge/session`) and a
  memory file the loop was read from. As root, `/run` is not listable for commands (`ls /run`:
  permission denied); unprivileged (a user namespace, no root) it is, and holds `trajforge/`. In
  docker the agent's file is a bind mount at `/run/trajforge/agent` (`mount` lists it) and `/run`
  is root's to list. None of it shows in what a command prints unless it goes looking:
  `benchmarks/harness_leaks.py` scans every tool result of a batch of these workloads for the
  harness's paths, variables and trap (docs/benchmarks.md).
- **Not root, no network, capped**: see the rows above and docs/security.md. `/dev/shm` is part of
  the sandbox's disk cap (`limits.disk_mb`, one tmpfs with the workdir and `/tmp`, when trajforge
  runs as root), emptied and verified by the reset between rollouts like `/tmp`.
"""


def table() -> str:
    rows = []
    for w in WORKLOADS:
        bwrap, docker = w.shows if w.differs else ("does its job", "the same answers")
        what, why, bwrap, docker = (text.replace("|", "\\|") for text in (w.what, w.differs, bwrap, docker))
        rows.append(f"| `{w.name}` | {what} | {len(w.calls)} | {bwrap} | {docker} | {why} |\n")
    return _HEAD + "".join(rows) + _TAIL


# -- running by hand ---------------------------------------------------------------------------------


async def _run_here(names: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    import docker_engine  # noqa: PLC0415 (tests/ on the path: this file runs as a script)
    from trajforge.sandbox import SandboxConfig, close_factory, create_sandbox_factory

    chosen = tuple(w for w in WORKLOADS if not names or w.name in names)
    backends: dict[str, Any] = {"bwrap": SandboxConfig(kind="bwrap", reuse=True)}
    host = ""
    if not docker_engine.why_not():
        host = docker_engine.acquire()
    try:
        if host:
            import os  # noqa: PLC0415

            os.environ["DOCKER_HOST"] = host
            backends["docker"] = SandboxConfig(kind="docker", docker_image=docker_engine.base_image())
        results = {}
        for kind, config in backends.items():
            factory = create_sandbox_factory(config)
            try:
                results[kind] = await run_all(factory, chosen)
            finally:
                await close_factory(factory)
        bad = 0
        for w in chosen:
            answers = {kind: results[kind][w.name] for kind in results}
            issues = {kind: problems(w, a) for kind, a in answers.items()}
            same = len({repr(a) for a in answers.values()}) == 1
            verdict = "same" if same else "DIFFERS"
            wrong = any(issues.values()) or (len(answers) > 1 and same == bool(w.differs))
            bad += wrong
            print(f"{'!!' if wrong else 'ok'} {w.name}: {verdict}")
            for kind, a in answers.items():
                print(f"   {kind}: {a!r}"[:1500])
                for issue in issues[kind]:
                    print(f"   {kind} PROBLEM: {issue}")
        return 1 if bad else 0
    finally:
        if host:
            docker_engine.release()


def main(argv: list[str]) -> int:
    if argv[:1] == ["table"]:
        sys.stdout.write(table())
        return 0
    if argv[:1] == ["run"]:
        return asyncio.run(_run_here(argv[1:]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
