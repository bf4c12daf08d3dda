def merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping closed intervals; the result is sorted by start."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
