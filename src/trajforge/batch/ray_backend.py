"""``batch --backend ray``: the dataset front end on the engine's one Ray backend
(:mod:`trajforge.engine.ray`); the driver keeps the books.

Each rollout actor runs the same engine and planner as a local worker (:mod:`.scheduler`: its
own endpoint client and sandbox factory, ``--concurrency`` rollouts at once), built from a
:class:`BatchRunnerSpec`, but it never writes: a finished sample goes back to the driver as the
return value of the call that carried it. The driver is the only writer (one shard, one ledger
connection, the same :class:`ShardWriter`), so exactly-once and resume hold as on one machine: a
sample is either waiting in the driver's queue or in exactly one call; a call that dies with its
actor (node lost, process killed) is asked again of another actor, counted in
``statistics.json`` under ``requeued``. A result that never reached the driver was never
committed, so nothing runs twice into the output. If the driver itself dies, the ledger holds
what was committed and ``--resume`` runs the rest, exactly as after a local ``kill -9``.

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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trajforge.batch.backends import open_backends
from trajforge.batch.dataset import Sample
from trajforge.batch.errors import RunError
from trajforge.batch.preflight import preflight
from trajforge.batch.scheduler import BatchPlanner, WorkerSpec, batch_engine
from trajforge.batch.writer import SHARDS_DIR, Finished, ShardWriter, find_output_error, open_ledger
from trajforge.engine import Engine
from trajforge.engine.ray import ActorPool
from trajforge.raycluster import ActorSlot, ClusterError, cluster_error, connect, import_ray
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
    """Hands samples to actors (at most ``--concurrency`` calls each), commits what comes back."""

    def __init__(
        self, ray: Any, spec: WorkerSpec, samples: list[Sample], announce: Callable[[str], None]
    ) -> None:
        self.spec = spec
        self.cfg = spec.config
        self.pending: deque[Sample] = deque(samples)
        self.requeued: Counter[str] = Counter()
        self.in_calls = 0  # samples handed to the pool and not back yet
        self.owner = f"s{spec.session:04d}-ray"
        self.pool = ActorPool(ray, announce, per_actor=self.cfg.concurrency)

    async def run(self) -> int:
        if not self.pending:
            return 0
        ledger = open_ledger(self.cfg.run_dir)
        try:
            path = self.cfg.run_dir / SHARDS_DIR / f"{self.owner}.jsonl"
            writer = ShardWriter(ledger, path, self.owner, fsync=self.cfg.fsync)
            writer.sandbox_counts = self.pool.counts
            await self._run_with_writer(writer)
        finally:
            ledger.close()
        return writer.committed

    async def _run_with_writer(self, writer: ShardWriter) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                writer_task = tg.create_task(writer.run())
                try:
                    await self.pool.start(
                        BatchRunnerSpec(self._actor_spec()),
                        per_node=self.cfg.workers,
                        max_concurrency=self.cfg.concurrency + 8,
                        describe=f"x {self.cfg.concurrency} rollouts",
                    )
                    await self._dispatch(writer)
                finally:
                    writer.close()
                    await self.pool.stop()
                await writer_task
        except BaseExceptionGroup as group:
            found = find_output_error(group)
            if found is None:
                raise
            raise found from None

    def _actor_spec(self) -> WorkerSpec:
        return WorkerSpec(self.cfg, 0, self.spec.session, [], self.spec.run_tools, self.spec.prefill)

    async def _dispatch(self, writer: ShardWriter) -> None:
        """``--concurrency`` consumers per actor started, each handing out the next sample; the
        pool waits for an actor with room, and asks another when one is lost."""

        async def consume() -> None:
            while self.pending:
                sample = self.pending.popleft()
                writer.started(sample.key)  # the ledger counts the attempt

                def requeued(_actor: ActorSlot, key: str = sample.key) -> None:
                    self.requeued[NODE_LOST] += 1
                    # stored with the writer's next transaction (there is always a closing one)
                    writer.aggregate.requeued = Counter(self.requeued)
                    writer.started(key)  # handed out again: counted again

                self.in_calls += 1
                try:
                    finished = await self.pool.call(sample, on_requeued=requeued)
                except ClusterError:
                    left = len(self.pending) + self.in_calls  # waiting, and in calls that failed too
                    raise ClusterError(  # run_on_ray says it as a RunError, whatever group it is in
                        f"every rollout actor was lost; {left} sample(s) stay pending, rerun with "
                        "--resume when the cluster is back"
                    ) from None
                finally:
                    self.in_calls -= 1
                writer.submit(finished)

        async with asyncio.TaskGroup() as tg:
            for _ in range(len(self.pool.alive()) * self.cfg.concurrency):
                tg.create_task(consume())


@dataclass(frozen=True)
class BatchRunnerSpec:
    """What a rollout actor builds its runner from (:class:`~trajforge.engine.ray.RunnerSpec`):
    the run's settings, never a live object or a secret."""

    spec: WorkerSpec

    @contextlib.asynccontextmanager
    async def open(self, shares: int, worker: int = 0) -> AsyncIterator[BatchRunner]:
        """The model (1/``shares`` of the endpoint budget) and the sandbox factory, checked as the
        local preflight does, with the planner and engine of a local worker."""
        cfg = self.spec.config.model_copy(update={"workers": shares})  # build_model's share divisor
        registry: ToolRegistry = build_registry(cfg.tools)
        try:
            async with open_backends(cfg) as backends:
                await preflight(backends, cfg.sandbox)
                spec = WorkerSpec(cfg, worker, self.spec.session, [], self.spec.run_tools, self.spec.prefill)
                engine = batch_engine(cfg, backends.model, backends.sandbox_factory, registry)
                async with engine.running():
                    yield BatchRunner(BatchPlanner(spec, registry), engine, backends)
        finally:
            await registry.aclose()


@dataclass
class BatchRunner:
    """The engine on a node (:class:`~trajforge.engine.ray.Runner`): one sample per call."""

    planner: BatchPlanner
    engine: Engine
    backends: Backends

    @property
    def model_name(self) -> str:
        return self.backends.model.name

    async def run(self, sample: Sample) -> Finished:
        """One sample to its final line (every outcome is a line, see the scheduler)."""
        return self.planner.finished(sample, await self.engine.run(self.planner.plan(sample)))

    def counts(self) -> dict[str, int]:
        return factory_counts(self.backends.sandbox_factory) or {}

    async def resize(self, settings: dict[str, int]) -> None:
        """A batch's concurrency is fixed for the run (``--concurrency``)."""
