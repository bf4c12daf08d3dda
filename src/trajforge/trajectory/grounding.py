"""Is a final answer backed by the sample's own tool outputs? A check for numbers, on the messages.

A reward that reads only the final answer cannot tell an agent that computed 34768 in the
terminal and answered 34768 from one whose terminal printed 34748 and that answered 34768 anyway
(a guess, or arithmetic done in its head against its own evidence). Both score 1; training on the
second teaches a model to ignore its tools. This check is deliberately narrow and says exactly
what it tests: every number the final answer states that the prompt did not already give must
appear in some tool result of the same conversation. An answer with no new number passes; an
answer with one and no tool result that shows it does not.

It is a heuristic over text, not a verifier: an agent that ``echo``-ed its guess passes, prose
numbers ("two files") are not read, and answers whose facts are not numbers are not judged. It is
offered where it helps a choice between samples that a reward ranks equal or wrongly
(``trajforge export --grounded``), never as a reward.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trajforge.messages import content_text

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


@dataclass(frozen=True, slots=True)
class Grounding:
    """``unsupported``: numbers of the final answer found in neither the prompt nor a tool result."""

    answer: str
    unsupported: tuple[str, ...]

    @property
    def grounded(self) -> bool:
        return not self.unsupported


def numbers(text: str) -> set[str]:
    """The numbers written in ``text``, normalised (``34,768`` -> ``34768``, ``-0.50`` -> ``-0.5``)."""
    out = set()
    for raw in _NUMBER.findall(_THOUSANDS.sub("", text)):
        value = raw.rstrip("0").rstrip(".") if "." in raw else raw
        out.add(value if value not in ("", "-") else "0")
    return out


def check_answer(messages: Sequence[Mapping[str, Any]]) -> Grounding | None:
    """The grounding of the conversation's final answer (the last assistant message, when it has
    text and no tool calls); None when the conversation did not end on an answer."""
    final = messages[-1] if messages else None
    if final is None or final.get("role") != "assistant" or final.get("tool_calls"):
        return None
    answer = content_text(final.get("content"))
    if not answer.strip():
        return None
    prompt = set().union(
        *(numbers(content_text(m.get("content"))) for m in messages if m.get("role") == "user")
    )
    evidence = set().union(
        *(numbers(content_text(m.get("content"))) for m in messages if m.get("role") == "tool")
    )
    unsupported = sorted(numbers(answer) - prompt - evidence)
    return Grounding(answer, tuple(unsupported))
