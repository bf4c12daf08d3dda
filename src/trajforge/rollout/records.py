"""A :class:`~trajforge.rollout.step.RolloutOutcome` -> the one :class:`~trajforge.record.Record`.

The caller says who the rollout was (:class:`Identity`: its key, the row or item, its place in its
group) and how it was asked (:class:`Asked`); everything else comes from the outcome. Batch lines,
env episodes and RL rollouts are all built here.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trajforge.agent import AgentConfig, ToolStat
from trajforge.record import Record, Reward, Timings, ToolCounts
from trajforge.rollout.step import RolloutOutcome

USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens", "reasoning_tokens", "cached_tokens")


@dataclass(frozen=True)
class Identity:
    """Which rollout: unique ``key`` in its run, the row or item it ran, its place in its group."""

    key: str
    item: dict[str, Any]
    prompt_index: int | None = None
    rollout: int = 0
    group_size: int = 1
    env: str | None = None
    item_id: str | None = None
    category: str | None = None


@dataclass(frozen=True)
class Asked:
    """How the rollout was asked: the model's name, the sampling settings every call sent, the
    run's system prompt; and which worker asked (recorded under ``timings``: provenance)."""

    model: str | None
    sampling: dict[str, Any] = field(default_factory=dict)
    system_prompt: str | None = None
    worker: int | None = None


def seeded(agent: AgentConfig, seed: int) -> AgentConfig:
    """``agent`` sending the rollout's seed with every model call (an endpoint that supports it
    replays the sampling). Both ``batch`` and the envs ask this way, so the same rollout is asked
    the same and records the same ``sampling``."""
    return agent.model_copy(update={"sampling": agent.sampling.model_copy(update={"seed": seed})})


def sent_sampling(agent: AgentConfig) -> dict[str, Any]:
    """The sampling settings every model call of ``agent`` sends, as the record keeps them (unset
    ones left out: the endpoint decided)."""
    return agent.sampling.model_dump(exclude_none=True)


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds")


def build_record(
    who: Identity,
    asked: Asked,
    done: RolloutOutcome,
    *,
    seed: int,
    toolsets: list[str],
    attempts: int = 1,
    pad: Sequence[str] = (),
) -> Record:
    """The record of one rollout. Tool statistics cover every tool offered, and every name in
    ``pad`` (zeros where one was not called): a batch pads over the run's tools, so every line of
    a run has the same keys (one Arrow schema)."""
    result = done.result
    reward = done.reward
    offered = [t.name for t in done.tools]
    counted = list(dict.fromkeys([*pad, *offered])) if pad else offered
    stats = result.tool_stats if result else {}
    errors = Counter(err.tool_name for err in result.tool_errors) if result else Counter[str]()
    usage = result.usage.model_dump() if result else {}
    if reward is None and done.judged:  # asked to judge, but the rollout never got that far
        reward = Reward.not_judged(f"not judged: {done.outcome.reason}")
    return Record(
        key=who.key,
        prompt_index=who.prompt_index,
        rollout=who.rollout,
        group_size=who.group_size,
        env=who.env,
        item_id=who.item_id,
        category=who.category,
        item=who.item,
        messages=result.messages if result else [],
        system_prompt=asked.system_prompt,
        status=done.outcome.status,  # type: ignore[arg-type]  # one of Status by construction
        reason=done.outcome.reason,
        reason_kind=done.outcome.reason_kind,
        termination=result.termination.value if result else "not_run",
        turns=result.api_calls if result else 0,
        attempts=attempts,
        reward=reward,
        tool_stats={n: ToolCounts(**stats.get(n, ToolStat()).model_dump()) for n in counted},
        tool_error_counts={n: errors[n] for n in counted},
        trace=done.trace,
        trace_error=done.trace_error,
        recovered_calls=list(result.recovered_calls) if result else [],
        usage={k: usage.get(k) for k in USAGE_KEYS} if result else {},  # None: the endpoint did not say
        timings=Timings(
            wall_s=round(done.finished_at - done.started_at, 4),
            model_s=round(result.model_time_s, 4) if result else 0.0,
            tool_s=round(result.tool_time_s, 4) if result else 0.0,
            reward_s=round(done.reward_s, 4),
            started_at=iso(done.started_at),
            finished_at=iso(done.finished_at),
            worker=asked.worker,
        ),
        model=(result.model if result and result.model else None) or asked.model,
        sampling=asked.sampling,
        seed=seed,
        toolsets=toolsets,
        tools=offered,
    )
