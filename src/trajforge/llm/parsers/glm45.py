"""GLM-4.5 / GLM-4.6 format.

::

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    </tool_call>

The function name ends at a newline (GLM-4.5 always writes one); values are raw text typed by
the tool schema (:mod:`trajforge.llm.parsers.schema`). Only whitespace may separate the tags; a
key without a value, an unclosed tag or a missing name is an error. :mod:`.glm47` is the looser
variant (no newline needed after the name, literal ``\\n`` between tags tolerated).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from trajforge.llm.parsers._scan import MalformedCall, scan_blocks
from trajforge.llm.parsers.base import (
    ParsedCall,
    ParseResult,
    Tools,
    call_arguments,
    make_content,
    render_value,
)
from trajforge.llm.parsers.schema import ToolSchemas

_TAG = re.compile(r"</?arg_(?:key|value)>")
_SEQUENCE = ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


class Glm45Parser:
    """``<tool_call>NAME\\n<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>``."""

    name = "glm45"
    start_marker = "<tool_call>"
    end_marker = "</tool_call>"
    markers = ("<tool_call>", "<arg_key>", "<arg_value>")
    newline_after_name = True
    separator = re.compile(r"\s*")
    layout = "\n"

    def parse(self, text: str, tools: Tools = None) -> ParseResult:
        schemas = ToolSchemas(tools)
        scan = scan_blocks(
            text, self.start_marker, self.end_marker, lambda body: self._read_call(body, schemas)
        )
        return ParseResult(make_content(scan.pieces), scan.calls, scan.errors, self.name)

    def format_calls(self, calls: Sequence[Any]) -> str:
        nl = self.layout
        out = []
        for call in calls:
            pairs = "".join(
                f"<arg_key>{k}</arg_key>{nl}<arg_value>{render_value(v)}</arg_value>{nl}"
                for k, v in call_arguments(call).items()
            )
            out.append(f"<tool_call>{call.name}{nl if pairs else ''}{pairs}</tool_call>")
        return "\n".join(out)

    def _read_call(self, body: str, schemas: ToolSchemas) -> ParsedCall:
        first = body.find("<arg_")
        head = body if first < 0 else body[:first]
        name = head.strip()
        if not name:
            raise MalformedCall("tool call has no function name")
        if "<" in name or ">" in name or "\n" in name:
            raise MalformedCall(f"invalid function name {name!r}")
        if first >= 0 and self.newline_after_name and "\n" not in head:
            raise MalformedCall(
                f"expected a newline after the function name {name!r} (GLM-4.5 format; "
                "use the glm47 parser for the looser format)"
            )
        start = len(body) if first < 0 else first
        return ParsedCall(name, self._read_args(name, body, start, schemas))

    def _read_args(self, name: str, body: str, start: int, schemas: ToolSchemas) -> dict[str, Any]:
        args: dict[str, Any] = {}
        step, pos, key = 0, start, ""
        for tag in _TAG.finditer(body, start):
            expected = _SEQUENCE[step % 4]
            if tag.group(0) != expected:
                raise MalformedCall(f"expected {expected} but found {tag.group(0)}")
            between = body[pos : tag.start()]
            if step % 4 == 1:
                key = between.strip()
                if not key:
                    raise MalformedCall("empty <arg_key>")
                if key in args:
                    raise MalformedCall(f"argument {key!r} given twice")
            elif step % 4 == 3:
                args[key] = schemas.convert(name, key, between)
            elif not self.separator.fullmatch(between):
                raise MalformedCall(f"unexpected text {between.strip()[:40]!r} between argument tags")
            step, pos = step + 1, tag.end()
        if step % 4:
            raise MalformedCall(f"unclosed argument: expected {_SEQUENCE[step % 4]}")
        if not self.separator.fullmatch(body[pos:]):
            raise MalformedCall(f"unexpected text {body[pos:].strip()[:40]!r} after the arguments")
        return args
