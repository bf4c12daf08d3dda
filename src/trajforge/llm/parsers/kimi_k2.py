"""Kimi-K2 format.

::

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{"a": 1}<|tool_call_end|><|tool_calls_section_end|>

The call id ``functions.NAME:IDX`` carries the name (the ``functions.`` prefix and the ``:IDX``
suffix are stripped). Each ``tool_call_begin ... tool_call_end`` block is one call; section
markers (also the singular ``tool_call_section`` spelling some checkpoints emit) are layout.
A last call cut off after its arguments (``tool_call_end``, maybe half of it, eaten by the end of
generation) is still a call when its JSON is complete. Arguments that are not a JSON object are
passed through as written.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from trajforge.llm.parsers._scan import MalformedCall, named_call, scan_blocks
from trajforge.llm.parsers.base import ParsedCall, ParseResult, Tools, arguments_json, build_result

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
_SECTION_ALIASES = (SECTION_BEGIN, SECTION_END, "<|tool_call_section_begin|>", "<|tool_call_section_end|>")
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
_CALL_ID = re.compile(r"\s*(?:functions\.)?(?P<name>[^\s:<>]+)(?::\d+)?\s*")


class KimiK2Parser:
    """``functions.NAME:IDX<|tool_call_argument_begin|>{json}`` per call."""

    name = "kimi_k2"
    start_marker = SECTION_BEGIN
    markers = (SECTION_BEGIN, CALL_BEGIN, ARG_BEGIN, CALL_END, SECTION_END)

    def parse(self, text: str, tools: Tools = None) -> ParseResult:
        scan = scan_blocks(
            text,
            CALL_BEGIN,
            CALL_END,
            _read_call,
            read_truncated=lambda body: _read_call(body, truncated=True),
        )
        scan.flag_empty_section(text, _SECTION_ALIASES[::2], f"tool calls section without any {CALL_BEGIN}")
        return build_result([_strip_sections(p) for p in scan.pieces], scan.calls, scan.errors, self.name)

    def format_calls(self, calls: Sequence[Any]) -> str:
        if not calls:
            return ""
        body = "".join(
            f"{CALL_BEGIN}functions.{c.name}:{i}{ARG_BEGIN}{arguments_json(c)}{CALL_END}"
            for i, c in enumerate(calls)
        )
        return f"{SECTION_BEGIN}{body}{SECTION_END}"


def _strip_sections(piece: str) -> str:
    for marker in _SECTION_ALIASES:
        piece = piece.replace(marker, "")
    return piece


def _read_call(body: str, truncated: bool = False) -> ParsedCall:
    call_id, sep, args = body.partition(ARG_BEGIN)
    if not sep:
        raise MalformedCall(f"no {ARG_BEGIN} in the call")
    if truncated and not args.strip():
        raise MalformedCall("the text ends before the arguments")
    match = _CALL_ID.fullmatch(call_id)
    if match is None:
        raise MalformedCall(f"invalid call id {call_id.strip()!r} (expected functions.NAME:IDX)")
    return named_call(match["name"], args)
