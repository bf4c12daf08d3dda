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
import gc
import random
import time
import traceback
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajforge.agent import AgentConfig, AgentResult, Termination, run_session
from trajforge.batch.config import BatchConfig
from trajforge.batch.dataset import Sample
from trajforge.batch.ledger import Ledger
from trajforge.batch.records import Attempting, Outcome, build_line, classify
from trajforge.batch.writer import (
    SHARDS_DIR,
    Finished,
    OutputError,
    ShardWriter,
    find_output_error,
    writing,
)
from trajforge.distributions import derive_seed, get_distribution, sample_toolsets
from trajforge.endpoint import EndpointConfig, build_chat_model
from trajforge.protocols import ChatModel, SandboxFactory
from trajforge.sandbox import (
    SandboxUnavailableError,
    close_factory,
    create_sandbox_factory,
    factory_counts,
)
from trajforge.tools.registry import ToolRegistry, default_registry

LEDGER_FILE = "ledger.sqlite"
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
class Attempt:
    """One try at a sample: a result, or an infrastructure error, and whether to retry."""

    result: AgentResult | None
    outcome: Outcome | None
    transient: bool


def build_agent_config(cfg: BatchConfig, prefill: list[dict[str, Any]]) -> AgentConfig:
    return AgentConfig(
        max_turns=cfg.max_turns,
        sampling=cfg.sampling(),
        system_prompt=cfg.system_prompt,
        ephemeral_system_prompt=cfg.ephemeral_system_prompt,
        prefill_messages=prefill,
        session_timeout_s=cfg.sample_timeout,
        tool_limits=cfg.tool_limits(),
    )


def worker_share(total: float | None, workers: int, *, integer: bool) -> float | int | None:
    """This worker's part of a global endpoint budget (``None`` = unlimited).

    Each of P workers gets 1/P of the requests/s and of the requests in flight: the sum never
    exceeds the budget, no IPC is needed on the hot path, and work is split evenly anyway.
    """
    if total is None:
        return None
    return max(1, int(total // workers)) if integer else total / workers


def build_model(cfg: BatchConfig) -> ChatModel:
    """The endpoint client for this worker, holding its share of the endpoint budget."""
    in_flight = worker_share(cfg.max_concurrent_requests, cfg.workers, integer=True)
    return build_chat_model(
        EndpointConfig(
            base_url=cfg.base_url,
            model=cfg.model,
            api_key_env=cfg.api_key_env,
            max_concurrency=int(in_flight or max(cfg.concurrency, 1)),
            requests_per_second=worker_share(cfg.rate_limit, cfg.workers, integer=False),
            request_timeout_s=cfg.request_timeout,
            max_retries=cfg.request_retries,
            backoff_base_s=cfg.retry_backoff,
        )
    )


class Worker:
    """Runs a list of samples; every one ends committed with a status, or stays pending if the
    worker is cancelled (and then runs again on resume)."""

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        model: ChatModel,
        sandbox_factory: SandboxFactory,
        registry: ToolRegistry,
        writer: ShardWriter,
    ) -> None:
        self.spec = spec
        self.cfg = spec.config
        self.model = model
        self.factory = sandbox_factory
        self.registry = registry
        self.writer = writer
        self.agent_config = build_agent_config(self.cfg, spec.prefill)
        self._dist = get_distribution(self.cfg.distribution_name) if self.cfg.distribution_name else None
        self._queue: deque[Sample] = deque(spec.samples)
        self._teardowns: asyncio.TaskGroup | None = None
        self._closing = 0  # sandbox teardowns in flight
        self._closed = asyncio.Condition()

    def _close_later(self, teardown: Coroutine[Any, Any, None]) -> None:
        """Own a sandbox teardown in the background (see ``run``)."""
        assert self._teardowns is not None
        self._closing += 1

        async def run() -> None:
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

        self._teardowns.create_task(run())

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

    def _toolsets(self, sample: Sample, seed: int) -> list[str]:
        if self._dist is None:
            return list(self.cfg.toolsets or ())
        return sample_toolsets(self._dist, random.Random(seed))

    async def _run_sample(self, sample: Sample) -> None:
        # 63 bits: the recorded seed must fit Arrow/Parquet int64; random.Random(seed) replays it.
        seed = derive_seed(self.cfg.seed, sample.key) & ((1 << 63) - 1)
        toolsets = self._toolsets(sample, seed)
        offered_tools = self.registry.for_toolsets(toolsets)
        offered = [t.name for t in offered_tools]
        started = time.time()
        self.writer.started(sample.key)
        attempts = 0
        while True:
            attempts += 1
            attempt = await self._attempt(sample, toolsets, offered, attempts)
            if not attempt.transient or attempts >= self.cfg.max_attempts:
                break
            delay = self.cfg.retry_backoff * 2 ** (attempts - 1)
            await asyncio.sleep(min(delay, 60.0) * random.uniform(0.5, 1.5))
        outcome = attempt.outcome
        assert outcome is not None
        if attempt.transient:
            outcome = Outcome(
                "failed", f"{outcome.reason} (gave up after {attempts} attempts)", outcome.reason_kind
            )
        run = Attempting(toolsets, offered, attempts, started, time.time(), self.spec.worker_id, seed)
        line, summary = build_line(
            sample,
            outcome,
            attempt.result,
            run,
            model=self.cfg.model,
            run_tools=self.spec.run_tools,
            tools=self.registry.schemas(offered_tools),
        )
        self.writer.submit(Finished(sample.key, outcome.status, outcome.reason, line, summary))

    async def _attempt(self, sample: Sample, toolsets: list[str], offered: list[str], n: int) -> Attempt:
        deadline = asyncio.timeout(self.cfg.sample_timeout + _HARD_DEADLINE_GRACE_S)
        try:
            async with deadline:
                result = await run_session(
                    sample.prompt,
                    model=self.model,
                    registry=self.registry,
                    toolsets=toolsets,
                    sandbox_factory=self.factory,
                    config=self.agent_config,
                    task_id=f"{sample.key}-{n}",
                    image=sample.image,
                    cwd=sample.cwd,
                    setup_files=sample.setup_files,
                    closer=self._close_later,
                )
        except TimeoutError as exc:
            if deadline.expired():
                return Attempt(
                    None, Outcome("failed", "sample_timeout: hard deadline passed", "sample_timeout"), False
                )
            return Attempt(
                None, Outcome("failed", f"sandbox_unavailable: {exc}", "sandbox_unavailable"), True
            )
        except (SandboxUnavailableError, OSError) as exc:
            return Attempt(
                None, Outcome("failed", f"sandbox_unavailable: {exc}", "sandbox_unavailable"), True
            )
        except Exception as exc:  # a bug must not take the batch down: it is recorded as data
            tb = traceback.format_exception_only(exc)[-1].strip()
            return Attempt(None, Outcome("failed", f"internal_error: {tb}", "internal_error"), False)
        outcome = classify(result, offered, self.cfg.require_reasoning)
        transient = result.termination is Termination.MODEL_ERROR and result.error_kind == "transient"
        return Attempt(result, outcome, transient)


async def run_worker(
    spec: WorkerSpec,
    *,
    model: ChatModel | None = None,
    sandbox_factory: SandboxFactory | None = None,
    registry: ToolRegistry | None = None,
) -> int:
    """Run one worker to the end; returns how many samples it committed."""
    cfg = spec.config
    run_dir = cfg.run_dir
    own_model, own_factory = model is None, sandbox_factory is None
    model = model if model is not None else build_model(cfg)
    factory = sandbox_factory or create_sandbox_factory(cfg.sandbox_config())
    with writing(run_dir / LEDGER_FILE):
        ledger = Ledger(run_dir / LEDGER_FILE)
    shard = run_dir / SHARDS_DIR / f"{spec.owner}.jsonl"
    try:
        writer = ShardWriter(ledger, shard, spec.owner, fsync=cfg.fsync)
    except BaseException:
        ledger.close()
        raise
    writer.sandbox_counts = functools.partial(factory_counts, factory)
    worker = Worker(
        spec, model=model, sandbox_factory=factory, registry=registry or default_registry(), writer=writer
    )
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
    finally:
        if own_model:
            await model.aclose()
        if own_factory:
            await close_factory(factory)
        ledger.close()
    return writer.committed


def worker_process_main(spec: WorkerSpec, errors: Any = None) -> None:
    """Entry point of a spawned worker process: dies with its parent, runs, exits.

    An output error (the run directory cannot be written) is not a crash: its one-line message
    goes to ``errors`` (a queue the parent reads) and the process exits with code 2."""
    _die_with_parent()
    gc.freeze()  # the unpickled samples live all run long: keep them out of GC scans
    try:
        asyncio.run(run_worker(spec))
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except OutputError as exc:
        if errors is not None:
            errors.put(str(exc))
        raise SystemExit(2) from None


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the parent dies, so a killed run leaves no worker
    writing behind the back of the next ``--resume``."""
    import ctypes
    import os
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: fall back to the parent check below
        pass
    if os.getppid() == 1:
        os._exit(1)


def shard_dir(run_dir: Path) -> Path:
    return run_dir / SHARDS_DIR
