"""LongCat format: Hermes JSON calls inside ``<longcat_tool_call>...</longcat_tool_call>``."""

from __future__ import annotations

from trajforge.llm.parsers.hermes import HermesParser


class LongcatParser(HermesParser):
    """Same JSON body as Hermes; only the tags differ."""

    name = "longcat"
    start_marker = "<longcat_tool_call>"
    end_marker = "</longcat_tool_call>"
