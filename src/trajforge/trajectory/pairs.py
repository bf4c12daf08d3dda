"""Which samples of a run make DPO pairs, and on what grounds.

A pair only means something when its two answers answer the same prompt and one is known to be
better. Two grounds, chosen per run and reported, never mixed silently:

* ``reward``: some line of the run carries a numeric ``reward``. Lines are grouped by
  ``prompt_index`` (``--samples-per-prompt N`` gives N lines per index); inside a group every two
  graded lines with *different* rewards make a pair, the higher one chosen. Equal rewards make no
  pair (nothing to prefer), ungraded lines (``reward`` null or absent) none either; both are
  counted.
* ``completion_status`` (the fallback, when no line of the run has a reward): a completed sample
  is chosen over a failed, partial or filtered one of the same prompt text (runs without
  ``--samples-per-prompt`` have duplicated prompts on different indices). Completion is weaker
  evidence than a grade, so the export says which ground it used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any, Literal

Line = Mapping[str, Any]
Ground = Literal["reward", "completion_status"]


@dataclass
class PairStats:
    """What the pairing did, written next to the export so a reader knows what "chosen" means."""

    ground: Ground
    lines: int = 0
    groups: int = 0
    pairs: int = 0
    ungraded_lines: int = 0
    tied_pairs_skipped: int = 0
    groups_without_pair: int = 0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def reward_of(line: Line) -> float | None:
    """The line's numeric reward, or None when ungraded (null, absent, not a finite number)."""
    value = line.get("reward")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def choose_ground(lines: Iterable[Line]) -> Ground:
    return "reward" if any(reward_of(line) is not None for line in lines) else "completion_status"


def pair_by_reward(lines: Sequence[Line]) -> tuple[list[tuple[Line, Line]], PairStats]:
    """(chosen, rejected) pairs inside each ``prompt_index`` group, higher reward chosen."""
    stats = PairStats("reward", lines=len(lines))
    groups: dict[Any, list[Line]] = {}
    for line in lines:
        groups.setdefault(line.get("prompt_index"), []).append(line)
    stats.groups = len(groups)
    pairs: list[tuple[Line, Line]] = []
    for members in groups.values():
        graded = [m for m in members if reward_of(m) is not None]
        stats.ungraded_lines += len(members) - len(graded)
        made = 0
        for a, b in combinations(graded, 2):
            ra, rb = reward_of(a), reward_of(b)
            assert ra is not None and rb is not None
            if ra == rb:
                stats.tied_pairs_skipped += 1
                continue
            pairs.append((a, b) if ra > rb else (b, a))
            made += 1
        stats.groups_without_pair += made == 0
    stats.pairs = len(pairs)
    return pairs, stats


def pair_by_completion(lines: Sequence[Line], prompt_of: Any) -> tuple[list[tuple[Line, Line]], PairStats]:
    """One pair per prompt text: its first completed sample against its first other sample."""
    stats = PairStats("completion_status", lines=len(lines))
    stats.notes.append(
        "no line of the run has a reward: pairs are a completed sample (chosen) against a "
        "failed/partial/filtered one of the same prompt; grade the run for reward-based pairs"
    )
    chosen: dict[str, Line] = {}
    rejected: dict[str, Line] = {}
    for line in lines:
        prompt = prompt_of(line)
        target = chosen if line.get("status") == "completed" else rejected
        target.setdefault(prompt, line)
    prompts = set(chosen) | set(rejected)
    stats.groups = len(prompts)
    pairs = [(chosen[p], rejected[p]) for p in chosen if p in rejected]
    stats.pairs = len(pairs)
    stats.groups_without_pair = len(prompts) - len(pairs)
    return pairs, stats
