"""The one engine: rollouts at bounded, resizable concurrency, each ending as one record.

``batch`` (dataset rows) and ``env eval`` (an env's items x a group size) are two front ends of
it: each turns its unit of work into a :class:`Plan` (who the rollout is, how it is asked, the
request its attempts send) and hands the plan here. The engine does what both need and neither
should write twice:

* at most ``slots`` rollouts at once, resizable while running (``control.json``, ``env resize``);
* attempts: only an infrastructure failure (a transient model error after the client's own
  retries, a sandbox that could not start) is tried again, up to the front end's
  :class:`RetryPolicy`, with exponential backoff and jitter; what the agent did is an outcome;
* sandbox teardowns in the background inside :meth:`Engine.running` (a slot takes its next
  rollout while the last one's sandbox closes), with back-pressure: never more sandboxes
  closing than rollouts allowed at once;
* the record (:func:`trajforge.rollout.build_record`), after the front end has put the outcome
  in its own words (:attr:`Plan.settle`).

Where the records go (a batch shard and its ledger, an eval's ``episodes.jsonl``, a trainer's
group) is the caller's; so is where the engine runs (this process, a worker process, a Ray actor:
:mod:`.ray`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from trajforge.cleanup import finish
from trajforge.engine.limiter import ResizableLimiter
from trajforge.record import Record
from trajforge.rollout import (
    Asked,
    Identity,
    Outcome,
    RolloutBackends,
    RolloutOutcome,
    RolloutRequest,
    build_record,
    run_rollout,
)
from trajforge.rollout.step import failure
from trajforge.sandbox.confined import DataPathError

J = TypeVar("J")


@dataclass(frozen=True)
class RetryPolicy:
    """How often an attempt that failed for infrastructure is tried again. ``max_attempts`` None
    (an env evaluation's default): one attempt, its outcome as it came (such an episode is failed
    and left out of the rates); a number (``batch --max-attempts``): at most that many, and a
    rollout still failing says it gave up."""

    max_attempts: int | None = None
    backoff_s: float = 1.0
    """the first wait; doubled after each attempt, capped at 60 s, jittered x0.5-1.5"""


@dataclass
class Plan:
    """One rollout as a front end planned it.

    ``request(attempt)`` builds the request of attempt ``attempt`` (1, 2, ...); raising
    :class:`~trajforge.sandbox.confined.DataPathError` there (a setup file or directory the row
    names that no sandbox may hold) makes the rollout the row's failure, never retried.
    ``settle`` rewrites a finished outcome in the front end's words (an env says ``bad item``
    where the factory says ``bad_row``), before the record is built."""

    who: Identity
    asked: Asked
    seed: int
    toolsets: list[str]
    request: Callable[[int], RolloutRequest]
    backends: RolloutBackends | None = None
    """None: the engine's (a front end overrides them per rollout: the oracle's model per item,
    a factory that prepares the env's sandbox)"""
    settle: Callable[[RolloutOutcome], None] | None = None
    pad: Sequence[str] = ()
    """tool names every record of the run counts (zeros where not offered): one Arrow schema"""
    judged: bool = False
    """the rollout is to be judged: a request that cannot be built still records ``reward: None``"""


@dataclass
class Ran:
    """A finished rollout: its record, and the outcome it was built from (the offered tool
    schemas and the exact times a batch line adds)."""

    record: Record
    done: RolloutOutcome
    attempts: int = 1


@dataclass
class Engine:
    """Runs :class:`Plan` s on ``backends`` with at most ``slots`` at once (see the module doc)."""

    backends: RolloutBackends
    concurrency: int = 1
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    slots: ResizableLimiter = field(init=False)

    def __post_init__(self) -> None:
        self.slots = ResizableLimiter(self.concurrency)
        self._teardowns: set[asyncio.Task[None]] | None = None
        self._teardown_failed: Exception | None = None
        self._closing = 0  # sandbox teardowns in flight
        self._closed = asyncio.Condition()

    # ------------------------------------------------------------------ lifetime

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Engine]:
        """Own the background sandbox teardowns: inside, a rollout's sandbox is closed while the
        next rollout starts; on the way out every teardown has finished (also on an error or a
        cancellation: a close cut short leaves processes that outlive the event loop), and the
        first teardown that failed is raised if nothing else was. Outside, each rollout closes
        its sandbox before it returns. (Not a task group: an error of the body comes out as it
        was raised, not wrapped in a group.)"""
        if self._teardowns is not None:
            yield self
            return
        teardowns: set[asyncio.Task[None]] = set()  # those in flight (a done one leaves)
        self._teardowns = teardowns
        self._teardown_failed = None
        try:
            yield self
        finally:
            self._teardowns = None
            if teardowns:
                await finish(asyncio.gather(*teardowns, return_exceptions=True))
        if self._teardown_failed is not None:
            raise self._teardown_failed

    def _close_later(self, teardown: Coroutine[Any, Any, None]) -> None:
        teardowns = self._teardowns
        assert teardowns is not None
        self._closing += 1
        task = asyncio.create_task(self._teardown(teardown))
        teardowns.add(task)
        task.add_done_callback(teardowns.discard)  # a million rollouts keep no million tasks

    async def _teardown(self, teardown: Coroutine[Any, Any, None]) -> None:
        try:
            await finish(teardown)
        except Exception as exc:  # raised when the engine stops (running()), the first one
            if self._teardown_failed is None:
                self._teardown_failed = exc
        finally:
            async with self._closed:
                self._closing -= 1
                self._closed.notify_all()

    async def _room_to_close(self) -> None:
        """Back-pressure: never more sandboxes closing than rollouts allowed at once."""
        async with self._closed:
            await self._closed.wait_for(lambda: self._closing < self.slots.size)

    async def resize(self, slots: int) -> None:
        await self.slots.resize(slots)

    def report(self) -> dict[str, int]:
        return {**self.slots.report(), "closing": self._closing}

    # ------------------------------------------------------------------ rollouts

    async def run(self, plan: Plan) -> Ran:
        """One rollout under a slot, to its record."""
        await self._room_to_close()
        async with self.slots:
            return await self._run(plan)

    async def run_all(
        self,
        jobs: Iterable[J],
        plan: Callable[[J], Plan],
        done: Callable[[J, Ran], Awaitable[None] | None],
        *,
        started: Callable[[J], None] | None = None,
    ) -> None:
        """Every job of ``jobs`` (pulled one at a time, as a slot frees: a million rows are not a
        million tasks), each planned, run and handed to ``done`` as it finishes. ``started`` is
        told as a job takes its slot. An error in ``done`` (an output that cannot be written)
        stops the run; the rollouts in flight are cancelled."""
        async with self.running(), asyncio.TaskGroup() as tg:
            for job in jobs:
                await self._room_to_close()
                await self.slots.acquire()
                if started is not None:
                    started(job)
                tg.create_task(self._one(job, plan, done))

    async def _one(
        self, job: J, plan: Callable[[J], Plan], done: Callable[[J, Ran], Awaitable[None] | None]
    ) -> None:
        try:
            ran = await self._run(plan(job))
        finally:
            await self.slots.release()
        waited = done(job, ran)
        if waited is not None:
            await waited

    async def _run(self, plan: Plan) -> Ran:
        started = time.time()
        done, attempts = await self._attempts(plan)
        done.started_at = started  # the rollout's span covers its retries
        if plan.settle is not None:
            plan.settle(done)
        record = build_record(
            plan.who,
            plan.asked,
            done,
            seed=plan.seed,
            toolsets=plan.toolsets,
            attempts=attempts,
            pad=plan.pad,
        )
        return Ran(record, done, attempts)

    async def _attempts(self, plan: Plan) -> tuple[RolloutOutcome, int]:
        """Try until an attempt is not transient or ``max_attempts`` ran (backoff with jitter)."""
        attempts = 0
        while True:
            attempts += 1
            done = await self._attempt(plan, attempts)
            if not done.transient or self.retry.max_attempts is None:
                return done, attempts
            if attempts >= self.retry.max_attempts:
                reason = f"{done.outcome.reason} (gave up after {attempts} attempts)"
                done.outcome = Outcome("failed", reason, done.outcome.reason_kind)
                return done, attempts
            delay = self.retry.backoff_s * 2 ** (attempts - 1)
            await asyncio.sleep(min(delay, 60.0) * random.uniform(0.5, 1.5))

    async def _attempt(self, plan: Plan, n: int) -> RolloutOutcome:
        try:
            request = plan.request(n)
        except DataPathError as exc:  # the row's own files: never retried
            return RolloutOutcome(failure(exc, hard_deadline=False)[0], None, [], [], judged=plan.judged)
        backends = plan.backends or self.backends
        if self._teardowns is not None:
            backends = replace(backends, closer=self._close_later)
        return await run_rollout(request, backends)
