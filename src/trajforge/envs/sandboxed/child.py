"""The env host: the process that runs an agent-written env, inside its own bubblewrap sandbox.

:mod:`trajforge.envs.sandboxed.host` starts it as ``python -I -S -B -c BOOT PATH...`` in a
sandbox with the system, the Python install and trajforge read-only, a small private tmpfs as
its only writable place, no network namespace of the host and, when the host runs as root, an
unprivileged uid of its own. This module is the program it runs: it reads one JSON request per
line from the host (:mod:`.wire`), calls the env's hooks and answers with JSON.

The first request (``init``) carries the env's source bytes (the ones the operator approved, read
by the host; this process never opens the store), its class name and config. Reward code gets a
:class:`RemoteVerifierContext`: every call it makes (run a command, read a file) is a request
back to the host, which performs it on the rollout's own sandbox. The protocol's own file
descriptors are private copies; the env's ``print`` goes to stderr (the host's log), so nothing
the env writes to stdout can be taken for an answer.
"""

from __future__ import annotations

import asyncio
import itertools
import linecache
import os
import resource
import shlex
import sys
import threading
import traceback
import types
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, cast

from trajforge.envs.hooks import (
    category_hook,
    env_description,
    env_name,
    keep_hook,
    rescore_hook,
    setup_files_hook,
    system_prompt_hook,
    verifier_files_hook,
)
from trajforge.envs.sandboxed.wire import (
    MAX_LINE,
    WireError,
    blob,
    decode,
    encode,
    error_text,
    files_out,
    unblob,
)

if TYPE_CHECKING:
    from trajforge.envs.verifier import VerifierContext

MODULE_NAME = "trajforge_agent_env"
_ERRORS: dict[str, type[Exception]] = {
    "FileNotFoundError": FileNotFoundError,
    "IsADirectoryError": IsADirectoryError,
    "PermissionError": PermissionError,
    "KeyError": KeyError,
    "LookupError": LookupError,
    "ValueError": ValueError,
    "TimeoutError": TimeoutError,
}


class HostCallError(RuntimeError):
    """The host could not do what the reward code asked of its rollout's sandbox."""


def main() -> None:
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # the env's prints go to the log, never onto the protocol
    sys.stdout = sys.stderr
    asyncio.run(_Server(proto_in, proto_out).serve())
    os._exit(0)


def _apply_limits(limits: Mapping[str, Any]) -> None:
    for key, which in (
        ("memory_bytes", resource.RLIMIT_AS),
        ("file_bytes", resource.RLIMIT_FSIZE),
        ("open_files", resource.RLIMIT_NOFILE),
        ("processes", resource.RLIMIT_NPROC),
    ):
        value = limits.get(key)
        if isinstance(value, int) and value > 0:
            resource.setrlimit(which, (value, value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class _Server:
    def __init__(self, fd_in: int, fd_out: int) -> None:
        self._in = fd_in
        self._out = fd_out
        self._write_lock = threading.Lock()
        self._env: Any = None
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count(1)

    def send(self, message: Mapping[str, Any]) -> None:
        try:
            line = encode(message)
        except WireError as exc:
            if "id" not in message:
                raise
            line = encode({"id": message["id"], "ok": False, "kind": "error", "error": error_text(exc)})
        with self._write_lock:
            view = memoryview(line)
            while view:
                view = view[os.write(self._out, view) :]

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=MAX_LINE + 1)
        pipe = os.fdopen(self._in, "rb", buffering=0)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
        while True:
            try:
                line = await reader.readuntil(b"\n")
            except asyncio.IncompleteReadError:
                break  # the host closed the pipe: our parent is done with us
            except asyncio.LimitOverrunError:
                sys.stderr.write("env host: a request over the line limit; exiting\n")
                break
            message = decode(line)
            if "reply" in message:
                self._resolve(message)
            elif message.get("op") == "cancel":
                task = self._tasks.get(message.get("target", -1))
                if task is not None:
                    task.cancel()
            else:
                rid = message.get("id")
                if not isinstance(rid, int):
                    raise WireError("a request without an integer id")
                self._tasks[rid] = asyncio.create_task(self._handle(rid, message))
        for task in list(self._tasks.values()):
            task.cancel()

    async def _handle(self, rid: int, message: dict[str, Any]) -> None:
        op = message.get("op")
        try:
            handler = getattr(self, f"_op_{op}", None)
            if not isinstance(op, str) or handler is None:
                raise ValueError(f"unknown request {op!r}")
            value = handler(message)
            if asyncio.iscoroutine(value):
                value = await value
            self.send({"id": rid, "ok": True, "value": value})
        except asyncio.CancelledError:
            self.send({"id": rid, "ok": False, "kind": "cancelled", "error": "cancelled by the host"})
        except Exception as exc:
            self.send({"id": rid, "ok": False, "kind": _kind(exc), "error": _explain(exc, op)})
        finally:
            self._tasks.pop(rid, None)

    # ------------------------------------------------------------------ calls back to the host
    async def call(self, rid: int, op: str, args: dict[str, Any]) -> Any:
        k = next(self._call_ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[k] = fut
        try:
            self.send({"call": k, "for": rid, "op": op, "args": args})
            return await fut
        finally:
            self._calls.pop(k, None)

    def _resolve(self, message: dict[str, Any]) -> None:
        fut = self._calls.get(message.get("reply", -1))
        if fut is None or fut.done():
            return
        if message.get("ok"):
            fut.set_result(message.get("value"))
        else:
            kind = str(message.get("kind") or "")
            fut.set_exception(_ERRORS.get(kind, HostCallError)(str(message.get("error") or "")))

    # ------------------------------------------------------------------ the env's hooks
    def _op_init(self, message: dict[str, Any]) -> dict[str, Any]:
        _apply_limits(message.get("limits") or {})
        source = unblob(message["source"])
        filename = str(message.get("filename") or "agent_env.py")
        module = types.ModuleType(MODULE_NAME)
        module.__file__ = f"/agent-env/{filename}"
        text = source.decode("utf-8", "replace")
        linecache.cache[module.__file__] = (len(text), None, text.splitlines(True), module.__file__)
        sys.modules[MODULE_NAME] = module
        exec(compile(source, module.__file__, "exec"), module.__dict__)  # inside the sandbox only
        cls = getattr(module, str(message["class_name"]), None)
        if not isinstance(cls, type) or not all(
            hasattr(cls, a) for a in ("name", "compute_reward", "format_prompt", "get_next_item")
        ):
            raise TypeError(
                f"{message['class_name']} is not an environment class (subclass trajforge.envs.BaseEnv)"
            )
        self._env = _instantiate(cls, message.get("config"), message.get("overrides"))
        system = system_prompt_hook(self._env)
        return {
            "name": env_name(self._env, cls.__name__),
            "description": env_description(self._env),
            "config": self._env.config.model_dump(mode="json"),
            "system_prompt": system() if system is not None else self._env.config.system_prompt,
        }

    async def _op_setup(self, message: dict[str, Any]) -> None:
        await self._env.setup()

    async def _op_next_item(self, message: dict[str, Any]) -> dict[str, Any]:
        return self._bundle(await self._env.get_next_item())

    def _op_eval_items(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        return [self._bundle(item) for item in self._env.eval_items(int(message["n"]))]

    def _op_info(self, message: dict[str, Any]) -> dict[str, Any]:
        return self._bundle(message["item"])

    def _bundle(self, item: Any) -> dict[str, Any]:
        env = self._env
        if not isinstance(item, dict):
            raise TypeError(f"an item must be a dict of JSON data, not {type(item).__name__}")
        category = category_hook(env)
        setup_files = setup_files_hook(env)
        verifier_files = verifier_files_hook(env)
        return {
            "item": item,
            "id": str(env.item_id(item)),
            "prompt": env.format_prompt(item),
            "setup_files": files_out(setup_files(item) if setup_files is not None else {}),
            "verifier_files": files_out(verifier_files(item) if verifier_files is not None else {}),
            "category": category(item) if category is not None else None,
        }

    async def _op_compute_reward(self, message: dict[str, Any]) -> dict[str, Any]:
        from trajforge.agent.result import AgentResult
        from trajforge.envs.types import RewardBreakdown

        ctx = RemoteVerifierContext(self, message["id"], message["sandbox"])
        result = AgentResult.model_validate(message["result"])
        value = await self._env.compute_reward(message["item"], result, ctx)
        return RewardBreakdown.of(value).model_dump(mode="json")

    async def _op_keep(self, message: dict[str, Any]) -> Any:
        from trajforge.agent.result import AgentResult

        keep = keep_hook(self._env)
        if keep is None:
            return {}
        # The remote context is the VerifierContext API over the wire (duck-typed, as for compute_reward).
        ctx = cast("VerifierContext", RemoteVerifierContext(self, message["id"], message["sandbox"]))
        return await keep(message["item"], AgentResult.model_validate(message["result"]), ctx)

    async def _op_rescore(self, message: dict[str, Any]) -> Any:
        from trajforge.envs.types import RewardBreakdown

        rescore = rescore_hook(self._env)
        if rescore is None:
            return None
        value = await rescore(message["item"], message["messages"], message["kept"])
        return None if value is None else RewardBreakdown.of(value).model_dump(mode="json")


def _instantiate(cls: type, config: Any, overrides: Any) -> Any:
    from trajforge.envs.base import BaseEnv
    from trajforge.envs.config import EnvConfig, parse_env_config

    if issubclass(cls, BaseEnv):
        base = cls.default_config()
        if isinstance(config, dict):
            conf = parse_env_config(config, type(base))
        else:
            conf = base.with_overrides(overrides) if isinstance(overrides, dict) and overrides else base
        return cls(conf)
    env: Any = cls()
    conf = parse_env_config(config, EnvConfig) if isinstance(config, dict) else EnvConfig()
    env.config = conf.with_overrides(overrides) if isinstance(overrides, dict) and overrides else conf
    return env


def _kind(exc: BaseException) -> str:
    from trajforge.envs.base import EnvDataError
    from trajforge.envs.config import EnvConfigError

    if isinstance(exc, EnvConfigError):
        return "config"
    if isinstance(exc, EnvDataError):
        return "data"
    return "error"


def _explain(exc: BaseException, op: Any) -> str:
    """The error, and for the env's own failures where in the env file it happened (the frames
    of the agent's file only: that is what its author can fix)."""
    text = error_text(exc)
    frames = [
        f"  {f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()}"
        for f in traceback.extract_tb(exc.__traceback__)
        if f.filename.startswith("/agent-env/")
    ]
    if frames:
        text += "\n" + "\n".join(frames[-8:])
    return text[:4000]


# ---------------------------------------------------------------------- what reward code sees


class RemoteSandbox:
    """``ctx.sandbox`` of reward code: the rollout's sandbox, reached through the host."""

    def __init__(self, ctx: RemoteVerifierContext) -> None:
        self._ctx = ctx

    @property
    def task_id(self) -> str:
        return self._ctx.task_id

    @property
    def workdir(self) -> str:
        return self._ctx.workdir

    async def exec(self, command: str, *, timeout: float | None = None, cwd: str | None = None) -> Any:  # noqa: ASYNC109
        from trajforge.sandbox.types import ExecResult

        value = await self._ctx._call("sandbox_exec", {"command": command, "timeout": timeout, "cwd": cwd})
        return ExecResult.model_validate(value)

    async def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        return unblob(await self._ctx._call("sandbox_read_bytes", {"path": path, "limit": limit}))

    async def write_bytes(self, path: str, data: bytes) -> None:
        await self._ctx._call("sandbox_write_bytes", {"path": path, "data": blob(data)})

    async def close(self) -> None:
        raise PermissionError("reward code does not close the rollout's sandbox")


class RemoteVerifierContext:
    """The :class:`~trajforge.envs.verifier.VerifierContext` API for reward code in the env host.
    Each method is one request to the host, which runs it on the rollout's own sandbox; host
    paths (``upload_*``/``download_*``) are paths of this sandbox's own file system."""

    def __init__(self, server: _Server, rid: int, sandbox: Mapping[str, Any]) -> None:
        self._server = server
        self._rid = rid
        self.workdir = str(sandbox.get("workdir") or "")
        self.task_id = str(sandbox.get("task_id") or "")
        self.sandbox = RemoteSandbox(self)

    async def _call(self, op: str, args: dict[str, Any]) -> Any:
        return await self._server.call(self._rid, op, args)

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,  # noqa: ASYNC109
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Any:
        from trajforge.envs.verifier import VerifierExec

        text = command if isinstance(command, str) else shlex.join(list(command))
        value = await self._call(
            "exec", {"command": text, "timeout": timeout, "cwd": cwd, "env": dict(env) if env else None}
        )
        return VerifierExec(
            exit_code=value["exit_code"],
            stdout=unblob(value["stdout"]),
            stderr=unblob(value["stderr"]),
            timed_out=bool(value["timed_out"]),
        )

    async def terminal(self, command: str, timeout: float = 180) -> dict[str, Any]:  # noqa: ASYNC109
        """The seed's verb: ``{"output", "exit_code", "timed_out"}`` (where it runs: the env's
        ``reward_shell``)."""
        return dict(await self._call("terminal", {"command": command, "timeout": timeout}))

    async def stop_processes(self) -> None:
        await self._call("stop_processes", {})

    async def read_file(self, path: str) -> bytes:
        return unblob(await self._call("read_file", {"path": path}))

    async def exists(self, path: str) -> bool:
        return bool(await self._call("exists", {"path": path}))

    async def write_file(self, path: str, data: bytes | str) -> None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        await self._call("write_file", {"path": path, "data": blob(raw)})

    async def upload_file(self, local: str | os.PathLike[str], remote: str) -> None:
        await self.write_file(remote, await asyncio.to_thread(Path(local).read_bytes))

    async def upload_dir(self, local: str | os.PathLike[str], remote: str) -> list[str]:
        written = []
        for rel, data in await asyncio.to_thread(_local_files, Path(local)):
            target = str(PurePosixPath(remote) / rel)
            await self.write_file(target, data)
            written.append(target)
        return written

    async def download_file(self, remote: str, local: str | os.PathLike[str]) -> Path:
        out = Path(local)
        data = await self.read_file(remote)
        await asyncio.to_thread(_write_local, out, data)
        return out

    async def search(self, pattern: str, path: str = ".", *, fixed: bool = False) -> list[Any]:
        from trajforge.envs.verifier import SearchHit

        hits = await self._call("search", {"pattern": pattern, "path": path, "fixed": fixed})
        return [SearchHit(h["path"], int(h["line"]), h["text"]) for h in hits]

    async def call_tool(self, name: str, args: dict[str, Any]) -> Any:
        from trajforge.tools.base import ToolOutput

        return ToolOutput.model_validate(await self._call("call_tool", {"name": name, "args": args}))


def _local_files(root: Path) -> list[tuple[str, bytes]]:
    return [
        (p.relative_to(root).as_posix(), p.read_bytes())
        for p in sorted(root.rglob("*"))
        if not p.is_symlink() and p.is_file()
    ]


def _write_local(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
