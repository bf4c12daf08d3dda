"""The 95% Wilson interval every eval summary reports: it must contain its own point estimate."""

from __future__ import annotations

import pytest

from trajforge.envs.summary import wilson


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
