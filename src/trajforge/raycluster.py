"""Rollout actors on a Ray cluster: what ``batch --backend ray`` and ``env eval --backend ray`` share.

Both commands keep their books on the driver (the batch ledger and shard, the env run's
``episodes.jsonl``) and send the rollouts to one kind of actor per node; what differs is what an
actor runs and what comes back. What is the same lives here: finding Ray (or the one line that
says what to install), connecting to ``--ray-address``, placing actors node by node (pinned, no
restarts: a lost node's work is requeued by the driver, never rerun by Ray behind its back),
reading a Ray object ref on asyncio, stopping the actors, and the equal shares of an endpoint
budget each actor holds (so the cluster as a whole stays under it with no coordinator on the hot
path). Ray itself is imported only inside these functions, lazily: ``pip install
'trajforge[ray]'`` is optional.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

INSTALL = "needs Ray on the driver and every node: pip install 'trajforge[ray]'"


class ClusterError(RuntimeError):
    """The cluster cannot run the rollouts; the message says what to do."""


def cluster_error(exc: BaseException) -> ClusterError | None:
    """The first :class:`ClusterError` in ``exc``, looking inside (nested) exception groups (a
    task group wraps what its tasks raise; the user should read the cluster's reason)."""
    if isinstance(exc, ClusterError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = cluster_error(inner)
            if found is not None:
                return found
    return None


def missing_ray(what: str) -> str | None:
    """None when Ray can be imported here; else the line that says what to install for ``what``.
    Looks the module up without importing it (importing Ray costs a second)."""
    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else f"{what} {INSTALL}"


def import_ray(what: str) -> Any:
    """The ``ray`` module, or :class:`ClusterError` saying what to install for ``what``."""
    try:
        import ray
    except ImportError:
        raise ClusterError(f"{what} {INSTALL}") from None
    return ray


def connect(ray: Any, address: str | None) -> None:
    """Join the cluster at ``address`` (None: one running on this machine, else a new local one).
    Blocking: call it in a thread."""
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
    if address is None:
        kwargs["include_dashboard"] = False
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = address or "this machine"
        raise ClusterError(
            f"cannot connect to the Ray cluster at {where}: {exc}; check --ray-address (a cluster with "
            "token authentication also needs RAY_AUTH_MODE=token and its token here)"
        ) from None


@dataclass
class ActorSlot:
    """The driver's view of one rollout actor: its handle, where it runs, its calls in flight."""

    worker_id: int
    handle: Any
    node: str
    in_flight: int = 0
    alive: bool = True
    counts: dict[str, int] = field(default_factory=dict)


async def start_actors(
    ray: Any,
    actor_class: type,
    *,
    per_node: int,
    max_concurrency: int,
    start: Callable[[ActorSlot, int], Any],
    describe: str,
    announce: Callable[[str], None],
) -> list[ActorSlot]:
    """Place ``per_node`` actors of ``actor_class`` on every live node and call ``start(slot,
    total)`` (a Ray call: returns an object ref) on each. An actor whose node went away while
    starting comes back marked lost (``alive`` False); any other start failure raises, and so does
    a cluster where no actor could start. ``describe`` completes the announcement
    ("ray: 3 rollout actor(s) <describe> on 3 node(s): w0 on head (...), ...")."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in await asyncio.to_thread(ray.nodes) if n.get("Alive")]
    remote = ray.remote(actor_class)
    placed = [node for node in nodes for _ in range(per_node)]
    actors: list[ActorSlot] = []
    for worker_id, node in enumerate(placed):
        handle = remote.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            num_cpus=0,
            max_restarts=0,
            max_task_retries=0,
            max_concurrency=max_concurrency,
        ).remote()
        name = node.get("NodeName") or node.get("NodeManagerAddress") or "?"
        actors.append(ActorSlot(worker_id, handle, f"{name} ({node['NodeID'][:12]})"))
    results = await asyncio.gather(
        *(as_future(start(a, len(actors))) for a in actors), return_exceptions=True
    )
    for actor, result in zip(actors, results, strict=True):
        if isinstance(result, ray.exceptions.RayActorError):
            lose(ray, actor, announce)  # its node went away while starting
        elif isinstance(result, BaseException):
            await stop_actors(ray, actors)
            raise ClusterError(f"rollout actor on node {actor.node} cannot start: {remote_cause(result)}")
    alive = [a for a in actors if a.alive]
    if not alive:
        raise ClusterError("no rollout actor could start on the Ray cluster; check `ray status`")
    announce(
        f"ray: {len(alive)} rollout actor(s) {describe} on {len(nodes)} node(s): "
        + ", ".join(f"w{a.worker_id} on {a.node}" for a in alive)
    )
    return actors


def lose(ray: Any, actor: ActorSlot, announce: Callable[[str], None]) -> None:
    """Mark ``actor`` lost (once, announced) and make sure Ray does not bring it back."""
    if actor.alive:
        actor.alive = False
        announce(f"ray: rollout actor w{actor.worker_id} on {actor.node} lost")
        with contextlib.suppress(Exception):
            ray.kill(actor.handle, no_restart=True)


async def stop_actors(ray: Any, actors: list[ActorSlot], *, timeout_s: float = 60.0) -> None:
    """Ask every live actor to ``stop()`` (close its sandboxes, client and tools), then kill them all."""
    stops = [as_future(a.handle.stop.remote()) for a in actors if a.alive]
    with contextlib.suppress(Exception):
        await asyncio.wait_for(asyncio.gather(*stops, return_exceptions=True), timeout_s)
    for actor in actors:
        with contextlib.suppress(Exception):
            ray.kill(actor.handle, no_restart=True)


def as_future(ref: Any) -> asyncio.Future[Any]:
    """An asyncio future for a Ray object ref (resolved on this loop)."""
    return asyncio.wrap_future(ref.future())


def remote_cause(exc: BaseException) -> str:
    """The message of the error an actor raised (Ray wraps it with a remote traceback)."""
    inner = getattr(exc, "cause", None)
    return str(inner) if inner is not None else str(exc).strip().splitlines()[-1]


def share_count(total: int | None, workers: int) -> int | None:
    """This worker's part of a global count (requests in flight; ``None`` = unlimited), never 0.

    Each of P workers gets 1/P of the requests in flight and of the requests/s (:func:`share_rate`):
    the sum never exceeds the budget, no IPC is needed on the hot path, and work is split evenly
    anyway."""
    return None if total is None else max(1, total // workers)


def share_rate(total: float | None, workers: int) -> float | None:
    """This worker's part of a global rate (requests/s; ``None`` = unlimited)."""
    return None if total is None else total / workers
