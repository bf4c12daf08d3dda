"""Judged episodes -> GRPO samples, and what a step's rollouts say (rewards, pass rate, families).

A group is the rollouts of one item; its advantages are normalised within it. A group whose
rewards are all equal carries no signal (every advantage is 0) and is dropped when asked --
unless its episodes carry per-token advantages (an env that scores tokens, ``opd``): those are
the advantages then, in place of the group's (:mod:`trajforge.rl.grpo`). An episode without an
exact token trace (the rollout failed before the model sampled, or the backend broke
token-exactness) keeps its place in its group's baseline but trains no token.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trajforge.envs.types import Episode
from trajforge.llm.token_trace import MASKED
from trajforge.rl.grpo import Sample, group_advantages
from trajforge.rl.rewards import aligned_token_advantages, scores_tokens

PASS_THRESHOLD = 1.0 - 1e-9
"""An episode passes when its reward is (numerically) 1.0: the env's own notion of solved."""


@dataclass
class StepRollouts:
    """The groups of one step: each a list of episodes of one item."""

    groups: list[list[Episode]]
    version: int
    """Server weight version when the step's rollouts began."""
    weights_step: int
    """The training step whose weights the server held then (0 = the initial model)."""
    seconds: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    uniform_groups: int = 0
    untraced: int = 0
    guided: list[Episode] = field(default_factory=list)
    """Oracle episodes put into groups with no success (``--guide oracle``; rl/guide.py)."""
    guided_samples: int = 0

    @property
    def episodes(self) -> list[Episode]:
        return [ep for g in self.groups for ep in g]


def build_samples(rollouts: StepRollouts, *, scale: bool = True, skip_uniform: bool = True) -> StepRollouts:
    samples: list[Sample] = []
    uniform = untraced = guided = 0
    guided_ids = {id(ep) for ep in rollouts.guided}
    for group in rollouts.groups:
        rewards = [ep.score for ep in group]
        scored_tokens = any(ep.trace is not None and scores_tokens(ep) for ep in group)
        if max(rewards) - min(rewards) < 1e-9:
            uniform += 1
            if skip_uniform and not scored_tokens:
                continue
        for ep, adv in zip(group, group_advantages(rewards, scale=scale), strict=True):
            trace = ep.trace
            if trace is None:
                untraced += 1
                continue
            sampled = [m != MASKED for m in trace.masks]
            if not any(sampled):
                untraced += 1
                continue
            spans = [(int(a), int(b), int(v)) for a, b, v in trace.span_versions or ()]
            samples.append(
                Sample(
                    tokens=list(trace.tokens),
                    sampled=sampled,
                    old_logprobs=list(trace.logprobs),
                    advantage=adv,
                    version=min((v for _, _, v in spans), default=rollouts.version),
                    token_advantages=aligned_token_advantages(ep),
                    span_versions=spans,
                )
            )
            guided += id(ep) in guided_ids
    rollouts.samples, rollouts.uniform_groups, rollouts.untraced = samples, uniform, untraced
    rollouts.guided_samples = guided
    return rollouts


def span_staleness(
    samples: Sequence[Sample], trained_step: int, step_of_version: dict[int, int]
) -> dict[str, Any]:
    """How old the weights that sampled each span were when ``trained_step`` trained on it:
    ``(trained_step - 1) - step_of_version[v]`` per sampled turn, token-weighted mean and max, and
    how many episodes straddle a weight reload (their turns sampled by more than one version).
    Samples without span versions count as sampled by ``Sample.version``."""
    tokens = weighted = 0
    worst = 0
    straddling = 0
    for s in samples:
        spans = s.span_versions or [(0, len(s.tokens), s.version)]
        straddling += len({v for _, _, v in spans}) > 1
        for start, end, version in spans:
            age = (trained_step - 1) - step_of_version.get(version, trained_step - 1)
            n = sum(s.sampled[start:end])
            tokens += n
            weighted += n * age
            worst = max(worst, age)
    return {
        "staleness_max": worst,
        "staleness_mean": round(weighted / tokens, 4) if tokens else 0.0,
        "straddling_episodes": straddling,
        "token_advantage_episodes": sum(s.token_advantages is not None for s in samples),
    }


def rollout_metrics(rollouts: StepRollouts) -> dict[str, Any]:
    """Reward figures are the policy's own episodes' (guided oracle episodes are counted apart)."""
    guided_ids = {id(ep) for ep in rollouts.guided}
    eps = [e for e in rollouts.episodes if id(e) not in guided_ids]
    rewards = [e.score for e in eps]
    sampled = sum(s.num_sampled for s in rollouts.samples)
    generated = sum(sum(m != MASKED for m in e.trace.masks) for e in eps if e.trace is not None)
    by_family: dict[str, list[float]] = defaultdict(list)
    for e in eps:
        by_family[e.category or "all"].append(e.score)
    return {
        "episodes": len(eps),
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "pass_rate": sum(r >= PASS_THRESHOLD for r in rewards) / max(1, len(rewards)),
        "reward_by_category": {k: statistics.fmean(v) for k, v in sorted(by_family.items())},
        "failed": sum(e.status == "failed" for e in eps),
        "reward_errors": sum(e.reward_failed for e in eps),
        "groups": len(rollouts.groups),
        "groups_uniform": rollouts.uniform_groups,
        "untraced": rollouts.untraced,
        "trained_episodes": len(rollouts.samples),
        "guided_groups": len(rollouts.guided),
        "guided_samples": rollouts.guided_samples,
        "sampled_tokens": sampled,
        "rollout_s": round(rollouts.seconds, 3),
        "rollout_tokens_per_s": round(generated / rollouts.seconds, 2) if rollouts.seconds > 0 else 0.0,
    }


def chunks(seq: Sequence[Any], n: int) -> list[list[Any]]:
    """``seq`` in ``n`` nearly equal consecutive parts (no empty part unless ``seq`` is short)."""
    n = max(1, min(n, len(seq))) if seq else 1
    size, extra = divmod(len(seq), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(list(seq[start:end]))
        start = end
    return [c for c in out if c]
