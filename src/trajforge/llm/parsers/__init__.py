"""Raw model text -> tool calls, one module per model family.

``get_parser(name).parse(text, tools=None)`` returns a :class:`ParseResult` (content, calls,
errors). Families are looked up through a fixed name -> import path map and imported on first
use, so importing this package costs nothing and nothing registers itself at import time.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Annotated

from pydantic import AfterValidator

from trajforge.llm.parsers.base import (
    ParsedCall,
    ParseError,
    ParseResult,
    ToolCallParser,
    Tools,
    to_tool_calls,
)

_PARSERS = MappingProxyType(
    {
        "auto": "trajforge.llm.parsers.auto:AutoParser",
        "deepseek_v3": "trajforge.llm.parsers.deepseek_v3:DeepseekV3Parser",
        "deepseek_v31": "trajforge.llm.parsers.deepseek_v31:DeepseekV31Parser",
        "glm45": "trajforge.llm.parsers.glm45:Glm45Parser",
        "glm47": "trajforge.llm.parsers.glm47:Glm47Parser",
        "hermes": "trajforge.llm.parsers.hermes:HermesParser",
        "kimi_k2": "trajforge.llm.parsers.kimi_k2:KimiK2Parser",
        "llama3_json": "trajforge.llm.parsers.llama3_json:Llama3JsonParser",
        "longcat": "trajforge.llm.parsers.longcat:LongcatParser",
        "mistral": "trajforge.llm.parsers.mistral:MistralParser",
        "pythonic": "trajforge.llm.parsers.pythonic:PythonicParser",
        "qwen3_coder": "trajforge.llm.parsers.qwen3_coder:Qwen3CoderParser",
    }
)

# The seed system's other names for the same formats (docs/hermes.md): Qwen 2.5 writes Hermes's
# ``<tool_call>`` JSON; DeepSeek V3.1 is also registered there as ``deepseek_v3_1``. Accepted by
# :func:`get_parser`, not listed as families of their own.
ALIASES = MappingProxyType({"qwen": "hermes", "deepseek_v3_1": "deepseek_v31"})


def list_parsers() -> list[str]:
    """The names :func:`get_parser` accepts, sorted."""
    return sorted(_PARSERS)


def get_parser(name: str) -> ToolCallParser:
    """A fresh parser for the family ``name`` (parsers hold no state between texts).

    Raises ``ValueError`` listing the known names when ``name`` is not one of them.
    """
    target = _PARSERS.get(ALIASES.get(name, name))
    if target is None:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of: {', '.join(list_parsers())}")
    module_name, _, class_name = target.partition(":")
    parser: ToolCallParser = getattr(importlib.import_module(module_name), class_name)()
    return parser


def check_parser_name(value: str) -> str:
    """``value`` when ``--tool-call-parser`` accepts it (a family, ``auto``, an alias or ``none``:
    no parsing), else ``ValueError`` listing the names."""
    if value != "none" and ALIASES.get(value, value) not in _PARSERS:
        raise ValueError(
            f"unknown tool-call parser {value!r}; choose one of: {', '.join([*list_parsers(), 'none'])}"
        )
    return value


ParserName = Annotated[str, AfterValidator(check_parser_name)]
"""A config field naming a tool-call parser (or ``auto``/``none``), checked as ``--tool-call-parser`` is."""

__all__ = [
    "ParseError",
    "ParseResult",
    "ParsedCall",
    "ParserName",
    "ToolCallParser",
    "Tools",
    "check_parser_name",
    "get_parser",
    "list_parsers",
    "to_tool_calls",
]
