"""``env eval`` of a seed env whose evaluation is its own ``evaluate()`` (the benchmark envs).

``setup()`` then ``evaluate()``, as the seed's ``evaluate`` subcommand runs them. While they run,
what the env prints goes to stderr (``--json`` keeps stdout for the summary) and the logging it
reconfigures (the benchmark envs replace the root logger's handlers) is put back afterwards.
Every ``HermesAgentLoop.run`` is one episode of ``episodes.jsonl``, scored by the sample the
env's ``evaluate_log`` reported for it (:meth:`.runtime.SeedRuntime.records`); the env's own
metrics go to ``evaluate_log.json``. The call is one unit: a rerun of an unfinished run starts it
over (the episodes of the unfinished one are replaced), a finished run is not run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from trajforge.engine.books import (
    EPISODES_FILE,
    RUN_FILE,
    SUMMARY_FILE,
    EvalRun,
    check_same_run,
    read_episodes,
    run_identity,
    write_summary,
)
from trajforge.envs.protocol import AgentEnv
from trajforge.rollout.gc_policy import rollout_gc

if TYPE_CHECKING:
    from trajforge.envs.hermes.runtime import SeedRuntime


class SelfEvaluating(AgentEnv, Protocol):
    """What this runs of a seed env (``HermesAgentBaseEnv``): its hooks and what it logged."""

    async def evaluate(self) -> None: ...

    def logged_samples(self) -> list[dict[str, Any]]: ...


@contextlib.contextmanager
def _env_io() -> Iterator[None]:
    """The env's prints on stderr; the root logger's handlers and level as they were."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


async def run_own_evaluation(
    env: SelfEvaluating,
    runtime: SeedRuntime,
    run_dir: Path,
    *,
    agent: str = "model",
    on_episode: Callable[..., None] | None = None,
) -> EvalRun:
    """Run ``env.setup()`` and ``env.evaluate()``; record their loop runs (module docstring)."""
    identity = run_identity(env, 0, 1, runtime.backends.model.name, agent)
    identity["evaluation"] = "evaluate"
    done = await asyncio.to_thread(_open, env, run_dir, identity)
    if done:
        summary = await asyncio.to_thread(write_summary, run_dir, env.name)
        return EvalRun(summary, run_dir, 0)
    failure: BaseException | None = None
    with rollout_gc(), _env_io():
        try:
            await env.setup()
            await env.evaluate()
        except Exception as exc:  # the env's own code: its episodes are still recorded
            failure = exc
    outcomes = await runtime.close()
    samples = env.logged_samples()
    records = runtime.records(outcomes, samples)
    with (run_dir / EPISODES_FILE).open("wb") as f:
        for i, record in enumerate(records, 1):
            f.write(record.line())
            if on_episode is not None:
                on_episode(record, i, len(records))
    if failure is not None:
        from trajforge.envs.base import EnvDataError

        if isinstance(failure, EnvDataError):
            raise failure
        raise EnvDataError(
            f"{type(env).__name__}.evaluate() failed after {len(records)} loop run(s): "
            f"{type(failure).__name__}: {failure}"
        ) from failure
    if not records:
        runtime.note_once(f"{type(env).__name__}.evaluate() ran no HermesAgentLoop: no episodes")
    summary = await asyncio.to_thread(write_summary, run_dir, env.name)
    return EvalRun(summary, run_dir, len(records))


def _open(env: Any, run_dir: Path, identity: dict[str, Any]) -> bool:
    """Create or reopen the run directory; whether it holds a finished evaluation already."""
    run_dir.mkdir(parents=True, exist_ok=True)
    check_same_run(env, run_dir, identity)
    finished = (run_dir / SUMMARY_FILE).exists() and bool(read_episodes(run_dir / EPISODES_FILE))
    (run_dir / RUN_FILE).write_bytes(orjson.dumps(identity, option=orjson.OPT_INDENT_2, default=str))
    return finished


__all__ = ["run_own_evaluation"]
