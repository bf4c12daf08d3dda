"""Llama 3.x JSON tool calls: ``{"name": "f", "parameters": {...}}``.

Calls are bare JSON objects, optionally after ``<|python_tag|>``, several separated by ``;``.
An object counts as a call when it starts with a ``"name"`` key (or ``"type": "function"``) and
carries ``parameters`` or ``arguments``; other JSON in the prose (``{"name": "Bob"}``) stays
content. Text that starts like a call (``{"name":``) but is not valid JSON is an error, since it
is far more likely a broken call than prose (a call the end of generation cut off is one).
Arguments that are not a JSON object are passed through as written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from trajforge.llm.parsers._scan import MalformedCall, json_call, raw_decode
from trajforge.llm.parsers.base import (
    ParsedCall,
    ParseError,
    ParseResult,
    Tools,
    build_result,
    call_arguments,
)

PYTHON_TAG = "<|python_tag|>"
_CANDIDATE = re.compile(r'<\|python_tag\|>|\{\s*"(?:name"|type"\s*:\s*"function")\s*[:,]')
_SEPARATOR = re.compile(r"\s*;")


class Llama3JsonParser:
    """JSON objects with ``name`` and ``parameters``/``arguments``, ``;``-separated."""

    name = "llama3_json"
    start_marker = PYTHON_TAG
    markers = (PYTHON_TAG, '{"name"')

    def parse(self, text: str, tools: Tools = None) -> ParseResult:
        pieces: list[str] = []
        calls: list[ParsedCall] = []
        errors: list[ParseError] = []
        pos = search_from = 0
        while (m := _CANDIDATE.search(text, search_from)) is not None:
            start = m.start()
            if m.group(0) == PYTHON_TAG:
                pieces.append(text[pos:start])
                pos = search_from = m.end()
                continue
            try:
                obj, end = raw_decode(text, start)
            except MalformedCall as exc:
                nxt = _CANDIDATE.search(text, m.end())
                end = nxt.start() if nxt is not None else len(text)
                pieces.append(text[pos:start])
                errors.append(ParseError(str(exc), text[start:end], start))
                pos = search_from = end
                continue
            if not (isinstance(obj, dict) and ("parameters" in obj or "arguments" in obj)):
                search_from = start + 1  # plain JSON in the prose
                continue
            pieces.append(text[pos:start])
            sep = _SEPARATOR.match(text, end)
            pos = search_from = sep.end() if sep is not None else end
            try:
                calls.append(json_call(obj))
            except MalformedCall as exc:
                errors.append(ParseError(str(exc), text[start:end], start))
        pieces.append(text[pos:])
        return build_result(pieces, calls, errors, self.name)

    def format_calls(self, calls: Sequence[Any]) -> str:
        return "; ".join(
            json.dumps({"name": c.name, "parameters": call_arguments(c)}, ensure_ascii=False) for c in calls
        )
