from collections import Counter


def mean(values: list[float]) -> float:
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def median(values: list[float]) -> float:
    if not values:
        raise ValueError("median of an empty sequence")
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def mode(values: list[float]) -> float:
    if not values:
        raise ValueError("mode of an empty sequence")
    counts = Counter(values)
    top = max(counts.values())
    return min(v for v, c in counts.items() if c == top)
