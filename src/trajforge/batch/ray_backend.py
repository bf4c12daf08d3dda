"""``--backend ray``: rollout actors on every node of a Ray cluster; the driver keeps the books.

Each actor runs the same async engine as a local worker (:class:`~.scheduler.Worker`, its own
endpoint client and sandbox factory, ``--concurrency`` rollouts at once), but it never writes:
a finished sample goes back to the driver as the return value of the call that carried it. The
driver is the only writer (one shard, one ledger connection, the same :class:`ShardWriter`), so
exactly-once and resume hold as on one machine: a sample is either waiting in the driver's queue
or in exactly one call; a call that dies with its actor (node lost, process killed) puts its
sample back in the queue, counted in ``statistics.json`` under ``requeued``, and it runs again
elsewhere. A result that never reached the driver was never committed, so nothing runs twice
into the output. If the driver itself dies, the ledger holds what was committed and
``--resume`` runs the rest, exactly as after a local ``kill -9``.

The endpoint budget (``--rate-limit``, ``--max-concurrent-requests``) is shared cluster-wide by
handing each actor an equal share when it starts (no call to a coordinator on the hot path; the
shares of a lost node are not handed on, so the cluster stays under the budget).

Every node needs trajforge (same version) installed for the Python that runs Ray, the sandbox
backend the run asks for, and the endpoint's key variable in the environment ``ray start`` ran
in (secrets never travel through Ray). Ray itself is optional: ``pip install 'trajforge[ray]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import Counter, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from trajforge.batch.backends import open_backends
from trajforge.batch.dataset import Sample
from trajforge.batch.errors import RunError
from trajforge.batch.preflight import preflight
from trajforge.batch.scheduler import Worker, WorkerSpec
from trajforge.batch.writer import SHARDS_DIR, Finished, ShardWriter, find_output_error, open_ledger
from trajforge.raycluster import (
    ActorSlot,
    ClusterError,
    as_future,
    cluster_error,
    connect,
    import_ray,
    lose,
    start_actors,
    stop_actors,
)
from trajforge.sandbox import factory_counts
from trajforge.tools.builtin import build_registry

if TYPE_CHECKING:
    from trajforge.batch.backends import Backends
    from trajforge.tools.registry import ToolRegistry

log = logging.getLogger(__name__)

NODE_LOST = "node lost"  # the reason a sample is requeued (statistics.json "requeued")


def interleave(parts: list[list[Sample]]) -> list[Sample]:
    """Undo :func:`~.processes.partition`: the samples back in their planned order."""
    return [s for group in itertools.zip_longest(*parts) for s in group if s is not None]


async def run_on_ray(specs: list[WorkerSpec], *, announce: Callable[[str], None] = log.info) -> int:
    """Run the samples of ``specs`` (one session's partition) on the Ray cluster at
    ``--ray-address`` (none: a cluster found on this machine or a new local one); returns how many
    samples the driver committed. ``--workers`` is the number of rollout actors per node."""
    try:
        ray = import_ray("--backend ray")
        first = specs[0]
        await asyncio.to_thread(connect, ray, first.config.ray_address)
    except ClusterError as exc:
        raise RunError(str(exc)) from None
    try:
        driver = _Driver(ray, first, interleave([s.samples for s in specs]), announce)
        return await driver.run()
    except (ClusterError, BaseExceptionGroup) as exc:  # the driver's task group wraps what it raises
        found = cluster_error(exc)
        if found is None:
            raise
        raise RunError(str(found)) from None
    finally:
        await asyncio.to_thread(ray.shutdown)  # disconnects the driver (stops a cluster it started)


class _Driver:
    """Hands samples to actors (at most ``--concurrency`` calls each), commits what comes back,
    and requeues what was lost with an actor."""

    def __init__(
        self, ray: Any, spec: WorkerSpec, samples: list[Sample], announce: Callable[[str], None]
    ) -> None:
        self.ray = ray
        self.spec = spec
        self.cfg = spec.config
        self.pending: deque[Sample] = deque(samples)
        self.announce = announce
        self.actors: list[ActorSlot] = []
        self.calls: dict[asyncio.Future[Any], tuple[ActorSlot, Sample]] = {}
        self.requeued: Counter[str] = Counter()
        self.owner = f"s{spec.session:04d}-ray"

    async def run(self) -> int:
        if not self.pending:
            return 0
        ledger = open_ledger(self.cfg.run_dir)
        try:
            path = self.cfg.run_dir / SHARDS_DIR / f"{self.owner}.jsonl"
            writer = ShardWriter(ledger, path, self.owner, fsync=self.cfg.fsync)
            writer.sandbox_counts = self._sandbox_counts
            await self._run_with_writer(writer)
        finally:
            ledger.close()
        return writer.committed

    def _sandbox_counts(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for actor in self.actors:
            total.update(actor.counts)
        return dict(total)

    async def _run_with_writer(self, writer: ShardWriter) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                writer_task = tg.create_task(writer.run())
                try:
                    await self._start_actors()
                    await self._dispatch(writer)
                finally:
                    writer.close()
                    await self._stop_actors()
                await writer_task
        except BaseExceptionGroup as group:
            found = find_output_error(group)
            if found is None:
                raise
            raise found from None

    # -- actors -----------------------------------------------------------------------------
    async def _start_actors(self) -> None:
        self.actors = await start_actors(
            self.ray,
            RolloutActor,
            per_node=self.cfg.workers,
            max_concurrency=self.cfg.concurrency + 8,
            start=lambda a, total: a.handle.start.remote(self._actor_spec(a.worker_id), total),
            describe=f"x {self.cfg.concurrency} rollouts",
            announce=self.announce,
        )

    def _actor_spec(self, worker_id: int) -> WorkerSpec:
        return WorkerSpec(
            self.spec.config, worker_id, self.spec.session, [], self.spec.run_tools, self.spec.prefill
        )

    async def _stop_actors(self) -> None:
        for call in self.calls:
            call.cancel()
        await stop_actors(self.ray, self.actors)

    def _lose(self, actor: ActorSlot, sample: Sample | None) -> None:
        lose(self.ray, actor, self.announce)
        if sample is not None:
            self.pending.appendleft(sample)
            self.requeued[NODE_LOST] += 1

    # -- samples ----------------------------------------------------------------------------
    async def _dispatch(self, writer: ShardWriter) -> None:
        lost = self.ray.exceptions.RayActorError
        while self.pending or self.calls:
            self._fill(writer)
            if not self.calls:
                raise RunError(
                    f"every rollout actor was lost; {len(self.pending)} sample(s) stay pending, rerun "
                    "with --resume when the cluster is back"
                )
            done, _ = await asyncio.wait(self.calls, return_when=asyncio.FIRST_COMPLETED)
            for call in done:
                actor, sample = self.calls.pop(call)
                actor.in_flight -= 1
                try:
                    finished, counts = call.result()
                except lost:
                    self._lose(actor, sample)
                    continue
                if counts is not None:
                    actor.counts = counts
                writer.submit(finished)
            self._note_requeued(writer)

    def _fill(self, writer: ShardWriter) -> None:
        """Give every live actor calls up to ``--concurrency``, the least busy first."""
        while self.pending:
            alive = [a for a in self.actors if a.alive and a.in_flight < self.cfg.concurrency]
            if not alive:
                return
            actor = min(alive, key=lambda a: a.in_flight)
            sample = self.pending.popleft()
            writer.started(sample.key)  # the ledger counts the attempt (again, after a requeue)
            call = as_future(actor.handle.rollout.remote(sample))
            self.calls[call] = (actor, sample)
            actor.in_flight += 1

    def _note_requeued(self, writer: ShardWriter) -> None:
        # Stored with the writer's next transaction (there is always a closing one).
        writer.aggregate.requeued = Counter(self.requeued)


class _Handoff:
    """Stands in for the shard writer on a node: a finished sample waits here for its call to
    return it to the driver, the only writer."""

    def __init__(self) -> None:
        self.done: dict[str, Finished] = {}

    def started(self, key: str) -> None:
        """The driver records starts (it knows when it handed the sample out)."""

    def submit(self, item: Finished) -> None:
        self.done[item.key] = item


class _NodeWorker(Worker):
    """The engine on a node: samples arrive one call at a time instead of as a list."""

    async def hold(self, stop: asyncio.Event) -> None:
        """Own the background sandbox teardowns until ``stop`` (then wait for them to finish)."""
        async with asyncio.TaskGroup() as teardowns:
            self._teardowns = teardowns
            await stop.wait()

    async def rollout(self, sample: Sample) -> None:
        async with self._closed:  # back-pressure, as in Worker: never more closing than running
            await self._closed.wait_for(lambda: self._closing < self.cfg.concurrency)
        await self._run_sample(sample)


class RolloutActor:
    """One rollout actor (made a Ray actor by the driver): the engine with its own endpoint
    client, holding its share of the endpoint budget, and its own sandbox factory."""

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self._handoff = _Handoff()
        self._worker: _NodeWorker | None = None
        self._backends: Backends | None = None
        self._stop = asyncio.Event()
        self._holder: asyncio.Task[None] | None = None

    async def start(self, spec: WorkerSpec, actors: int) -> None:
        """Build the model (1/``actors`` of the endpoint budget) and the sandbox factory, check
        both as the local preflight does, and get ready for samples."""
        cfg = spec.config.model_copy(update={"workers": actors})  # build_model's share divisor
        registry: ToolRegistry = build_registry(cfg.tools)
        self._stack.push_async_callback(registry.aclose)
        backends = await self._stack.enter_async_context(open_backends(cfg))
        await preflight(backends, cfg.sandbox)
        self._backends = backends
        worker_spec = WorkerSpec(cfg, spec.worker_id, spec.session, [], spec.run_tools, spec.prefill)
        self._worker = _NodeWorker(worker_spec, backends, registry, cast(ShardWriter, self._handoff))
        self._holder = asyncio.create_task(self._worker.hold(self._stop))

    async def rollout(self, sample: Sample) -> tuple[Finished, dict[str, int] | None]:
        """Run one sample to its final line (every outcome is a line, see Worker)."""
        assert self._worker is not None and self._backends is not None, "start() first"
        await self._worker.rollout(sample)
        finished = self._handoff.done.pop(sample.key)
        return finished, factory_counts(self._backends.sandbox_factory)

    async def stop(self) -> None:
        """Wait for the sandbox teardowns, then close the factory, the client and the tools."""
        self._stop.set()
        if self._holder is not None:
            await self._holder
        await self._stack.aclose()
