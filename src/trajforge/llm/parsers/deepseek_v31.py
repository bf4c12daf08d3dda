"""DeepSeek-V3.1 / V3.2 format: no call type, no code fence.

::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"arg": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Scanning and the section rules are DeepSeek-V3's (:mod:`.deepseek_v3`); only a call's body
differs.
"""

from __future__ import annotations

from typing import Any

from trajforge.llm.parsers._scan import MalformedCall, named_call
from trajforge.llm.parsers.base import ParsedCall, arguments_json
from trajforge.llm.parsers.deepseek_v3 import SEP, DeepseekV3Parser


class DeepseekV31Parser(DeepseekV3Parser):
    """``NAME<｜tool▁sep｜>{json}`` per call."""

    name = "deepseek_v31"

    def _format_one(self, call: Any) -> str:
        return f"{call.name}{SEP}{arguments_json(call)}"

    def _read_call(self, body: str, truncated: bool = False) -> ParsedCall:
        name, sep, args = body.partition(SEP)
        if not sep:
            raise MalformedCall(f"no {SEP} in the call")
        if truncated and not args.strip():
            raise MalformedCall("the text ends before the arguments")
        return named_call(name, args)
