"""The engine of one worker: up to ``concurrency`` rollouts at once on one event loop.

A fixed pool of consumer tasks pulls samples from a shared queue, so a slow sample only holds its
own slot. Each attempt is the one rollout step (:func:`trajforge.rollout.run_rollout`: draw,
sandbox, session, judge with ``--env``, trace, status) and has a deadline. Only infrastructure failures are retried, with
exponential backoff and jitter: a transient model error (429/5xx/timeouts/malformed bodies,
after the client's own retries) or a sandbox that could not start. What the agent did (answered,
ran out of turns, called a tool it was not offered) is an outcome, never retried.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajforge.agent import AgentConfig
from trajforge.batch.backends import Backends
from trajforge.batch.config import BatchConfig
from trajforge.batch.dataset import Sample
from trajforge.batch.records import batch_line
from trajforge.batch.writer import SHARDS_DIR, Finished, ShardWriter, find_output_error, open_ledger
from trajforge.cleanup import finish
from trajforge.distributions import derive_seed, get_distribution
from trajforge.envs.catalog import load_grader
from trajforge.envs.judge import EnvJudge, registry_tools
from trajforge.envs.protocol import AgentEnv
from trajforge.llm.types import AssistantTurn, SamplingParams
from trajforge.protocols import ChatModel, SandboxFactory
from trajforge.rollout import (
    Asked,
    Identity,
    Outcome,
    RolloutBackends,
    RolloutOutcome,
    RolloutRequest,
    build_record,
    draw_toolsets,
    run_rollout,
    seeded,
    sent_sampling,
)
from trajforge.rollout.gc_policy import rollout_gc
from trajforge.rollout.step import HARD_DEADLINE_GRACE_S, failure
from trajforge.sandbox import factory_counts
from trajforge.sandbox.confined import DataPathError
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
        self.spec = spec
        self.cfg = spec.config
        self.model: ChatModel = backends.model if activity is None else _Counted(backends.model, activity)
        self.factory: SandboxFactory = backends.sandbox_factory
        if self.cfg.samples_per_prompt > 1 and supports_templates(self.factory):
            # The N samples of a row with a ``cwd`` fork from one template of that directory
            # instead of copying it N times (sandbox.templates).
            self.factory = ForkingFactory(self.factory)
        self.registry = registry
        self.writer = writer
        self.agent_config = build_agent_config(self.cfg, spec.prefill)
        self._dist = get_distribution(self.cfg.distribution_name) if self.cfg.distribution_name else None
        self._queue: deque[Sample] = deque(spec.samples)
        # --env: each sample is judged in its sandbox before the sandbox is closed or reset.
        self.grader: AgentEnv | None = load_grader(self.cfg.env) if self.cfg.env else None
        self._verifier_tools = registry_tools(registry) if self.grader else {}
        self._backends = RolloutBackends(
            self.model, self.factory, registry, getattr(self.model, "template", None), self._close_later
        )
        self._teardowns: asyncio.TaskGroup | None = None
        self._closing = 0  # sandbox teardowns in flight
        self._closed = asyncio.Condition()

    def _close_later(self, teardown: Coroutine[Any, Any, None]) -> None:
        """Own a sandbox teardown in the background (see ``run``)."""
        assert self._teardowns is not None
        self._closing += 1
        self._teardowns.create_task(self._teardown(teardown))

    async def _teardown(self, teardown: Coroutine[Any, Any, None]) -> None:
        try:
            # A worker that stops early (an output error, Ctrl-C) still closes its sandboxes:
            # a close cut short leaves processes that outlive the event loop.
            await finish(teardown)
        finally:
            async with self._closed:
                self._closing -= 1
                self._closed.notify_all()

    async def run(self) -> None:
        slots = min(self.cfg.concurrency, len(self._queue))
        async with asyncio.TaskGroup() as teardowns, asyncio.TaskGroup() as tg:
            # Sandboxes are closed in the background (owned by ``teardowns``, which outlives the
            # rollouts): a slot takes its next sample while the last one's sandbox is torn down.
            self._teardowns = teardowns
            for _ in range(slots):
                tg.create_task(self._consume())

    async def _consume(self) -> None:
        while self._queue:
            # Back-pressure: never more sandboxes closing than rollouts running.
            async with self._closed:
                await self._closed.wait_for(lambda: self._closing < self.cfg.concurrency)
            if self._queue:
                await self._run_sample(self._queue.popleft())

    async def _run_sample(self, sample: Sample) -> None:
        seed = derive_seed(self.cfg.seed, sample.key)
        drawn = draw_toolsets(seed, distribution=self._dist, enabled=self.cfg.toolsets)
        # recorded as offered: a drawn toolset with no tool configured here gave the model nothing
        toolsets = [t for t in drawn if self.registry.for_toolsets([t])]
        agent = seeded(self.agent_config, seed)
        self.writer.started(sample.key)
        started = time.time()
        done, attempts = await self._attempts(sample, seed, toolsets, agent)
        done.started_at = started  # the sample's span covers its retries
        if done.outcome.reason_kind == "bad_row":
            detail = done.outcome.reason.removeprefix("bad_row: ")
            done.outcome.reason = f"bad_row: row {sample.index + 1} (prompt_index {sample.index}): {detail}"
        record = build_record(
            self._identity(sample),
            Asked(self.cfg.model, sent_sampling(agent), self.cfg.system_prompt, self.spec.worker_id),
            done,
            seed=seed,
            toolsets=toolsets,
            attempts=attempts,
            pad=self.spec.run_tools,
        )
        line, summary = batch_line(record, done.schemas, started=done.started_at, finished=done.finished_at)
        self.writer.submit(Finished(sample.key, done.outcome.status, done.outcome.reason, line, summary))

    def _identity(self, sample: Sample) -> Identity:
        item = sample_item(sample)
        grader = self.grader
        return Identity(
            key=sample.key,
            item=item,
            prompt_index=sample.index,
            rollout=sample.sample_index,
            group_size=self.cfg.samples_per_prompt,
            env=self.cfg.env,
            item_id=grader.item_id(item) if grader is not None else None,
            category=grader.category(item) if grader is not None else None,
        )

    async def _attempts(
        self, sample: Sample, seed: int, toolsets: list[str], agent: AgentConfig
    ) -> tuple[RolloutOutcome, int]:
        """Try until an attempt is not transient or ``max_attempts`` ran (backoff with jitter).
        Every try is the one rollout step; what the agent did is an outcome, never retried."""
        attempts = 0
        while True:
            attempts += 1
            done = await self._attempt(sample, seed, toolsets, agent, attempts)
            if not done.transient:
                return done, attempts
            if attempts >= self.cfg.max_attempts:
                reason = f"{done.outcome.reason} (gave up after {attempts} attempts)"
                done.outcome = Outcome("failed", reason, done.outcome.reason_kind)
                return done, attempts
            delay = self.cfg.retry_backoff * 2 ** (attempts - 1)
            await asyncio.sleep(min(delay, 60.0) * random.uniform(0.5, 1.5))

    async def _attempt(
        self, sample: Sample, seed: int, toolsets: list[str], agent: AgentConfig, n: int
    ) -> RolloutOutcome:
        grader = self.grader
        setup_files: dict[str, str | bytes] | None = dict(sample.setup_files or {}) or None
        judge = None
        if grader is not None:
            item = sample_item(sample)
            judge = EnvJudge(grader, item, self._verifier_tools)
            try:  # the env reads the row: a host path in it is refused here
                setup_files = {**grader.setup_files(item), **(setup_files or {})}
            except DataPathError as exc:
                return RolloutOutcome(failure(exc, hard_deadline=False)[0], None, [], [], judged=True)
        request = RolloutRequest(
            sample.prompt,
            seed,
            toolsets,
            agent,
            task_id=f"{sample.key}-{n}",
            image=sample.image,
            cwd=sample.cwd,
            setup_files=setup_files,
            judge=judge,
            filters=True,
            require_reasoning=self.cfg.require_reasoning,
            hard_deadline_s=self.cfg.sample_timeout + HARD_DEADLINE_GRACE_S,
        )
        return await run_rollout(request, self._backends)


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
