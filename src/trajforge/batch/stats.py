"""Run statistics as a mergeable aggregate.

Each writer keeps one :class:`Aggregate` and stores it in the ledger in the same transaction that
commits its samples, so statistics never disagree with the ledger, survive ``kill -9``, and a
resumed run of a million samples sums a handful of rows instead of re-reading every record.
Latencies go into a log-bucket histogram (mergeable, fixed size) for percentiles.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson

_BUCKET_BASE = 1.1  # 10% resolution for latency percentiles
_BUCKET_MIN_S = 0.001


def _bucket(seconds: float) -> int:
    if seconds <= _BUCKET_MIN_S:
        return 0
    return 1 + int(math.log(seconds / _BUCKET_MIN_S, _BUCKET_BASE))


def _bucket_upper(bucket: int) -> float:
    return _BUCKET_MIN_S * _BUCKET_BASE**bucket


@dataclass
class Aggregate:
    """Counters over committed samples. ``merge`` adds another aggregate into this one."""

    status: Counter[str] = field(default_factory=Counter)
    reasons: dict[str, Counter[str]] = field(default_factory=dict)
    tools: dict[str, list[int]] = field(default_factory=dict)  # name -> [count, success, failure]
    tool_errors: Counter[str] = field(default_factory=Counter)
    toolsets: Counter[str] = field(default_factory=Counter)
    turns_with_reasoning: int = 0
    turns_without_reasoning: int = 0
    tokens: Counter[str] = field(default_factory=Counter)
    api_calls: int = 0
    attempts: int = 0
    latency: Counter[int] = field(default_factory=Counter)  # bucket -> samples
    latency_sum: float = 0.0
    model_time: float = 0.0
    tool_time: float = 0.0
    first_start: float | None = None
    last_finish: float | None = None
    # The worker's sandbox factory counters ("created", "reused", "discarded: <why>"): cumulative
    # per writer, so they are set (not added) at each commit and summed across writers.
    sandboxes: Counter[str] = field(default_factory=Counter)

    def add(self, summary: dict[str, Any]) -> None:
        """Add one committed sample (the summary dict built by :mod:`trajforge.batch.records`)."""
        status = summary["status"]
        self.status[status] += 1
        if status != "completed":
            self.reasons.setdefault(status, Counter())[summary["reason_kind"]] += 1
        for name, (count, ok, bad) in summary["tool_stats"].items():
            acc = self.tools.setdefault(name, [0, 0, 0])
            acc[0] += count
            acc[1] += ok
            acc[2] += bad
        self.tool_errors.update(summary["tool_errors"])
        self.toolsets.update(summary["toolsets"])
        self.turns_with_reasoning += summary["turns_with_reasoning"]
        self.turns_without_reasoning += summary["turns_without_reasoning"]
        self.tokens.update(summary["usage"])
        self.api_calls += summary["api_calls"]
        self.attempts += summary["attempts"]
        wall = summary["wall_s"]
        self.latency[_bucket(wall)] += 1
        self.latency_sum += wall
        self.model_time += summary["model_s"]
        self.tool_time += summary["tool_s"]
        started, finished = summary["started_at"], summary["finished_at"]
        self.first_start = started if self.first_start is None else min(self.first_start, started)
        self.last_finish = finished if self.last_finish is None else max(self.last_finish, finished)

    def merge(self, other: Aggregate) -> None:
        self.status.update(other.status)
        for status, counter in other.reasons.items():
            self.reasons.setdefault(status, Counter()).update(counter)
        for name, (count, ok, bad) in other.tools.items():
            acc = self.tools.setdefault(name, [0, 0, 0])
            acc[0] += count
            acc[1] += ok
            acc[2] += bad
        self.tool_errors.update(other.tool_errors)
        self.toolsets.update(other.toolsets)
        self.turns_with_reasoning += other.turns_with_reasoning
        self.turns_without_reasoning += other.turns_without_reasoning
        self.tokens.update(other.tokens)
        self.api_calls += other.api_calls
        self.attempts += other.attempts
        self.latency.update(other.latency)
        self.latency_sum += other.latency_sum
        self.model_time += other.model_time
        self.tool_time += other.tool_time
        self.sandboxes.update(other.sandboxes)
        for attr, pick in (("first_start", min), ("last_finish", max)):
            mine, theirs = getattr(self, attr), getattr(other, attr)
            if theirs is not None:
                setattr(self, attr, theirs if mine is None else pick(mine, theirs))

    @property
    def done(self) -> int:
        return sum(self.status.values())

    def percentile(self, q: float) -> float | None:
        total = sum(self.latency.values())
        if not total:
            return None
        target = q * total
        seen = 0
        for bucket in sorted(self.latency):
            seen += self.latency[bucket]
            if seen >= target:
                return round(_bucket_upper(bucket), 4)
        return None

    def to_bytes(self) -> bytes:
        data = {k: v for k, v in self.__dict__.items() if k != "latency"}
        data["latency"] = {str(k): v for k, v in self.latency.items()}
        return orjson.dumps(data)

    @classmethod
    def from_bytes(cls, raw: bytes) -> Aggregate:
        data = orjson.loads(raw)
        agg = cls()
        agg.status = Counter(data["status"])
        agg.reasons = {k: Counter(v) for k, v in data["reasons"].items()}
        agg.tools = {k: list(v) for k, v in data["tools"].items()}
        agg.tool_errors = Counter(data["tool_errors"])
        agg.toolsets = Counter(data["toolsets"])
        agg.tokens = Counter(data["tokens"])
        agg.latency = Counter({int(k): v for k, v in data["latency"].items()})
        agg.sandboxes = Counter(data.get("sandboxes", {}))  # absent in runs made before reuse
        for name in (
            "turns_with_reasoning",
            "turns_without_reasoning",
            "api_calls",
            "attempts",
            "latency_sum",
            "model_time",
            "tool_time",
            "first_start",
            "last_finish",
        ):
            setattr(agg, name, data[name])
        return agg


def merge_all(raws: dict[str, bytes], prefix: str | None = None) -> Aggregate:
    """Sum stored aggregates (only owners starting with ``prefix`` when given)."""
    total = Aggregate()
    for owner, raw in raws.items():
        if prefix is None or owner.startswith(prefix):
            total.merge(Aggregate.from_bytes(raw))
    return total


def build_statistics(
    agg: Aggregate,
    *,
    run_name: str,
    model: str,
    distribution: str | None,
    toolsets: list[str] | None,
    total_samples: int,
    session: Aggregate,
    session_elapsed_s: float,
    finished: bool,
) -> dict[str, Any]:
    """statistics.json: the reference's fields plus status counts, reasons, tokens, latency
    percentiles and throughput (of this session, so a resume reports its own speed)."""
    turns = agg.turns_with_reasoning + agg.turns_without_reasoning
    tool_stats = {
        name: {
            "count": c,
            "success": ok,
            "failure": bad,
            "success_rate": round(ok / c, 4) if c else 0.0,
            "failure_rate": round(bad / c, 4) if c else 0.0,
        }
        for name, (c, ok, bad) in sorted(agg.tools.items())
    }
    duration = (agg.last_finish - agg.first_start) if agg.first_start and agg.last_finish else 0.0
    rate = session.done / session_elapsed_s if session_elapsed_s > 0 else 0.0
    remaining = max(total_samples - agg.done, 0)
    return {
        "run_name": run_name,
        "model": model,
        "distribution": distribution,
        "toolsets": toolsets,
        "finished": finished,
        "total_prompts": total_samples,
        "total_done": agg.done,
        "remaining": remaining,
        "completed_prompts": agg.status.get("completed", 0),
        "status_counts": dict(agg.status),
        "filter_reasons": dict(agg.reasons.get("filtered", {})),
        "failure_reasons": dict(agg.reasons.get("failed", {})),
        "partial_reasons": dict(agg.reasons.get("partial", {})),
        "duration_s": round(duration, 3),
        "tool_statistics": tool_stats,
        "tool_error_counts": dict(agg.tool_errors),
        "toolset_usage": dict(agg.toolsets),
        "reasoning_coverage": {
            "assistant_turns": turns,
            "turns_with_reasoning": agg.turns_with_reasoning,
            "turns_without_reasoning": agg.turns_without_reasoning,
            "coverage": round(agg.turns_with_reasoning / turns, 4) if turns else 0.0,
        },
        "tokens": dict(agg.tokens),
        "api_calls": agg.api_calls,
        "attempts": agg.attempts,
        "latency_s": {
            "mean": round(agg.latency_sum / agg.done, 4) if agg.done else None,
            "p50": agg.percentile(0.5),
            "p90": agg.percentile(0.9),
            "p99": agg.percentile(0.99),
        },
        "sandboxes": {
            "created": agg.sandboxes.get("created", 0),
            "reused": agg.sandboxes.get("reused", 0),
            "discarded": {
                k.removeprefix("discarded: "): v
                for k, v in agg.sandboxes.items()
                if k.startswith("discarded: ")
            },
        },
        "model_time_s": round(agg.model_time, 3),
        "tool_time_s": round(agg.tool_time, 3),
        "session": {
            "done": session.done,
            "elapsed_s": round(session_elapsed_s, 3),
            "throughput_per_s": round(rate, 3),
            "eta_s": round(remaining / rate, 1) if rate > 0 and remaining else None,
        },
    }
