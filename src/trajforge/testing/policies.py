"""Which reply a request gets: ready-made policies, and scripts served per conversation.

A *policy* is a callable ``(request body) -> Reply`` (or an awaitable Reply). A *script* is a
list of replies served in order *per conversation* (keyed by the first user message, so
concurrent conversations each walk the whole script); :func:`as_policy` turns one into a policy.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trajforge.messages import content_text
from trajforge.testing.replies import PolicyFn, ReasoningField, Reply, ToolCallSpec


def conversation_key(body: Mapping[str, Any]) -> str:
    """The conversation a request belongs to: its first user message."""
    for m in body.get("messages", ()):
        if isinstance(m, dict) and m.get("role") == "user":
            return content_text(m.get("content"))
    return ""


def count_assistant_turns(body: Mapping[str, Any]) -> int:
    """How many assistant messages the conversation already has (= model calls answered so far)."""
    return sum(1 for m in body.get("messages", ()) if isinstance(m, dict) and m.get("role") == "assistant")


def last_user_text(body: Mapping[str, Any]) -> str:
    for m in reversed(body.get("messages", ())):
        if isinstance(m, dict) and m.get("role") == "user":
            return content_text(m.get("content"))
    return ""


def echo_policy(body: dict[str, Any]) -> Reply:
    """Answers with the last user message, no tools, no reasoning."""
    return Reply(content=last_user_text(body))


def tool_then_answer(
    calls_per_sample: int = 2,
    tool: str = "terminal",
    command: str = "echo hi",
    answer: str = "done",
    *,
    arguments: dict[str, Any] | str | None = None,
    reasoning: str | None = "Let me work through this step by step.",
    reasoning_field: ReasoningField = "reasoning_content",
) -> PolicyFn:
    """Each sample makes ``calls_per_sample`` tool calls (one per turn), then answers.

    The turn number comes from the assistant messages already in the conversation, so retried
    requests and concurrent samples all get the right step. Every turn carries reasoning (so the
    batch factory's reasoning filter passes) unless ``reasoning`` is None.
    """
    args = {"command": command} if arguments is None else arguments

    def policy(body: dict[str, Any]) -> Reply:
        step = count_assistant_turns(body)
        text = f"{reasoning} (step {step + 1})" if reasoning else None
        if step < calls_per_sample:
            return Reply(
                reasoning=text, reasoning_field=reasoning_field, tool_calls=[ToolCallSpec(tool, args)]
            )
        return Reply(content=answer, reasoning=text, reasoning_field=reasoning_field)

    return policy


POLICIES: Mapping[str, Callable[..., PolicyFn]] = {
    "echo": lambda **_: echo_policy,
    "tool_then_answer": tool_then_answer,
}


class Script:
    """A list of replies as a policy: each conversation walks it from the start.

    The list is read, not copied, at each request. A conversation that asks for more replies
    than the script has gets a 400 with code ``script_exhausted``.
    """

    def __init__(self, replies: Sequence[Reply]) -> None:
        self.replies = replies
        self._pos: collections.Counter[str] = collections.Counter()

    def __call__(self, body: dict[str, Any]) -> Reply:
        key = conversation_key(body)
        pos = self._pos[key]
        if pos >= len(self.replies):
            return Reply.fail(
                400,
                f"scripted server: script exhausted after {len(self.replies)} replies for conversation {key[:60]!r}",
                code="script_exhausted",
            )
        self._pos[key] += 1
        return self.replies[pos]


def as_policy(policy: PolicyFn | Sequence[Reply]) -> PolicyFn:
    """``policy`` itself when it is callable, else a :class:`Script` of it."""
    return policy if callable(policy) else Script(policy)
