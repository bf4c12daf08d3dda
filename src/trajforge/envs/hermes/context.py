"""The seed's ``ToolContext``: blocking reward verbs over trajforge's :class:`VerifierContext`.

Two ways to get one, as in the seed:

- handed to ``compute_reward(item, result, ctx)`` by the judge (a rollout of ``env eval``'s
  rollouts mode): it wraps that rollout's verifier context;
- made by the env's own code as ``ToolContext(task_id)`` after ``HermesAgentLoop(task_id=...)``
  ran (an env's ``evaluate()``): it finds that task's sandbox in the running evaluation
  (:mod:`.runtime`), prepared as the judge prepares one.

The verbs block (the seed's reward code calls them without ``await``): each runs on the
evaluation's event loop and is waited for, so they are called from a thread other than the
loop's -- ``compute_reward`` runs in one (:mod:`.env`), and the seed's benchmark code runs its
tests in an executor. Confinement, bounded reads and the reward shell (fresh by default, or the
rollout's session with ``reward_shell: session``) are the verifier context's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from trajforge.envs.hermes import runtime as _runtime
from trajforge.envs.verifier import VerifierContext

_T = TypeVar("_T")


def _json_or_error(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (ValueError, TypeError):
        return {"error": text} if text else {}
    return value if isinstance(value, dict) else {"result": value}


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class ToolContext:
    """The seed's ``ToolContext``: ``ToolContext(task_id)`` in an env's own code, or the one the
    judge hands ``compute_reward`` (``ToolContext(verifier_context, loop)``)."""

    def __init__(self, task: str | VerifierContext, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._runtime: _runtime.SeedRuntime | None = None
        self._ctx: VerifierContext | None = None
        if isinstance(task, VerifierContext):
            if loop is None:
                raise TypeError("ToolContext(verifier_context, loop): the loop its verbs run on")
            self._ctx, self._loop = task, loop
            self.task_id = task.sandbox.task_id
        else:
            self._runtime = _runtime.current()
            self._loop = self._runtime.loop
            self.task_id = str(task)

    @property
    def verifier(self) -> VerifierContext:
        """The trajforge context underneath (its async verbs: ``exec``, ``search``, ...)."""
        if self._ctx is None:
            self._ctx = self._run(self._context)
        return self._ctx

    async def _context(self) -> VerifierContext:
        if self._ctx is not None:
            return self._ctx
        assert self._runtime is not None
        self._ctx = await self._runtime.verifier(self.task_id)
        return self._ctx

    def _run(self, make: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise RuntimeError(
                "the seed's ToolContext verbs block: call them from compute_reward (which runs in a "
                "thread of its own) or an executor, or await the trajforge context's verbs via ctx.verifier"
            )
        return asyncio.run_coroutine_threadsafe(make(), self._loop).result()

    def _on(self, verb: Callable[[VerifierContext], Coroutine[Any, Any, _T]]) -> _T:
        async def go() -> _T:
            return await verb(await self._context())

        return self._run(go)

    # -- terminal

    def terminal(self, command: str, timeout: int = 180) -> dict[str, Any]:
        """``{"exit_code": int, "output": str}`` (-1 when killed at ``timeout``)."""
        got = self._on(lambda c: c.terminal(command, timeout=timeout))
        return {"exit_code": got["exit_code"], "output": got["output"]}

    # -- files

    def read_file(self, path: str) -> dict[str, Any]:
        try:
            data = self._on(lambda c: c.read_file(path))
        except (OSError, ValueError) as exc:
            return {"error": _error(exc)}
        return {"content": data.decode(errors="replace"), "path": path, "bytes": len(data)}

    def write_file(self, path: str, content: str) -> dict[str, Any]:
        try:
            self._on(lambda c: c.write_file(path, content))
        except (OSError, ValueError) as exc:
            return {"error": _error(exc)}
        return {"success": True, "path": path, "bytes": len(content.encode())}

    def upload_file(self, local_path: str, remote_path: str) -> dict[str, Any]:
        if not Path(local_path).is_file():
            return {"exit_code": -1, "output": f"Local file not found: {local_path}"}
        try:
            self._on(lambda c: c.upload_file(local_path, remote_path))
        except (OSError, ValueError) as exc:
            return {"exit_code": -1, "output": _error(exc)}
        return {"exit_code": 0, "output": ""}

    def upload_dir(self, local_dir: str, remote_dir: str) -> list[dict[str, Any]]:
        if not Path(local_dir).is_dir():
            return [{"exit_code": -1, "output": f"Local directory not found: {local_dir}"}]
        try:
            written = self._on(lambda c: c.upload_dir(local_dir, remote_dir))
        except (OSError, ValueError) as exc:
            return [{"exit_code": -1, "output": _error(exc)}]
        return [{"exit_code": 0, "output": path} for path in written]

    def download_file(self, remote_path: str, local_path: str) -> dict[str, Any]:
        try:
            out = self._on(lambda c: c.download_file(remote_path, local_path))
        except (OSError, ValueError) as exc:
            return {"success": False, "error": _error(exc)}
        return {"success": True, "bytes": out.stat().st_size}

    def download_dir(self, remote_dir: str, local_dir: str) -> list[dict[str, Any]]:
        try:
            paths = self._on(lambda c: c.download_dir(remote_dir, local_dir))
        except (OSError, ValueError) as exc:
            return [{"success": False, "error": _error(exc)}]
        return [{"success": True, "bytes": p.stat().st_size} for p in paths]

    def search(self, query: str, path: str = ".") -> dict[str, Any]:
        try:
            hits = self._on(lambda c: c.search(query, path))
        except (OSError, ValueError, RuntimeError) as exc:
            return {"error": _error(exc)}
        return {"matches": [{"path": h.path, "line": h.line, "content": h.text} for h in hits]}

    # -- web, browser, any tool

    def web_search(self, query: str) -> dict[str, Any]:
        return self._tool_json("web_search", {"query": query})

    def web_extract(self, urls: list[str]) -> dict[str, Any]:
        return self._tool_json("web_extract", {"urls": list(urls)})

    def browser_navigate(self, url: str) -> dict[str, Any]:
        return self._tool_json("browser_navigate", {"url": url})

    def browser_snapshot(self) -> dict[str, Any]:
        return self._tool_json("browser_snapshot", {})

    def call_tool(self, tool_name: str, arguments: dict[str, Any]) -> str:
        """The tool's raw result text (an unknown or unconfigured tool: a JSON error)."""
        try:
            out = self._on(lambda c: c.call_tool(tool_name, arguments))
        except KeyError as exc:
            return json.dumps({"error": str(exc.args[0]) if exc.args else str(exc)})
        return str(out.content)

    def _tool_json(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return _json_or_error(self.call_tool(name, args))

    def cleanup(self) -> None:
        """Release the rollout: for a ``ToolContext(task_id)``, its sandbox closes (as the seed's
        cleanup); for the judge's, what the rollout left running is stopped (the judge closes the
        sandbox afterwards). Safe from any thread, and more than once."""
        if self._runtime is not None:
            self._runtime.release(self.task_id)
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:  # nothing to wait for here: the judge stops and closes it
            return
        assert self._ctx is not None
        self._run(self._ctx.stop_processes)


__all__ = ["ToolContext"]
