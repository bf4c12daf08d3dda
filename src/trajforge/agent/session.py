"""``run_session``: one prompt -> one sandbox -> one ``AgentResult``, sandbox always closed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

from trajforge.agent.config import AgentConfig
from trajforge.agent.loop import AgentLoop
from trajforge.agent.result import AgentResult
from trajforge.protocols import ChatModel, Sandbox, SandboxFactory
from trajforge.sandbox.confined import DataPathError, name_problem
from trajforge.tools.base import Tool, ToolContext
from trajforge.tools.registry import ToolRegistry

Closer = Callable[[Coroutine[Any, Any, None]], object]
Inspector = Callable[[AgentResult, Sandbox], Awaitable[None]]


async def run_session(
    prompt: str | list[dict[str, Any]],
    *,
    model: ChatModel,
    sandbox_factory: SandboxFactory,
    tools: Sequence[Tool] | None = None,
    registry: ToolRegistry | None = None,
    toolsets: Sequence[str] = (),
    config: AgentConfig | None = None,
    task_id: str = "task",
    image: str | None = None,
    cwd: str | None = None,
    setup_files: Mapping[str, str | bytes] | None = None,
    closer: Closer | None = None,
    inspect: Inspector | None = None,
) -> AgentResult:
    """Run a fresh agent (no memory, no context files) in its own sandbox.

    The model is offered ``tools`` -- resolved once by a caller that also needs them (the batch
    scheduler records their schemas) -- or, for a one-off session, ``registry``'s tools of
    ``toolsets``.

    ``setup_files`` (relative path -> text or bytes) are written into the sandbox before the first turn.
    Their names come from data (a dataset row, an env item): one the sandbox cannot hold (a NUL, a
    component over 255 bytes, ``..``, absolute, no file named) raises ``DataPathError`` before
    anything starts -- the data's fault, not the sandbox's, so never retried as one.
    A sandbox that fails to start raises ``SandboxStartError`` (an infrastructure failure the
    caller may retry); everything else ends up in the returned result.

    ``closer`` takes ownership of the sandbox's teardown coroutine (e.g. ``task_group.create_task``)
    so a caller with many rollouts does not wait for the teardown before its next one; without it
    the teardown is awaited here.

    ``inspect`` is awaited with the result and the rollout's sandbox after the loop ended and
    before the sandbox is closed (and so before a reused one is reset): reward code judges what
    *this* rollout left behind. The sandbox is started for it even if no tool ran.
    """
    offered = _offered(tools, registry, toolsets)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    cfg = config or AgentConfig()
    files = setup_files or {}
    for name in files:
        problem = name_problem(name)
        if problem:
            shown = repr(name) if len(name) <= 80 else f"{name[:60]!r}... ({len(name)} characters)"
            raise DataPathError(f"setup file name {shown} {problem}")

    def start() -> Coroutine[Any, Any, Sandbox]:
        return _start(sandbox_factory, task_id, image, cwd, files)

    starting: asyncio.Task[Sandbox] | None = None
    if cfg.sandbox_start == "eager" or files:
        # The sandbox starts while the first model call is in flight: its start-up (processes,
        # namespaces) is hidden behind the model's latency instead of added to it. (Setup files
        # are part of the task: they are in place before the model could look.)
        starting = asyncio.create_task(start(), name=f"sandbox-start-{task_id}")
        ctx = ToolContext(task_id=task_id, starting=starting, limits=cfg.tool_limits)
    else:  # lazy: the first tool call (or the reward's inspection) starts it
        ctx = ToolContext(task_id=task_id, start=start, limits=cfg.tool_limits)
    try:
        result = await AgentLoop(model, offered, ctx, config).run(messages)
        if inspect is not None:
            sandbox = await ctx.ensure_sandbox()
            assert sandbox is not None  # a session always starts one
            await inspect(result, sandbox)
        return result
    finally:
        task = starting or ctx.started  # None: a lazy sandbox that was never needed
        if closer is None:
            await _teardown(ctx, task)
        else:
            closer(_teardown(ctx, task))


def _offered(
    tools: Sequence[Tool] | None, registry: ToolRegistry | None, toolsets: Sequence[str]
) -> Sequence[Tool]:
    if tools is not None and registry is None:
        return tools
    if registry is not None and tools is None:
        return registry.for_toolsets(toolsets)
    raise TypeError("run_session takes either tools or a registry (with toolsets), not both or neither")


async def _start(
    factory: SandboxFactory,
    task_id: str,
    image: str | None,
    cwd: str | None,
    setup_files: Mapping[str, str | bytes],
) -> Sandbox:
    """A new sandbox with ``setup_files`` written in (closed again if writing them fails)."""
    sandbox = await factory.create(task_id, image=image, cwd=cwd)
    try:
        for path, content in setup_files.items():
            await sandbox.write_bytes(path, content.encode() if isinstance(content, str) else content)
    except BaseException:
        await sandbox.close()
        raise
    return sandbox


async def _teardown(ctx: ToolContext, starting: asyncio.Task[Sandbox] | None) -> None:
    """End the rollout: the tools' own state (a browser context), then the sandbox."""
    try:
        await ctx.aclose()
    finally:
        await _dispose(starting)


async def _dispose(starting: asyncio.Task[Sandbox] | None) -> None:
    """Close the sandbox if it started; cancel its start if it is still starting."""
    if starting is None:
        return
    if not starting.done():
        starting.cancel()
    try:
        sandbox = await starting
    except (asyncio.CancelledError, Exception):  # never started: nothing to close
        return
    await sandbox.close()
