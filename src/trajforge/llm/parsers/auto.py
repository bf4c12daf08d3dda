"""Pick the tool-call family from the markers in the text, then parse with it.

For when the serving stack does not say which model produced a text (debugging, mixed logs).
Detection looks at unambiguous markers first (special tokens), then at what the first
``<tool_call>`` holds (JSON -> hermes, ``<function=`` -> qwen3_coder, a bare name -> glm47),
then at Qwen3-Coder ``<function=NAME>`` blocks without the wrapper, bare JSON (llama3_json)
and line-leading ``[name(`` (pythonic). One text is parsed with one family; a text without any
marker is all content, returned untouched. Prefer naming the family when known:
detection cannot tell GLM-4.5 from GLM-4.7, or Hermes from a model that merely mentions JSON.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from trajforge.llm.parsers.base import ParseResult, Tools, build_result
from trajforge.llm.parsers.deepseek_v3 import CALL_BEGIN as DS_CALL_BEGIN
from trajforge.llm.parsers.deepseek_v3 import CALLS_BEGIN as DS_CALLS_BEGIN
from trajforge.llm.parsers.llama3_json import _CANDIDATE as LLAMA_CANDIDATE
from trajforge.llm.parsers.pythonic import _START as PYTHONIC_START

_DS_V3 = re.compile(r"<｜tool▁call▁begin｜>\s*function\s*<｜tool▁sep｜>[^\n]*\n\s*```")
_BARE_QWEN = re.compile(r"<function=[^<>\n]+>\s*(?:<parameter=|</function>|$)")
_KIMI = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>", "<|tool_call_begin|>")


class AutoParser:
    """Detects the family per text (see :meth:`detect`) and delegates to it."""

    name = "auto"
    start_marker = ""
    markers: tuple[str, ...] = ()

    def detect(self, text: str) -> str | None:
        """The family whose markers appear in ``text``, or ``None`` when there are none."""
        if "<longcat_tool_call>" in text:
            return "longcat"
        if DS_CALL_BEGIN in text or DS_CALLS_BEGIN in text:
            return "deepseek_v3" if _DS_V3.search(text) else "deepseek_v31"
        if any(marker in text for marker in _KIMI):
            return "kimi_k2"
        if "[TOOL_CALLS]" in text:
            return "mistral"
        at = text.find("<tool_call>")
        if at >= 0:
            body = text[at + len("<tool_call>") :].lstrip()
            if body.startswith("<function="):
                return "qwen3_coder"
            if body[:1].isalpha() or body[:1] == "_":
                return "glm47"
            return "hermes"
        if _BARE_QWEN.search(text):
            return "qwen3_coder"
        if LLAMA_CANDIDATE.search(text):
            return "llama3_json"
        if PYTHONIC_START.search(text):
            return "pythonic"
        return None

    def parse(self, text: str, tools: Tools = None) -> ParseResult:
        from trajforge.llm.parsers import get_parser

        family = self.detect(text)
        if family is None:
            return build_result([text], [], [], None)
        return get_parser(family).parse(text, tools)

    def format_calls(self, calls: Sequence[Any]) -> str:
        raise ValueError("the auto parser cannot write calls: pick a family (see list_parsers())")
