"""Hermes / Qwen2.5 / Qwen3 format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Each call is its own tagged block holding one JSON object; whitespace and newlines around the
JSON are ignored. ``arguments`` may also be spelled ``parameters``, may be a JSON string holding
an object (decoded), or be absent (a call without arguments).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from trajforge.llm.parsers._scan import json_call, loads, scan_blocks
from trajforge.llm.parsers.base import ParsedCall, ParseResult, Tools, call_arguments, make_content


class HermesParser:
    """``<tool_call>`` + JSON object + ``</tool_call>``, one block per call."""

    name = "hermes"
    start_marker = "<tool_call>"
    end_marker = "</tool_call>"

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.start_marker, self.end_marker)

    def parse(self, text: str, tools: Tools = None) -> ParseResult:
        scan = scan_blocks(text, self.start_marker, self.end_marker, _read_call)
        return ParseResult(make_content(scan.pieces), scan.calls, scan.errors, self.name)

    def format_calls(self, calls: Sequence[Any]) -> str:
        return "\n".join(
            f"{self.start_marker}\n"
            + json.dumps({"name": c.name, "arguments": call_arguments(c)}, ensure_ascii=False)
            + f"\n{self.end_marker}"
            for c in calls
        )


def _read_call(body: str) -> ParsedCall:
    """One block holds one JSON object; whitespace around it is layout."""
    return json_call(loads(body.strip()))
