"""Results of an evaluation: mean reward, pass@1, pass@k, per category, with 95% intervals.

pass@k is the unbiased estimator of Chen et al. (2021): over the n rollouts of an item with c
successes, ``1 - C(n-c, k) / C(n, k)``, averaged over items. Intervals are normal approximations
over items (the unit that varies), Wilson's for rates, so a 100-item eval says how far apart two
policies must be before the difference means anything.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from pydantic import BaseModel

from trajforge.envs.types import Episode

SUCCESS = 1.0  # a rollout "passes" when its reward reaches this


class Interval(BaseModel):
    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


class CategoryResult(BaseModel):
    items: int
    episodes: int
    mean_reward: Interval
    pass_at_1: Interval


class EvalSummary(BaseModel):
    env: str
    items: int
    episodes: int
    group_size: int
    failed: int
    """episodes that could not run (sandbox/model failures): excluded from the rates"""
    reward_errors: int
    mean_reward: Interval
    pass_at_1: Interval
    pass_at_k: dict[int, float]
    by_category: dict[str, CategoryResult]
    requeued: int = 0
    """episodes asked again of another rollout actor after theirs was lost (``--backend ray``), over
    every invocation of the run (``runner.write_summary``); always 0 on one machine"""
    actors_lost: int = 0
    """rollout actors lost (their node went down, their process died), over every invocation"""


def mean_interval(values: Sequence[float]) -> Interval:
    n = len(values)
    if n == 0:
        return Interval(value=0.0, low=0.0, high=0.0)
    mean = sum(values) / n
    if n == 1:
        return Interval(value=mean, low=mean, high=mean)
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    half = 1.96 * math.sqrt(var / n)
    return Interval(value=mean, low=mean - half, high=mean + half)


def wilson(successes: float, n: int, z: float = 1.96) -> Interval:
    if n == 0:
        return Interval(value=0.0, low=0.0, high=0.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At p = 0 or 1 the bound is exactly p; in floats centre +- half lands 1e-16 short of it, and
    # an interval that excludes its own point estimate misleads every "within the CI" check.
    low = 0.0 if p <= 0.0 else max(0.0, min(p, centre - half))
    high = 1.0 if p >= 1.0 else min(1.0, max(p, centre + half))
    return Interval(value=p, low=low, high=high)


def pass_at_k(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _rate(per_item: list[float]) -> Interval:
    """A rate over items: Wilson when each item is one rollout, else normal over item means."""
    if all(v in (0.0, 1.0) for v in per_item):
        return wilson(sum(per_item), len(per_item))
    return mean_interval(per_item)


def summarize(episodes: Iterable[Episode], env: str) -> EvalSummary:
    groups: dict[str, list[Episode]] = defaultdict(list)
    failed = reward_errors = 0
    total = 0
    for ep in episodes:
        total += 1
        if ep.status == "failed" and ep.termination == "not_run":
            failed += 1
            continue
        reward_errors += ep.reward_error is not None
        groups[ep.item_id or ep.key].append(ep)
    sizes = sorted({len(g) for g in groups.values()})
    group_size = max(sizes, default=0)
    item_reward = {i: sum(e.score for e in g) / len(g) for i, g in groups.items()}
    item_pass = {i: sum(e.score >= SUCCESS for e in g) / len(g) for i, g in groups.items()}
    ks = sorted({1, group_size} | ({2, 4, 8} & set(range(1, min(sizes, default=1) + 1))))
    at_k = {
        k: sum(pass_at_k(len(g), sum(e.score >= SUCCESS for e in g), k) for g in groups.values())
        / max(1, len(groups))
        for k in ks
        if k <= min(sizes, default=0)
    }
    cats: dict[str, list[str]] = defaultdict(list)
    for i, g in groups.items():
        cats[g[0].category or "-"].append(i)
    by_cat = {
        c: CategoryResult(
            items=len(ids),
            episodes=sum(len(groups[i]) for i in ids),
            mean_reward=mean_interval([item_reward[i] for i in ids]),
            pass_at_1=_rate([item_pass[i] for i in ids]),
        )
        for c, ids in sorted(cats.items())
    }
    return EvalSummary(
        env=env,
        items=len(groups),
        episodes=total,
        group_size=group_size,
        failed=failed,
        reward_errors=reward_errors,
        mean_reward=mean_interval(list(item_reward.values())),
        pass_at_1=_rate(list(item_pass.values())),
        pass_at_k=at_k,
        by_category=by_cat,
    )
