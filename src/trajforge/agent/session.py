"""``run_session``: one prompt -> one sandbox -> one ``AgentResult``, sandbox always closed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trajforge.agent.config import AgentConfig
from trajforge.agent.loop import AgentLoop
from trajforge.agent.result import AgentResult
from trajforge.protocols import ChatModel, SandboxFactory
from trajforge.tools.base import ToolContext
from trajforge.tools.registry import ToolRegistry


async def run_session(
    prompt: str | list[dict[str, Any]],
    *,
    model: ChatModel,
    registry: ToolRegistry,
    toolsets: Sequence[str],
    sandbox_factory: SandboxFactory,
    config: AgentConfig | None = None,
    task_id: str = "task",
    image: str | None = None,
    cwd: str | None = None,
    setup_files: dict[str, str] | None = None,
) -> AgentResult:
    """Run a fresh agent (no memory, no context files) in its own sandbox.

    ``setup_files`` (relative path -> text) are written into the sandbox before the first turn.
    Sandbox creation failures propagate (they are infrastructure failures the caller may retry);
    everything after that ends up in the returned result.
    """
    tools = registry.for_toolsets(toolsets)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    sandbox = await sandbox_factory.create(task_id, image=image, cwd=cwd)
    try:
        for path, content in (setup_files or {}).items():
            await sandbox.write_bytes(path, content.encode())
        loop = AgentLoop(model, tools, ToolContext(task_id=task_id, sandbox=sandbox), config)
        return await loop.run(messages)
    finally:
        await sandbox.close()
