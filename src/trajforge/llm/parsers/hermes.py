"""Hermes / Qwen2.5 / Qwen3 format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Each call is its own tagged block holding one JSON object (a list of such objects is read as
several calls); whitespace and newlines around the JSON are ignored. ``arguments`` may also be
spelled ``parameters``, may be a JSON string holding an object (decoded), or be absent (a call
without arguments); any other value is passed through as the arguments text.

The JSON is decoded before the end tag is looked for, so ``</tool_call>`` inside a string value
does not cut the call, and a call whose ``</tool_call>`` the end of generation ate (maybe half of
it) is still a call when its JSON is complete. An unclosed block whose body does not start like
JSON is prose that mentions the tag.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from trajforge.llm.parsers._scan import scan_json_blocks
from trajforge.llm.parsers.base import ParseResult, Tools, build_result, call_arguments


class HermesParser:
    """``<tool_call>`` + JSON object + ``</tool_call>``, one block per call."""

    name = "hermes"
    start_marker = "<tool_call>"
    end_marker = "</tool_call>"

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.start_marker, self.end_marker)

    def parse(self, text: str, tools: Tools = None) -> ParseResult:
        scan = scan_json_blocks(text, self.start_marker, self.end_marker)
        return build_result(scan.pieces, scan.calls, scan.errors, self.name)

    def format_calls(self, calls: Sequence[Any]) -> str:
        return "\n".join(
            f"{self.start_marker}\n"
            + json.dumps({"name": c.name, "arguments": call_arguments(c)}, ensure_ascii=False)
            + f"\n{self.end_marker}"
            for c in calls
        )
