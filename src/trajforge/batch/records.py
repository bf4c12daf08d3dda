"""A batch sample's record -> its JSONL line and its statistics summary.

The line is the one :class:`~trajforge.record.Record` (docs/formats.md) carrying the reference's
ShareGPT view beside it (``conversations``, ``metadata``, ``completed``, ``partial``,
``api_calls``, ``toolsets_used``: :func:`trajforge.record.views.reference_view`), so a reader of
the reference's format reads a line unchanged. Two deliberate differences from the reference keep
lines small and loadable by Arrow:

* the canonical system turn lists only the tools offered to *that* sample (the reference lists
  every tool it knows); ``run.json`` also keeps the run's schemas once;
* ``tool_stats`` / ``tool_error_counts`` are padded over this run's tools only (fixed per run,
  so every line has one schema), not over every tool ever known.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from trajforge.batch.dataset import BadRow
from trajforge.batch.stats import SampleSummary
from trajforge.record import Record, Reward, Timings, ToolCounts
from trajforge.record.views import with_view
from trajforge.rollout.records import USAGE_KEYS, iso
from trajforge.trajectory import reasoning_coverage


def batch_line(
    record: Record, schemas: Sequence[dict[str, Any]], *, started: float, finished: float
) -> tuple[bytes, SampleSummary]:
    """(the JSONL line, the summary for statistics); ``schemas`` are the tools offered."""
    return with_view(record, schemas).line(), summarize(record, started, finished)


def summarize(record: Record, started: float, finished: float) -> SampleSummary:
    coverage = reasoning_coverage(record.messages)
    return SampleSummary(
        status=record.status,
        reason_kind=record.reason_kind or record.status,
        tool_stats={n: (s.count, s.success, s.failure) for n, s in record.tool_stats.items() if s.count},
        tool_errors={n: c for n, c in record.tool_error_counts.items() if c},
        toolsets=record.toolsets,
        turns_with_reasoning=coverage.with_reasoning,
        turns_without_reasoning=coverage.without_reasoning,
        usage={k: n for k in USAGE_KEYS if (n := record.usage.get(k))},
        usage_unknown=record.turns > 0 and record.usage.get("total_tokens") is None,
        api_calls=record.turns,
        attempts=record.attempts,
        wall_s=record.timings.wall_s,
        model_s=record.timings.model_s,
        tool_s=record.timings.tool_s,
        started_at=started,
        finished_at=finished,
        reward=record.reward_value,
        reward_error=record.reward_failed,
    )


def bad_row_line(
    row: BadRow, *, model: str | None, env: str | None, run_tools: Sequence[str], samples_per_prompt: int
) -> tuple[bytes, SampleSummary]:
    """The line of a row that cannot run: failed with its reason, never judged (null reward)."""
    now = time.time()
    reason = f"bad_row: {row.reason}"
    reward = Reward.not_judged(f"not judged: {reason}") if env else None
    record = Record(
        key=row.key,
        prompt_index=row.index,
        rollout=_index_of(row.key),
        group_size=samples_per_prompt,
        env=env,
        item={"prompt": row.raw},
        status="failed",
        reason=reason,
        reason_kind="bad_row",
        attempts=0,
        reward=reward,
        tool_stats={n: ToolCounts() for n in run_tools},
        tool_error_counts={n: 0 for n in run_tools},
        timings=Timings(started_at=iso(now), finished_at=iso(now), worker=-1),
        model=model,
    )
    return batch_line(record, (), started=now, finished=now)


def _index_of(key: str) -> int:
    tail = key.rpartition("#")[2]
    return int(tail) if tail.isdigit() else 0
