"""Results of an evaluation: mean reward, pass@1, pass@k, per category, with 95% intervals.

pass@k is the unbiased estimator of Chen et al. (2021): over the n rollouts of an item with c
successes, ``1 - C(n-c, k) / C(n, k)``, averaged over items. Every figure shown has a 95% interval
over items (the unit that varies), so a 100-item eval says how far apart two policies must be
before the difference means anything:

- a rate of binary outcomes (pass@1, pass@k, and the mean reward when every reward is 0 or 1) whose
  per-item values are all 0 or 1: Wilson's score interval (never zero-width at 0% or 100%, where a
  normal interval collapses to a point);
- such a rate with fractional per-item values (group size > 1): a percentile bootstrap over items
  (:data:`BOOTSTRAP_RESAMPLES`, seeded, so a summary is reproducible), Wilson's when every item has
  the same value (a bootstrap of identical values has no width either);
- the mean of a non-binary reward: the normal approximation over item means.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from pydantic import BaseModel

from trajforge.record import Record as Episode

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
    """episodes that could not run (a sandbox that did not start, a model never reached):
    excluded from the rates"""
    reward_errors: int
    mean_reward: Interval
    pass_at_1: Interval
    pass_at_k: dict[int, float]
    pass_at_k_interval: dict[int, Interval] = {}
    """the same pass@k figures with their 95% intervals (see the module's docstring)"""
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


BOOTSTRAP_RESAMPLES = 2000


def bootstrap(values: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> Interval:
    """The mean of ``values`` with a 95% percentile-bootstrap interval (resampling the values)."""
    import numpy as np

    n = len(values)
    if n == 0:
        return Interval(value=0.0, low=0.0, high=0.0)
    data = np.asarray(values, dtype=float)
    means = data[np.random.default_rng(seed).integers(0, n, size=(resamples, n))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    mean = float(data.mean())
    return Interval(value=mean, low=min(float(low), mean), high=max(float(high), mean))


def rate_interval(per_item: Sequence[float]) -> Interval:
    """A rate of binary outcomes over items (each value in [0, 1]): Wilson when each item is 0 or 1
    or all items are equal, else a bootstrap over items."""
    if all(v in (0.0, 1.0) for v in per_item) or len(set(per_item)) <= 1:
        return wilson(sum(per_item), len(per_item))
    return bootstrap(per_item)


def pass_at_k(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _mean_reward(per_item: list[float], binary: bool) -> Interval:
    """The mean reward over items: a rate when every reward is 0 or 1, else normal."""
    return rate_interval(per_item) if binary else mean_interval(per_item)


def summarize(episodes: Iterable[Episode], env: str) -> EvalSummary:
    groups: dict[str, list[Episode]] = defaultdict(list)
    failed = reward_errors = 0
    total = 0
    for ep in episodes:
        total += 1
        if ep.status == "failed" and (ep.termination == "not_run" or ep.reason_kind == "model_not_reached"):
            failed += 1
            continue
        reward_errors += ep.reward_failed
        groups[ep.item_id or ep.key].append(ep)
    sizes = sorted({len(g) for g in groups.values()})
    group_size = max(sizes, default=0)
    item_reward = {i: sum(e.score for e in g) / len(g) for i, g in groups.items()}
    item_pass = {i: sum(e.score >= SUCCESS for e in g) / len(g) for i, g in groups.items()}
    binary = all(e.score in (0.0, 1.0) for g in groups.values() for e in g)
    ks = sorted({1, group_size} | ({2, 4, 8} & set(range(1, min(sizes, default=1) + 1))))
    per_item_at_k = {
        k: [pass_at_k(len(g), sum(e.score >= SUCCESS for e in g), k) for g in groups.values()]
        for k in ks
        if k <= min(sizes, default=0)
    }
    at_k = {k: sum(v) / max(1, len(v)) for k, v in per_item_at_k.items()}
    at_k_interval = {k: rate_interval(v) for k, v in per_item_at_k.items()}
    cats: dict[str, list[str]] = defaultdict(list)
    for i, g in groups.items():
        cats[g[0].category or "-"].append(i)
    by_cat = {
        c: CategoryResult(
            items=len(ids),
            episodes=sum(len(groups[i]) for i in ids),
            mean_reward=_mean_reward([item_reward[i] for i in ids], binary),
            pass_at_1=rate_interval([item_pass[i] for i in ids]),
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
        mean_reward=_mean_reward(list(item_reward.values()), binary),
        pass_at_1=rate_interval(list(item_pass.values())),
        pass_at_k=at_k,
        pass_at_k_interval=at_k_interval,
        by_category=by_cat,
    )
