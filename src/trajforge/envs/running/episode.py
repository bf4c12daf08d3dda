"""Rollouts of an environment: one item -> one judged :class:`Episode`; a group of them.

Each rollout is keyed by the one rule ``batch`` keys its rows with (:mod:`trajforge.record.keys`:
the item's content and occurrence, ``#ROLLOUT`` in a group), draws its own toolsets (seeded from
the run seed and that key, recorded; the same seed is sent with every model call)
and gets its own sandbox; the rollout itself is the one step every rollout takes
(:func:`trajforge.rollout.run_rollout`), judged by the env (:class:`~trajforge.envs.judge.EnvJudge`)
inside the session's ``inspect`` hook: after the loop ended, before the sandbox is closed (and so
before a reused sandbox is reset), after the rollout's leftover processes were stopped and the
verifier files were put in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trajforge.agent import AgentConfig
from trajforge.distributions import derive_seed
from trajforge.engine import Engine, Plan, ResizableLimiter
from trajforge.envs.hooks import (
    prepare_sandbox_hook,
    sandbox_config_hook,
    sandbox_image_hook,
    system_prompt_hook,
    template_key_hook,
)
from trajforge.envs.judge import EnvJudge, mark_never_reached, registry_tools
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.types import Episode, Item
from trajforge.llm.types import SamplingParams
from trajforge.protocols import ChatModel, Sandbox, SandboxFactory
from trajforge.record.keys import key_of, rollout_key
from trajforge.rollout import (
    Asked,
    Identity,
    Outcome,
    RolloutOutcome,
    RolloutRequest,
    draw_toolsets,
    seeded,
    sent_sampling,
)
from trajforge.rollout import RolloutBackends as StepBackends
from trajforge.sandbox.errors import SandboxStartError, SandboxUnavailableError
from trajforge.sandbox.templates import TemplateGone, supports_templates
from trajforge.sandbox.types import SandboxConfig

log = logging.getLogger(__name__)

DEFAULT_TOOLSETS = ("terminal", "file")
ModelFor = Callable[[AgentEnv, Item], ChatModel]
"""Picks the model of one rollout (the oracle agent is a model per item)."""


@dataclass
class RolloutBackends(StepBackends):
    """What an env's rollouts run on: the rollout step's backends (model, sandbox factory, tool
    registry, chat template) and, for agents that are a model per item (the oracle), ``model_for``."""

    model_for: ModelFor | None = field(default=None, kw_only=True)


@dataclass
class Rollouts:
    """An env's front end of the engine (:class:`~trajforge.engine.Engine`): an item and its place
    in a group -> a :class:`~trajforge.engine.Plan` -> one judged :class:`Episode`, with the env's
    bounded, resizable concurrency."""

    env: AgentEnv
    backends: RolloutBackends
    engine: Engine = field(init=False)

    def __post_init__(self) -> None:
        self.engine = Engine(self.backends, self.env.config.max_concurrent_rollouts)
        self._tools_by_name = registry_tools(self.backends.registry)

    @property
    def slots(self) -> ResizableLimiter:
        return self.engine.slots

    async def resize(self, *, rollouts: int | None = None, tools_per_rollout: int | None = None) -> None:
        """Change concurrency while running: rollouts at once, and tool calls within a rollout
        (taken by rollouts that start after the change)."""
        if rollouts is not None:
            await self.engine.resize(rollouts)
        if tools_per_rollout is not None:
            self.env.config = self.env.config.model_copy(update={"max_parallel_tools": tools_per_rollout})

    def report(self) -> dict[str, Any]:
        return {"rollouts": self.slots.report(), "tools_per_rollout": self.env.config.max_parallel_tools}

    # ------------------------------------------------------------------ one rollout

    def toolsets(self, seed: int) -> list[str]:
        cfg = self.env.config
        enabled = cfg.enabled_toolsets if cfg.enabled_toolsets is not None else DEFAULT_TOOLSETS
        return draw_toolsets(
            seed, distribution=cfg.distribution, enabled=enabled, disabled=cfg.disabled_toolsets
        )

    def agent_config(self, seed: int) -> AgentConfig:
        cfg = self.env.config
        system = system_prompt_hook(self.env)
        agent = AgentConfig(
            max_turns=cfg.max_agent_turns,
            sampling=SamplingParams(
                temperature=cfg.agent_temperature, max_tokens=cfg.max_tokens, extra_body=dict(cfg.extra_body)
            ),
            system_prompt=system() if system is not None else cfg.system_prompt,
            max_parallel_tools=cfg.max_parallel_tools,
            session_timeout_s=cfg.sandbox_lifetime_s,
        )
        return seeded(agent, seed)  # sent with every call, as batch does

    def plan(
        self,
        item: Item,
        *,
        rollout: int = 0,
        group_size: int = 1,
        seed: int | None = None,
        prompt_index: int | None = None,
        prompt_key: str | None = None,
    ) -> Plan:
        """The engine's plan of one rollout of ``item`` (see :meth:`episode`)."""
        env = self.env
        item_id = env.item_id(item)
        key = rollout_key(prompt_key or key_of(item), rollout, group_size)
        seed = derive_seed(env.config.seed, key) if seed is None else seed
        toolsets = self.toolsets(seed)
        model = self.backends.model_for(env, item) if self.backends.model_for else self.backends.model
        agent = self.agent_config(seed)
        prompt = env.format_prompt(item)
        judge = EnvJudge(env, item, self._tools_by_name)
        task_id = f"{env.name}-{_safe(item_id)}-{rollout}-{seed % 10**6}"

        def request(_attempt: int) -> RolloutRequest:
            # the item's own files: one the sandbox cannot hold is the item's failure
            files = _as_bytes(env.setup_files(item))
            return RolloutRequest(
                prompt, seed, toolsets, agent, task_id=task_id, judge=judge, setup_files=files
            )

        who = Identity(
            key=key,
            item=item,
            prompt_index=prompt_index,
            rollout=rollout,
            group_size=group_size,
            env=env.name,
            item_id=item_id,
            category=env.category(item),
        )
        backends = StepBackends(
            model, _prepared(self.backends.factory, env, item), self.backends.registry, self.backends.template
        )
        return Plan(who, asked(model, agent), seed, toolsets, request, backends, _settle, judged=True)

    async def episode(
        self,
        item: Item,
        *,
        rollout: int = 0,
        group_size: int = 1,
        seed: int | None = None,
        prompt_index: int | None = None,
        prompt_key: str | None = None,
    ) -> Episode:
        """One judged rollout of ``item`` through the engine. ``prompt_index`` and
        ``prompt_key`` (default: the item's content key, first occurrence) are its place in an
        evaluation's item list (``run_episodes``); ``seed`` (default: derived from the env's seed
        and the rollout's key) is a trainer's own."""
        plan = self.plan(
            item,
            rollout=rollout,
            group_size=group_size,
            seed=seed,
            prompt_index=prompt_index,
            prompt_key=prompt_key,
        )
        return (await self.engine.run(plan)).record

    # ------------------------------------------------------------------ groups

    async def group(self, item: Item, size: int | None = None, *, first_rollout: int = 0) -> list[Episode]:
        """``size`` rollouts of one item at once (each its own draw and sandbox)."""
        size = size or self.env.config.group_size
        return list(
            await asyncio.gather(
                *(self.episode(item, rollout=first_rollout + r, group_size=size) for r in range(size))
            )
        )


def _settle(done: RolloutOutcome) -> None:
    """An env's words for an outcome: its items are its rows (``bad item``), and an episode whose
    model never answered failed to run (:func:`~trajforge.envs.judge.mark_never_reached`)."""
    if done.outcome.reason_kind == "bad_row":
        detail = done.outcome.reason.removeprefix("bad_row: ")
        done.outcome = Outcome("failed", f"bad item: {detail}", "bad_item")
    else:
        mark_never_reached(done)


def env_sandbox_config(env: AgentEnv, base: SandboxConfig) -> SandboxConfig:
    """``base`` as the env needs it: an env with an optional ``sandbox_config(base)`` hook adds
    what its commands need (yc_bench: the benchmark virtualenv read-only, its CLI on ``PATH``)."""
    hook = sandbox_config_hook(env)
    if hook is None:
        return base
    config = hook(base)
    assert isinstance(config, SandboxConfig)
    return config


def _prepared(factory: SandboxFactory, env: AgentEnv, item: Item) -> SandboxFactory:
    """Optional env hooks (:mod:`trajforge.envs.hooks`; neither is part of ``AgentEnv``):
    ``sandbox_image(item)`` picks the image of a docker sandbox (a per-task built image), and
    ``async prepare_sandbox(item, sandbox)`` runs in the fresh sandbox before the rollout and
    before ``setup_files`` are written (a Dockerfile's COPY/RUN steps). A prepare that fails is
    a sandbox start failure: the episode fails with the reason, it is not scored."""
    prepare = prepare_sandbox_hook(env)
    image_of = sandbox_image_hook(env)
    key_of = template_key_hook(env)
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


def asked(model: ChatModel, agent: AgentConfig) -> Asked:
    """How an env rollout was asked, for its record."""
    return Asked(model.name, sent_sampling(agent), agent.system_prompt)


def _as_bytes(files: Mapping[str, bytes | str]) -> dict[str, bytes]:
    return {path: data.encode() if isinstance(data, str) else bytes(data) for path, data in files.items()}


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:48]


EpisodeSink = Callable[[Episode], Awaitable[None]]
