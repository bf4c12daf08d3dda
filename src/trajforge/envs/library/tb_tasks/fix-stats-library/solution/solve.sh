#!/bin/bash
cat > /app/stats_lib.py <<'PY'
import math


def median(values):
    """The median of a non-empty list of numbers (the mean of the two middle ones for an even
    count). The list given is not modified."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def percentile(values, p):
    """The p-th percentile (0 < p <= 100) by the nearest-rank method: the k-th smallest value,
    k = ceil(p / 100 * n). The list given is not modified."""
    ordered = sorted(values)
    k = math.ceil(p / 100 * len(ordered))
    return ordered[max(k, 1) - 1]


def moving_average(values, window):
    """Averages of each run of `window` consecutive values: n - window + 1 of them."""
    return [sum(values[i : i + window]) / window for i in range(len(values) - window + 1)]
PY
