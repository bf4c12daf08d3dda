"""Quality filters over a finished conversation, each returning a reason instead of a silent drop.

The batch factory keeps every filtered sample with its verdicts, so a verdict says what was
wrong in words a person can act on. Two differences from the reference, on purpose:

* the reasoning filter is a switch (``require_reasoning``), not hard-wired;
* a tool call is "hallucinated" when it names a tool that was not OFFERED to this sample, not
  merely one missing from a global registry (a model offered only ``web`` that calls
  ``terminal`` is hallucinating even though ``terminal`` exists).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from trajforge.trajectory.think import (
    content_text,
    has_incomplete_scratchpad,
    has_reasoning,
    has_unclosed_think,
)

NO_REASONING: Final = "no_reasoning"
HALLUCINATED_TOOL: Final = "hallucinated_tool"
INCOMPLETE_SCRATCHPAD: Final = "incomplete_scratchpad"
FILTER_NAMES: Final = (NO_REASONING, HALLUCINATED_TOOL, INCOMPLETE_SCRATCHPAD)

Message = Mapping[str, Any]


@dataclass(frozen=True)
class FilterVerdict:
    """One filter that rejected a sample: ``name`` is one of :data:`FILTER_NAMES`."""

    name: str
    reason: str


@dataclass(frozen=True)
class ReasoningCoverage:
    """Assistant turns with and without reasoning (native field or think/scratchpad tags).

    Addable, so statistics can sum coverage over a whole run.
    """

    with_reasoning: int = 0
    without_reasoning: int = 0

    @property
    def total(self) -> int:
        return self.with_reasoning + self.without_reasoning

    @property
    def ratio(self) -> float:
        return self.with_reasoning / self.total if self.total else 0.0

    def __add__(self, other: ReasoningCoverage) -> ReasoningCoverage:
        return ReasoningCoverage(
            self.with_reasoning + other.with_reasoning, self.without_reasoning + other.without_reasoning
        )


def _assistant_messages(messages: Iterable[Message]) -> list[Message]:
    return [m for m in messages if m.get("role") == "assistant"]


def reasoning_coverage(messages: Iterable[Message]) -> ReasoningCoverage:
    """Count the assistant turns of ``messages`` that reasoned and those that did not."""
    flags = [has_reasoning(m) for m in _assistant_messages(messages)]
    return ReasoningCoverage(with_reasoning=sum(flags), without_reasoning=len(flags) - sum(flags))


def check_reasoning(messages: Sequence[Message]) -> FilterVerdict | None:
    """Reject a conversation in which no assistant turn reasoned at all."""
    coverage = reasoning_coverage(messages)
    if coverage.with_reasoning:
        return None
    if not coverage.total:
        return FilterVerdict(NO_REASONING, "the conversation has no assistant turn")
    return FilterVerdict(
        NO_REASONING,
        f"none of the {coverage.total} assistant turn(s) had reasoning "
        "(no reasoning field, no <think> or <REASONING_SCRATCHPAD> in the content)",
    )


def check_offered_tools(
    messages: Sequence[Message], offered_tool_names: Iterable[str]
) -> FilterVerdict | None:
    """Reject a conversation that calls a tool not offered to it."""
    offered = set(offered_tool_names)
    bad: list[str] = []
    for turn, msg in enumerate(_assistant_messages(messages), start=1):
        for call in msg.get("tool_calls") or ():
            name = (call.get("function") or {}).get("name") if isinstance(call, Mapping) else None
            if name not in offered:
                bad.append(f"{name!r} (assistant turn {turn})")
    if not bad:
        return None
    offered_text = ", ".join(sorted(offered)) or "none"
    return FilterVerdict(
        HALLUCINATED_TOOL,
        f"called tool(s) not offered to this sample: {', '.join(bad)}; offered: {offered_text}",
    )


def check_scratchpads(messages: Sequence[Message]) -> FilterVerdict | None:
    """Reject a conversation with a reasoning block opened and never closed (a cut-off thought)."""
    bad: list[str] = []
    for turn, msg in enumerate(_assistant_messages(messages), start=1):
        for where, text in (
            ("content", content_text(msg.get("content"))),
            ("reasoning", msg.get("reasoning")),
        ):
            if not isinstance(text, str):
                continue
            if has_incomplete_scratchpad(text):
                bad.append(f"assistant turn {turn} {where}: <REASONING_SCRATCHPAD> not closed")
            elif has_unclosed_think(text):
                bad.append(f"assistant turn {turn} {where}: <think> not closed")
    if not bad:
        return None
    return FilterVerdict(INCOMPLETE_SCRATCHPAD, "; ".join(bad))


def evaluate_filters(
    messages: Sequence[Message],
    offered_tool_names: Iterable[str],
    require_reasoning: bool = True,
) -> list[FilterVerdict]:
    """Every filter that rejects ``messages``; an empty list means the sample is kept.

    All filters run (not just the first that fails), so a record shows every reason at once.
    """
    verdicts = [
        check_reasoning(messages) if require_reasoning else None,
        check_offered_tools(messages, offered_tool_names),
        check_scratchpads(messages),
    ]
    return [v for v in verdicts if v is not None]
