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
trap '__tf_rc=$?; { pwd > "$__tf_state.cwd.tmp" && env -0 > "$__tf_state.env.tmp" && mv -f "$__tf_state.cwd.tmp" "$__tf_state.cwd" && mv -f "$__tf_state.env.tmp" "$__tf_state.env"; } 2>/dev/null; exit $__tf_rc' EXIT
. "$__tf_cmd"
"""

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


class Agent:
    def __init__(self, workdir: str, scratch: str) -> None:
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

    def _load_state(self, base: str) -> None:
        try:
            with open(base + ".cwd", "rb") as f:
                cwd = f.read().decode("utf-8", "surrogateescape").rstrip("\n")
            with open(base + ".env", "rb") as f:
                raw = f.read().decode("utf-8", "surrogateescape")
        except OSError:
            return  # killed before the trap ran: keep the previous session state
        env = {}
        for item in raw.split("\0"):
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
        for suffix in (".cwd", ".env"):
            with contextlib.suppress(OSError):
                os.unlink(base + suffix)
        cwd = req.get("cwd") or self.cwd
        if not os.path.isabs(cwd):
            cwd = os.path.join(self.cwd, cwd)
        if not os.path.isdir(cwd):
            return self._answer(req, 1, f"cwd does not exist: {cwd}".encode(), started, cap)
        env = dict(self.env)
        env.update({k: v for k, v in self.limits.items() if v})
        proc = subprocess.Popen(
            ["bash", "-c", WRAPPER, "bash", base, cmd_file],
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
            self._load_state(base)
        for suffix in (".cwd", ".env"):
            with contextlib.suppress(OSError):
                os.unlink(base + suffix)
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


def main() -> None:
    workdir, scratch = sys.argv[1], sys.argv[2]
    agent = Agent(workdir, scratch)
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
        try:
            answer = agent.exec(req)
        except Exception as exc:  # report, never die: the session must survive a bad request
            answer = {"id": req.get("id"), "error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    agent.close()


if __name__ == "__main__":
    main()
