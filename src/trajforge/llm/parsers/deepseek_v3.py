"""DeepSeek-V3 / R1 format.

::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {"arg": 1}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(the bars and underscores are the full-width ``｜`` U+FF5C and ``▁`` U+2581 of DeepSeek's
special tokens). Each ``tool▁call▁begin ... tool▁call▁end`` block is one call; the section
markers around them are layout. A section opened without any complete call is an error.

A last call that the end of generation cut off after its arguments (``tool▁call▁end``, maybe
half of it, or even the closing fence missing) is still a call when its JSON is complete; one cut
inside the JSON is an error. Arguments that are not a JSON object are passed through as written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trajforge.llm.parsers._scan import MalformedCall, named_call, scan_blocks
from trajforge.llm.parsers.base import ParsedCall, ParseResult, Tools, arguments_json, build_result

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"


class DeepseekV3Parser:
    """``function<｜tool▁sep｜>NAME`` + a fenced JSON block, per call."""

    name = "deepseek_v3"
    start_marker = CALLS_BEGIN
    markers = (CALLS_BEGIN, CALL_BEGIN, SEP, CALL_END, CALLS_END)

    def parse(self, text: str, tools: Tools = None) -> ParseResult:
        scan = scan_blocks(
            text,
            CALL_BEGIN,
            CALL_END,
            self._read_call,
            read_truncated=lambda body: self._read_call(body, truncated=True),
        )
        scan.flag_empty_section(text, (CALLS_BEGIN,), f"{CALLS_BEGIN} without any {CALL_BEGIN}")
        pieces = [p.replace(CALLS_BEGIN, "").replace(CALLS_END, "") for p in scan.pieces]
        return build_result(pieces, scan.calls, scan.errors, self.name)

    def format_calls(self, calls: Sequence[Any]) -> str:
        if not calls:
            return ""
        body = "".join(f"{CALL_BEGIN}{self._format_one(c)}{CALL_END}" for c in calls)
        return f"{CALLS_BEGIN}{body}{CALLS_END}"

    def _format_one(self, call: Any) -> str:
        return f"function{SEP}{call.name}\n```json\n{arguments_json(call)}\n```"

    def _read_call(self, body: str, truncated: bool = False) -> ParsedCall:
        kind, sep, rest = body.partition(SEP)
        if not sep:
            raise MalformedCall(f"no {SEP} in the call")
        if kind.strip() != "function":
            raise MalformedCall(f"call type must be 'function', got {kind.strip()!r}")
        name, newline, args = rest.partition("\n")
        if not newline:
            raise MalformedCall("expected a newline and a ```json block after the function name")
        args = args.strip()
        if args.startswith("```"):
            closed = args.endswith("```") and len(args) >= 6
            if not closed and not truncated:
                raise MalformedCall("unclosed ```json fence around the arguments")
            args = args[3:-3] if closed else args[3:].rstrip("`")
            if args.startswith("json"):
                args = args[4:]
        if truncated and not args.strip():
            raise MalformedCall("the text ends before the arguments")
        return named_call(name, args)
