"""Rollouts of an environment: one item -> one judged :class:`Episode`; a group of them.

Each rollout draws its own toolsets (seeded from the run seed and the rollout's key, recorded)
and gets its own sandbox. The reward runs inside :func:`run_session`'s ``inspect`` hook: after
the loop ended, before the sandbox is closed (and so before a reused sandbox is reset), after
the rollout's leftover processes were stopped and the verifier files were put in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trajforge.agent import AgentConfig, AgentResult, Termination, run_session
from trajforge.distributions import derive_seed, sample_toolsets
from trajforge.envs.judge import Judgement, judge, registry_tools
from trajforge.envs.limiter import ResizableLimiter
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.types import Episode, Item, RewardBreakdown, TokenRecord
from trajforge.llm.chat_template import ChatTemplate
from trajforge.llm.token_trace import TraceError, TurnSpan
from trajforge.llm.types import SamplingParams
from trajforge.protocols import ChatModel, Sandbox, SandboxFactory
from trajforge.sandbox.confined import DataPathError
from trajforge.sandbox.errors import SandboxStartError, SandboxUnavailableError
from trajforge.sandbox.templates import TemplateGone, supports_templates
from trajforge.tools.base import Tool
from trajforge.tools.registry import ToolRegistry

log = logging.getLogger(__name__)

DEFAULT_TOOLSETS = ("terminal", "file")

ModelFor = Callable[[AgentEnv, Item], ChatModel]
"""Picks the model of one rollout (the oracle agent is a model per item)."""


@dataclass
class RolloutBackends:
    """What rollouts run on. ``template`` (the model's chat template) makes token traces carry a
    drift report; a token-level model (``CompletionChatModel``) brings its own."""

    model: ChatModel
    factory: SandboxFactory
    registry: ToolRegistry
    template: ChatTemplate | None = None
    model_for: ModelFor | None = None


@dataclass
class Rollouts:
    """Runs an env's rollouts with bounded, resizable concurrency."""

    env: AgentEnv
    backends: RolloutBackends
    slots: ResizableLimiter = field(init=False)  # sized from the env config, resizable while running

    def __post_init__(self) -> None:
        self.slots = ResizableLimiter(self.env.config.max_concurrent_rollouts)
        self._tools_by_name = registry_tools(self.backends.registry)

    async def resize(self, *, rollouts: int | None = None, tools_per_rollout: int | None = None) -> None:
        """Change concurrency while running: rollouts at once, and tool calls within a rollout
        (taken by rollouts that start after the change)."""
        if rollouts is not None:
            await self.slots.resize(rollouts)
        if tools_per_rollout is not None:
            self.env.config = self.env.config.model_copy(update={"max_parallel_tools": tools_per_rollout})

    def report(self) -> dict[str, Any]:
        return {"rollouts": self.slots.report(), "tools_per_rollout": self.env.config.max_parallel_tools}

    # ------------------------------------------------------------------ one rollout

    def toolsets(self, seed: int) -> list[str]:
        cfg = self.env.config
        if cfg.distribution is not None:
            drawn = sample_toolsets(cfg.distribution, random.Random(seed))
        else:
            drawn = list(cfg.enabled_toolsets if cfg.enabled_toolsets is not None else DEFAULT_TOOLSETS)
        return [t for t in drawn if t not in cfg.disabled_toolsets]

    def agent_config(self, seed: int) -> AgentConfig:
        cfg = self.env.config
        system = getattr(self.env, "system_prompt", None)
        return AgentConfig(
            max_turns=cfg.max_agent_turns,
            sampling=SamplingParams(
                temperature=cfg.agent_temperature,
                max_tokens=cfg.max_tokens,
                seed=seed,
                extra_body=dict(cfg.extra_body),
            ),
            system_prompt=system() if callable(system) else cfg.system_prompt,
            max_parallel_tools=cfg.max_parallel_tools,
            session_timeout_s=cfg.sandbox_lifetime_s,
        )

    async def episode(
        self, item: Item, *, rollout: int = 0, group_size: int = 1, seed: int | None = None
    ) -> Episode:
        env = self.env
        item_id = env.item_id(item)
        seed = (
            derive_seed(env.config.seed, f"{item_id}#{rollout}") & ((1 << 63) - 1) if seed is None else seed
        )
        toolsets = self.toolsets(seed)
        tools = self.backends.registry.for_toolsets(toolsets)
        draw = _Draw(item, item_id, rollout, group_size, seed, toolsets, tools, time.monotonic())
        model = self.backends.model_for(env, item) if self.backends.model_for else self.backends.model
        judged = Judgement()
        async with self.slots:
            try:
                result = await run_session(
                    env.format_prompt(item),
                    model=model,
                    tools=tools,
                    sandbox_factory=_prepared(self.backends.factory, env, item),
                    config=self.agent_config(seed),
                    task_id=f"{env.name}-{_safe(item_id)}-{rollout}-{seed % 10**6}",
                    setup_files=_as_bytes(env.setup_files(item)),
                    inspect=lambda res, box: self._judge(item, res, box, judged),
                )
            except DataPathError as exc:  # the item names a path it may not (a bad setup file name)
                return Episode(
                    **self._fields(draw),
                    messages=[],
                    status="failed",
                    reason=f"bad item: {exc}",
                    termination="not_run",
                    reward=0.0,
                    reward_reason="not judged: the item cannot run",
                    reward_error=str(exc),
                )
            except (SandboxUnavailableError, OSError) as exc:
                return Episode(
                    **self._fields(draw),
                    messages=[],
                    status="failed",
                    reason=f"sandbox: {exc}",
                    termination="not_run",
                    reward=0.0,
                    reward_reason="not judged: the sandbox failed",
                    reward_error=str(exc),
                )
        return self._record(draw, result, judged, model)

    async def _judge(self, item: Item, result: AgentResult, sandbox: Sandbox, judged: Judgement) -> None:
        await judge(self.env, item, result, sandbox, tools=self._tools_by_name, into=judged)

    def _fields(self, draw: _Draw) -> dict[str, Any]:
        """What every episode record of this draw says, however it ended."""
        return {
            "env": self.env.name,
            "item_id": draw.item_id,
            "rollout": draw.rollout,
            "group_size": draw.group_size,
            "seed": draw.seed,
            "category": self.env.category(draw.item),
            "item": draw.item,
            "toolsets": draw.toolsets,
            "tools": [t.name for t in draw.tools],
            "wall_s": round(time.monotonic() - draw.started, 4),
            "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds"),
        }

    def _record(self, draw: _Draw, result: AgentResult, judged: Judgement, model: ChatModel) -> Episode:
        schemas = self.backends.registry.schemas(draw.tools)
        trace, trace_error = None, None
        if result.token_traces:
            template = getattr(model, "template", None) or self.backends.template
            try:
                et = result.episode_trace(template, tools=schemas)
                trace = TokenRecord(
                    tokens=et.tokens,
                    masks=et.masks,
                    logprobs=et.logprobs,
                    token_advantages=judged.breakdown.token_advantages if judged.breakdown else None,
                    span_versions=_span_versions(et.spans),
                )
            except TraceError as exc:
                trace_error = str(exc)
        status, reason = _status(result)
        bd = judged.breakdown or RewardBreakdown(reward=0.0, reason="not judged")
        return Episode(
            **self._fields(draw),
            messages=result.messages,
            status=status,
            reason=reason,
            termination=result.termination.value,
            turns=result.turns_used,
            reward=bd.reward,
            reward_components=bd.components,
            reward_reason=bd.reason,
            reward_error=judged.error,
            trace=trace,
            trace_error=trace_error,
            kept=judged.kept,
            model=result.model or model.name,
            reward_s=round(judged.seconds, 4),
            usage=result.usage.model_dump(),
            model_s=round(result.model_time_s, 4),
            tool_s=round(result.tool_time_s, 4),
        )

    # ------------------------------------------------------------------ groups

    async def group(self, item: Item, size: int | None = None, *, first_rollout: int = 0) -> list[Episode]:
        """``size`` rollouts of one item at once (each its own draw and sandbox)."""
        size = size or self.env.config.group_size
        return list(
            await asyncio.gather(
                *(self.episode(item, rollout=first_rollout + r, group_size=size) for r in range(size))
            )
        )


def _span_versions(spans: list[TurnSpan]) -> list[tuple[int, int, int]] | None:
    """Each sampled turn's ``(start, end, version)``, or None unless the server named every one."""
    if not spans or any(s.model_version is None for s in spans):
        return None
    return [(s.start, s.end, int(s.model_version or 0)) for s in spans]


def _prepared(factory: SandboxFactory, env: AgentEnv, item: Item) -> SandboxFactory:
    """Optional env hooks (helper-added for terminal_bench; neither is part of ``AgentEnv``):
    ``sandbox_image(item)`` picks the image of a docker sandbox (a per-task built image), and
    ``async prepare_sandbox(item, sandbox)`` runs in the fresh sandbox before the rollout and
    before ``setup_files`` are written (a Dockerfile's COPY/RUN steps). A prepare that fails is
    a sandbox start failure: the episode fails with the reason, it is not scored."""
    prepare = getattr(env, "prepare_sandbox", None)
    image_of = getattr(env, "sandbox_image", None)
    key_of = getattr(env, "template_key", None)
    if prepare is not None and key_of is not None and image_of is None and supports_templates(factory):
        key = key_of(item)
        if key is not None:
            return _TemplatedFactory(factory, f"{env.name}:{key}", prepare, item)
    if prepare is None and image_of is None:
        return factory
    return _PreparingFactory(factory, prepare, image_of(item) if image_of else None, item)


@dataclass
class _TemplatedFactory:
    """An env whose ``template_key(item)`` names a shared starting state: ``prepare_sandbox`` runs
    once per key, in the template the factory keeps, and every rollout of that key (a GRPO group's
    G, the same item again later) forks its sandbox from it (``sandbox.templates``)."""

    inner: Any
    key: str
    prepare: Callable[[Item, Sandbox], Awaitable[None]]
    item: Item

    async def create(self, task_id: str, *, image: str | None = None, cwd: str | None = None) -> Sandbox:
        while True:
            try:
                template = await self.inner.template(self.key, setup=self._setup)
            except SandboxUnavailableError:
                raise
            except Exception as exc:
                raise SandboxStartError(f"preparing the sandbox template failed: {exc}") from exc
            with contextlib.suppress(TemplateGone):  # evicted in between: prepared again
                sandbox: Sandbox = await self.inner.create(task_id, template=template)
                return sandbox

    async def _setup(self, sandbox: Sandbox) -> None:
        await self.prepare(self.item, sandbox)


@dataclass
class _PreparingFactory:
    inner: SandboxFactory
    prepare: Callable[[Item, Sandbox], Awaitable[None]] | None
    image: str | None
    item: Item

    async def create(self, task_id: str, *, image: str | None = None, cwd: str | None = None) -> Sandbox:
        sandbox = await self.inner.create(task_id, image=image or self.image, cwd=cwd)
        if self.prepare is None:
            return sandbox
        try:
            await self.prepare(self.item, sandbox)
        except Exception as exc:
            await sandbox.close()
            if isinstance(exc, SandboxUnavailableError):
                raise
            raise SandboxStartError(f"preparing the sandbox failed: {exc}") from exc
        except BaseException:
            await sandbox.close()
            raise
        return sandbox


@dataclass(frozen=True)
class _Draw:
    """One rollout's identity: its item, place in the group, seed and the tools it drew."""

    item: Item
    item_id: str
    rollout: int
    group_size: int
    seed: int
    toolsets: list[str]
    tools: list[Tool]
    started: float


_FAILED = {Termination.MODEL_ERROR, Termination.CANCELLED}


def _status(result: AgentResult) -> tuple[str, str | None]:
    if result.termination is Termination.FINAL_ANSWER:
        return "completed", None
    if result.termination in _FAILED:
        return "failed", result.error or result.termination.value
    return "partial", result.error or result.termination.value


def _as_bytes(files: Mapping[str, bytes | str]) -> dict[str, bytes]:
    return {path: data.encode() if isinstance(data, str) else bytes(data) for path, data in files.items()}


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:48]


EpisodeSink = Callable[[Episode], Awaitable[None]]
