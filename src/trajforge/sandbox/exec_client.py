"""Host side of the exec agent: start it, send one request at a time, read the answer.

Commands in one sandbox are serialised (a lock): a shell session has one current directory, and
two commands racing to save it would leave it undefined. File reads/writes do not take the lock.
If the agent dies, stops answering or reports an error of its own, the command raises
:class:`SandboxBrokenError` -- an infrastructure failure that ends the rollout (the batch retries
it in a fresh sandbox) -- rather than a tool result the model would read and a trajectory that
would be saved as completed although none of its later commands could run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from trajforge.sandbox.errors import SandboxBrokenError
from trajforge.sandbox.types import ExecResult
from trajforge.spawn import kill_process, spawn

# Time allowed beyond a command's own timeout for the agent to kill it and answer.
_ANSWER_GRACE_S = 15.0
_START_TIMEOUT_S = 30.0
_LINE_LIMIT = 64 * 1024 * 1024  # answers carry at most the output cap, this is only a guard


def _encode(request: dict[str, Any]) -> bytes:
    """One request line: orjson, or json for what orjson refuses (a command with lone surrogates,
    which a model's JSON can carry and the agent writes back with ``surrogateescape``)."""
    try:
        return orjson.dumps(request) + b"\n"
    except orjson.JSONEncodeError:
        return json.dumps(request).encode() + b"\n"


class AgentError(RuntimeError):
    """The exec agent could not be started or stopped answering."""


class ExecAgent:
    """The host's handle on one sandbox's exec agent process: start it, talk JSON lines, close it."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: Path | None = None,
        env: dict[str, str] | None = None,
        pass_fds: Sequence[int] = (),
    ) -> None:
        self._argv = list(argv)
        self._env = env
        self._pass_fds = tuple(pass_fds)
        self._log_path = log_path
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self._next_id = 0
        # A call abandoned between request and answer (cancelled, timed out): the agent may still
        # be running that command, so its next answer is not ours. Such a session is not reused.
        self.interrupted = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def start(self) -> None:
        # The agent's own stderr (crash tracebacks) goes to a host-side log the sandbox cannot see.
        log = open(self._log_path, "ab") if self._log_path else None  # noqa: SIM115, ASYNC230
        try:
            self._proc = await spawn(
                *self._argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log if log is not None else asyncio.subprocess.DEVNULL,
                limit=_LINE_LIMIT,
                env=self._env,
                pass_fds=self._pass_fds,
                # bwrap's own child (pid 1 of the sandbox) waits on an eventfd until bwrap has
                # set it up, and only then dies with its parent: bwrap killed in between left it
                # asleep forever. In a group of their own, both are killed (see kill).
                start_new_session=True,
            )
        finally:
            if log is not None:
                log.close()
        try:
            async with asyncio.timeout(_START_TIMEOUT_S):  # not wait_for: it can swallow a cancel
                hello = await self._read_line()
        except (TimeoutError, AgentError) as exc:
            await self.kill()
            raise AgentError(f"the sandbox exec agent did not start: {exc}{self._log_tail()}") from exc
        except BaseException:  # cancelled while it greets: a half-started sandbox is not left running
            await self.kill()
            raise
        if not hello.get("ready"):
            await self.kill()
            raise AgentError(f"unexpected greeting from the sandbox exec agent: {hello!r}")

    def _log_tail(self) -> str:
        if self._log_path is None:
            return ""
        try:
            text = self._log_path.read_bytes()[-1000:].decode(errors="replace").strip()
        except OSError:
            return ""
        return f" ({text})" if text else ""

    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def exec(
        self,
        command: str,
        *,
        timeout: float,  # noqa: ASYNC109 (the command's timeout, enforced inside the agent)
        cwd: str | None,
        cap: int,
        fresh: bool = False,
    ) -> ExecResult:
        async with self._lock:
            if not self.alive():
                raise SandboxBrokenError("the sandbox exec agent is not running")
            request = {"op": "exec", "command": command, "timeout": timeout, "cwd": cwd, "cap": cap}
            if fresh:
                request["fresh"] = True
            try:
                answer = await asyncio.wait_for(self._call(request), timeout + _ANSWER_GRACE_S)
            except (TimeoutError, AgentError) as exc:
                await self.kill()
                raise SandboxBrokenError(f"the sandbox exec agent failed: {exc or 'no answer'}") from exc
            if "error" in answer:
                await self.kill()
                raise SandboxBrokenError(f"the sandbox exec agent failed: {answer['error']}")
            return ExecResult.model_validate({k: v for k, v in answer.items() if k != "id"})

    async def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdin is not None
        self._next_id += 1
        request["id"] = self._next_id
        try:
            return await self._exchange(request)
        except BaseException:
            self.interrupted = True
            raise

    async def _exchange(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(_encode(request))
            await self._proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise AgentError("the sandbox exec agent is gone") from exc
        answer = await self._read_line()
        if answer.get("id") != request["id"]:
            raise AgentError(f"out-of-order answer from the sandbox exec agent: {answer!r}")
        return answer

    async def _read_line(self) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        line = await self._proc.stdout.readline()
        if not line:
            raise AgentError("the sandbox exec agent exited")
        try:
            answer = orjson.loads(line)
        except ValueError as exc:
            raise AgentError(f"unreadable answer from the sandbox exec agent: {line[:200]!r}") from exc
        if not isinstance(answer, dict):
            raise AgentError(f"unreadable answer from the sandbox exec agent: {line[:200]!r}")
        return answer

    async def reset(self, timeout_s: float = 15.0) -> str | None:
        """Ask the agent to put its sandbox back into the starting state (``op: reset``).

        None when it did and verified it; otherwise why not (the caller discards the sandbox).
        """
        if not self.alive():
            return "the exec agent is not running"
        if self.interrupted:
            return "a command was interrupted mid-call"
        try:
            async with asyncio.timeout(timeout_s), self._lock:
                answer = await self._call({"op": "reset"})
        except (TimeoutError, AgentError, OSError) as exc:
            return f"reset failed: {str(exc) or type(exc).__name__}"  # a timeout has no text
        if answer.get("reset") is True:
            return None
        return str(answer.get("reason") or "reset refused")

    async def stop_processes(self, timeout_s: float = 15.0) -> None:
        """Kill every process the commands started (``op: stop``), files untouched; a failure
        breaks the sandbox (the caller must not trust what it would inspect next)."""
        if not self.alive():
            raise SandboxBrokenError("the sandbox exec agent is not running")
        try:
            async with asyncio.timeout(timeout_s), self._lock:
                answer = await self._call({"op": "stop"})
        except (TimeoutError, AgentError, OSError) as exc:
            await self.kill()
            raise SandboxBrokenError(
                f"could not stop the sandbox's processes: {exc or type(exc).__name__}"
            ) from exc
        if answer.get("stopped") is not True:
            await self.kill()
            raise SandboxBrokenError(f"could not stop the sandbox's processes: {answer!r}")

    async def close(self, grace_s: float = 5.0) -> None:
        """Ask the agent to kill its process groups and exit; kill it if it does not."""
        if self.alive():
            with contextlib.suppress(TimeoutError, AgentError, OSError):
                async with asyncio.timeout(grace_s), self._lock:
                    await self._call({"op": "close"})
                    # It exits by itself now: let asyncio reap it. ``kill()`` racing that exit
                    # would reap it behind asyncio's back (Popen.send_signal polls first), and
                    # asyncio then logs "Unknown child process pid ..." and reports 255.
                    if self._proc is not None:
                        await self._proc.wait()
        await self.kill()

    async def kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        kill_process(proc, group=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)
