"""``run_eval``: an env's held-out items x a group size, judged, written as they finish.

The env's front end of the engine (:class:`~.episode.Rollouts`) inside the engine's books of an
evaluation run (:mod:`trajforge.engine.books`: the run directory, resume, status, summary). The
same books serve ``--backend ray`` (:mod:`.ray_backend`) and a seed env that runs its own
evaluation (:mod:`.hermes`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trajforge.engine.books import EvalRun, run_episodes
from trajforge.envs.hooks import run_evaluation_hook
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.running.budget import fit_token_budget, fitter
from trajforge.envs.running.episode import RolloutBackends, Rollouts
from trajforge.envs.types import Episode
from trajforge.rollout.gc_policy import rollout_gc


async def run_eval(
    env: AgentEnv,
    backends: RolloutBackends,
    run_dir: Path,
    *,
    n: int,
    group_size: int,
    agent: str = "model",
    on_episode: Callable[[Episode, int, int], None] | None = None,
    announce: Callable[[str], None] = lambda _m: None,
) -> EvalRun:
    """Evaluate ``n`` held-out items x ``group_size`` rollouts in this process; resumable (see
    module doc). The env's ``max_tokens`` is first fitted to the endpoint's context
    (:mod:`.budget`; ``announce`` gets the note). An env with its own ``run_evaluation`` (a
    seed env: :mod:`.hermes`) runs the evaluation itself, with these same books."""
    fit = await fit_token_budget(env, backends.model, announce) if agent == "model" else fitter(None)
    own = run_evaluation_hook(env)
    if own is not None:
        run: EvalRun = await own(
            backends,
            run_dir,
            n=n,
            group_size=group_size,
            agent=agent,
            on_episode=on_episode,
            fit=fit,
            announce=announce,
        )
        return run
    return await evaluate_rollouts(
        env, backends, run_dir, n=n, group_size=group_size, agent=agent, on_episode=on_episode
    )


async def evaluate_rollouts(
    env: AgentEnv,
    backends: RolloutBackends,
    run_dir: Path,
    *,
    n: int,
    group_size: int,
    agent: str = "model",
    on_episode: Callable[[Episode, int, int], None] | None = None,
) -> EvalRun:
    """The env's own rollouts on the engine, inside the engine's books: what :func:`run_eval`
    runs for an env without its own evaluation, and a seed env for its loop's rollouts."""
    rollouts = Rollouts(env, backends)
    with rollout_gc():
        async with rollouts.engine.running():  # sandboxes close while the next episodes start
            return await run_episodes(
                env,
                rollouts,
                run_dir,
                n=n,
                group_size=group_size,
                model=backends.model.name,
                agent=agent,
                on_episode=on_episode,
            )
