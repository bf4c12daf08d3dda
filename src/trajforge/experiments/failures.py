"""What went wrong in an evaluation's episodes, by kind: the demo's before/after breakdown.

A success rate says how often; the kinds say what changed. :func:`failure_kind` names an
episode's outcome from its record alone: ``passed``; how it ended when it did not end with an
answer (``ended: truncated``, ``ended: max_turns``, ``ended: tool_parse_error``, ``failed: ...``);
else the checker's own reason with its particulars taken out (numbers -> ``N``, quoted text ->
``'...'``, file names -> ``FILE``), so ``answer 42 is wrong; expected 45`` and ``answer 7 is wrong;
expected 9`` count as one kind. ``(no tool call)`` is added where the episode called no tool.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from trajforge.record import Record
from trajforge.rl.samples import PASS_THRESHOLD

_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_PAREN = re.compile(r"\([^)]*\)")
_FILE = re.compile(r"\b[\w\-]+\.(?:txt|conf|ini|env|json|csv|log|md|py|sh)\b")
_NUMBER = re.compile(r"-?\d[\d,]*")


def failure_kind(record: Record) -> str:
    """The outcome kind of one episode record (an ``episodes.jsonl`` line, read by ``record.read``)."""
    reward = record.reward
    if record.reward_value is not None and record.reward_value >= PASS_THRESHOLD:
        return "passed"
    if record.reward_failed:
        return "reward code raised"
    status = record.status
    kind = record.reason_kind or ""
    if status == "failed":
        label = f"failed: {kind or 'unknown'}"
    elif kind and kind != "final_answer":
        label = f"ended: {kind}"
    else:
        reason = (reward.reason if reward is not None else "") or record.reason or "no reason given"
        reason = _QUOTED.sub("'...'", reason)
        reason = _PAREN.sub("(...)", reason)
        reason = _FILE.sub("FILE", reason)
        label = _NUMBER.sub("N", reason)[:70]
    calls = sum(counts.count for counts in record.tool_stats.values())
    return f"{label} (no tool call)" if calls == 0 else label


def breakdown(records: Iterable[Record]) -> dict[str, int]:
    """How many episodes of each kind, most common first."""
    return dict(Counter(failure_kind(r) for r in records).most_common())
