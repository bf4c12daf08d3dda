"""The RL command-line agent: one model, the terminal/file/web tools in a sandbox, and the real
``rl`` toolset over a run manager, following the workflow of :mod:`trajforge.rl.prompt`.

A session is one :class:`RLAgent`: its sandbox (the agent's workspace, where it may write env
files; they reach the host only as data in an agent env store, and run only in their own sandbox
once the operator approved them: ``approver`` asks), its tools, and one :class:`~trajforge.tools.base.ToolContext` whose ``state`` keeps the
rl session (selected env, config being edited, runs started) across the turns of a REPL. The
conversation goes on from one :meth:`RLAgent.ask` to the next; each ask may use up to
``max_iterations`` model calls.

With ``save_trajectories`` each ask appends the conversation so far as one trajectory line (the
project's line format, :mod:`trajforge.trajectory.save`: ShareGPT ``conversations`` plus the exact
``messages``), as the seed's RL CLI saves its sessions: to that ``.jsonl`` file, or, for a
directory, to ``trajectory_samples.jsonl`` / ``failed_trajectories.jsonl`` in it by outcome. Lines
of one session share ``session_id``; a later one extends an earlier one (``task_index``).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trajforge.agent import AgentConfig, AgentResult
from trajforge.agent.loop import AgentLoop
from trajforge.protocols import ChatModel, Sandbox, SandboxFactory
from trajforge.rl.prompt import SYSTEM_PROMPT
from trajforge.rl.runs.manager import Manager
from trajforge.rl.runs.schema import RunState
from trajforge.rl.runs.tools import Approver, RLToolSettings, rl_tools
from trajforge.sandbox.types import SandboxKind
from trajforge.tools.base import Tool, ToolContext
from trajforge.tools.limits import ToolLimits
from trajforge.tools.registry import ToolRegistry
from trajforge.tools.toolsets import check_toolsets

DEFAULT_TOOLSETS = ("terminal", "file", "web", "rl")


class RLAgentConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    max_iterations: int = Field(200, ge=1, description="model calls per task (per REPL message)")
    toolsets: list[str] = Field(default_factory=lambda: list(DEFAULT_TOOLSETS))
    sandbox: SandboxKind = Field("bwrap", description="where the terminal and file tools run")
    network: bool = Field(False, description="network inside the sandbox")
    system_prompt: str = SYSTEM_PROMPT
    session_timeout_s: float | None = Field(None, gt=0, description="deadline for one task")
    max_command_timeout_s: float = Field(600.0, gt=0)
    save_trajectories: Path | None = Field(
        None,
        description="append each task's conversation as a trajectory line: to this .jsonl file, or in "
        "this directory to trajectory_samples.jsonl / failed_trajectories.jsonl by outcome",
    )

    @field_validator("save_trajectories")
    @classmethod
    def _where(cls, value: Path | None) -> Path | None:
        """Refused before any session starts when it cannot take lines."""
        if value is None:
            return None
        if value.suffix == ".jsonl" and value.is_dir():
            raise ValueError(f"{value} is a directory, not a .jsonl file: name a file or drop .jsonl")
        if value.suffix != ".jsonl" and value.exists() and not value.is_dir():
            raise ValueError(f"{value} is a file: give a .jsonl file or a directory")
        return value


class RLAgent:
    """``async with RLAgent(model, manager, settings) as agent: await agent.ask("...")``.

    ``approver`` is asked before an env the agent wrote first runs (the REPL asks the operator);
    without one only ``settings.trust_agent_envs`` or an earlier approval lets such an env run."""

    def __init__(
        self,
        model: ChatModel,
        manager: Manager,
        settings: RLToolSettings | None = None,
        config: RLAgentConfig | None = None,
        *,
        registry: ToolRegistry | None = None,
        sandbox_factory: SandboxFactory | None = None,
        approver: Approver | None = None,
    ) -> None:
        self.model = model
        self.approver = approver
        self.manager = manager
        self.settings = settings or RLToolSettings()
        self.config = config or RLAgentConfig()
        check_toolsets(self.config.toolsets)
        self._registry = registry
        self._own_registry = registry is None
        self._factory = sandbox_factory
        self._own_factory = sandbox_factory is None
        self.history: list[dict[str, Any]] = []
        self.ctx: ToolContext | None = None
        self.tools: list[Tool] = []
        self.session_id = secrets.token_hex(8)
        self._asked = 0

    async def __aenter__(self) -> RLAgent:
        from trajforge.sandbox import create_sandbox_factory
        from trajforge.sandbox.types import SandboxConfig
        from trajforge.tools.builtin import build_registry

        if self.config.save_trajectories is not None:
            await asyncio.to_thread(_trajectory_target, self.config.save_trajectories, True)
        if self._registry is None:
            self._registry = build_registry(None)
        if self._factory is None:
            self._factory = create_sandbox_factory(
                SandboxConfig(kind=self.config.sandbox, network=self.config.network)
            )
        others = [t for t in self.config.toolsets if t != "rl"]
        # The registry's rl entries are the declared placeholders; the agent offers the real ones.
        self.tools = [t for t in self._registry.for_toolsets(others) if t.toolset != "rl"]
        if "rl" in self.config.toolsets:
            self.tools += rl_tools(self.manager, self.settings, self.approver)
        starting = asyncio.create_task(self._factory.create("rl-agent"), name="rl-agent-sandbox")
        self.ctx = ToolContext(
            task_id="rl-agent",
            starting=starting,
            limits=ToolLimits(max_command_timeout_s=self.config.max_command_timeout_s),
        )
        return self

    async def ask(self, text: str) -> AgentResult:
        """One task (or REPL message): the loop runs until a final answer or the iteration budget;
        the conversation is kept for the next ask."""
        assert self.ctx is not None, "use RLAgent as an async context manager"
        cfg = AgentConfig(
            max_turns=self.config.max_iterations,
            system_prompt=self.config.system_prompt,
            session_timeout_s=self.config.session_timeout_s,
            tool_limits=ToolLimits(max_command_timeout_s=self.config.max_command_timeout_s),
        )
        messages = [*self.history, {"role": "user", "content": text}]
        result = await AgentLoop(self.model, self.tools, self.ctx, cfg).run(messages)
        self.history = [m for m in result.messages if m.get("role") != "system"]
        self._asked += 1
        if self.config.save_trajectories is not None:
            await self.save_trajectory(result)
        return result

    async def save_trajectory(self, result: AgentResult) -> Path:
        """Append ``result`` (the whole conversation so far) as one trajectory line; the file."""
        from trajforge.trajectory import to_sharegpt
        from trajforge.trajectory.save import append_jsonl, dumps_line, trajectory_line

        assert self.config.save_trajectories is not None
        extra = {
            "session_id": self.session_id,
            "task_index": self._asked - 1,
            "source": "rl_agent",
            "termination": result.termination.value,
            "toolsets_used": list(self.config.toolsets),
            "tool_stats": {k: v.model_dump() for k, v in result.tool_stats.items()},
            "api_calls": result.api_calls,
            "usage": result.usage.model_dump(),
        }
        line = trajectory_line(
            to_sharegpt(result.messages, self.tools),
            result.model or self.model.name,
            result.finished_naturally,
            result.messages,
            extra,
        )

        def write() -> Path:
            target = _trajectory_target(self.config.save_trajectories, result.finished_naturally)  # type: ignore[arg-type]
            append_jsonl(target, dumps_line(line))
            return target

        return await asyncio.to_thread(write)

    async def runs(self) -> list[RunState]:
        """Every run the manager knows (the REPL's ``status`` shortcut)."""
        return await self.manager.list_runs()

    async def __aexit__(self, *exc: object) -> None:
        from trajforge.sandbox import close_factory

        ctx, self.ctx = self.ctx, None
        if ctx is not None:
            await ctx.aclose()
            sandbox: Sandbox | None = None
            if ctx.starting is not None and not ctx.starting.done():
                ctx.starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                sandbox = ctx.sandbox or (await ctx.starting if ctx.starting is not None else None)
            if sandbox is not None:
                await sandbox.close()
        if self._own_factory and self._factory is not None:
            await close_factory(self._factory)
        if self._own_registry and self._registry is not None:
            await self._registry.aclose()


def _trajectory_target(where: Path, completed: bool) -> Path:
    """The file a session's line goes to (its directory made); a path that cannot hold one says so."""
    from trajforge.trajectory.save import trajectory_file

    target = where if where.suffix == ".jsonl" else trajectory_file(where, completed)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--save-trajectories {where}: cannot make {target.parent} ({exc})") from None
    if target.is_dir():
        raise ValueError(f"--save-trajectories {where}: {target} is a directory, not a .jsonl file")
    return target
