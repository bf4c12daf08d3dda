"""The dataset front end of the engine, and one worker: up to ``concurrency`` rollouts at once.

:class:`BatchPlanner` turns a dataset row (a :class:`~.dataset.Sample`) into the engine's
:class:`~trajforge.engine.Plan` and its finished rollout into the line the shard writer commits;
:class:`Worker` runs a list of them on the engine (:class:`~trajforge.engine.Engine`: slots
taken as they free, so a slow sample only holds its own; background sandbox teardowns) and
commits each as it finishes. Each attempt is the one rollout step
(:func:`trajforge.rollout.run_rollout`: draw, sandbox, session, judge with ``--env``, trace,
status) and has a deadline. Only infrastructure failures are retried (``--max-attempts``, with
exponential backoff and jitter): a transient model error (429/5xx/timeouts/malformed bodies,
after the client's own retries) or a sandbox that could not start. What the agent did
(answered, ran out of turns, called a tool it was not offered) is an outcome, never retried.
The same planner runs on a Ray actor (:mod:`.ray_backend`).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajforge.agent import AgentConfig
from trajforge.batch.backends import Backends
from trajforge.batch.config import BatchConfig
from trajforge.batch.dataset import Sample
from trajforge.batch.records import batch_line
from trajforge.batch.writer import SHARDS_DIR, Finished, ShardWriter, find_output_error, open_ledger
from trajforge.distributions import derive_seed, get_distribution
from trajforge.engine import Engine, Plan, Ran, RetryPolicy
from trajforge.envs.catalog import load_grader
from trajforge.envs.judge import EnvJudge, registry_tools
from trajforge.envs.protocol import AgentEnv
from trajforge.llm.types import AssistantTurn, SamplingParams
from trajforge.protocols import ChatModel, SandboxFactory
from trajforge.rollout import (
    Asked,
    Identity,
    RolloutBackends,
    RolloutOutcome,
    RolloutRequest,
    draw_toolsets,
    seeded,
    sent_sampling,
)
from trajforge.rollout.gc_policy import rollout_gc
from trajforge.rollout.step import HARD_DEADLINE_GRACE_S
from trajforge.sandbox import factory_counts
from trajforge.sandbox.layout import AgentFile
from trajforge.sandbox.templates import ForkingFactory, supports_templates
from trajforge.tools.registry import ToolRegistry


@dataclass
class WorkerSpec:
    """What one worker process needs; picklable (it crosses into spawned processes)."""

    config: BatchConfig
    worker_id: int
    session: int
    samples: list[Sample]
    run_tools: list[str]
    prefill: list[dict[str, Any]] = field(default_factory=list)
    # The exec agent the parent's preflight built (the native one compiled there): a worker
    # process on this machine runs it instead of compiling its own. None: build as usual.
    sandbox_agent: AgentFile | None = None

    @property
    def owner(self) -> str:
        return f"s{self.session:04d}-w{self.worker_id:03d}"


def build_agent_config(cfg: BatchConfig, prefill: list[dict[str, Any]]) -> AgentConfig:
    return AgentConfig(
        max_turns=cfg.max_turns,
        sandbox_start=cfg.sandbox_start,
        sampling=cfg.sampling(),
        system_prompt=cfg.system_prompt,
        ephemeral_system_prompt=cfg.ephemeral_system_prompt,
        prefill_messages=prefill,
        session_timeout_s=cfg.sample_timeout,
        tool_limits=cfg.tool_limits(),
    )


@dataclass
class Activity:
    """What an in-process worker's rollouts have done so far, counted as it happens: model calls
    answered and tokens generated. The display shows it while no sample is done yet (a batch on a
    CPU model spends its first minute there; "0/20 first samples in flight" alone said nothing)."""

    model_calls: int = 0
    tokens: int = 0
    #: answers whose endpoint did not say how many tokens it generated: the count is then a floor
    tokens_unknown: int = 0

    def text(self) -> str:
        if not self.model_calls:
            return ""
        if self.tokens_unknown == self.model_calls:
            return f"{self.model_calls} model calls answered"
        at_least = "at least " if self.tokens_unknown else ""
        return f"{self.model_calls} model calls answered, {at_least}{self.tokens:,} tokens generated"


class _Counted:
    """``model`` with every answer counted into an :class:`Activity`; everything else its own."""

    def __init__(self, model: ChatModel, activity: Activity) -> None:
        self._model = model
        self._activity = activity

    @property
    def name(self) -> str:
        return self._model.name

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
    ) -> AssistantTurn:
        turn = await self._model.complete(messages, tools, sampling)
        self._activity.model_calls += 1
        if turn.usage.completion_tokens is None:  # unknown is not zero (llm.types.Usage)
            self._activity.tokens_unknown += 1
        else:
            self._activity.tokens += turn.usage.completion_tokens
        return turn

    async def aclose(self) -> None:
        await self._model.aclose()

    def __getattr__(self, name: str) -> Any:  # the token-level client's template, and the like
        return getattr(self._model, name)


class BatchPlanner:
    """Dataset rows -> the engine's plans; finished rollouts -> batch lines. One per worker (or
    Ray actor): it holds the worker's agent settings, distribution and ``--env`` grader."""

    def __init__(self, spec: WorkerSpec, registry: ToolRegistry) -> None:
        self.spec = spec
        self.cfg = spec.config
        self.registry = registry
        self.agent_config = build_agent_config(self.cfg, spec.prefill)
        self._dist = get_distribution(self.cfg.distribution_name) if self.cfg.distribution_name else None
        # --env: each sample is judged in its sandbox before the sandbox is closed or reset.
        self.grader: AgentEnv | None = load_grader(self.cfg.env) if self.cfg.env else None
        self._verifier_tools = registry_tools(registry) if self.grader else {}

    def plan(self, sample: Sample) -> Plan:
        cfg = self.cfg
        seed = derive_seed(cfg.seed, sample.key)
        drawn = draw_toolsets(seed, distribution=self._dist, enabled=cfg.toolsets)
        # recorded as offered: a drawn toolset with no tool configured here gave the model nothing
        toolsets = [t for t in drawn if self.registry.for_toolsets([t])]
        agent = seeded(self.agent_config, seed)
        grader = self.grader
        item = sample_item(sample)

        def request(attempt: int) -> RolloutRequest:
            setup_files: dict[str, str | bytes] | None = dict(sample.setup_files or {}) or None
            judge = None
            if grader is not None:
                judge = EnvJudge(grader, item, self._verifier_tools)
                # the env reads the row: a host path in it is refused here (DataPathError)
                setup_files = {**grader.setup_files(item), **(setup_files or {})}
            return RolloutRequest(
                sample.prompt,
                seed,
                toolsets,
                agent,
                task_id=f"{sample.key}-{attempt}",
                image=sample.image,
                cwd=sample.cwd,
                setup_files=setup_files,
                judge=judge,
                filters=True,
                require_reasoning=cfg.require_reasoning,
                hard_deadline_s=cfg.sample_timeout + HARD_DEADLINE_GRACE_S,
            )

        def settle(done: RolloutOutcome) -> None:
            if done.outcome.reason_kind == "bad_row":
                detail = done.outcome.reason.removeprefix("bad_row: ")
                done.outcome.reason = (
                    f"bad_row: row {sample.index + 1} (prompt_index {sample.index}): {detail}"
                )

        who = Identity(
            key=sample.key,
            item=item,
            prompt_index=sample.index,
            rollout=sample.sample_index,
            group_size=cfg.samples_per_prompt,
            env=cfg.env,
            item_id=grader.item_id(item) if grader is not None else None,
            category=grader.category(item) if grader is not None else None,
        )
        asked = Asked(cfg.model, sent_sampling(agent), cfg.system_prompt, self.spec.worker_id)
        return Plan(
            who,
            asked,
            seed,
            toolsets,
            request,
            settle=settle,
            pad=self.spec.run_tools,
            judged=grader is not None,
        )

    def finished(self, sample: Sample, ran: Ran) -> Finished:
        """The line the shard writer commits for ``sample``."""
        done = ran.done
        line, summary = batch_line(
            ran.record, done.schemas, started=done.started_at, finished=done.finished_at
        )
        return Finished(sample.key, done.outcome.status, done.outcome.reason, line, summary)


def batch_engine(
    cfg: BatchConfig, model: ChatModel, factory: SandboxFactory, registry: ToolRegistry
) -> Engine:
    """The engine a worker (or Ray actor) runs its samples on."""
    if cfg.samples_per_prompt > 1 and supports_templates(factory):
        # The N samples of a row with a ``cwd`` fork from one template of that directory
        # instead of copying it N times (sandbox.templates).
        factory = ForkingFactory(factory)
    return Engine(
        RolloutBackends(model, factory, registry, getattr(model, "template", None)),
        cfg.concurrency,
        RetryPolicy(cfg.max_attempts, cfg.retry_backoff),
    )


class Worker:
    """Runs a list of samples; every one ends committed with a status, or stays pending if the
    worker is cancelled (and then runs again on resume)."""

    def __init__(
        self,
        spec: WorkerSpec,
        backends: Backends,
        registry: ToolRegistry,
        writer: ShardWriter,
        activity: Activity | None = None,
    ) -> None:
        model: ChatModel = backends.model if activity is None else _Counted(backends.model, activity)
        self.planner = BatchPlanner(spec, registry)
        self.engine = batch_engine(spec.config, model, backends.sandbox_factory, registry)
        self.writer = writer
        self.samples = spec.samples

    async def run(self) -> None:
        planner, writer = self.planner, self.writer

        def done(sample: Sample, ran: Ran) -> None:
            writer.submit(planner.finished(sample, ran))

        await self.engine.run_all(self.samples, planner.plan, done, started=lambda s: writer.started(s.key))


def sample_item(sample: Sample) -> dict[str, Any]:
    """The env item a dataset row stands for: the row itself (prompt, setup files and every
    other field), what ``compute_reward`` reads."""
    item: dict[str, Any] = {**(sample.extra or {}), "prompt": sample.prompt}
    if sample.setup_files is not None:
        item["setup_files"] = dict(sample.setup_files)
    return item


async def run_worker(
    spec: WorkerSpec, backends: Backends, registry: ToolRegistry, activity: Activity | None = None
) -> int:
    """Run one worker to the end on ``backends`` (the caller's to close); returns how many
    samples it committed. ``activity``: counted as the rollouts go (an in-process worker's)."""
    ledger = open_ledger(spec.config.run_dir)
    try:
        writer = ShardWriter(ledger, _shard(spec), spec.owner, fsync=spec.config.fsync)
        writer.sandbox_counts = functools.partial(factory_counts, backends.sandbox_factory)
        with rollout_gc():
            await _run_with_writer(Worker(spec, backends, registry, writer, activity), writer)
    finally:
        ledger.close()
    return writer.committed


def _shard(spec: WorkerSpec) -> Path:
    return spec.config.run_dir / SHARDS_DIR / f"{spec.owner}.jsonl"


async def _run_with_writer(worker: Worker, writer: ShardWriter) -> None:
    """The worker's rollouts and its writer's commit loop, the writer drained at the end."""
    try:
        async with asyncio.TaskGroup() as tg:
            writer_task = tg.create_task(writer.run())
            try:
                await worker.run()
            finally:
                writer.close()
            await writer_task
    except BaseExceptionGroup as group:
        # A shard or ledger write failed (disk full, ...): that is the error to report.
        found = find_output_error(group)
        if found is None:
            raise
        raise found from None
