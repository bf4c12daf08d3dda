"""Everything the report's statistics and charts say, gathered in one pass over every line.

Per-sample numbers (turns, tokens, latency, reward, finish time) are kept as plain lists of
floats: a million samples are a few tens of MiB, and exact percentiles need no sketch. Every line
is read as the one :class:`~trajforge.record.Record` (older lines upgraded); a line that is no
record is counted unreadable, never an error: the report of a damaged run is still worth reading.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trajforge.record import Record
from trajforge.trajectory.calls import unparsed_replies

# The tool table's row for replies whose call could not be parsed (no tool name: nothing ran).
UNPARSED = "(unparsed tool call)"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one (a field missing or of another type)."""
    return value if isinstance(value, dict) else {}


def reason_key(record: Record) -> str:
    """The key a record's reason is counted under: its ``reason_kind``, the one ``statistics.json``
    counts (``filter_reasons``, ``failure_reasons``, ``partial_reasons``), so a sample is one
    count. A reason's text is never split for kinds: it holds "; " and ":" of its own (a filter's
    "tool 'x' not offered; assistant turn 3 reasoning: ..."). A line older than ``reason_kind``:
    the reason's head before its first ":", else the termination."""
    if record.reason_kind:
        return record.reason_kind
    reason = record.reason or record.termination or ""
    return reason.split(":", 1)[0].strip() or "unknown"


def finish_time(record: Record) -> float | None:
    """The record's ``timings.finished_at`` as a Unix time (None when absent or unreadable)."""
    stamp = record.timings.finished_at
    if not isinstance(stamp, str):
        return None
    try:
        return dt.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def tools_used(record: Record) -> tuple[list[str], list[str]]:
    """(tools called at least once, tools with at least one failed call) of a record."""
    used = [name for name, stat in record.tool_stats.items() if stat.count > 0]
    return used, [name for name in used if record.tool_stats[name].failure > 0]


def turns_of(record: Record) -> list[dict[str, Any]]:
    """The turns the loop left: a batch line's ShareGPT turns, else the messages."""
    stored = (record.model_extra or {}).get("conversations")
    turns = stored if isinstance(stored, list) else record.messages
    return [t for t in turns if isinstance(t, dict)]


@dataclass
class ToolFacts:
    calls: int = 0
    success: int = 0
    failure: int = 0
    samples: int = 0  # samples that called it at least once


@dataclass
class RunFacts:
    """Counters and per-sample series over every line of the run."""

    lines: int = 0
    unreadable: int = 0
    status: Counter[str] = field(default_factory=Counter)
    reasons: dict[str, Counter[str]] = field(default_factory=dict)  # status -> reason kind -> n
    toolsets: Counter[str] = field(default_factory=Counter)
    tools: dict[str, ToolFacts] = field(default_factory=dict)
    turns: list[float] = field(default_factory=list)  # api calls (model turns) per sample
    total_tokens: list[float] = field(default_factory=list)
    completion_tokens: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    model_s: list[float] = field(default_factory=list)
    tool_s: list[float] = field(default_factory=list)
    finished_at: list[float] = field(default_factory=list)
    finished_status: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    reward_by_status: dict[str, list[float]] = field(default_factory=dict)
    reward_parts: dict[str, list[float]] = field(default_factory=dict)
    no_reward: int = 0

    def add(self, record: Record | None) -> None:
        """Count one record (None: a line that is no record)."""
        if record is None:
            self.unreadable += 1
            return
        self.lines += 1
        status = record.status
        self.status[status] += 1
        if status != "completed":
            counter = self.reasons.setdefault(status, Counter())
            counter[reason_key(record)] += 1
        self.toolsets.update(record.toolsets)
        self._add_tools(record)
        self._add_numbers(record)
        self._add_reward(record, status)
        finished = finish_time(record)
        if finished is not None:
            self.finished_at.append(finished)
            self.finished_status.append(status)

    def _add_tools(self, record: Record) -> None:
        unparsed = unparsed_replies(turns_of(record))
        if unparsed:  # the loop told the model its call could not be parsed: a failed call, no tool
            facts = self.tools.setdefault(UNPARSED, ToolFacts())
            facts.calls += unparsed
            facts.failure += unparsed
            facts.samples += 1
        for name, stat in record.tool_stats.items():
            if stat.count <= 0:
                continue
            facts = self.tools.setdefault(name, ToolFacts())
            facts.calls += stat.count
            facts.success += stat.success
            facts.failure += stat.failure
            facts.samples += 1

    def _add_numbers(self, record: Record) -> None:
        self.turns.append(float(record.turns))
        for key, series in (
            ("total_tokens", self.total_tokens),
            ("completion_tokens", self.completion_tokens),
        ):
            value = _number(record.usage.get(key))
            if value is not None:
                series.append(value)
        t = record.timings
        for value, series in ((t.wall_s, self.wall_s), (t.model_s, self.model_s), (t.tool_s, self.tool_s)):
            series.append(float(value))

    def _add_reward(self, record: Record, status: str) -> None:
        reward = _number(record.reward_value)
        if reward is None or record.reward is None:
            self.no_reward += 1
            return
        self.rewards.append(reward)
        self.reward_by_status.setdefault(status, []).append(reward)
        for name, value in record.reward.components.items():
            number = _number(value)
            if number is not None:
                self.reward_parts.setdefault(name, []).append(number)


def percentiles(values: list[float], qs: tuple[float, ...] = (0.5, 0.9, 0.99)) -> dict[str, float | None]:
    """Nearest-rank percentiles plus mean and max (None for an empty series)."""
    if not values:
        return {"mean": None, **{f"p{round(q * 100)}": None for q in qs}, "max": None}
    ordered = sorted(values)
    n = len(ordered)
    out: dict[str, float | None] = {"mean": sum(ordered) / n}
    for q in qs:
        out[f"p{round(q * 100)}"] = ordered[min(n - 1, max(0, math.ceil(q * n) - 1))]
    out["max"] = ordered[-1]
    return out
