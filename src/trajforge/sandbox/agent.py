"""The exec agent: a tiny stdlib-only program that runs inside a sandbox and executes commands.

Why a resident agent instead of one ``bash -c`` per call: the model expects a *shell session*
(``cd`` and ``export`` carry over), background jobs must outlive the call that started them, and the
output of a runaway command must be capped *where it is produced* so 50 MB never crosses into the
host's memory. One agent per sandbox, started once, talking JSON lines over stdin/stdout.

Protocol (one JSON object per line):
  request  ``{"id": n, "op": "exec", "command": str, "timeout": float, "cwd": str|null, "cap": int}``
  answer   ``{"id": n, "exit_code": int|null, "output": str, "timed_out": bool, "truncated": bool,
             "output_bytes": int, "duration_s": float}``
  request  ``{"id": n, "op": "close"}`` -> kills every process group it started, answers, exits.
  request  ``{"id": n, "op": "reset"}`` -> ``{"id": n, "reset": bool, "reason": str}``: puts a
           reusable sandbox back into its starting state (see :meth:`Agent.reset`), or says why not.

Each command runs as ``bash`` in a new session (so the whole tree is one process group that can be
killed at the timeout) with the saved cwd and exported environment, and rlimits applied by ``ulimit``
in that bash before the user's command. The state is re-saved by an EXIT trap after the command.

This file must stay importable by any python3 >= 3.8 with nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time

# The wrapper sources the user's command from a file (no ARG_MAX limit, exact bytes), with the
# limits set first and the session state saved on exit, whatever way the command exits.
WRAPPER = r"""
__tf_state=$1; __tf_cmd=$2; shift 2
ulimit -f "$TF_LIMIT_FSIZE_KB" 2>/dev/null
ulimit -t "$TF_LIMIT_CPU_S" 2>/dev/null
[ -n "$TF_LIMIT_AS_KB" ] && ulimit -v "$TF_LIMIT_AS_KB" 2>/dev/null
[ -n "$TF_LIMIT_NPROC" ] && ulimit -u "$TF_LIMIT_NPROC" 2>/dev/null
unset TF_LIMIT_FSIZE_KB TF_LIMIT_CPU_S TF_LIMIT_AS_KB TF_LIMIT_NPROC
trap '__tf_rc=$?; builtin unset IFS; { builtin pwd; builtin printf "\0"; for __tf_n in $(builtin compgen -e); do builtin printf "%s=%s\0" "$__tf_n" "${!__tf_n}"; done; builtin printf __TF_END__; } > "$__tf_state" 2>/dev/null; builtin exit $__tf_rc' EXIT
. "$__tf_cmd"
"""
# The EXIT trap uses bash builtins only (one fork for ``compgen``, no exec): ``env``/``mv`` cost
# three extra programs per command, 3-4 ms of CPU each time (measured). The state file ends with
# a marker, so a command killed mid-write leaves the previous session state in force.
_STATE_END = "__TF_END__"

# Variables bash manages itself; restoring them would make them drift (SHLVL grows each call).
_VOLATILE = {"_", "SHLVL", "PWD"}
_GRACE_S = 0.2  # how long to keep reading after the command exits while a background job holds the pipe


class OutputCap:
    """Keeps the first ``head`` and the last ``tail`` bytes of a stream, counting the rest."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_cap > 0:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_cap:  # trim rarely, keep it amortised O(1)
                del self.tail[: len(self.tail) - self.tail_cap]

    def render(self) -> tuple[str, bool]:
        tail = bytes(self.tail[-self.tail_cap :]) if self.tail_cap > 0 else b""
        kept = len(self.head) + len(tail)
        if kept >= self.total:
            return (bytes(self.head) + tail).decode("utf-8", "replace"), False
        omitted = self.total - kept
        marker = f"\n\n[... {omitted} bytes of output omitted ({self.total} total) ...]\n\n".encode()
        return (bytes(self.head) + marker + tail).decode("utf-8", "replace"), True


def _drain_forever(fd: int) -> None:
    """Read and discard what background jobs still write, so they never block or get SIGPIPE."""
    try:
        while os.read(fd, 65536):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _tmpfs_mounts() -> list[str]:
    """Writable tmpfs mounts (bwrap's ``/``, ``/dev``, ``/run``): where a command could leave
    something outside the workdir and scratch dir. From mountinfo, so the check follows the
    layout bwrap actually built (as root they are not writable for the sandbox uid; in a user
    namespace they are)."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if right.split()[:1] == ["tmpfs"] and "rw" in fields[5].split(","):
                mounts.append(fields[4].replace("\\040", " "))
    return mounts


def _tree(root: str) -> dict:
    """Every entry of one mount (not descending into other mounts): type+mode, owner, and the
    size+mtime of files or the target of links. Directory times are left out on purpose: removing
    what a command added changes them, and that is not a difference the next rollout can see."""
    out = {}
    top = os.lstat(root)
    out[root] = (top.st_mode, top.st_uid, top.st_gid, None)
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    extra = os.readlink(entry.path)
                elif stat.S_ISREG(st.st_mode):
                    extra = (st.st_size, st.st_mtime_ns)
                else:
                    extra = None
                out[entry.path] = (st.st_mode, st.st_uid, st.st_gid, extra)
                if stat.S_ISDIR(st.st_mode) and st.st_dev == top.st_dev:
                    stack.append(entry.path)
    return out


def _remove(path: str) -> None:
    """Remove a file or a whole tree the sandbox uid owns, whatever modes a command left on it."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    os.chmod(path, 0o700)
    _empty(path)
    os.rmdir(path)


def _empty(path: str) -> None:
    with os.scandir(path) as entries:
        names = [entry.path for entry in entries]
    for name in names:
        _remove(name)


def _ipc_objects() -> int:
    """System V shared memory segments, semaphores and message queues in our IPC namespace."""
    count = 0
    for kind in ("shm", "sem", "msg"):
        with contextlib.suppress(OSError), open("/proc/sysvipc/" + kind) as f:
            count += max(0, len(f.read().splitlines()) - 1)
    return count


class ResetRefused(Exception):
    """The sandbox cannot be put back into its starting state; the host must discard it."""


class Agent:
    def __init__(self, workdir: str, scratch: str, reusable: bool = False) -> None:
        self.workdir = workdir
        self.scratch = scratch
        self.cwd = workdir
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TF_AGENT_")}
        self.state_dir = os.path.join(scratch, ".trajforge-session")
        self.groups: set[int] = set()
        self.limits = {
            k: os.environ.get(k, "")
            for k in ("TF_LIMIT_FSIZE_KB", "TF_LIMIT_CPU_S", "TF_LIMIT_AS_KB", "TF_LIMIT_NPROC")
        }
        for k in self.limits:
            self.env.pop(k, None)
        self.counter = 0
        self.initial_env = dict(self.env)
        self.reusable = reusable
        if reusable:  # the starting state that reset() must restore and verify
            self.dir_modes = {d: os.lstat(d).st_mode for d in (workdir, scratch)}
            self.snapshot = {m: _tree(m) for m in _tmpfs_mounts()}

    def reset(self) -> None:
        """Put the sandbox back into the state it started in, for the next rollout; verify it.

        Kills every other process of the sandbox (we are in our own pid namespace: ``kill(-1)``
        reaches exactly the sandbox), empties the workdir and scratch dir, removes System V IPC
        objects, removes whatever was added to the writable tmpfs mounts, and forgets the shell
        session's cwd and environment. Anything it cannot restore exactly (a changed entry in a
        tmpfs, a process that will not die) raises :class:`ResetRefused`: the host then discards
        the sandbox and builds a fresh one, so a reused sandbox is never subtly different.
        """
        if not (self.reusable and _in_own_pid_namespace()):
            raise ResetRefused("not started as a reusable sandbox in its own pid namespace")
        me = os.getpid()
        left: list[int] = []
        for _ in range(200):  # repeat while a fork bomb keeps spawning
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)
            _reap()
            left = [p for p in _pids() if p not in (1, me)]
            if not left:
                break
            time.sleep(0.005)
        if left:
            raise ResetRefused(f"{len(left)} processes survived SIGKILL")
        for path, mode in self.dir_modes.items():
            os.chmod(path, stat.S_IMODE(mode))
            _empty(path)
        if _ipc_objects():
            subprocess.run(["ipcrm", "--all"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if _ipc_objects():
                raise ResetRefused("System V IPC objects could not be removed")
        for mount, before in self.snapshot.items():
            now = _tree(mount)
            added = sorted(set(now) - set(before), key=len)
            for path in added:  # shortest first: a removed directory takes its contents along
                if os.path.lexists(path):
                    _remove(path)
            if added:
                now = _tree(mount)
            if now != before:
                changed = sorted(p for p in set(now) | set(before) if now.get(p) != before.get(p))
                raise ResetRefused(f"cannot restore {mount}: {', '.join(changed[:3])} changed")
        self.cwd = self.workdir
        self.env = dict(self.initial_env)
        self.groups.clear()
        self.counter = 0

    def _load_state(self, path: str) -> None:
        try:
            with open(path, "rb") as f:
                raw = f.read().decode("utf-8", "surrogateescape")
        except OSError:
            return  # killed before the trap ran: keep the previous session state
        if not raw.endswith(_STATE_END):
            return  # torn write: keep the previous state
        items = raw[: -len(_STATE_END)].split("\0")
        cwd = items[0].rstrip("\n")
        env = {}
        for item in items[1:]:
            name, sep, value = item.partition("=")
            if sep and name not in _VOLATILE and not name.startswith("TF_LIMIT_"):
                env[name] = value
        if os.path.isdir(cwd):
            self.cwd = cwd
        self.env = env

    def _kill_group(self, pgid: int) -> None:
        # A fork bomb keeps spawning while we kill: repeat until the group is empty.
        for _ in range(50):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                return
            except PermissionError:
                return
            time.sleep(0.01)

    def exec(self, req: dict) -> dict:
        started = time.monotonic()
        timeout = float(req.get("timeout") or 60.0)
        cap = OutputCap(int(req.get("cap") or 16384))
        os.makedirs(self.state_dir, exist_ok=True)
        self.counter += 1
        base = os.path.join(self.state_dir, f"s{self.counter}")
        cmd_file = base + ".sh"
        with open(cmd_file, "wb") as f:
            f.write(req["command"].encode("utf-8", "surrogateescape"))
        state = base + ".state"
        with contextlib.suppress(OSError):
            os.unlink(state)
        cwd = req.get("cwd") or self.cwd
        if not os.path.isabs(cwd):
            cwd = os.path.join(self.cwd, cwd)
        if not os.path.isdir(cwd):
            return self._answer(req, 1, f"cwd does not exist: {cwd}".encode(), started, cap)
        env = dict(self.env)
        env.update({k: v for k, v in self.limits.items() if v})
        proc = subprocess.Popen(
            ["bash", "-c", WRAPPER, "bash", state, cmd_file],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
        self.groups.add(proc.pid)
        assert proc.stdout is not None
        fd = os.dup(proc.stdout.fileno())
        proc.stdout.close()
        deadline = started + timeout
        timed_out = False
        exited_at = None
        eof = False
        while True:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > _GRACE_S:
                break
            if exited_at is None and now >= deadline:
                timed_out = True
                self._kill_group(proc.pid)
                proc.wait()
                exited_at = time.monotonic()
                continue
            wait = min(0.05, max(0.0, deadline - now))
            ready, _, _ = select.select([fd], [], [], wait)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    eof = True
                    break
                cap.feed(chunk)
        code = proc.wait()
        if eof:
            os.close(fd)
        else:  # a background job still holds the pipe: keep draining it off the main path
            threading.Thread(target=_drain_forever, args=(fd,), daemon=True).start()
        with contextlib.suppress(OSError):
            os.unlink(cmd_file)
        if not timed_out:
            self._load_state(state)
        with contextlib.suppress(OSError):
            os.unlink(state)
        return self._answer(req, None if timed_out else code, None, started, cap, timed_out)

    def _answer(self, req, code, message, started, cap, timed_out=False) -> dict:
        if message is not None:
            cap.feed(message)
        output, truncated = cap.render()
        return {
            "id": req.get("id"),
            "exit_code": code,
            "output": output,
            "timed_out": timed_out,
            "truncated": truncated,
            "output_bytes": cap.total,
            "duration_s": time.monotonic() - started,
        }

    def close(self) -> None:
        for pgid in list(self.groups):
            self._kill_group(pgid)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _in_own_pid_namespace() -> bool:
    """True only inside a bwrap pid namespace (bwrap is pid 1 and our parent). ``reset`` kills
    with ``kill(-1)``: on a host that would reach every process of the user, so never there."""
    return os.getppid() == 1 and _read("/proc/1/comm").strip() == "bwrap"


def _make_undumpable() -> None:
    """Commands run as our uid and could otherwise ptrace this process (or read its memory) and
    make a reset lie about the sandbox's state. A non-dumpable process can only be traced with
    CAP_SYS_PTRACE, which nothing in the sandbox has. Only for reusable sandboxes: importing
    ctypes costs ~9 ms of start-up, paid once per reused sandbox."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (ImportError, OSError, AttributeError):
        pass


def _reap() -> None:
    """Collect exited children (killed background shells), so they do not linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main() -> None:
    workdir, scratch = sys.argv[1], sys.argv[2]
    reusable = "--reusable" in sys.argv[3:]
    if reusable:
        _make_undumpable()
    agent = Agent(workdir, scratch, reusable=reusable)
    out = sys.stdout
    out.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if req.get("op") == "close":
            agent.close()
            out.write(json.dumps({"id": req.get("id"), "closed": True}) + "\n")
            out.flush()
            return
        if req.get("op") == "reset":
            try:
                agent.reset()
                answer = {"id": req.get("id"), "reset": True}
            except (ResetRefused, OSError, RecursionError) as exc:
                answer = {"id": req.get("id"), "reset": False, "reason": str(exc) or type(exc).__name__}
            out.write(json.dumps(answer) + "\n")
            out.flush()
            continue
        try:
            answer = agent.exec(req)
        except Exception as exc:  # report, never die: the session must survive a bad request
            answer = {"id": req.get("id"), "error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    agent.close()


if __name__ == "__main__":
    main()
