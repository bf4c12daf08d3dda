"""Qwen3-Coder XML format.

::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

Values are raw text (one newline after the opening and before the closing parameter tag is
layout, not value) typed by the tool schema (:mod:`trajforge.llm.parsers.schema`). A missing
``</parameter>`` is tolerated when the next ``<parameter=`` or ``</function>`` makes the end of
the value unambiguous (Qwen3-Coder models do drop it); a missing ``</function>`` or
``</tool_call>``, stray text between tags, or a nameless function is an error.
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

_TAG = re.compile(r"<function=([^>]*)>|</function>|<parameter=([^>]*)>|</parameter>")


class Qwen3CoderParser:
    """``<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>``."""

    name = "qwen3_coder"
    start_marker = "<tool_call>"
    end_marker = "</tool_call>"
    markers = ("<tool_call>", "<function=", "<parameter=")

    def parse(self, text: str, tools: Tools = None) -> ParseResult:
        schemas = ToolSchemas(tools)
        scan = scan_blocks(
            text, self.start_marker, self.end_marker, lambda body: _read_functions(body, schemas)
        )
        return ParseResult(make_content(scan.pieces), scan.calls, scan.errors, self.name)

    def format_calls(self, calls: Sequence[Any]) -> str:
        out = []
        for call in calls:
            params = "".join(
                f"<parameter={key}>\n{render_value(value)}\n</parameter>\n"
                for key, value in call_arguments(call).items()
            )
            out.append(f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>")
        return "\n".join(out)


def _read_functions(body: str, schemas: ToolSchemas) -> list[ParsedCall]:
    """A small state machine over the tags of one ``<tool_call>`` body (one regex pass)."""
    calls: list[ParsedCall] = []
    fn: str | None = None
    args: dict[str, Any] = {}
    param: str | None = None
    value_start = pos = 0

    def close_param(end: int) -> None:
        nonlocal param
        assert fn is not None and param is not None
        if param in args:
            raise MalformedCall(f"parameter {param!r} given twice in function {fn!r}")
        args[param] = schemas.convert(fn, param, _trim(body[value_start:end]))
        param = None

    for tag in _TAG.finditer(body):
        token = tag.group(0)
        if param is None and body[pos : tag.start()].strip():
            raise MalformedCall(f"unexpected text {body[pos : tag.start()].strip()[:40]!r} between tags")
        if token.startswith("<function="):
            if fn is not None:
                raise MalformedCall(f"<function={fn}> is not closed before the next <function=")
            fn, args = _name(tag.group(1), "function"), {}
        elif fn is None:
            raise MalformedCall(f"{token} outside <function=...>")
        elif token == "</function>":
            if param is not None:
                close_param(tag.start())
            calls.append(ParsedCall(fn, args))
            fn = None
        elif token.startswith("<parameter="):
            if param is not None:
                close_param(tag.start())
            param, value_start = _name(tag.group(2), "parameter"), tag.end()
        elif param is None:
            raise MalformedCall("</parameter> without an opening <parameter=...>")
        else:
            close_param(tag.start())
        pos = tag.end()
    if fn is not None:
        raise MalformedCall(f"unclosed <function={fn}>: no </function>")
    if body[pos:].strip():
        raise MalformedCall(f"unexpected text {body[pos:].strip()[:40]!r} after </function>")
    if not calls:
        raise MalformedCall("no <function=NAME> inside <tool_call>")
    return calls


def _name(raw: str, what: str) -> str:
    name = raw.strip()
    if not name or "<" in name or "\n" in name:
        raise MalformedCall(f"invalid {what} name {raw!r}")
    return name


def _trim(value: str) -> str:
    """Drop the layout newline after the opening and before the closing tag (one each)."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value
