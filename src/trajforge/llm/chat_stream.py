"""Folding a streamed chat completion (the SDK's ``ChatCompletionChunk``s) into one turn.

The streaming half of :mod:`trajforge.llm.chat_wire`: the same :class:`AssistantTurn` a
non-streamed answer gives, built from deltas.
"""

from __future__ import annotations

from typing import Any

from trajforge.llm.chat_wire import MalformedResponseError, new_call_id, usage_from
from trajforge.llm.types import AssistantTurn, ToolCall
from trajforge.messages import extract_reasoning, reasoning_from_fields


class _PartialCall:
    __slots__ = ("arguments", "id", "name")

    def __init__(self, call_id: str | None) -> None:
        self.id = call_id
        self.name = ""
        self.arguments: list[str] = []

    def add(self, fn: Any) -> None:
        """Take a fragment's ``function`` part: the name, and a piece of the arguments."""
        if fn is None:
            return
        if fn.name:
            self.name = fn.name
        if fn.arguments:
            self.arguments.append(fn.arguments)

    def call(self) -> ToolCall:
        if not self.name:
            raise MalformedResponseError("streamed tool call without a function name")
        arguments = "".join(self.arguments) or "{}"
        return ToolCall(id=self.id or new_call_id(), name=self.name, arguments=arguments)


class StreamAssembler:
    """Folds ``ChatCompletionChunk``s into one :class:`AssistantTurn`.

    Tool calls arrive as fragments keyed by ``index`` (id and name first, arguments in pieces);
    some providers omit the index or reuse index 0 for a new call with a new id, so a changed id
    starts a new call. A stream that ends without any ``finish_reason`` was cut off and is
    reported as malformed (and so retried) rather than returned half-done.
    """

    def __init__(self, default_model: str) -> None:
        self.model = default_model
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, _PartialCall] = {}
        self.finish_reason: str | None = None
        self.usage: Any = None
        self._last_key: int | None = None

    def add(self, chunk: Any) -> None:
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        self.model = getattr(chunk, "model", None) or self.model
        for choice in getattr(chunk, "choices", None) or ():
            if choice.index in (0, None):
                self._add_choice(choice)

    def _add_choice(self, choice: Any) -> None:
        if choice.finish_reason:
            self.finish_reason = choice.finish_reason
        delta = choice.delta
        if delta is None:
            return
        if delta.content:
            self.content.append(delta.content)
        if (piece := reasoning_from_fields(delta.model_extra)) is not None:
            self.reasoning.append(piece)
        for fragment in delta.tool_calls or ():
            self._add_call_fragment(fragment)

    def _add_call_fragment(self, fragment: Any) -> None:
        key = self._call_key(fragment)
        call = self.calls.get(key)
        if call is None:
            call = self.calls[key] = _PartialCall(fragment.id)
        self._last_key = key
        call.add(fragment.function)

    def _call_key(self, fragment: Any) -> int:
        """The call a fragment belongs to: its index (else the last call's), unless a new id says a new call."""
        key: int | None = fragment.index
        if key is None:
            key = len(self.calls) if fragment.id or self._last_key is None else self._last_key
        call = self.calls.get(key)
        if call is not None and fragment.id and call.id and fragment.id != call.id:
            return max(self.calls) + 1
        return key

    def turn(self) -> AssistantTurn:
        if self.finish_reason is None:
            raise MalformedResponseError("stream ended before a finish_reason (truncated)")
        calls = [self.calls[key].call() for key in sorted(self.calls)]
        fields = {"reasoning_content": "".join(self.reasoning)} if self.reasoning else None
        content, reasoning = extract_reasoning(fields, "".join(self.content) or None)
        return AssistantTurn(
            content=content,
            reasoning=reasoning,
            tool_calls=calls,
            finish_reason=self.finish_reason,
            usage=usage_from(self.usage),
            model=self.model,
        )
