"""Which samples of a run make DPO pairs, and on what grounds.

A pair only means something when its two answers answer the same prompt and one is known to be
better. Two grounds, chosen per run and reported, never mixed silently:

* ``reward``: some line of the run carries a numeric ``reward``. Lines are grouped by
  ``prompt_index`` (``--group-size N`` gives N lines per index); inside a group every two
  graded lines with *different* rewards make a pair, the higher one chosen. Equal rewards make no
  pair (nothing to prefer), ungraded lines (``reward`` null or absent) none either; both are
  counted.
* ``completion_status`` (the fallback, when no line of the run has a reward): a completed sample
  is chosen over a failed, partial or filtered one of the same prompt text (runs without
  ``--group-size`` have duplicated prompts on different indices). Completion is weaker
  evidence than a grade, so the export says which ground it used.

Two hooks shape a pairing without changing its ground: ``can_choose`` says whether a line may be
the chosen answer at all (the export's filters: status, reward, a malformed call, grounding; a
pair whose better member may not be chosen is left out and counted by reason), and ``tiebreak``
ranks two lines of *equal* reward (the export's ``--grounded``: an answer its own tool outputs
support is chosen over one they do not, which a reward that reads only the final answer cannot
tell apart).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any, Literal

Line = Mapping[str, Any]
Ground = Literal["reward", "completion_status"]
# why a line may not be chosen (None: it may)
ChooseCheck = Callable[[Line], str | None]
TieBreak = Callable[[Line], int]


def _anyone(line: Line) -> str | None:
    return None


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
    ties_broken: int = 0
    pairs_left_out: dict[str, int] = field(default_factory=dict)
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


def pair_by_reward(
    lines: Sequence[Line],
    *,
    can_choose: ChooseCheck = _anyone,
    tiebreak: TieBreak | None = None,
    max_per_prompt: int | None = None,
) -> tuple[list[tuple[Line, Line]], PairStats]:
    """(chosen, rejected) pairs inside each ``prompt_index`` group, higher reward chosen; with
    ``tiebreak``, equal rewards pair too when it ranks the two differently. ``max_per_prompt``
    keeps the group's pairs with the widest reward margin first."""
    stats = PairStats("reward", lines=len(lines))
    groups: dict[Any, list[Line]] = {}
    for line in lines:
        groups.setdefault(line.get("prompt_index"), []).append(line)
    stats.groups = len(groups)
    pairs: list[tuple[Line, Line]] = []
    left_out: Counter[str] = Counter()
    for members in groups.values():
        graded = [m for m in members if reward_of(m) is not None]
        stats.ungraded_lines += len(members) - len(graded)
        made: list[tuple[float, Line, Line]] = []
        for a, b in combinations(graded, 2):
            ra, rb = reward_of(a), reward_of(b)
            assert ra is not None and rb is not None
            if ra == rb:
                ta, tb = (tiebreak(a), tiebreak(b)) if tiebreak else (0, 0)
                if ta == tb:
                    stats.tied_pairs_skipped += 1
                    continue
                chosen, rejected = (a, b) if ta > tb else (b, a)
            else:
                chosen, rejected = (a, b) if ra > rb else (b, a)
            why = can_choose(chosen)
            if why is not None:
                left_out[why] += 1
                continue
            stats.ties_broken += ra == rb
            made.append((abs(ra - rb), chosen, rejected))
        if max_per_prompt is not None and len(made) > max_per_prompt:
            made.sort(key=lambda m: -m[0])  # stable: the widest margins, in their first order
            left_out["over --max-per-prompt"] += len(made) - max_per_prompt
            made = made[:max_per_prompt]
        pairs += [(c, r) for _, c, r in made]
        stats.groups_without_pair += not made
    stats.pairs = len(pairs)
    stats.pairs_left_out = dict(left_out)
    return pairs, stats


def pair_by_completion(
    lines: Sequence[Line], prompt_of: Any, *, can_choose: ChooseCheck = _anyone
) -> tuple[list[tuple[Line, Line]], PairStats]:
    """One pair per prompt text: its first completed sample that may be chosen against its first
    other sample."""
    stats = PairStats("completion_status", lines=len(lines))
    stats.notes.append(
        "no line of the run has a reward: pairs are a completed sample (chosen) against a "
        "failed/partial/filtered one of the same prompt; grade the run for reward-based pairs"
    )
    chosen: dict[str, Line] = {}
    rejected: dict[str, Line] = {}
    passed_over: dict[str, str] = {}
    for line in lines:
        prompt = prompt_of(line)
        if line.get("status") != "completed":
            rejected.setdefault(prompt, line)
            continue
        why = can_choose(line)
        if why is None:
            chosen.setdefault(prompt, line)
        else:
            passed_over.setdefault(prompt, why)
    prompts = set(chosen) | set(rejected) | set(passed_over)
    stats.groups = len(prompts)
    pairs = [(chosen[p], rejected[p]) for p in chosen if p in rejected]
    stats.pairs_left_out = dict(
        Counter(why for p, why in passed_over.items() if p in rejected and p not in chosen)
    )
    stats.pairs = len(pairs)
    stats.groups_without_pair = len(prompts) - len(pairs)
    return pairs, stats
