"""Mistral formats, both generations.

- pre-v11 tokenizers (Mistral-7B-Instruct-v0.3, Mixtral): ``[TOOL_CALLS] [{"name": ...,
  "arguments": {...}}, ...]`` -- one JSON list after a single marker;
- v11+ tokenizers (Mistral-Small-3.1+, Devstral, Magistral): ``[TOOL_CALLS]NAME[ARGS]{...}``,
  one marker per call; ``[ARGS]`` is absent when special tokens were skipped while decoding
  (``[TOOL_CALLS]NAME{...}``), and ``[CALL_ID]ID`` may sit between name and arguments.

The generation is told apart per marker by what follows it (``[``/``{`` means JSON). Text after
a call's JSON stays content; a marker followed by neither a JSON list nor ``NAME{...}`` is an
error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from trajforge.llm.parsers._scan import MalformedCall, json_call, object_arguments, raw_decode
from trajforge.llm.parsers.base import (
    ParsedCall,
    ParseError,
    ParseResult,
    Tools,
    arguments_json,
    make_content,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_V11_HEAD = re.compile(r"\s*(?P<name>[A-Za-z0-9_.:\-]+)\s*(?:\[CALL_ID\][^\[{]*)?(?:\[ARGS\])?\s*")


class MistralParser:
    """``[TOOL_CALLS]`` + a JSON list (pre-v11) or ``NAME[ARGS]{json}`` (v11+)."""

    name = "mistral"
    start_marker = TOOL_CALLS
    markers = (TOOL_CALLS, ARGS)

    def parse(self, text: str, tools: Tools = None) -> ParseResult:
        parts = text.split(TOOL_CALLS)
        pieces = [parts[0]]
        calls: list[ParsedCall] = []
        errors: list[ParseError] = []
        offset = len(parts[0])
        for part in parts[1:]:
            try:
                found, end = _read_segment(part)
            except MalformedCall as exc:
                errors.append(ParseError(str(exc), TOOL_CALLS + part, offset))
            else:
                calls.extend(found)
                pieces.append(part[end:])
            offset += len(TOOL_CALLS) + len(part)
        return ParseResult(make_content(pieces), calls, errors, self.name)

    def format_calls(self, calls: Sequence[Any]) -> str:
        """The v11+ spelling, ``[TOOL_CALLS]NAME[ARGS]{json}`` per call."""
        return "".join(f"{TOOL_CALLS}{c.name}{ARGS}{arguments_json(c)}" for c in calls)


def _read_segment(part: str) -> tuple[list[ParsedCall], int]:
    """The calls after one ``[TOOL_CALLS]`` marker and where they end in ``part``."""
    start = len(part) - len(part.lstrip())
    if part.startswith(("[", "{"), start) and not part.startswith((ARGS, CALL_ID), start):
        value, end = raw_decode(part, start)
        items = value if isinstance(value, list) else [value]
        if not items:
            raise MalformedCall(f"empty call list after {TOOL_CALLS}")
        return [json_call(item) for item in items], end
    head = _V11_HEAD.match(part)
    if head is None:
        raise MalformedCall(f"expected a JSON list or NAME{{arguments}} after {TOOL_CALLS}")
    if not part.startswith("{", head.end()):
        raise MalformedCall(f"expected a JSON object of arguments after {head['name']!r}")
    args, end = raw_decode(part, head.end())
    return [ParsedCall(head["name"], object_arguments(args))], end
