"""The engine on a Ray cluster: rollout actors on every node; the driver keeps the books.

One backend for both front ends (``batch --backend ray``, ``env eval --backend ray``). Each
:class:`RolloutActor` builds, on its node, what a local run builds (its own endpoint client
holding its share of the endpoint budget, its own sandbox factory and tools, the engine) from a
:class:`RunnerSpec`: settings only, never a live object or a secret (the endpoint names its key's
variable; each node reads its own). The driver's :class:`ActorPool` hands one job per call to the
least busy live actor and gets the finished result back as the call's return value; the driver
is the only writer of the run directory, so exactly-once and resume hold as on one machine: a job
is in exactly one call or waiting for one, and a call that dies with its actor (node lost,
process killed) is asked again of another actor (``on_requeued`` says so; the front end counts
it). A result that never reached the driver was never written, so nothing runs twice into the
output; if the driver itself dies, a resume runs what was not written, as after a local kill.

Every node needs trajforge (same version) for the Python that runs Ray, the sandbox backend the
run asks for, the files a run reads from a path, and the endpoint key's variable in the
environment ``ray start`` ran in. Ray itself is optional: ``pip install 'trajforge[ray]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import IO, Any, Protocol

import orjson

from trajforge.raycluster import ActorSlot, ClusterError, as_future, lose, start_actors, stop_actors


class Runner(Protocol):
    """What a rollout actor runs jobs on (a front end's engine, built on the node)."""

    @property
    def model_name(self) -> str: ...

    async def run(self, job: Any) -> Any:
        """One job to its result (every outcome is a result: a record, a batch line)."""
        ...

    def counts(self) -> dict[str, int]:
        """What the driver shows of this actor (sandbox counts, ...); may be empty."""
        ...

    async def resize(self, settings: dict[str, int]) -> None:
        """Concurrency settings changed on the driver (``control.json``)."""
        ...


class RunnerSpec(Protocol):
    """Picklable settings a :class:`RolloutActor` builds its :class:`Runner` from; ``shares`` is
    how many actors split the endpoint's budget (this one holds one share), ``worker`` the
    actor's number (what its records name as their worker)."""

    def open(self, shares: int, worker: int) -> AbstractAsyncContextManager[Runner]: ...


class RolloutActor:
    """One rollout actor (made a Ray actor by :class:`ActorPool`): a runner built on its node."""

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self._runner: Runner | None = None

    async def start(self, spec: RunnerSpec, actors: int, worker: int) -> None:
        """Build the runner (1/``actors`` of the endpoint budget)."""
        self._runner = await self._stack.enter_async_context(spec.open(actors, worker))

    async def model_name(self) -> str:
        return self._ready().model_name

    def _ready(self) -> Runner:
        if self._runner is None:
            raise RuntimeError("start() first")
        return self._runner

    async def run(self, job: Any) -> tuple[Any, dict[str, int]]:
        runner = self._ready()
        result = await runner.run(job)
        return result, runner.counts()

    async def resize(self, settings: dict[str, int]) -> None:
        await self._ready().resize(settings)

    async def stop(self) -> None:
        """Wait for the runner's sandbox teardowns, then close its factory, client and tools."""
        await self._stack.aclose()


class ActorPool:
    """The driver's side of the rollout actors. :meth:`call` runs one job on the least busy live
    actor (at most ``per_actor`` calls each, when given; else the caller holds the limit), and
    asks another actor when the call dies with its actor."""

    def __init__(
        self,
        ray: Any,
        announce: Callable[[str], None],
        *,
        per_actor: int | None = None,
        all_lost: str = "every rollout actor was lost",
    ) -> None:
        self.ray = ray
        self.announce = announce
        self.per_actor = per_actor
        self.all_lost = all_lost
        self.actors: list[ActorSlot] = []
        self.per_node = 1
        self.requeued = 0
        self.jobs: dict[int, int] = {}
        """results returned, by actor (``worker_id``)"""
        self._room = asyncio.Condition()

    async def start(self, spec: RunnerSpec, *, per_node: int, max_concurrency: int, describe: str) -> str:
        """Start ``per_node`` actors on every node, each holding 1/(actors started) of the
        endpoint budget; the name of the model they run (the same on every node)."""
        self.per_node = per_node

        def started(slot: ActorSlot, total: int) -> Any:
            return slot.handle.start.remote(spec, total, slot.worker_id)

        self.actors = await start_actors(
            self.ray,
            RolloutActor,
            per_node=per_node,
            max_concurrency=max_concurrency,
            start=started,
            describe=describe,
            announce=self.announce,
        )
        for actor in self.alive():
            with contextlib.suppress(self.ray.exceptions.RayActorError):
                return str(await as_future(actor.handle.model_name.remote()))
            lose(self.ray, actor, self.announce)
        raise ClusterError(self.all_lost)

    def alive(self) -> list[ActorSlot]:
        return [a for a in self.actors if a.alive]

    async def stop(self) -> None:
        await stop_actors(self.ray, self.actors)

    async def _pick(self) -> ActorSlot:
        async with self._room:
            while True:
                alive = self.alive()
                if not alive:
                    raise ClusterError(self.all_lost)
                free = [a for a in alive if self.per_actor is None or a.in_flight < self.per_actor]
                if free:
                    actor = min(free, key=lambda a: a.in_flight)
                    actor.in_flight += 1
                    return actor
                await self._room.wait()

    async def _done(self, actor: ActorSlot) -> None:
        async with self._room:
            actor.in_flight -= 1
            self._room.notify_all()

    async def call(
        self,
        job: Any,
        *,
        on_lost: Callable[[ActorSlot], None] = lambda _a: None,
        on_requeued: Callable[[ActorSlot], None] = lambda _a: None,
    ) -> Any:
        """``job``'s result from some actor. An actor lost under the call: ``on_lost`` (the first
        time that actor is seen lost), ``on_requeued``, and the job goes to another actor; every
        actor lost: :class:`~trajforge.raycluster.ClusterError` with ``all_lost``."""
        while True:
            actor = await self._pick()
            try:
                result, counts = await as_future(actor.handle.run.remote(job))
                actor.counts = counts
                self.jobs[actor.worker_id] = self.jobs.get(actor.worker_id, 0) + 1
                return result
            except self.ray.exceptions.RayActorError:
                if actor.alive:
                    on_lost(actor)
                lose(self.ray, actor, self.announce)
                self.requeued += 1
                on_requeued(actor)
            finally:
                await self._done(actor)

    async def resize(self, settings: dict[str, int]) -> None:
        """Tell every live actor (a lost one is noticed by its calls)."""
        calls = [as_future(a.handle.resize.remote(settings)) for a in self.alive()]
        await asyncio.gather(*calls, return_exceptions=True)

    def counts(self) -> dict[str, int]:
        """The actors' counts added up."""
        total: dict[str, int] = {}
        for actor in self.actors:
            for name, value in actor.counts.items():
                total[name] = total.get(name, 0) + value
        return total


class ClusterEventLog:
    """``cluster_events.jsonl``: one line per actor lost or job requeued, appended and synced as it
    happens (rare: a node loss), so the count survives a killed driver. Nothing is written before
    :meth:`claim` (the run directory made and checked to be this run's); until then events wait
    here. The file is opened on the first event (a run that loses nothing leaves none); a torn
    last line from a killed writer is cut off first."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._f: IO[bytes] | None = None
        self._waiting: list[dict[str, Any]] | None = []

    def claim(self) -> None:
        if self._waiting is not None:
            waiting, self._waiting = self._waiting, None
            for event in waiting:
                self.add(event)

    def add(self, event: dict[str, Any]) -> None:
        event = {**event, "at": event.get("at") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if self._waiting is not None:
            self._waiting.append(event)
            return
        if self.path is None:
            return
        if self._f is None:
            if self.path.exists():
                data = self.path.read_bytes()
                with self.path.open("r+b") as f:
                    f.truncate(data.rfind(b"\n") + 1)
            self._f = self.path.open("ab")
        self._f.write(orjson.dumps(event) + b"\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None
