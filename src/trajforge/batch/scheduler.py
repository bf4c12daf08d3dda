"""The engine of one worker: up to ``concurrency`` rollouts at once on one event loop.

A fixed pool of consumer tasks pulls samples from a shared queue, so a slow sample only holds its
own slot. Each attempt has a deadline. Only infrastructure failures are retried, with
exponential backoff and jitter: a transient model error (429/5xx/timeouts/malformed bodies,
after the client's own retries) or a sandbox that could not start. What the agent did (answered,
ran out of turns, called a tool it was not offered) is an outcome, never retried.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
import traceback
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajforge.agent import AgentConfig, AgentResult, Termination, run_session
from trajforge.agent.session import Inspector
from trajforge.batch.backends import Backends
from trajforge.batch.config import BatchConfig
from trajforge.batch.dataset import Sample
from trajforge.batch.records import Grading, Outcome, SampleFacts, build_line, classify, not_judged
from trajforge.batch.writer import SHARDS_DIR, Finished, ShardWriter, find_output_error, open_ledger
from trajforge.distributions import derive_seed, get_distribution, sample_toolsets
from trajforge.envs.catalog import load_grader
from trajforge.envs.judge import Judgement, judge, registry_tools
from trajforge.envs.protocol import AgentEnv
from trajforge.llm.token_trace import TraceError
from trajforge.protocols import ChatModel, Sandbox, SandboxFactory
from trajforge.sandbox import SandboxUnavailableError, factory_counts
from trajforge.sandbox.confined import DataPathError
from trajforge.sandbox.templates import ForkingFactory, supports_templates
from trajforge.tools.base import Tool
from trajforge.tools.registry import ToolRegistry

_HARD_DEADLINE_GRACE_S = 30.0  # the loop's own session timeout should fire first


@dataclass
class WorkerSpec:
    """What one worker process needs; picklable (it crosses into spawned processes)."""

    config: BatchConfig
    worker_id: int
    session: int
    samples: list[Sample]
    run_tools: list[str]
    prefill: list[dict[str, Any]] = field(default_factory=list)

    @property
    def owner(self) -> str:
        return f"s{self.session:04d}-w{self.worker_id:03d}"


@dataclass
class AttemptResult:
    """One try at a sample: a result, or an infrastructure error, and whether to retry."""

    result: AgentResult | None
    outcome: Outcome
    transient: bool
    judged: Judgement | None = None


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


class Worker:
    """Runs a list of samples; every one ends committed with a status, or stays pending if the
    worker is cancelled (and then runs again on resume)."""

    def __init__(
        self, spec: WorkerSpec, backends: Backends, registry: ToolRegistry, writer: ShardWriter
    ) -> None:
        self.spec = spec
        self.cfg = spec.config
        self.model: ChatModel = backends.model
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
        self._teardowns: asyncio.TaskGroup | None = None
        self._closing = 0  # sandbox teardowns in flight
        self._closed = asyncio.Condition()

    def _close_later(self, teardown: Coroutine[Any, Any, None]) -> None:
        """Own a sandbox teardown in the background (see ``run``)."""
        assert self._teardowns is not None
        self._closing += 1
        self._teardowns.create_task(self._teardown(teardown))

    async def _teardown(self, teardown: Coroutine[Any, Any, None]) -> None:
        closing = asyncio.ensure_future(teardown)
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            # A worker that stops early (an output error, Ctrl-C) still closes its sandboxes:
            # a close cut short leaves processes that outlive the event loop.
            await asyncio.wait([closing])
            _ = closing.cancelled() or closing.exception()  # retrieved: we are stopping
            raise
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

    def _toolsets(self, seed: int) -> list[str]:
        if self._dist is None:
            return list(self.cfg.toolsets or ())
        return sample_toolsets(self._dist, random.Random(seed))

    async def _run_sample(self, sample: Sample) -> None:
        seed = derive_seed(self.cfg.seed, sample.key)
        toolsets = self._toolsets(seed)
        tools = self.registry.for_toolsets(toolsets)  # resolved here only, handed to the session
        started = time.time()
        self.writer.started(sample.key)
        attempt, attempts = await self._attempts(sample, tools)
        run = SampleFacts(
            toolsets, attempts, started, time.time(), self.spec.worker_id, seed, self.cfg.samples_per_prompt
        )
        schemas = self.registry.schemas(tools)
        line, summary = build_line(
            sample,
            attempt.outcome,
            attempt.result,
            run,
            model=self.cfg.model,
            run_tools=self.spec.run_tools,
            tools=schemas,
            system_prompt=self.cfg.system_prompt,
            grading=self._grading(attempt),
            trace=self._trace(attempt.result, schemas),
        )
        self.writer.submit(
            Finished(sample.key, attempt.outcome.status, attempt.outcome.reason, line, summary)
        )

    async def _attempts(self, sample: Sample, tools: list[Tool]) -> tuple[AttemptResult, int]:
        """Try until an attempt is not transient or ``max_attempts`` ran (backoff with jitter)."""
        attempts = 0
        while True:
            attempts += 1
            attempt = await self._attempt(sample, tools, attempts)
            if not attempt.transient:
                return attempt, attempts
            if attempts >= self.cfg.max_attempts:
                reason = f"{attempt.outcome.reason} (gave up after {attempts} attempts)"
                return AttemptResult(
                    attempt.result, Outcome("failed", reason, attempt.outcome.reason_kind), True
                ), attempts
            delay = self.cfg.retry_backoff * 2 ** (attempts - 1)
            await asyncio.sleep(min(delay, 60.0) * random.uniform(0.5, 1.5))

    async def _attempt(self, sample: Sample, tools: list[Tool], n: int) -> AttemptResult:
        deadline = asyncio.timeout(self.cfg.sample_timeout + _HARD_DEADLINE_GRACE_S)
        grader = self.grader
        judged = Judgement() if grader is not None else None
        setup_files: dict[str, str | bytes] | None = dict(sample.setup_files or {}) or None
        inspect: Inspector | None = None
        if grader is not None:
            item = sample_item(sample)

            async def inspect(result: AgentResult, sandbox: Sandbox) -> None:
                await judge(grader, item, result, sandbox, tools=self._verifier_tools, into=judged)

        try:
            if grader is not None:  # the env reads the row: a host path in it is refused here
                setup_files = {**grader.setup_files(item), **(setup_files or {})}
            async with deadline:
                result = await run_session(
                    sample.prompt,
                    model=self.model,
                    tools=tools,
                    sandbox_factory=self.factory,
                    config=self.agent_config,
                    task_id=f"{sample.key}-{n}",
                    image=sample.image,
                    cwd=sample.cwd,
                    setup_files=setup_files,
                    closer=self._close_later,
                    inspect=inspect,
                )
        except Exception as exc:
            return _failed_attempt(exc, sample, hard_deadline=deadline.expired())
        outcome = classify(result, [t.name for t in tools], self.cfg.require_reasoning)
        transient = result.termination is Termination.MODEL_ERROR and result.error_kind == "transient"
        return AttemptResult(result, outcome, transient, judged)

    def _grading(self, attempt: AttemptResult) -> Grading | None:
        if self.grader is None or self.cfg.env is None:
            return None
        judged = attempt.judged
        if attempt.result is None or judged is None or judged.breakdown is None:
            return not_judged(self.cfg, attempt.outcome)
        bd = judged.breakdown
        return Grading(bd.reward, bd.components, bd.reason, judged.error, self.cfg.env)

    def _trace(self, result: AgentResult | None, schemas: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The exact tokens of a token-level run (``--tokenizer``); why not, when they broke."""
        if result is None or not result.token_traces:
            return None
        try:
            et = result.episode_trace(getattr(self.model, "template", None), tools=schemas)
        except TraceError as exc:
            return {"error": str(exc)}
        return {"tokens": et.tokens, "masks": et.masks, "logprobs": et.logprobs}


def sample_item(sample: Sample) -> dict[str, Any]:
    """The env item a dataset row stands for: the row itself (prompt, setup files and every
    other field), what ``compute_reward`` reads."""
    item: dict[str, Any] = {**(sample.extra or {}), "prompt": sample.prompt}
    if sample.setup_files:
        item["setup_files"] = dict(sample.setup_files)
    return item


def _failed_attempt(exc: Exception, sample: Sample, *, hard_deadline: bool) -> AttemptResult:
    """An attempt that raised: a sandbox that could not start is retried; a path the row names
    that cannot be used (a cwd swapped for a link, a task_dir outside its root) is a bad row, never
    retried; a bug is recorded."""
    if isinstance(exc, DataPathError):
        reason = f"bad_row: row {sample.index + 1} (prompt_index {sample.index}): {exc}"
        return AttemptResult(None, Outcome("failed", reason, "bad_row"), False)
    if isinstance(exc, TimeoutError) and hard_deadline:
        return AttemptResult(
            None, Outcome("failed", "sample_timeout: hard deadline passed", "sample_timeout"), False
        )
    if isinstance(exc, (TimeoutError, SandboxUnavailableError, OSError)):
        return AttemptResult(
            None, Outcome("failed", f"sandbox_unavailable: {exc}", "sandbox_unavailable"), True
        )
    # A bug must not take the batch down: it is recorded as data.
    tb = traceback.format_exception_only(exc)[-1].strip()
    return AttemptResult(None, Outcome("failed", f"internal_error: {tb}", "internal_error"), False)


async def run_worker(spec: WorkerSpec, backends: Backends, registry: ToolRegistry) -> int:
    """Run one worker to the end on ``backends`` (the caller's to close); returns how many
    samples it committed."""
    ledger = open_ledger(spec.config.run_dir)
    try:
        writer = ShardWriter(ledger, _shard(spec), spec.owner, fsync=spec.config.fsync)
        writer.sandbox_counts = functools.partial(factory_counts, backends.sandbox_factory)
        await _run_with_writer(Worker(spec, backends, registry, writer), writer)
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
