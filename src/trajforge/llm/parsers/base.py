"""What every tool-call parser returns, and the contract each family implements.

A parser turns the raw text an open model produced into tool calls. The result keeps three
things apart on purpose: the prose (``content``), the calls that parsed, and the calls that did
not (``errors``). A malformed call is never dropped as if the model had not called a tool: the
agent loop shows the error to the model and records it (the reference system ended the
episode as if it had finished naturally).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from trajforge.llm.types import ToolCall

Tools = Sequence[dict[str, Any]] | None
"""An OpenAI-style tools list: ``[{"type": "function", "function": {"name", "parameters"}}]``."""


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """One tool call that parsed: a name and its arguments.

    ``arguments`` is the decoded JSON object in the normal case. When the model wrote something
    else -- a JSON string that does not hold an object, an array, a number -- it is passed
    through as the arguments *text* (a ``str``, what OpenAI's ``function.arguments`` carries), so
    the agent loop can tell the model that the tool wants an object instead of the call being
    dropped or its arguments guessed.
    """

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True, slots=True)
class ParseError:
    """A tool call the model attempted but that could not be parsed.

    ``fragment`` is the offending text exactly as the model wrote it (so it can be shown back to
    the model), ``offset`` where it starts in the parsed text.
    """

    message: str
    fragment: str
    offset: int = 0

    def describe(self, max_fragment: int = 200) -> str:
        """One line for a model or a log: the reason and the start of the offending text."""
        frag = self.fragment if len(self.fragment) <= max_fragment else self.fragment[:max_fragment] + "..."
        return f"{self.message}: {frag!r}"

    def to_dict(self) -> dict[str, Any]:
        return {"message": self.message, "fragment": self.fragment, "offset": self.offset}


@dataclass(frozen=True, slots=True)
class ParseResult:
    """The parse of one assistant message.

    ``prose`` is the text outside the calls exactly as the model wrote it (leading and trailing
    text and whitespace kept; for a text without any call, the text itself, byte for byte).
    ``content`` is the same text trimmed at both ends, ``None`` when nothing is left: what goes
    into an assistant message, where the layout newlines around call blocks are not content.
    ``parser`` names the family that produced the result (useful after ``auto``).
    """

    content: str | None
    calls: list[ParsedCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)
    parser: str | None = None
    prose: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "parser": self.parser,
            "content": self.content,
            "calls": [c.to_dict() for c in self.calls],
            "errors": [e.to_dict() for e in self.errors],
        }


@runtime_checkable
class ToolCallParser(Protocol):
    """One model family's tool-call format.

    ``markers`` are the strings whose presence in a text means "this family is calling a tool"
    (``start_marker`` is the first thing a call begins with); ``format_calls`` writes calls back
    in the family's own text, for scripted models and token-trace tests.
    """

    name: str
    start_marker: str
    markers: tuple[str, ...]

    def parse(self, text: str, tools: Tools = None) -> ParseResult: ...

    def format_calls(self, calls: Sequence[Any]) -> str: ...


def make_content(pieces: Sequence[str]) -> str | None:
    """Join the non-call pieces of a text; strip; ``None`` when empty."""
    content = "".join(pieces).strip()
    return content or None


def build_result(
    pieces: Sequence[str], calls: list[ParsedCall], errors: list[ParseError], parser: str | None
) -> ParseResult:
    """The result of a family parse from the pieces of text outside its calls."""
    prose = "".join(pieces)
    return ParseResult(prose.strip() or None, calls, errors, parser, prose)


def call_arguments(call: Any) -> Any:
    """The decoded arguments of a call-like object (a :class:`ParsedCall` or a ``ToolCall``).

    Arguments text that is not JSON (a passed-through value, see :class:`ParsedCall`) comes back
    as that text.
    """
    args = call.arguments
    if isinstance(args, str):
        if not args.strip():
            return {}
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def object_arguments_of(call: Any, family: str) -> dict[str, Any]:
    """A call's arguments for a format that can only write key/value pairs."""
    args = call_arguments(call)
    if not isinstance(args, dict):
        raise ValueError(f"the {family} format can only write object arguments, got {args!r}")
    return args


def arguments_json(call: Any) -> str:
    """A call's arguments as JSON text for ``format_calls`` (non-ASCII kept as is).

    Arguments that are already text (a passed-through non-object value) are written as they are.
    """
    if isinstance(call.arguments, str) and call.arguments.strip():
        return call.arguments
    return json.dumps(call_arguments(call), ensure_ascii=False)


def render_value(value: Any) -> str:
    """One argument value as the tag-based formats write it: strings raw, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def to_tool_calls(result: ParseResult, *, start: int = 0, prefix: str = "call_") -> list[ToolCall]:
    """The agent's :class:`ToolCall` list for a parse, with deterministic ids.

    Ids are ``call_<n>`` counted from ``start`` within the message, so re-parsing the same text
    gives the same ids; pass a running ``start`` to keep them unique across an episode.
    Object arguments are re-encoded as JSON (non-ASCII kept as is); passed-through arguments text
    is kept exactly as the model wrote it.
    """
    return [
        ToolCall(
            id=f"{prefix}{start + i}",
            name=call.name,
            arguments=call.arguments
            if isinstance(call.arguments, str)
            else json.dumps(call.arguments, ensure_ascii=False),
        )
        for i, call in enumerate(result.calls)
    ]
