"""Everything the report's statistics and charts say, gathered in one pass over every line.

Per-sample numbers (turns, tokens, latency, reward, finish time) are kept as plain lists of
floats: a million samples are a few tens of MiB, and exact percentiles need no sketch. Anything
that is not where the schema says (an older line, a hand-written one) counts as absent, never as
an error: the report of a damaged run is still worth reading.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

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


def reason_kinds(status: str, reason: str) -> list[str]:
    """The short kinds of a line's reason: ``"no_reasoning: ...; hallucinated_tool: ..."`` ->
    both names; ``"timeout(...): detail"`` -> ``"timeout(...)"``."""
    if not reason:
        return ["unknown"]
    parts = reason.split("; ") if status == "filtered" else [reason]
    return [part.split(":", 1)[0].strip() or "unknown" for part in parts]


def finish_time(line: dict[str, Any]) -> float | None:
    """The line's ``timings.finished_at`` as a Unix time (None when absent or unreadable)."""
    timings = line.get("timings")
    stamp = timings.get("finished_at") if isinstance(timings, dict) else None
    if not isinstance(stamp, str):
        return None
    try:
        return dt.datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def tools_used(line: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(tools called at least once, tools with at least one failed call) of a line."""
    stats = line.get("tool_stats")
    used, failed = [], []
    if isinstance(stats, dict):
        for name, stat in stats.items():
            if isinstance(stat, dict) and (_number(stat.get("count")) or 0) > 0:
                used.append(str(name))
                if (_number(stat.get("failure")) or 0) > 0:
                    failed.append(str(name))
    return used, failed


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

    def add(self, line: dict[str, Any] | None) -> None:
        """Count one line (None: a line that was not a JSON object)."""
        if line is None:
            self.unreadable += 1
            return
        self.lines += 1
        status = str(line.get("status") or "unknown")
        self.status[status] += 1
        if status != "completed":
            counter = self.reasons.setdefault(status, Counter())
            counter.update(reason_kinds(status, str(line.get("reason") or "")))
        toolsets = line.get("toolsets_used")
        if isinstance(toolsets, list):
            self.toolsets.update(str(t) for t in toolsets)
        self._add_tools(line)
        self._add_numbers(line)
        self._add_reward(line, status)
        finished = finish_time(line)
        if finished is not None:
            self.finished_at.append(finished)
            self.finished_status.append(status)

    def _add_tools(self, line: dict[str, Any]) -> None:
        turns = line.get("conversations") or line.get("messages")
        unparsed = unparsed_replies(t for t in turns if isinstance(t, dict)) if isinstance(turns, list) else 0
        if unparsed:  # the loop told the model its call could not be parsed: a failed call, no tool
            facts = self.tools.setdefault(UNPARSED, ToolFacts())
            facts.calls += unparsed
            facts.failure += unparsed
            facts.samples += 1
        stats = line.get("tool_stats")
        if not isinstance(stats, dict):
            return
        for name, stat in stats.items():
            if not isinstance(stat, dict):
                continue
            count = int(_number(stat.get("count")) or 0)
            if count <= 0:
                continue
            facts = self.tools.setdefault(str(name), ToolFacts())
            facts.calls += count
            facts.success += int(_number(stat.get("success")) or 0)
            facts.failure += int(_number(stat.get("failure")) or 0)
            facts.samples += 1

    def _add_numbers(self, line: dict[str, Any]) -> None:
        turns = _number(line.get("api_calls"))
        if turns is not None:
            self.turns.append(turns)
        usage = line.get("usage")
        if isinstance(usage, dict):
            for key, series in (
                ("total_tokens", self.total_tokens),
                ("completion_tokens", self.completion_tokens),
            ):
                value = _number(usage.get(key))
                if value is not None:
                    series.append(value)
        timings = line.get("timings")
        if isinstance(timings, dict):
            for key, series in (("wall_s", self.wall_s), ("model_s", self.model_s), ("tool_s", self.tool_s)):
                value = _number(timings.get(key))
                if value is not None:
                    series.append(value)

    def _add_reward(self, line: dict[str, Any], status: str) -> None:
        reward = _number(line.get("reward"))
        if reward is None:
            self.no_reward += 1
            return
        self.rewards.append(reward)
        self.reward_by_status.setdefault(status, []).append(reward)
        parts = line.get("reward_breakdown")
        if isinstance(parts, dict):
            for name, value in parts.items():
                number = _number(value)
                if number is not None:
                    self.reward_parts.setdefault(str(name), []).append(number)


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
