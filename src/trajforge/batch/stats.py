"""Run statistics as a mergeable aggregate.

Each writer keeps one :class:`Aggregate` and stores it in the ledger in the same transaction that
commits its samples, so statistics never disagree with the ledger, survive ``kill -9``, and a
resumed run of a million samples sums a handful of rows instead of re-reading every record.
Latencies go into a log-bucket histogram (mergeable, fixed size) for percentiles.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
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


@dataclass(frozen=True, slots=True)
class SampleSummary:
    """What statistics keep of one committed sample (built with its line by
    :func:`trajforge.batch.records.build_line`)."""

    status: str
    reason_kind: str
    tool_stats: dict[str, tuple[int, int, int]]  # name -> (count, success, failure)
    tool_errors: dict[str, int]  # name -> failed calls, only tools that failed
    toolsets: list[str]
    turns_with_reasoning: int
    turns_without_reasoning: int
    usage: dict[str, int]  # token counts that are known and not zero
    api_calls: int
    attempts: int
    wall_s: float
    model_s: float
    tool_s: float
    started_at: float
    finished_at: float
    reward: float | None = None  # None: not graded (no --env)
    reward_error: bool = False
    usage_unknown: bool = False  # it called the model, and an endpoint did not say how many tokens


@dataclass(frozen=True, slots=True)
class RunLabel:
    """What ``statistics.json`` says the run is: its name, model and toolset choice."""

    run_name: str
    model: str | None
    distribution: str | None
    toolsets: list[str] | None


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
    usage_unknown: int = 0  # samples whose token total is unknown (left out of ``tokens``)
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
    # Grading (--env): samples graded, their reward sum, how many scored 1.0, reward code failures.
    graded: int = 0
    reward_sum: float = 0.0
    solved: int = 0
    reward_errors: int = 0
    # Samples put back to pending mid-run, by why ("node lost": their Ray actor died with them).
    requeued: Counter[str] = field(default_factory=Counter)

    def add(self, summary: SampleSummary) -> None:
        """Add one committed sample."""
        self.status[summary.status] += 1
        if summary.status != "completed":
            self.reasons.setdefault(summary.status, Counter())[summary.reason_kind] += 1
        self._add_tools(summary.tool_stats)
        self.tool_errors.update(summary.tool_errors)
        self.toolsets.update(summary.toolsets)
        self.turns_with_reasoning += summary.turns_with_reasoning
        self.turns_without_reasoning += summary.turns_without_reasoning
        self.tokens.update(summary.usage)
        self.usage_unknown += summary.usage_unknown
        self.api_calls += summary.api_calls
        self.attempts += summary.attempts
        self.latency[_bucket(summary.wall_s)] += 1
        self.latency_sum += summary.wall_s
        self.model_time += summary.model_s
        self.tool_time += summary.tool_s
        self._add_span(summary.started_at, summary.finished_at)
        if summary.reward is not None:
            self.graded += 1
            self.reward_sum += summary.reward
            self.solved += summary.reward >= 1.0
            self.reward_errors += summary.reward_error

    def merge(self, other: Aggregate) -> None:
        self.status.update(other.status)
        for status, counter in other.reasons.items():
            self.reasons.setdefault(status, Counter()).update(counter)
        self._add_tools(other.tools)
        self.tool_errors.update(other.tool_errors)
        self.toolsets.update(other.toolsets)
        self.turns_with_reasoning += other.turns_with_reasoning
        self.turns_without_reasoning += other.turns_without_reasoning
        self.tokens.update(other.tokens)
        self.usage_unknown += other.usage_unknown
        self.api_calls += other.api_calls
        self.attempts += other.attempts
        self.latency.update(other.latency)
        self.latency_sum += other.latency_sum
        self.model_time += other.model_time
        self.tool_time += other.tool_time
        self.sandboxes.update(other.sandboxes)
        self._add_span(other.first_start, other.last_finish)
        self.graded += other.graded
        self.reward_sum += other.reward_sum
        self.solved += other.solved
        self.reward_errors += other.reward_errors
        self.requeued.update(other.requeued)

    def _add_tools(self, tools: Mapping[str, Sequence[int]]) -> None:
        for name, (count, ok, bad) in tools.items():
            acc = self.tools.setdefault(name, [0, 0, 0])
            acc[0] += count
            acc[1] += ok
            acc[2] += bad

    def _add_span(self, started: float | None, finished: float | None) -> None:
        if started is not None:
            self.first_start = started if self.first_start is None else min(self.first_start, started)
        if finished is not None:
            self.last_finish = finished if self.last_finish is None else max(self.last_finish, finished)

    @property
    def done(self) -> int:
        return sum(self.status.values())

    @property
    def duration_s(self) -> float:
        """From the first sample's start to the last one's finish (0 before any)."""
        if self.first_start and self.last_finish:
            return self.last_finish - self.first_start
        return 0.0

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
        agg.requeued = Counter(data.get("requeued", {}))  # absent before the Ray backend
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
        # absent in older runs: grading's (before --env), usage_unknown's (before unknown usage was kept)
        for name in ("graded", "reward_sum", "solved", "reward_errors", "usage_unknown"):
            setattr(agg, name, data.get(name, 0))
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
    session: Aggregate,
    label: RunLabel,
    *,
    total_samples: int,
    session_elapsed_s: float,
    finished: bool,
) -> dict[str, Any]:
    """statistics.json: the reference's fields plus status counts, reasons, tokens, latency
    percentiles and throughput (of this session, so a resume reports its own speed)."""
    remaining = max(total_samples - agg.done, 0)
    return {
        **asdict(label),
        "finished": finished,
        "total_prompts": total_samples,
        "total_done": agg.done,
        "remaining": remaining,
        "completed_prompts": agg.status.get("completed", 0),
        "status_counts": dict(agg.status),
        "filter_reasons": dict(agg.reasons.get("filtered", {})),
        "failure_reasons": dict(agg.reasons.get("failed", {})),
        "partial_reasons": dict(agg.reasons.get("partial", {})),
        "duration_s": round(agg.duration_s, 3),
        "tool_statistics": _tool_statistics(agg),
        "tool_error_counts": dict(agg.tool_errors),
        "toolset_usage": dict(agg.toolsets),
        "reasoning_coverage": _reasoning_coverage(agg),
        "tokens": dict(agg.tokens),
        "tokens_unknown_samples": agg.usage_unknown,
        "api_calls": agg.api_calls,
        "attempts": agg.attempts,
        "latency_s": _latency(agg),
        "sandboxes": _sandboxes(agg),
        "requeued": dict(agg.requeued),
        "model_time_s": round(agg.model_time, 3),
        "tool_time_s": round(agg.tool_time, 3),
        "session": _session(session, session_elapsed_s, remaining),
        "rewards": _rewards(agg),
    }


def _rewards(agg: Aggregate) -> dict[str, Any] | None:
    """Grading results (``--env``): None when no sample was graded."""
    if not agg.graded:
        return None
    return {
        "graded": agg.graded,
        "mean": round(agg.reward_sum / agg.graded, 4),
        "solved": agg.solved,
        "solved_rate": _rate(agg.solved, agg.graded),
        "reward_errors": agg.reward_errors,
    }


def _rate(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0


def _tool_statistics(agg: Aggregate) -> dict[str, dict[str, int | float]]:
    return {
        name: {
            "count": c,
            "success": ok,
            "failure": bad,
            "success_rate": _rate(ok, c),
            "failure_rate": _rate(bad, c),
        }
        for name, (c, ok, bad) in sorted(agg.tools.items())
    }


def _reasoning_coverage(agg: Aggregate) -> dict[str, int | float]:
    turns = agg.turns_with_reasoning + agg.turns_without_reasoning
    return {
        "assistant_turns": turns,
        "turns_with_reasoning": agg.turns_with_reasoning,
        "turns_without_reasoning": agg.turns_without_reasoning,
        "coverage": _rate(agg.turns_with_reasoning, turns),
    }


def _latency(agg: Aggregate) -> dict[str, float | None]:
    return {
        "mean": round(agg.latency_sum / agg.done, 4) if agg.done else None,
        "p50": agg.percentile(0.5),
        "p90": agg.percentile(0.9),
        "p99": agg.percentile(0.99),
    }


def _sandboxes(agg: Aggregate) -> dict[str, Any]:
    discarded = {
        k.removeprefix("discarded: "): v for k, v in agg.sandboxes.items() if k.startswith("discarded: ")
    }
    created, reused = agg.sandboxes.get("created", 0), agg.sandboxes.get("reused", 0)
    return {"created": created, "reused": reused, "discarded": discarded}


def _session(session: Aggregate, elapsed_s: float, remaining: int) -> dict[str, float | None]:
    rate = session.done / elapsed_s if elapsed_s > 0 else 0.0
    return {
        "done": session.done,
        "elapsed_s": round(elapsed_s, 3),
        "throughput_per_s": round(rate, 3),
        "eta_s": round(remaining / rate, 1) if rate > 0 and remaining else None,
    }
