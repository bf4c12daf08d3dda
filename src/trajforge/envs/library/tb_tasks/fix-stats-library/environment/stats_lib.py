def median(values):
    """The median of a non-empty list of numbers (the mean of the two middle ones for an even
    count). The list given is not modified."""
    values.sort()
    mid = len(values) // 2
    return values[mid]


def percentile(values, p):
    """The p-th percentile (0 < p <= 100) by the nearest-rank method: the k-th smallest value,
    k = ceil(p / 100 * n). The list given is not modified."""
    ordered = sorted(values)
    k = int(p / 100 * len(ordered))
    return ordered[k]


def moving_average(values, window):
    """Averages of each run of `window` consecutive values: n - window + 1 of them."""
    return [sum(values[i : i + window]) / window for i in range(len(values) - window)]
