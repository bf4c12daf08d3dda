"""A finished session's status and reason: completed, partial, failed or filtered.

One classification for every rollout, so a batch line and an env episode of the same session say
the same thing. Transient model errors are an outcome here too; whether to retry is the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trajforge.agent import AgentResult, Termination
from trajforge.trajectory import evaluate_filters

PARTIAL = frozenset(
    {
        Termination.MAX_TURNS,
        Termination.TIMEOUT,
        Termination.TOOL_PARSE_ERROR,
        Termination.CONTEXT_LENGTH,
        Termination.TRUNCATED,
    }
)


@dataclass(slots=True)
class Outcome:
    """What became of a rollout: status in completed|partial|failed|filtered, with a reason and
    the reason's kind (for counting)."""

    status: str
    reason: str
    reason_kind: str


def classify(
    result: AgentResult, offered: Sequence[str], *, filters: bool = True, require_reasoning: bool = False
) -> Outcome:
    """Status and reason of a finished session. ``filters``: a final answer the trajectory
    filters reject (a hallucinated tool, an unfinished scratchpad, no reasoning when required)
    is ``filtered``, not ``completed``."""
    term = result.termination
    if term is Termination.FINAL_ANSWER:
        verdicts = (
            evaluate_filters(result.messages, offered, require_reasoning=require_reasoning) if filters else []
        )
        if verdicts:
            return Outcome(
                "filtered",
                "; ".join(f"{v.name}: {v.reason}" for v in verdicts),
                ",".join(v.name for v in verdicts),
            )
        return Outcome("completed", "final_answer", "final_answer")
    if term in PARTIAL:
        detail = f": {result.error}" if result.error else ""
        return Outcome("partial", f"{term.value}{detail}", term.value)
    kind = f"{term.value}({result.error_kind})" if result.error_kind else term.value
    return Outcome("failed", f"{kind}: {result.error or 'no detail'}", kind)
