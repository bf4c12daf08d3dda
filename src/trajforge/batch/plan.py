"""What a (re)started run still has to do, without a Python pass over a million done samples.

Every plan leaves each of its dataset rows in the ledger under its key with its row index, and
nothing else changes a sample's key or index; the ledger stores, in the same transaction, a
:class:`PlanMark` (how many rows, and a fingerprint of their keys in order). So when the first
``rows`` keys of the dataset now have that fingerprint, the ledger already knows those rows:
the ones still to do are exactly its open (pending/running) samples whose index points at a row
with the same key, read through a partial index; only rows past the mark (an appended tail) are
looked up by key. Any other dataset (edited, reordered, truncated, a first start) takes the full
comparison against every done sample, which is always right, and leaves a new mark behind.
"""

from __future__ import annotations

from dataclasses import dataclass

from trajforge.batch.dataset import BadRow, DatasetIndex, Sample
from trajforge.batch.groups import GroupedIndex
from trajforge.batch.ledger import Ledger, PlanMark

# Past this many rows beyond the mark, one pass over the done samples is cheaper than looking
# each new row up in the ledger's b-tree.
_MAX_TAIL_LOOKUPS = 100_000


@dataclass(slots=True)
class Plan:
    todo: list[Sample]
    """samples to run, in dataset order"""
    bad: list[BadRow]
    """bad rows not yet recorded as failed"""
    upserts: list[tuple[str, int]]
    """(key, index) to register as pending, or to move to their new row"""
    mark: PlanMark
    """what the ledger agrees with once ``upserts`` are in"""
    full: bool
    """True when every row was compared (no usable mark)"""


def _known_rows(mark: PlanMark | None, data: DatasetIndex | GroupedIndex) -> int:
    """The leading rows the ledger's plan mark vouches for (0: compare every row)."""
    total = len(data.keys)
    if mark is None or not total - _MAX_TAIL_LOOKUPS <= mark.rows <= total:
        return 0
    if mark.rows and data.fingerprint(mark.rows) != mark.keys:
        return 0
    return mark.rows


def plan_run(ledger: Ledger, data: DatasetIndex | GroupedIndex) -> Plan:
    """Compare ``data`` with the ledger; the caller applies ``upserts`` and ``mark`` together
    (:meth:`Ledger.add_pending`) before running ``todo``."""
    keys = data.keys
    total = len(keys)
    mark = ledger.plan_mark()
    known = _known_rows(mark, data)
    upserts: list[tuple[str, int]] = []
    if known:
        todo = sorted(idx for key, idx in ledger.open_samples() if idx < known and keys[idx] == key)
        found = ledger.find(keys[known:])
        for i in range(known, total):
            hit = found.get(keys[i])
            if hit is None or not hit[1]:
                todo.append(i)
                upserts.append((keys[i], i))
            elif hit[0] != i:
                upserts.append((keys[i], i))  # done under another row: merged in its new place
    else:
        todo = _compare_all(ledger, keys, upserts)
    fingerprint = mark.keys if known == total and mark is not None else data.fingerprint(total)
    return Plan(
        *data.samples(todo),
        upserts,
        PlanMark(total, fingerprint),
        full=not known,
    )


def _compare_all(ledger: Ledger, keys: list[str], upserts: list[tuple[str, int]]) -> list[int]:
    """Rows not done (appending their upserts, and those of done rows that moved), comparing
    every done sample. Most done samples still sit at their row (a dataset that only grew, or a
    run from before plan marks): they are matched by index, and only the rest by key."""
    total = len(keys)
    at_row = bytearray(total)  # 1: done, and the ledger has it at this very row
    moved: dict[str, int] = {}
    done_keys, done_idxs = ledger.done_samples()
    for key, idx in zip(done_keys, done_idxs, strict=True):
        if idx < total and keys[idx] == key:
            at_row[idx] = 1
        else:
            moved[key] = idx
    todo: list[int] = []
    i = at_row.find(0)
    while i >= 0:
        key = keys[i]
        if key not in moved:
            todo.append(i)
        upserts.append((key, i))  # pending from now on, or done and moved to this row
        i = at_row.find(0, i + 1)
    return todo
