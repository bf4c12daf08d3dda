"""``env eval --backend ray``: the env's front end on the engine's one Ray backend
(:mod:`trajforge.engine.ray`); the driver keeps the books.

``actors_per_node`` rollout actors on every node (``--actors-per-node``, default 1; batch's
``--workers``) each build what a local evaluation builds (the env, from its name or
``path.py:Class`` and the run's :class:`~.config.EnvConfig` as JSON; its own endpoint client,
sandbox factory and tool registry, :mod:`~.rollout_backends`) from an :class:`EnvSpec` and run
the episodes the driver asks for, one call each, returning the finished :class:`~.types.Episode`.
The driver is the same :func:`~trajforge.engine.books.run_episodes` as a local run and the only
writer of the run directory
(``episodes.jsonl``, ``status.json``, ``summary.json``), so exactly-once and resume hold as on
one machine: an (item, rollout) is in exactly one call or waiting for one; a call that dies with
its actor (node lost, process killed) is asked again of another actor, counted as ``requeued``
(``status.json`` and the run's result for this invocation; ``summary.json`` for the whole run,
from ``cluster_events.jsonl``, see :func:`~trajforge.engine.books.write_summary`); an episode that never
reached the driver was never written. If the driver dies, rerunning the command resumes from the
file, as after a local kill.

Concurrency: the eval's ``max_concurrent_rollouts`` is the cluster's total, held by the driver
(so ``env resize`` / ``control.json`` work as locally, and more actors per node add no
rollouts, only places to run them) and spread over the actors least-busy first; the endpoint's
budget is split into equal shares, one per actor started (nodes x actors per node), as
``batch`` does.

Every node needs trajforge (same version) for the Python that runs Ray, the env's files when it
is loaded from a path or reads a task directory, the sandbox backend, and the endpoint key's
variable in the environment ``ray start`` ran in: secrets never travel through Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trajforge.endpoint import EndpointConfig, embedded_endpoint, embedded_weights
from trajforge.engine import ResizableLimiter
from trajforge.engine.books import CLUSTER_EVENTS_FILE, EvalRun, run_episodes
from trajforge.engine.ray import ActorPool, ClusterEventLog
from trajforge.envs.base import BaseEnv
from trajforge.envs.catalog import env_class, load_env
from trajforge.envs.config import EnvConfig, parse_env_config
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.running.backends import open_rollout_backends
from trajforge.envs.running.episode import Rollouts
from trajforge.envs.types import Episode, Item
from trajforge.raycluster import ActorSlot, cluster_error, connect, import_ray
from trajforge.record.keys import key_of, rollout_key

log = logging.getLogger(__name__)

# An actor runs whatever the driver hands it (the driver holds the cluster's limit); its own
# limiter and Ray's per-actor call limit only have to stay out of the way.
_ACTOR_CALLS = 4096


class RayEvalConfig(BaseModel):
    """Where ``env eval --backend ray`` runs its rollouts. Not part of the run's identity
    (``run.json``): a resume may use another cluster or another number of actors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str | None = Field(
        None, description="the cluster's HOST:PORT (None: one running on this machine, else a new local one)"
    )
    actors_per_node: int = Field(
        1,
        description="rollout actors on every node (each its own process, endpoint client and sandbox "
        "factory); the rollout limit stays the cluster's total",
    )

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("--ray-address is empty: give the cluster's HOST:PORT, or leave it out")
        return value

    @field_validator("actors_per_node")
    @classmethod
    def _actors(cls, value: int) -> int:
        if value < 1:
            raise ValueError(
                f"--actors-per-node must be at least 1, not {value}: it is how many rollout actors run "
                "on each node (1, the default, is one per node; raise it for nodes with many cores)"
            )
        return value

    @classmethod
    def of(cls, address: str | None = None, actors_per_node: int = 1) -> RayEvalConfig:
        """The config, or a :class:`ValueError` whose message is only what to change."""
        try:
            return cls(address=address, actors_per_node=actors_per_node)
        except ValidationError as exc:
            raise ValueError(
                "; ".join(str(e.get("ctx", {}).get("error", e["msg"])) for e in exc.errors())
            ) from None


@dataclass(frozen=True)
class EnvSpec:
    """What an actor needs to build the run's env and backends: settings only, no live object
    and no secret (the endpoint names its key's variable; each node reads its own)."""

    env_ref: str
    """library name or ``path/to/file.py:Class`` (the file must exist on every node)"""
    config: dict[str, Any]
    """the run's whole EnvConfig, as JSON"""
    endpoint: EndpointConfig
    agent: str = "model"

    @classmethod
    def of(cls, env_ref: str, env: AgentEnv, endpoint: EndpointConfig, agent: str) -> EnvSpec:
        return cls(env_ref, env.config.model_dump(mode="json"), endpoint, agent)

    def build_env(self) -> AgentEnv:
        """The env as the driver configured it (its config class validates the JSON again)."""
        kind = env_class(self.env_ref)
        base = kind.default_config() if issubclass(kind, BaseEnv) else EnvConfig()
        return load_env(self.env_ref, config=parse_env_config(self.config, type(base)))

    @contextlib.asynccontextmanager
    async def open(self, shares: int, worker: int = 0) -> AsyncIterator[EnvRunner]:
        """On a node: the env and its backends (1/``shares`` of the endpoint budget), running
        whatever the driver hands them (the driver holds the cluster's rollout limit)."""
        env = self.build_env()
        await env.setup()
        async with open_rollout_backends(env, self.endpoint, self.agent, shares=shares) as backends:
            rollouts = Rollouts(env, backends)
            await rollouts.resize(rollouts=_ACTOR_CALLS)
            async with rollouts.engine.running():
                yield EnvRunner(rollouts)


async def run_eval_on_ray(
    env: AgentEnv,
    spec: EnvSpec,
    run_dir: Path,
    *,
    n: int,
    group_size: int,
    ray_address: str | None = None,
    actors_per_node: int = 1,
    on_episode: Callable[[Episode, int, int], None] | None = None,
    announce: Callable[[str], None] = log.info,
) -> EvalRun:
    """:func:`~.runner.run_eval` with the rollouts on ``actors_per_node`` actors on every node of
    the Ray cluster at ``ray_address`` (None: one running on this machine, else a new local one);
    ``env`` is the driver's copy of ``spec``'s env (its items are the run's). See the module doc.
    ``EvalRun.requeued`` is this invocation's count; ``summary.requeued`` the whole run's."""
    where = RayEvalConfig.of(ray_address, actors_per_node)
    ray = import_ray("--backend ray")
    await asyncio.to_thread(connect, ray, where.address)
    try:
        async with contextlib.AsyncExitStack() as stack:
            if spec.agent == "model" and spec.endpoint.embedded:
                # Served here on loopback: reachable by the actors of this machine only.
                base_url, name = await stack.enter_async_context(embedded_endpoint(announce=announce))
                update: dict[str, Any] = {"base_url": base_url, "model": name}
                if spec.endpoint.tokenizer == "auto":
                    update["tokenizer"] = str(embedded_weights())
                spec = EnvSpec(spec.env_ref, spec.config, spec.endpoint.model_copy(update=update), spec.agent)
            pool = ActorRollouts(ray, env, announce, run_dir=run_dir)
            stack.push_async_callback(pool.stop)
            model = await pool.start(spec, per_node=where.actors_per_node)
            try:
                run = await run_episodes(
                    env,
                    pool,
                    run_dir,
                    n=n,
                    group_size=group_size,
                    model=model,
                    agent=spec.agent,
                    on_episode=on_episode,
                )
            except BaseExceptionGroup as group:  # the episodes' task group: say the cluster's reason
                found = cluster_error(group)
                if found is None:
                    raise
                raise found from None
            run.requeued = pool.requeued
            return run
    finally:
        await asyncio.to_thread(ray.shutdown)  # disconnects the driver (stops a cluster it started)


class ActorRollouts:
    """The driver's side of the rollout actors, an :class:`~trajforge.engine.books.EpisodeSource`:
    one call per episode (:class:`~trajforge.engine.ray.ActorPool`), under the cluster-wide rollout
    limit held here; a call lost with its actor is asked again of another one. With ``run_dir``,
    each actor lost and each episode asked again is appended to its ``cluster_events.jsonl`` as it
    happens (what the summary counts over the run's whole life)."""

    def __init__(
        self, ray: Any, env: AgentEnv, announce: Callable[[str], None], *, run_dir: Path | None = None
    ) -> None:
        self.env = env
        self.slots = ResizableLimiter(env.config.max_concurrent_rollouts)
        self.pool = ActorPool(
            ray,
            announce,
            all_lost="every rollout actor was lost; the episodes written so far are kept: run the "
            "same command again to resume when the cluster is back",
        )
        self.events = ClusterEventLog(run_dir / CLUSTER_EVENTS_FILE if run_dir is not None else None)

    @property
    def requeued(self) -> int:
        return self.pool.requeued

    async def start(self, spec: EnvSpec, *, per_node: int = 1) -> str:
        """Start ``per_node`` actors on every node, each holding 1/(actors started) of the
        endpoint budget; the name of the model they run (the same on every node)."""
        name = await self.pool.start(
            spec,
            per_node=per_node,
            max_concurrency=_ACTOR_CALLS,
            describe=f"sharing {self.env.config.max_concurrent_rollouts} rollouts",
        )
        for actor in self.pool.actors:
            if not actor.alive:  # its node went away while it started
                self.events.add(_where(actor, "actor_lost"))
        return name

    async def stop(self) -> None:
        self.events.close()
        await self.pool.stop()

    async def episode(
        self,
        item: Item,
        *,
        rollout: int = 0,
        group_size: int = 1,
        prompt_index: int | None = None,
        prompt_key: str | None = None,
    ) -> Episode:
        self.events.claim()  # asked by run_episodes: the run directory is this run's
        key = rollout_key(prompt_key or key_of(item), rollout, group_size)
        async with self.slots:
            episode: Episode = await self.pool.call(
                EnvJob(item, rollout, group_size, prompt_index, prompt_key),
                on_lost=lambda actor: self.events.add(_where(actor, "actor_lost")),
                on_requeued=lambda actor: self.events.add({**_where(actor, "requeued"), "episode": key}),
            )
            return episode

    async def resize(self, *, rollouts: int | None = None, tools_per_rollout: int | None = None) -> None:
        """Rollouts at once across the cluster (held here); tool calls within a rollout (told to
        every actor, taken by the rollouts that start after)."""
        if rollouts is not None:
            await self.slots.resize(rollouts)
        if tools_per_rollout is not None:
            self.env.config = self.env.config.model_copy(update={"max_parallel_tools": tools_per_rollout})
            await self.pool.resize({"max_parallel_tools": tools_per_rollout})

    def report(self) -> dict[str, Any]:
        actors = self.pool.actors
        alive = self.pool.alive()
        return {
            "rollouts": self.slots.report(),
            "tools_per_rollout": self.env.config.max_parallel_tools,
            "backend": "ray",
            "actors": {
                "alive": len(alive),
                "lost": len(actors) - len(alive),
                "per_node": self.pool.per_node,
                "endpoint_shares": len(actors),
                "in_flight": {f"w{a.worker_id}": a.in_flight for a in alive},
                "nodes": {f"w{a.worker_id}": a.node for a in actors},
                "episodes": {f"w{a.worker_id}": self.pool.jobs.get(a.worker_id, 0) for a in actors},
            },
            "requeued": self.pool.requeued,
        }


def _where(actor: ActorSlot, event: str) -> dict[str, Any]:
    return {"event": event, "actor": f"w{actor.worker_id}", "node": actor.node}


@dataclass(frozen=True)
class EnvJob:
    """One episode asked of an actor: the item and its place in the run (picklable)."""

    item: Item
    rollout: int
    group_size: int
    prompt_index: int | None
    prompt_key: str | None


@dataclass
class EnvRunner:
    """An env's rollouts on a node (:class:`~trajforge.engine.ray.Runner`)."""

    rollouts: Rollouts

    @property
    def model_name(self) -> str:
        return self.rollouts.backends.model.name

    async def run(self, job: EnvJob) -> Episode:
        """One rollout of the job's item, judged in its own sandbox (every outcome is an episode)."""
        return await self.rollouts.episode(
            job.item,
            rollout=job.rollout,
            group_size=job.group_size,
            prompt_index=job.prompt_index,
            prompt_key=job.prompt_key,
        )

    def counts(self) -> dict[str, int]:
        return {}

    async def resize(self, settings: dict[str, int]) -> None:
        if "max_parallel_tools" in settings:
            await self.rollouts.resize(tools_per_rollout=settings["max_parallel_tools"])
