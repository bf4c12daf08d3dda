"""Chat on top of a completion engine: render the prompt, split what the model wrote.

Going in, OpenAI messages are normalised for Hugging Face chat templates (tool-call arguments
decoded from JSON strings to objects, content parts joined to text, ``reasoning`` copied to
``reasoning_content``) -- what vLLM does too, because templates ``tojson`` the arguments.

Coming out, the raw text is split into three parts by one set of rules used for both JSON and
SSE responses, so a stream always reassembles to the same message:

1. reasoning: a leading ``<think>...</think>`` block (or, when the prompt itself ends inside an
   opened ``<think>``, everything up to ``</think>``); an unclosed block is all reasoning;
2. tool calls: the rest goes through the configured parser (only when tools were offered);
3. content: the parser's non-call text. When calls were attempted but *none* parsed, content is
   the raw text instead, and the parse errors travel in ``parse_errors`` -- nothing is lost.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trajforge.llm.parsers import ToolCallParser, to_tool_calls
from trajforge.llm.types import ToolCall
from trajforge.messages import THINK_CLOSE, THINK_OPEN, content_text


def _decoded_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
    return arguments


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of OpenAI messages shaped the way Hugging Face chat templates read them."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        m = dict(msg)
        m["content"] = content_text(m.get("content"))
        if m.get("reasoning") and not m.get("reasoning_content"):
            m["reasoning_content"] = m["reasoning"]
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                call = dict(call)
                function = dict(call.get("function") or {})
                function["arguments"] = _decoded_arguments(function.get("arguments", {}))
                call["function"] = function
                calls.append(call)
            m["tool_calls"] = calls
        out.append(m)
    return out


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """Whether the rendered prompt ends inside an opened ``<think>`` (some templates force it)."""
    tail = prompt_text.rstrip()
    return tail.endswith(THINK_OPEN)


@dataclass(frozen=True, slots=True)
class ChatOutput:
    """One assistant message, split."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)


def split_reasoning(text: str, opened: bool) -> tuple[str | None, str, bool]:
    """``(reasoning, rest, closed)``; ``closed`` is False while a think block is still open."""
    body = THINK_OPEN + text if opened else text
    stripped = body.lstrip()
    if not stripped.startswith(THINK_OPEN):
        return None, text, True
    inner = stripped[len(THINK_OPEN) :]
    end = inner.find(THINK_CLOSE)
    if end == -1:
        return inner.strip() or None, "", False
    return inner[:end].strip() or None, inner[end + len(THINK_CLOSE) :], True


@dataclass(frozen=True, slots=True)
class OutputSplitter:
    """The rules above, bound to one request (its parser and tools)."""

    parser: ToolCallParser | None
    tools: Sequence[Mapping[str, Any]] | None
    opened_reasoning: bool = False

    def split(self, text: str) -> ChatOutput:
        reasoning, rest, _ = split_reasoning(text, self.opened_reasoning)
        if self.parser is None:
            return ChatOutput(reasoning, rest.strip() or None)
        result = self.parser.parse(rest, [dict(t) for t in self.tools] if self.tools else None)
        calls = to_tool_calls(result, prefix=f"call_{secrets.token_hex(4)}_")
        errors = [e.describe() for e in result.errors]
        content = result.content if result.calls or not result.errors else (rest.strip() or None)
        return ChatOutput(reasoning, content, calls, errors)


def _held_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def _settled(text: str, marker: str | None) -> str:
    """The part of a growing text that is final: before ``marker``, minus a partial marker and
    trailing whitespace (which the final ``strip()`` might remove), with leading whitespace dropped."""
    if marker is not None:
        idx = text.find(marker)
        text = text[:idx] if idx != -1 else text[: len(text) - _held_suffix(text, marker)]
    return text.rstrip().lstrip()


@dataclass
class StreamSplitter:
    """Streams reasoning and content deltas that are guaranteed prefixes of the final split."""

    splitter: OutputSplitter
    text: str = ""
    sent_reasoning: str = ""
    sent_content: str = ""

    def feed(self, delta: str) -> tuple[str, str]:
        """Add generated text; return the ``(reasoning, content)`` deltas safe to send now."""
        self.text += delta
        head = self.text.lstrip()
        if not self.splitter.opened_reasoning and head and THINK_OPEN.startswith(head):
            return "", ""  # could still become "<think>"
        reasoning, rest, closed = split_reasoning(self.text, self.splitter.opened_reasoning)
        if reasoning is not None or not closed or self.text.lstrip().startswith(THINK_OPEN):
            body = (THINK_OPEN + self.text) if self.splitter.opened_reasoning else self.text
            inner = body.lstrip()[len(THINK_OPEN) :]
            r_safe = _settled(inner, THINK_CLOSE)
        else:
            r_safe = ""
        c_safe = ""
        if closed:
            marker = self.splitter.parser.start_marker if self.splitter.parser is not None else None
            c_safe = _settled(rest, marker)
        return self._advance(r_safe, c_safe)

    def finish(self, final: ChatOutput) -> tuple[str, str]:
        """The remaining deltas so that everything sent equals ``final``."""
        return self._advance(final.reasoning or "", final.content or "")

    def _advance(self, reasoning: str, content: str) -> tuple[str, str]:
        r = reasoning[len(self.sent_reasoning) :] if reasoning.startswith(self.sent_reasoning) else ""
        c = content[len(self.sent_content) :] if content.startswith(self.sent_content) else ""
        self.sent_reasoning += r
        self.sent_content += c
        return r, c
