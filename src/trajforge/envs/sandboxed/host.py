"""Starting the env host in bubblewrap, and talking to it.

The env host (:mod:`.child`) runs an agent-written env's Python where it can do no harm to the
host: bubblewrap with

- the system (``/usr`` and its links), the Python install, its site-packages and trajforge
  itself read-only, and from ``/etc`` only the dynamic loader's cache; nothing else of the host
  (no ``/root``, ``/home``, ``/etc/shadow``, no run directories, no env store);
- a private size-capped tmpfs as its only writable place (``/run/env``, also ``HOME`` and the
  working directory) and another one at ``/tmp``;
- its own network namespace with nothing in it (not even the host's loopback), and its own pid,
  IPC and UTS namespaces; ``--die-with-parent``: it cannot outlive this process;
- as root: no user namespace, a fresh unprivileged uid (``setpriv``, no capabilities,
  ``no_new_privs``); unprivileged: a user namespace with our uid (bwrap's default);
- rlimits (address space, file size, open files, processes when the uid is its own).

The conversation is :mod:`.wire` JSON lines over a pipe. A reader thread takes the child's
lines: answers go to the waiting request's future; calls that reward code makes back (``exec``,
``read_file``, ...) are checked and run on the event loop that awaits that reward, against the
rollout's :class:`~trajforge.envs.verifier.VerifierContext` -- the rollout's own sandbox, itself
confined. A line that is not a valid message ends the env host (it is killed); nothing it sends
is ever unpickled or evaluated.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

import trajforge
from trajforge.envs.sandboxed.wire import (
    MAX_LINE,
    WireError,
    blob,
    decode,
    encode,
    error_text,
    unblob,
)
from trajforge.sandbox.errors import SandboxUnavailableError

log = logging.getLogger(__name__)

INSIDE_RUN = "/run/env"
_UID_BASE = 200_000
_UID_SPAN = 1_000_000_000
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_BOOT = (
    "import sys; sys.path[:0] = sys.argv[1:]; del sys.argv[1:]; "
    "from trajforge.envs.sandboxed.child import main; main()"
)
_CALL_OPS = (
    "exec",
    "terminal",
    "read_file",
    "exists",
    "write_file",
    "search",
    "stop_processes",
    "sandbox_exec",
    "sandbox_read_bytes",
    "sandbox_write_bytes",
    "call_tool",
)
_HOST_ERRORS = (
    FileNotFoundError,
    IsADirectoryError,
    PermissionError,
    KeyError,
    LookupError,
    ValueError,
    TimeoutError,
)


class EnvHostError(SandboxUnavailableError):
    """The env host failed, exited or broke the protocol (the message has its log's tail). An
    infrastructure failure: an episode it ends is failed with this reason, never scored."""


class EnvHostCallError(RuntimeError):
    """A hook of the env raised inside the env host; ``kind`` is config, data, cancelled or error."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class EnvHostConfig(BaseModel):
    """Limits of one env host."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    memory_mb: int = Field(4096, ge=256, description="address space of the env host's processes")
    tmpfs_mb: int = Field(256, ge=1, description="size of its writable run directory (and of /tmp)")
    max_processes: int = Field(64, ge=1, description="processes of its uid (when the uid is its own: root)")
    start_timeout_s: float = Field(120.0, gt=0, description="the env file's import and init, at most")
    call_timeout_s: float = Field(
        600.0, gt=0, description="a synchronous hook (eval_items, an item's prompt) answers by then"
    )
    max_calls_per_reward: int = Field(8, ge=1, description="calls one reward may have in flight at once")


# ---------------------------------------------------------------------- the sandbox's argv


def _readable_roots() -> list[str]:
    """What the env host must read: the Python install, the venv, the site-packages on sys.path
    and the trajforge package directory itself -- not the directory around it (a checkout's other
    files), never '' or another directory of the user's."""
    candidates = [
        sys.prefix,
        sys.base_prefix,
        str(Path(sys.executable).resolve().parent.parent),
        str(Path(trajforge.__file__).resolve().parent),
    ]
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        real = os.path.realpath(entry)
        if real.endswith(("site-packages", "dist-packages")) or any(
            real.startswith(os.path.realpath(p) + "/") for p in (sys.prefix, sys.base_prefix)
        ):
            candidates.append(entry)
    roots: list[str] = []
    for path in candidates:
        for p in {os.path.abspath(path), os.path.realpath(path)}:
            if p == "/" or p.startswith("/usr/") or p == "/usr" or not os.path.exists(p):
                continue
            if p not in roots:
                roots.append(p)
    roots.sort(key=len)
    return [p for i, p in enumerate(roots) if not any(p.startswith(q + "/") for q in roots[:i])]


def _python_paths() -> list[str]:
    """sys.path for the child (``-S``: no site, so no .pth runs; the same directories as ours)."""
    package_root = str(Path(trajforge.__file__).resolve().parent.parent)
    keep = [package_root]
    for entry in sys.path:
        if entry and os.path.isdir(entry) and entry not in keep:
            real = os.path.realpath(entry)
            if real.endswith(("site-packages", "dist-packages")) or real == package_root:
                keep.append(entry)
    return keep


def _dirs_for(path: str) -> list[str]:
    """bwrap steps that create ``path``'s ancestors world-traversable (0755)."""
    out: list[str] = []
    parts = Path(path).parts[1:-1]
    for i in range(len(parts)):
        out += ["--perms", "0755", "--dir", "/" + "/".join(parts[: i + 1])]
    return out


def bwrap_argv(config: EnvHostConfig, uid: int | None) -> list[str]:
    size = str(config.tmpfs_mb * 1024 * 1024)
    argv = ["bwrap", "--die-with-parent", "--new-session", "--hostname", "envhost"]
    if uid is None:
        argv += ["--unshare-all"]  # user namespace with our uid; no --share-net: no network
    else:
        argv += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-net", "--unshare-cgroup-try"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for link in _SYSTEM_LINKS:
        if os.path.islink(link):
            argv += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            argv += ["--ro-bind", link, link]
    for path in _ETC_FILES:
        argv += ["--ro-bind-try", path, path]
    # /tmp first: a Python install that lives under /tmp (a clone there with its .venv) is then
    # bound on top of the tmpfs instead of being hidden by it
    argv += ["--perms", "0777", "--size", size, "--tmpfs", "/tmp"]
    for root in _readable_roots():
        argv += [*_dirs_for(root), "--ro-bind", root, root]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "0755", "--dir", "/run", "--perms", "0777", "--size", size, "--tmpfs", INSIDE_RUN]
    argv += ["--chdir", INSIDE_RUN]
    if uid is not None:
        argv += [
            "--",
            shutil.which("setpriv") or "/usr/bin/setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--no-new-privs",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ]
    return [*argv, "--", sys.executable, "-I", "-S", "-B", "-c", _BOOT, *_python_paths()]


def unavailable_reason() -> str | None:
    """Why an env host cannot start here, or None."""
    if shutil.which("bwrap") is None:
        return (
            "agent-written envs run only inside bubblewrap, which is not installed "
            "(apt-get install bubblewrap); they never run on the host"
        )
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "as root the env host drops to its own uid with setpriv (util-linux), which is missing"
    return None


# ---------------------------------------------------------------------- the messages


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: int
    ok: bool
    value: Any = None
    kind: str | None = Field(None, max_length=32)
    error: str | None = Field(None, max_length=8000)


class _Call(BaseModel):
    model_config = ConfigDict(extra="forbid")

    call: int
    for_: int = Field(alias="for")
    op: str = Field(max_length=32)
    args: dict[str, Any]


class _ExecArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    command: str = Field(max_length=1_000_000)
    timeout: float | None = Field(None, gt=0)
    cwd: str | None = Field(None, max_length=4096)
    env: dict[str, str] | None = None


class _PathArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(max_length=4096)
    limit: int | None = Field(None, ge=0)
    data: dict[str, str] | None = None


class _SearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(max_length=100_000)
    path: str = Field(".", max_length=4096)
    fixed: bool = False


class _ToolArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=128)
    args: dict[str, Any]


@dataclass
class _Binding:
    """A reward in flight: where its calls back run (the loop that awaits it, its context)."""

    loop: asyncio.AbstractEventLoop
    ctx: Any  # trajforge.envs.verifier.VerifierContext (typed loosely: no import cycle at runtime)
    slots: asyncio.Semaphore
    timeout_s: float
    calls: set[concurrent.futures.Future[None]] = field(default_factory=set)


# ---------------------------------------------------------------------- the process


class EnvHost:
    """One env host process: ``EnvHost.start(...)``, then ``call_sync`` / ``await call``, ``close``."""

    def __init__(self, config: EnvHostConfig) -> None:
        self.config = config
        self._ids = itertools.count(1)
        self._pending: dict[int, concurrent.futures.Future[Any]] = {}
        self._bindings: dict[int, _Binding] = {}
        self._lock = threading.Lock()  # pending, bindings, dead
        self._write_lock = threading.Lock()
        self._dead: str | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="trajforge-envhost-"))
        self._log_path = self._dir / "env-host.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdin: IO[bytes] | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    # ------------------------------------------------------------------ life
    @classmethod
    def start(
        cls,
        *,
        source: bytes,
        filename: str,
        class_name: str,
        config: Mapping[str, Any] | None,
        overrides: Mapping[str, Any] | None,
        host_config: EnvHostConfig | None = None,
    ) -> tuple[EnvHost, dict[str, Any]]:
        """Start the sandbox, load the env in it; (host, the env's init answer). Blocking: async
        callers run it in a thread. Raises ``EnvHostError`` (could not start) or
        ``EnvHostCallError`` (the env file or its config failed)."""
        problem = unavailable_reason()
        if problem:
            raise EnvHostError(problem)
        host = cls(host_config or EnvHostConfig())
        try:
            host._spawn()
            limits = {
                "memory_bytes": host.config.memory_mb * 1024 * 1024,
                "file_bytes": host.config.tmpfs_mb * 1024 * 1024,
                "open_files": 1024,
                "processes": host.config.max_processes if os.geteuid() == 0 else 0,
            }
            init = host.call_sync(
                "init",
                timeout=host.config.start_timeout_s,
                source=blob(source),
                filename=filename,
                class_name=class_name,
                config=dict(config) if config is not None else None,
                overrides=dict(overrides) if overrides else None,
                limits=limits,
            )
        except BaseException:
            host.close()
            raise
        if not isinstance(init, dict):
            host.close()
            raise EnvHostError("the env host answered init with something other than an object")
        return host, init

    def _spawn(self) -> None:
        uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if os.geteuid() == 0 else None
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": INSIDE_RUN,
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
        }
        with open(self._log_path, "wb") as log_file:
            self._proc = subprocess.Popen(
                bwrap_argv(self.config, uid),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                env=env,
                close_fds=True,
                cwd="/",
            )
        self._stdin = self._proc.stdin
        self._finalizer = weakref.finalize(self, _reap, self._proc, str(self._dir))
        threading.Thread(target=self._read_loop, name="trajforge-envhost-reader", daemon=True).start()

    def close(self) -> None:
        """End the env host (its stdin closes, then SIGKILL) and remove its log; idempotent."""
        self._fail(self._dead or "the env host was closed")
        if self._finalizer is not None:
            self._finalizer()
        else:
            shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def alive(self) -> bool:
        return self._dead is None and self._proc is not None and self._proc.poll() is None

    def log_tail(self, limit: int = 3000) -> str:
        try:
            with open(self._log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - limit))
                return f.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    # ------------------------------------------------------------------ requests
    def _send(self, message: Mapping[str, Any]) -> None:
        line = encode(message)
        with self._write_lock:
            if self._stdin is None or (self._dead is not None and "reply" not in message):
                raise EnvHostError(self._dead or "the env host is not running")
            try:
                self._stdin.write(line)
                self._stdin.flush()
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise EnvHostError(f"the env host is gone ({exc}): {self.log_tail()}") from None

    def _submit(
        self, op: str, fields: Mapping[str, Any], binding: _Binding | None = None
    ) -> tuple[int, concurrent.futures.Future[Any]]:
        rid = next(self._ids)
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self._dead is not None:
                raise EnvHostError(self._dead)
            self._pending[rid] = fut
            if binding is not None:
                self._bindings[rid] = binding
        try:
            self._send({"id": rid, "op": op, **fields})
        except BaseException:
            self._forget(rid)
            raise
        return rid, fut

    def _forget(self, rid: int) -> None:
        with self._lock:
            self._pending.pop(rid, None)
            binding = self._bindings.pop(rid, None)
        if binding is not None:
            for call in list(binding.calls):
                call.cancel()

    def call_sync(self, op: str, *, timeout: float | None = None, **fields: Any) -> Any:  # noqa: ASYNC109
        """One request, waited for in this thread (the protocol's synchronous hooks)."""
        rid, fut = self._submit(op, fields)
        try:
            return fut.result(timeout or self.config.call_timeout_s)
        except concurrent.futures.TimeoutError:
            self._cancel(rid)
            raise EnvHostError(
                f"the env host did not answer {op} within {timeout or self.config.call_timeout_s:.0f}s"
            ) from None
        finally:
            self._forget(rid)

    async def call(self, op: str, *, ctx: Any = None, timeout_s: float = 300.0, **fields: Any) -> Any:
        """One request, awaited; with ``ctx`` (a VerifierContext) the env's calls back are served
        against it while this waits. Cancelling this cancels the request in the env host."""
        binding = None
        if ctx is not None:
            binding = _Binding(
                asyncio.get_running_loop(),
                ctx,
                asyncio.Semaphore(self.config.max_calls_per_reward),
                timeout_s,
            )
        rid, fut = await asyncio.to_thread(self._submit, op, fields, binding)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            self._cancel(rid)
            raise
        finally:
            self._forget(rid)

    def _cancel(self, rid: int) -> None:
        with contextlib.suppress(EnvHostError, WireError):
            self._send({"op": "cancel", "target": rid})

    # ------------------------------------------------------------------ the reader thread
    def _read_loop(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        out = self._proc.stdout
        reason = "the env host exited"
        try:
            while True:
                line = out.readline(MAX_LINE + 1)
                if not line:
                    code = self._proc.wait()
                    reason = f"the env host exited (code {code})"
                    break
                try:
                    self._dispatch(decode(line))
                except (WireError, ValidationError) as exc:
                    reason = f"the env host broke the protocol ({str(exc)[:300]}); it was stopped"
                    self._kill()
                    break
        except (OSError, ValueError) as exc:
            reason = f"reading from the env host failed: {exc}"
        finally:
            with contextlib.suppress(OSError):
                out.close()
        tail = self.log_tail()
        self._fail(reason + (f"; its log ends:\n{tail}" if tail else ""))

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "call" in message:
            call = _Call.model_validate(message)
            with self._lock:
                binding = self._bindings.get(call.for_)
            if binding is None or call.op not in _CALL_OPS:
                why = "no reward of that id is in flight" if binding is None else f"unknown call {call.op!r}"
                # from another thread: this one must keep reading, or a full pipe deadlocks both sides
                threading.Thread(target=self._reply_quietly, args=(call.call, why), daemon=True).start()
                return
            serving = asyncio.run_coroutine_threadsafe(self._serve_call(binding, call), binding.loop)
            binding.calls.add(serving)
            serving.add_done_callback(binding.calls.discard)
            return
        answer = _Answer.model_validate(message)
        with self._lock:
            fut = self._pending.get(answer.id)
        if fut is None or fut.done():
            return
        if answer.ok:
            fut.set_result(answer.value)
        else:
            fut.set_exception(EnvHostCallError(answer.kind or "error", answer.error or "failed"))

    def _reply(self, k: int, value: Any = None, error: tuple[str, str] | None = None) -> None:
        message: dict[str, Any] = {"reply": k, "ok": error is None}
        if error is None:
            message["value"] = value
        else:
            message["kind"], message["error"] = error[0], error[1][:4000]
        try:
            self._send(message)
        except WireError as exc:
            self._send({"reply": k, "ok": False, "kind": "error", "error": error_text(exc)})

    def _reply_quietly(self, k: int, why: str) -> None:
        with contextlib.suppress(EnvHostError, WireError):
            self._reply(k, error=("error", why))

    async def _serve_call(self, binding: _Binding, call: _Call) -> None:
        """Run one call of reward code on the rollout's VerifierContext and answer it."""
        try:
            async with binding.slots:
                value = await _perform(binding, call.op, call.args)
        except asyncio.CancelledError:
            raise
        except ValidationError as exc:
            await asyncio.to_thread(
                self._reply, call.call, error=("ValueError", f"bad arguments to {call.op}: {exc}")
            )
        except _HOST_ERRORS as exc:
            await asyncio.to_thread(self._reply, call.call, error=(type(exc).__name__, str(exc)))
        except Exception as exc:
            await asyncio.to_thread(self._reply, call.call, error=("error", error_text(exc)))
        else:
            with contextlib.suppress(EnvHostError):
                await asyncio.to_thread(self._reply, call.call, value)

    # ------------------------------------------------------------------ ending
    def _fail(self, reason: str) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = reason
            pending, self._pending = dict(self._pending), {}
            bindings, self._bindings = dict(self._bindings), {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(EnvHostError(reason))
        for binding in bindings.values():
            for call in list(binding.calls):
                call.cancel()

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._proc.kill()


async def _perform(binding: _Binding, op: str, args: dict[str, Any]) -> Any:
    ctx = binding.ctx
    if op == "exec":
        a = _ExecArgs.model_validate(args)
        timeout = min(a.timeout or binding.timeout_s, binding.timeout_s)
        res = await ctx.exec(a.command, timeout=timeout, cwd=a.cwd, env=a.env)
        return {
            "exit_code": res.exit_code,
            "stdout": blob(res.stdout),
            "stderr": blob(res.stderr),
            "timed_out": res.timed_out,
        }
    if op == "terminal":  # the seed's verb; fresh or the rollout's session as the env's config says
        a = _ExecArgs.model_validate(args)
        if a.env or a.cwd:
            raise ValueError("terminal takes a command and a timeout; use ctx.exec for cwd and env")
        return await ctx.terminal(a.command, timeout=min(a.timeout or 180, binding.timeout_s))
    if op == "sandbox_exec":
        a = _ExecArgs.model_validate(args)
        if a.env:
            raise ValueError("sandbox.exec takes no env; use ctx.exec(command, env=...)")
        timeout = min(a.timeout or binding.timeout_s, binding.timeout_s)
        res = await ctx.sandbox.exec(a.command, timeout=timeout, cwd=a.cwd)
        return res.model_dump(mode="json")
    if op in ("read_file", "exists", "write_file", "sandbox_read_bytes", "sandbox_write_bytes"):
        p = _PathArgs.model_validate(args)
        if op == "read_file":
            return blob(await ctx.read_file(p.path))
        if op == "exists":
            return bool(await ctx.exists(p.path))
        if op == "sandbox_read_bytes":
            return blob(await ctx.sandbox.read_bytes(p.path, p.limit))
        data = unblob(p.data)
        if op == "write_file":
            await ctx.write_file(p.path, data)
        else:
            await ctx.sandbox.write_bytes(p.path, data)
        return None
    if op == "search":
        s = _SearchArgs.model_validate(args)
        hits = await ctx.search(s.pattern, s.path, fixed=s.fixed)
        return [{"path": h.path, "line": h.line, "text": h.text} for h in hits]
    if op == "stop_processes":
        await ctx.stop_processes()
        return None
    if op == "call_tool":
        t = _ToolArgs.model_validate(args)
        out = await ctx.call_tool(t.name, t.args)
        return out.model_dump(mode="json")
    raise ValueError(f"unknown call {op!r}")


def _reap(proc: subprocess.Popen[bytes], directory: str) -> None:
    """Kill bwrap (the env host is pid 1 of its own namespace under it, and dies with it: nothing
    it started survives), reap it, remove its log. The env host keeps nothing worth a graceful end."""
    if proc.poll() is None:
        with contextlib.suppress(OSError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    with contextlib.suppress(OSError, ValueError):
        if proc.stdin is not None:
            proc.stdin.close()
    shutil.rmtree(directory, ignore_errors=True)
