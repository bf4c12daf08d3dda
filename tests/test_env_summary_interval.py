"""The 95% Wilson interval every eval summary reports: it must contain its own point estimate."""

from __future__ import annotations

import pytest

from trajforge.engine.summary import bootstrap, summarize, wilson
from trajforge.envs.types import Episode
from trajforge.record import Reward


@pytest.mark.parametrize("n", [1, 3, 6, 7, 40, 200, 1001])
def test_wilson_interval_contains_its_estimate_at_every_count(n: int) -> None:
    for k in range(n + 1):
        iv = wilson(k, n)
        assert iv.low <= iv.value <= iv.high, (k, n, iv)
        assert iv.low >= 0.0 and iv.high <= 1.0
    # all passed / none passed: the bound on that side is exactly the estimate (in floats, the
    # formula's centre + half came to 0.9999999999999999 for 6 of 6 and excluded 1.0)
    assert wilson(n, n).high == 1.0 and wilson(0, n).low == 0.0


def test_wilson_matches_the_textbook_values() -> None:
    iv = wilson(126, 200)  # the closed loop's 63.0% [56.1, 69.4]
    assert (round(iv.low * 100, 1), round(iv.high * 100, 1)) == (56.1, 69.4)
    assert wilson(0, 0).high == 0.0


def _episodes(outcomes: dict[str, list[float]]) -> list[Episode]:
    """Episodes of items named by ``outcomes``' keys, one per reward."""
    return [
        Episode(
            env="e",
            item_id=item,
            rollout=r,
            group_size=len(rewards),
            seed=r,
            item={},
            toolsets=[],
            tools=[],
            messages=[],
            status="completed",
            termination="final_answer",
            reward=Reward(value=reward),
        )
        for item, rewards in outcomes.items()
        for r, reward in enumerate(rewards)
    ]


@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("reward", [0.0, 1.0])
def test_binary_mean_reward_at_0_or_100_percent_has_a_wilson_interval_not_zero_width(
    group: int, reward: float
) -> None:
    """Before, 30 items that all passed showed mean reward 1.000 [1.000, 1.000] (a normal interval
    over identical values) next to pass@1's Wilson [0.886, 1.000]."""
    s = summarize(_episodes({f"i{n}": [reward] * group for n in range(30)}), "e")
    expected = wilson(30 * reward, 30)
    assert s.mean_reward == expected == s.pass_at_1
    assert s.mean_reward.high - s.mean_reward.low > 0.1


def test_every_pass_at_k_shown_has_an_interval_containing_it() -> None:
    outcomes = {f"i{n}": [1.0 if (n + r) % 3 == 0 else 0.0 for r in range(8)] for n in range(40)}
    s = summarize(_episodes(outcomes), "e")
    assert set(s.pass_at_k) == {1, 2, 4, 8} == set(s.pass_at_k_interval)
    for k, value in s.pass_at_k.items():
        iv = s.pass_at_k_interval[k]
        assert iv.value == pytest.approx(value)
        assert iv.low <= value <= iv.high and iv.high - iv.low > 0, (k, iv)
    # fractional per-item rates: a bootstrap over items, seeded, so the summary is reproducible
    again = summarize(_episodes(outcomes), "e")
    assert again.pass_at_k_interval == s.pass_at_k_interval
    assert s.pass_at_k_interval[1] == bootstrap([sum(v) / 8 for v in outcomes.values()])


def test_bootstrap_interval_matches_the_spread_of_the_data() -> None:
    """On 200 items with rates 0.25/0.75 the 95% interval of the mean is about +-1.96*0.25/sqrt(200)."""
    values = [0.25, 0.75] * 100
    iv = bootstrap(values)
    assert iv.value == 0.5
    assert iv.high - iv.low == pytest.approx(2 * 1.96 * 0.25 / 200**0.5, rel=0.15)


def test_non_binary_rewards_keep_the_normal_interval_and_pass_at_k_still_has_one() -> None:
    s = summarize(_episodes({f"i{n}": [0.5, 0.25 * (n % 4)] for n in range(20)}), "e")
    assert s.mean_reward.low < s.mean_reward.value < s.mean_reward.high
    assert set(s.pass_at_k_interval) == set(s.pass_at_k) == {1, 2}
