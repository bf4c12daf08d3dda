"""The ``Tool`` boundary: what a model may call, and the context a call runs in."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from trajforge.protocols import Sandbox
from trajforge.tools.limits import ToolLimits


@dataclass
class ToolContext:
    """Everything a tool call may touch: the rollout's own sandbox and task id.

    ``state`` is per-rollout scratch space owned by tools (the background-process table lives
    there), so two rollouts never share it and nothing global is mutated.

    ``starting`` lets the sandbox start while the first model call is in flight (see
    :func:`trajforge.agent.run_session`): the agent loop awaits :meth:`ensure_sandbox` before it
    runs any tool, so tools reach a ready one through :attr:`ready_sandbox`.

    ``limits`` bounds the durations and sizes a model may set in its tool arguments.

    A tool that opens something for the rollout outside the sandbox (a browser context) registers
    its teardown with :meth:`on_close`; whoever ends the rollout awaits :meth:`aclose`.
    """

    task_id: str
    sandbox: Sandbox | None = None  # set once started
    state: dict[str, Any] = field(default_factory=dict)
    starting: asyncio.Task[Sandbox] | None = None
    start: Callable[[], Coroutine[Any, Any, Sandbox]] | None = None
    """A lazy start (``sandbox_start: lazy``): run by the first :meth:`ensure_sandbox`."""
    started: asyncio.Task[Sandbox] | None = None
    """The task a lazy start became (kept for the rollout's teardown)."""
    limits: ToolLimits = field(default_factory=ToolLimits)
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def on_close(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Run ``closer`` when the rollout ends (see :meth:`aclose`)."""
        self.closers.append(closer)

    async def aclose(self) -> None:
        """End the rollout's tool state: the registered closers, newest first, each run even if
        another failed (a teardown failure must not leak the next one's resources)."""
        closers, self.closers = self.closers[::-1], []
        for closer in closers:
            try:
                await closer()
            except Exception:  # teardown is best effort: nothing to report it to
                continue

    @property
    def ready_sandbox(self) -> Sandbox:
        """The rollout's sandbox; a tool that needs one and runs before it started is a bug."""
        if self.sandbox is None:
            raise RuntimeError(f"the sandbox of {self.task_id} is not started (await ensure_sandbox first)")
        return self.sandbox

    async def ensure_sandbox(self) -> Sandbox | None:
        """The ready sandbox (None for sandbox-less tools); a start failure raises
        ``SandboxStartError`` (infrastructure)."""
        if self.sandbox is None and self.starting is None and self.start is not None:
            start, self.start = self.start, None
            self.starting = self.started = asyncio.create_task(start(), name=f"sandbox-start-{self.task_id}")
        if self.starting is not None:
            try:
                self.sandbox = await asyncio.shield(self.starting)
            except Exception as exc:
                from trajforge.sandbox import SandboxStartError

                raise SandboxStartError(f"the sandbox of {self.task_id} could not start: {exc}") from exc
            self.starting = None
        return self.sandbox


class ToolOutput(BaseModel):
    """Result of a tool call. ``content`` is what the model sees; ``ok`` feeds tool statistics."""

    content: str
    ok: bool = True
    error: str | None = None

    @classmethod
    def failure(cls, error: str, content: str | None = None) -> ToolOutput:
        return cls(content=content if content is not None else f"Error: {error}", ok=False, error=error)


@runtime_checkable
class Tool(Protocol):
    """A callable tool with an OpenAI function schema.

    Tool failures that the model should see are returned as ``ToolOutput.failure``; a raised
    exception is treated by the agent loop as a tool crash and also reported to the model.
    """

    @property
    def name(self) -> str: ...

    @property
    def toolset(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> dict[str, Any]: ...

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput: ...


Handler = Callable[[dict[str, Any], ToolContext], Awaitable[ToolOutput]]


@dataclass(frozen=True)
class FunctionTool:
    """A ``Tool`` built from an async function and its JSON schema."""

    name: str
    toolset: str
    description: str
    parameters: dict[str, Any]
    handler: Handler
    implemented: bool = True
    parallel_safe: bool = True

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        return await self.handler(args, ctx)


def openai_schema(tool: Tool) -> dict[str, Any]:
    """The tool as an entry of the ``tools`` list of a chat-completions request."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }
