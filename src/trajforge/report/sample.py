"""Which lines the trajectory browser gets: a uniform sample within each status.

One reservoir per status (Algorithm R, seeded), holding only where each line is. At the end the
budget is shared out so that a rare status (a handful of failures among a million completions)
is shown whole rather than sampled away: every status gets an equal share, and what a small
status does not use goes to the others.
"""

from __future__ import annotations

import random

from trajforge.report.source import LineRef


class StatusSampler:
    """Uniform reservoirs per status; :meth:`chosen` returns at most ``capacity`` line refs."""

    def __init__(self, capacity: int, seed: int) -> None:
        self.capacity = capacity
        self._rng = random.Random(seed)
        self._seen: dict[str, int] = {}
        self._reservoirs: dict[str, list[LineRef]] = {}

    def offer(self, status: str, ref: LineRef) -> None:
        if self.capacity <= 0:
            return
        seen = self._seen.get(status, 0) + 1
        self._seen[status] = seen
        reservoir = self._reservoirs.setdefault(status, [])
        if len(reservoir) < self.capacity:
            reservoir.append(ref)
            return
        slot = self._rng.randrange(seen)
        if slot < self.capacity:
            reservoir[slot] = ref

    def quotas(self) -> dict[str, int]:
        """How many of each status to show: equal shares, what a small status leaves goes on."""
        left = self.capacity
        sizes = {status: len(r) for status, r in self._reservoirs.items()}
        quota = dict.fromkeys(sizes, 0)
        open_ = sorted(sizes, key=lambda s: sizes[s])
        while left > 0 and open_:
            share = max(left // len(open_), 1)
            for status in list(open_):
                take = min(share, sizes[status] - quota[status], left)
                quota[status] += take
                left -= take
                if quota[status] >= sizes[status]:
                    open_.remove(status)
                if left <= 0:
                    break
        return quota

    def chosen(self) -> list[LineRef]:
        """The sampled refs, in a seeded random order (so a size cut drops a random few)."""
        picked: list[LineRef] = []
        for status, take in self.quotas().items():
            reservoir = self._reservoirs[status]
            picked.extend(self._rng.sample(reservoir, take) if take < len(reservoir) else reservoir)
        self._rng.shuffle(picked)
        return picked
