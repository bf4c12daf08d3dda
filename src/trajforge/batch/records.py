"""One finished sample -> its status, reason, output line and statistics summary.

The line is reference-compatible (prompt_index, conversations, metadata, completed, partial,
api_calls, toolsets_used, tool_stats, tool_error_counts) plus key, status, reason, usage and
timings. Two deliberate differences keep lines small and loadable by Arrow:

* the canonical system turn lists only the tools offered to *that* sample (the reference lists
  every tool it knows); ``run.json`` also keeps the run's schemas once;
* ``tool_stats`` / ``tool_error_counts`` are padded over this run's tools only (fixed per run,
  so every line has one schema), not over every tool ever known.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from trajforge.agent.result import AgentResult, Termination, ToolStat
from trajforge.batch.dataset import BadRow, Sample
from trajforge.batch.stats import SampleSummary
from trajforge.trajectory import (
    ReasoningCoverage,
    evaluate_filters,
    reasoning_coverage,
    system_prompt,
    to_sharegpt,
)

_PARTIAL = {
    Termination.MAX_TURNS,
    Termination.TIMEOUT,
    Termination.TOOL_PARSE_ERROR,
    Termination.CONTEXT_LENGTH,
    *([Termination("truncated")] if "truncated" in Termination._value2member_map_ else []),
}
_USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens", "reasoning_tokens", "cached_tokens")


@dataclass(slots=True)
class Outcome:
    """What became of a sample: status in completed|partial|failed|filtered, with a reason."""

    status: str
    reason: str
    reason_kind: str


@dataclass(slots=True)
class SampleFacts:
    """How a sample was run, beyond its AgentResult: toolsets drawn, attempts, wall-clock span,
    worker and seed."""

    toolsets: list[str]
    attempts: int
    started_at: float
    finished_at: float
    worker: int
    seed: int
    samples_per_prompt: int = 1


def classify(result: AgentResult, offered: Sequence[str], require_reasoning: bool) -> Outcome:
    """Status and reason of a finished agent session (transient errors are retried upstream)."""
    term = result.termination
    if term is Termination.FINAL_ANSWER:
        verdicts = evaluate_filters(result.messages, offered, require_reasoning=require_reasoning)
        if verdicts:
            return Outcome(
                "filtered",
                "; ".join(f"{v.name}: {v.reason}" for v in verdicts),
                ",".join(v.name for v in verdicts),
            )
        return Outcome("completed", "final_answer", "final_answer")
    if term in _PARTIAL:
        detail = f": {result.error}" if result.error else ""
        return Outcome("partial", f"{term.value}{detail}", term.value)
    kind = f"{term.value}({result.error_kind})" if result.error_kind else term.value
    return Outcome("failed", f"{kind}: {result.error or 'no detail'}", kind)


def _padded_stats(
    run_tools: Sequence[str], result: AgentResult | None
) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """(tool_stats, tool_error_counts) over this run's tools, zeros where a tool was not called."""
    stats = result.tool_stats if result else {}
    errors = Counter(err.tool_name for err in result.tool_errors) if result else Counter[str]()
    zero = ToolStat()
    tool_stats = {name: stats.get(name, zero).model_dump() for name in run_tools}
    return tool_stats, {name: errors[name] for name in run_tools}


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds")


def _conversations(
    sample: Sample | BadRow, result: AgentResult | None, tools: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    prompt = sample.prompt if isinstance(sample, Sample) else sample.raw
    if result is not None and result.messages:
        return to_sharegpt(result.messages, tools, prompt=prompt)
    return [{"from": "system", "value": system_prompt(tools)}, {"from": "human", "value": prompt}]


def build_line(
    sample: Sample | BadRow,
    outcome: Outcome,
    result: AgentResult | None,
    run: SampleFacts,
    *,
    model: str | None,
    run_tools: Sequence[str],
    tools: Sequence[dict[str, Any]] = (),
    system_prompt: str | None = None,
    grading: Grading | None = None,
    trace: Mapping[str, Any] | None = None,
) -> tuple[bytes, SampleSummary]:
    """(the JSONL line, the summary for statistics); ``tools`` are the schemas offered to the sample.

    ``metadata`` also carries what the sample was asked with beyond its prompt: the run's system
    prompt (the ShareGPT turns replace it with the reference's tools prompt) and the dataset row's
    other fields under ``row`` (ids, expected answers: what grading needs).

    ``grading`` (a run with ``--env``) adds ``reward``, ``reward_breakdown``, ``reward_reason``
    and ``reward_error`` (null reward: the sample never ran, so it was not judged); ``trace`` (a
    token-level run) adds the exact ``tokens``/``masks``/``logprobs`` under ``trace``."""
    tool_stats, tool_error_counts = _padded_stats(run_tools, result)
    summary = _summary(outcome, result, run, tool_error_counts, grading)
    finished_at = _iso(run.finished_at)
    record = {
        "prompt_index": sample.index,
        "key": sample.key,
        "status": outcome.status,
        "reason": outcome.reason,
        "conversations": _conversations(sample, result, tools),
        "metadata": _metadata(sample, run, model, finished_at, system_prompt),
        "completed": outcome.status == "completed",
        "partial": outcome.status == "partial",
        "api_calls": summary.api_calls,
        "toolsets_used": run.toolsets,
        "tool_stats": tool_stats,
        "tool_error_counts": tool_error_counts,
        "usage": {k: summary.usage.get(k, 0) for k in _USAGE_KEYS},
        "timings": {
            "wall_s": summary.wall_s,
            "model_s": summary.model_s,
            "tool_s": summary.tool_s,
            "started_at": _iso(run.started_at),
            "finished_at": finished_at,
        },
        "attempts": run.attempts,
        "termination": result.termination.value if result else "not_run",
    }
    if grading is not None:
        record.update(grading.fields())
    if trace is not None:
        record["trace"] = dict(trace)
    return orjson.dumps(record) + b"\n", summary


def _metadata(
    sample: Sample | BadRow, run: SampleFacts, model: str | None, finished_at: str, system_prompt: str | None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "batch_num": run.worker,
        "timestamp": finished_at,
        "model": model,
        "seed": run.seed,
    }
    if system_prompt is not None:
        meta["system_prompt"] = system_prompt
    if isinstance(sample, Sample) and sample.extra:
        meta["row"] = sample.extra
    if run.samples_per_prompt > 1:
        meta["sample_index"] = sample.sample_index if isinstance(sample, Sample) else _index_of(sample.key)
        meta["samples_per_prompt"] = run.samples_per_prompt
    return meta


def _index_of(key: str) -> int:
    tail = key.rpartition("#")[2]
    return int(tail) if tail.isdigit() else 0


@dataclass(frozen=True, slots=True)
class Grading:
    """A sample's judgement for its line: ``reward`` None when it could not be judged."""

    reward: float | None
    breakdown: Mapping[str, float]
    reason: str
    error: str | None
    env: str

    def fields(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "reward_breakdown": dict(self.breakdown),
            "reward_reason": self.reason,
            "reward_error": self.error,
            "graded_by": self.env,
        }


def _summary(
    outcome: Outcome,
    result: AgentResult | None,
    run: SampleFacts,
    tool_error_counts: dict[str, int],
    grading: Grading | None = None,
) -> SampleSummary:
    coverage = reasoning_coverage(result.messages) if result else ReasoningCoverage()
    usage = result.usage.model_dump() if result else {}
    return SampleSummary(
        status=outcome.status,
        reason_kind=outcome.reason_kind,
        tool_stats={
            n: (s.count, s.success, s.failure) for n, s in (result.tool_stats.items() if result else ())
        },
        tool_errors={n: c for n, c in tool_error_counts.items() if c},
        toolsets=run.toolsets,
        turns_with_reasoning=coverage.with_reasoning,
        turns_without_reasoning=coverage.without_reasoning,
        usage={k: usage[k] for k in _USAGE_KEYS if usage.get(k)},
        api_calls=result.api_calls if result else 0,
        attempts=run.attempts,
        wall_s=round(run.finished_at - run.started_at, 4),
        model_s=round(result.model_time_s, 4) if result else 0.0,
        tool_s=round(result.tool_time_s, 4) if result else 0.0,
        started_at=run.started_at,
        finished_at=run.finished_at,
        reward=grading.reward if grading is not None else None,
        reward_error=grading is not None and grading.error is not None,
    )


def not_judged(cfg: Any, outcome: Outcome) -> Grading | None:
    """The grading of a sample that never ran (bad row, sandbox failure): a null reward, so no
    trainer mistakes "not judged" for "scored 0"; None when the run does not grade."""
    env = getattr(cfg, "env", None)
    if env is None:
        return None
    return Grading(None, {}, f"not judged: {outcome.reason}", None, env)
