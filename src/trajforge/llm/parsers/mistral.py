"""Mistral formats, both generations.

- pre-v11 tokenizers (Mistral-7B-Instruct-v0.3, Mixtral): ``[TOOL_CALLS] [{"name": ...,
  "arguments": {...}}, ...]`` -- one JSON list after a single marker;
- v11+ tokenizers (Mistral-Small-3.1+, Devstral, Magistral): ``[TOOL_CALLS]NAME[ARGS]{...}``,
  one marker per call; ``[ARGS]`` is absent when special tokens were skipped while decoding
  (``[TOOL_CALLS]NAME{...}``), and ``[CALL_ID]ID`` may sit between name and arguments.

The generation is told apart per marker by what follows it (``[``/``{`` means JSON). Text after
a call's JSON stays content, and a ``[TOOL_CALLS]`` inside a call's JSON strings is part of the
call. A list the end of generation cut off keeps its complete calls (and reports the cut one);
arguments after ``[ARGS]`` that are not a JSON object are passed through as written. A marker
followed by neither a JSON list nor ``NAME{...}`` is an error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from trajforge.llm.parsers._scan import (
    MalformedCall,
    call_arguments_value,
    json_call,
    positions,
    raw_decode,
    skip_space,
)
from trajforge.llm.parsers.base import (
    ParsedCall,
    ParseError,
    ParseResult,
    Tools,
    arguments_json,
    build_result,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_V11_HEAD = re.compile(r"\s*(?P<name>[A-Za-z0-9_.:\-]+)\s*(?:\[CALL_ID\][^\[{]*)?(?P<args>\[ARGS\])?\s*")


class MistralParser:
    """``[TOOL_CALLS]`` + a JSON list (pre-v11) or ``NAME[ARGS]{json}`` (v11+)."""

    name = "mistral"
    start_marker = TOOL_CALLS
    markers = (TOOL_CALLS, ARGS)

    def parse(self, text: str, tools: Tools = None) -> ParseResult:
        marks = positions(text, TOOL_CALLS)
        pieces: list[str] = []
        calls: list[ParsedCall] = []
        errors: list[ParseError] = []
        prose_from = 0
        for k, at in enumerate(marks):
            if at < prose_from:
                continue  # inside the JSON of the call before
            pieces.append(text[prose_from:at])
            following = marks[k + 1] if k + 1 < len(marks) else len(text)
            try:
                found, end, cut = _read_segment(text, at + len(TOOL_CALLS), following)
            except MalformedCall as exc:
                errors.append(ParseError(str(exc), text[at:following], at))
                prose_from = following
                continue
            calls.extend(found)
            errors.extend(cut)
            prose_from = end
        pieces.append(text[prose_from:])
        return build_result(pieces, calls, errors, self.name)

    def format_calls(self, calls: Sequence[Any]) -> str:
        """The v11+ spelling, ``[TOOL_CALLS]NAME[ARGS]{json}`` per call."""
        return "".join(f"{TOOL_CALLS}{c.name}{ARGS}{arguments_json(c)}" for c in calls)


def _read_segment(text: str, pos: int, bound: int) -> tuple[list[ParsedCall], int, list[ParseError]]:
    """The calls after one ``[TOOL_CALLS]`` marker (the next one is at ``bound``), where they
    end, and the errors of a list the end of the text cut off."""
    start = skip_space(text, pos)
    if text.startswith("{", start):
        value, end = raw_decode(text, start, bound)
        return [json_call(value)], end, []
    if text.startswith("[", start) and not text.startswith((ARGS, CALL_ID), start):
        return _read_list(text, start, bound)
    head = _V11_HEAD.match(text, pos)
    if head is None or not head["name"]:
        raise MalformedCall(f"expected a JSON list or NAME{{arguments}} after {TOOL_CALLS}")
    at = head.end()
    if not (text.startswith("{", at) or (head["args"] and at < len(text))):
        raise MalformedCall(f"expected a JSON object of arguments after {head['name']!r}")
    value, end = raw_decode(text, at, bound)
    return [ParsedCall(head["name"], call_arguments_value(value, text[at:end]))], end, []


def _read_list(text: str, start: int, bound: int) -> tuple[list[ParsedCall], int, list[ParseError]]:
    """A JSON list of calls, item by item, so a list cut off by the end of the text keeps its
    complete items (the cut item is an error); elsewhere a broken list is one error."""
    calls: list[ParsedCall] = []
    pos = skip_space(text, start + 1)
    if text.startswith("]", pos):
        raise MalformedCall(f"empty call list after {TOOL_CALLS}")
    while True:
        if pos >= len(text) and calls:
            return calls, pos, []  # the closing "]" was eaten
        try:
            value, pos = raw_decode(text, pos, bound)
        except MalformedCall:
            if calls and text.find(TOOL_CALLS, pos) < 0 and not text.rstrip().endswith(("]", "}")):
                cut = ParseError("call cut off by the end of the text", text[pos:], pos)
                return calls, len(text), [cut]
            raise
        calls.append(json_call(value))
        pos = skip_space(text, pos)
        if text.startswith("]", pos):
            return calls, pos + 1, []
        if text.startswith(",", pos):
            pos = skip_space(text, pos + 1)
        elif pos < len(text):
            raise MalformedCall(f"invalid JSON (expected ',' or ']' after a call, found {text[pos]!r})")
