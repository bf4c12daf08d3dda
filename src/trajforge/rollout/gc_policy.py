"""The cyclic garbage collector while many rollouts run in one process.

Why: a rollout allocates thousands of short-lived container objects per model call (the SDK's
request and response objects, headers, JSON trees, asyncio futures). CPython's default first
generation threshold (700 net allocations) then runs a young collection every few calls, and each
one walks every young object still alive: the requests of the other rollouts in flight. Measured
on a batch of 3,000 samples, 2 worker processes x 128 rollouts at 200 ms calls
(``benchmarks/batch_throughput.py``, docs/benchmarks.md "Garbage collection"): 650-670 young
collections and 0.7-0.9 s of CPU per worker process, 11% of the worker's CPU; with the first
threshold at 50,000, 9 collections and 0.23-0.27 s.

What stays the same: reference counting frees acyclic garbage at once, as before; the older
generations keep their ratios to the first (a full collection every 100 young ones), so cyclic
garbage is still collected, after ~50,000 net allocations instead of 700: a few MB at most.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

ROLLOUT_GEN0_THRESHOLD = 50_000


@contextmanager
def rollout_gc() -> Iterator[None]:
    """The collector's first threshold at :data:`ROLLOUT_GEN0_THRESHOLD` for the block; the
    thresholds before it are put back after (an embedding program keeps its own)."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], ROLLOUT_GEN0_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
