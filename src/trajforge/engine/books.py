"""The books of an evaluation run: its directory, resume, live status and summary, whatever runs
the rollouts.

The run directory holds ``run.json`` (what was asked), ``episodes.jsonl`` (one record per line,
appended as each episode finishes, flushed), ``status.json`` (progress and the concurrency in
force, rewritten every second), with ``--backend ray`` ``cluster_events.jsonl`` (rollout actors
lost and the episodes asked again elsewhere, appended as they happen) and, at the end,
``summary.json``. A killed run resumes: episodes already in the file are not run again (a torn
last line is dropped and its episode rerun), so every (item, rollout) ends in the file exactly
once. Episodes are keyed as ``batch`` keys its rows (:mod:`trajforge.record.keys`), with
``prompt_index`` the item's place in the list; a run written when episodes were keyed
``ITEM_ID#ROLLOUT`` resumes by those keys.

Concurrency changes while running: write ``control.json`` (``{"max_concurrent_rollouts": 90,
"max_parallel_tools": 4}``, or use ``trajforge env resize``); it is read every second.

:func:`run_episodes` keeps these books around an :class:`EpisodeSource`: the env's front end
of the engine in this process (:class:`trajforge.envs.Rollouts`), or the driver's side of the
Ray actors (:mod:`.ray`), which hand each finished episode back to this same loop, the only
writer of the run directory. ``trajforge.envs.run_eval`` is the front door.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
from pydantic import BaseModel, ValidationError

from trajforge.engine.summary import EvalSummary, summarize
from trajforge.record import Record as Episode
from trajforge.record import load as load_record
from trajforge.record.keys import prompt_keys, rollout_key
from trajforge.trajectory.save import read_complete_objects

Item = dict[str, Any]

EPISODES_FILE = "episodes.jsonl"
RUN_FILE = "run.json"
STATUS_FILE = "status.json"
CONTROL_FILE = "control.json"
SUMMARY_FILE = "summary.json"
CLUSTER_EVENTS_FILE = "cluster_events.jsonl"


class EvalRunError(ValueError):
    """The run directory belongs to another evaluation; the message says what differs."""


@dataclass
class EvalRun:
    summary: EvalSummary
    run_dir: Path
    ran: int
    """episodes run by this invocation (the rest were already in the file)"""
    requeued: int = 0
    """episodes started again elsewhere after their rollout actor was lost (``--backend ray``), in
    this invocation; ``summary.requeued`` counts the whole run"""


class EvalTarget(Protocol):
    """What the books read of the env being evaluated (a part of ``trajforge.envs.AgentEnv``):
    its name and config (the run's identity), its held-out items and their ids."""

    @property
    def name(self) -> str: ...

    @property
    def config(self) -> BaseModel: ...

    async def setup(self) -> None: ...

    def eval_items(self, n: int) -> list[Item]: ...

    def item_id(self, item: Item) -> str: ...


class EpisodeSource(Protocol):
    """What runs an evaluation's rollouts: :class:`~.episode.Rollouts` here, or the driver's
    side of the rollout actors (``--backend ray``). ``report()`` goes into ``status.json``."""

    async def episode(
        self,
        item: Item,
        *,
        rollout: int = 0,
        group_size: int = 1,
        prompt_index: int | None = None,
        prompt_key: str | None = None,
    ) -> Episode: ...

    async def resize(self, *, rollouts: int | None = None, tools_per_rollout: int | None = None) -> None: ...

    def report(self) -> dict[str, Any]: ...


def read_episodes(path: Path, *, repair: bool = False) -> list[Episode]:
    """Episodes of a run file, as records (lines of an older trajforge upgraded: such a run still
    resumes, reports and rescores); a torn last line (a kill mid-write) is skipped, and with
    ``repair`` cut off so appends start on a fresh line."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if repair and end != len(data):
        with path.open("r+b") as f:
            f.truncate(end)
    out = []
    for n, line in enumerate(data[:end].splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(load_record(orjson.loads(line)))  # a version-1 episode is upgraded
        except (orjson.JSONDecodeError, ValueError) as exc:
            raise EvalRunError(
                f"{path}:{n}: not an episode record ({exc}); move the file away to start over"
            ) from None
    return out


class _EpisodeLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = path.open("ab")
        self._since_sync = 0

    def write(self, episode: Episode) -> None:
        self._f.write(episode.line())
        self._f.flush()
        self._since_sync += 1
        if self._since_sync >= 32:
            os.fsync(self._f.fileno())
            self._since_sync = 0

    def close(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


def run_identity(env: EvalTarget, n: int, group_size: int, model: str, agent: str) -> dict[str, Any]:
    return {
        "env": env.name,
        "n": n,
        "group_size": group_size,
        "model": model,
        "agent": agent,
        "config": env.config.model_dump(mode="json"),
    }


def _same_config(env: EvalTarget, old: Any, new: Any) -> bool:
    """Whether a run's saved config is this one. A run written before a field was added to the
    env's config saved no value for it: it is read with the field's default (the value the run
    had, since the field did not exist), so adding a field does not orphan older runs."""
    if old == new:
        return True
    try:
        upgraded = type(env.config).model_validate(old).model_dump(mode="json")
    except (ValidationError, TypeError):
        return False
    return bool(upgraded == new)


def check_same_run(env: EvalTarget, run_dir: Path, identity: dict[str, Any]) -> None:
    path = run_dir / RUN_FILE
    if not path.exists():
        return
    old = orjson.loads(path.read_bytes())
    diff = [k for k in ("env", "n", "group_size", "model", "agent") if old.get(k) != identity.get(k)]
    if not _same_config(env, old.get("config"), identity.get("config")):
        diff.append("config")
    if diff:
        raise EvalRunError(
            f"{run_dir} holds another evaluation (differs in: {', '.join(diff)}); "
            "use a new --output-dir or repeat the original options to resume it"
        )


async def run_episodes(
    env: EvalTarget,
    rollouts: EpisodeSource,
    run_dir: Path,
    *,
    n: int,
    group_size: int,
    model: str,
    agent: str = "model",
    on_episode: Callable[[Episode, int, int], None] | None = None,
) -> EvalRun:
    """The books of an evaluation (run directory, resume, status, summary) around ``rollouts``:
    each (item, rollout) not yet in ``episodes.jsonl`` is asked of it once and appended when it
    comes back. ``model`` is the name ``run.json`` records (a resume must name the same)."""
    identity = run_identity(env, n, group_size, model, agent)
    episodes_path = run_dir / EPISODES_FILE
    done = await asyncio.to_thread(_open_run, env, run_dir, identity)  # noqa: ASYNC240
    await env.setup()
    items = env.eval_items(n)
    keys = prompt_keys(items)
    todo: list[tuple[int, int]] = [
        (i, r)
        for i, item in enumerate(items)
        for r in range(group_size)
        if rollout_key(keys[i], r, group_size) not in done and f"{env.item_id(item)}#{r}" not in done
    ]  # ITEM_ID#ROLLOUT: how an episode was keyed before record.keys (a run of then still resumes)
    total = len(items) * group_size
    log = _EpisodeLog(episodes_path)
    finished = total - len(todo)
    started = time.monotonic()

    async def one(i: int, r: int) -> None:
        nonlocal finished
        ep = await rollouts.episode(
            items[i], rollout=r, group_size=group_size, prompt_index=i, prompt_key=keys[i]
        )
        log.write(ep)
        finished += 1
        if on_episode is not None:
            on_episode(ep, finished, total)

    watcher = asyncio.create_task(_watch(run_dir, rollouts, lambda: (finished, total, started)))
    try:
        async with asyncio.TaskGroup() as tg:
            for i, r in todo:
                tg.create_task(one(i, r))
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        log.close()
        _write_status(run_dir, rollouts, finished, total, started)
    summary = await asyncio.to_thread(write_summary, run_dir, env.name)
    return EvalRun(summary, run_dir, len(todo))


def _open_run(env: EvalTarget, run_dir: Path, identity: dict[str, Any]) -> set[str]:
    """Create or reopen the run directory; the keys of the episodes it already holds."""
    run_dir.mkdir(parents=True, exist_ok=True)
    check_same_run(env, run_dir, identity)
    (run_dir / RUN_FILE).write_bytes(orjson.dumps(identity, option=orjson.OPT_INDENT_2))
    return {e.key for e in read_episodes(run_dir / EPISODES_FILE, repair=True)}


def read_cluster_events(run_dir: Path) -> list[dict[str, Any]]:
    """The run's ``cluster_events.jsonl`` (none for a run that never lost an actor); a torn last
    line (the driver killed mid-write) is skipped."""
    return read_complete_objects(run_dir / CLUSTER_EVENTS_FILE)


def write_summary(run_dir: Path, env: str) -> EvalSummary:
    """``summary.json`` from the episodes in the file and the run's cluster events.

    ``requeued`` and ``actors_lost`` count over the run directory's whole life, not this
    invocation: the driver appends one line per event to ``cluster_events.jsonl`` as it happens,
    so a run that lost a node and requeued 3 episodes, was killed, and was resumed without losing
    anything says 3 (the resume adds its own, 0). A count kept in memory and written at the end
    would be lost with a killed driver, and one in ``status.json`` is rewritten by the next
    invocation; the event file also survives ``env rescore`` (which rewrites this summary). An
    episode rerun because the driver itself died is not counted: it had never been written.
    """
    summary = summarize(read_episodes(run_dir / EPISODES_FILE), env)
    events = Counter(e.get("event") for e in read_cluster_events(run_dir))
    summary = summary.model_copy(update={"requeued": events["requeued"], "actors_lost": events["actor_lost"]})
    (run_dir / SUMMARY_FILE).write_bytes(
        orjson.dumps(summary.model_dump(mode="json"), option=orjson.OPT_INDENT_2)
    )
    return summary


def _write_status(run_dir: Path, rollouts: EpisodeSource, finished: int, total: int, started: float) -> None:
    status = {
        "finished": finished,
        "total": total,
        "elapsed_s": round(time.monotonic() - started, 2),
        **rollouts.report(),
    }
    tmp = run_dir / (STATUS_FILE + ".tmp")
    tmp.write_bytes(orjson.dumps(status))
    tmp.replace(run_dir / STATUS_FILE)


async def _watch(
    run_dir: Path, rollouts: EpisodeSource, progress: Callable[[], tuple[int, int, float]]
) -> None:
    """Apply ``control.json`` and rewrite ``status.json`` once a second."""
    seen: bytes | None = None
    while True:
        control = run_dir / CONTROL_FILE
        with contextlib.suppress(OSError):
            raw = control.read_bytes()
            if raw != seen:
                seen = raw
                try:
                    wanted = orjson.loads(raw)
                    await rollouts.resize(
                        rollouts=wanted.get("max_concurrent_rollouts"),
                        tools_per_rollout=wanted.get("max_parallel_tools"),
                    )
                except (orjson.JSONDecodeError, ValueError, AttributeError) as exc:
                    (run_dir / "control.error").write_text(f"ignored {CONTROL_FILE}: {exc}\n")
        finished, total, started = progress()
        _write_status(run_dir, rollouts, finished, total, started)
        await asyncio.sleep(1.0)


def write_control(run_dir: Path, **settings: int | None) -> None:
    """What ``trajforge env resize`` writes (atomically) for a running evaluation to pick up."""
    tmp = run_dir / (CONTROL_FILE + ".tmp")
    tmp.write_bytes(orjson.dumps({k: v for k, v in settings.items() if v is not None}))
    tmp.replace(run_dir / CONTROL_FILE)
