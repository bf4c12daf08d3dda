"""GLM-4.7 format: GLM-4.5's tags with looser layout.

GLM-4.7 writes ``<tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`` with
no newline after the name, and sometimes a literal ``\\n`` (backslash, n) between tags or after
the name; both are accepted. Values are typed by the tool schema, and read with the same rules
for tags inside values and cut-off calls, as for GLM-4.5 (:mod:`.glm45`).
"""

from __future__ import annotations

import re

from trajforge.llm.parsers.glm45 import Glm45Parser

_LITERAL_NEWLINES = re.compile(r"^(?:\s|\\n)+|(?:\s|\\n)+$")


class Glm47Parser(Glm45Parser):
    """GLM-4.5 parsing without the newline rule; ``\\n`` escapes count as layout."""

    name = "glm47"
    newline_after_name = False
    separator = re.compile(r"(?:\s|\\n)*")
    layout = ""

    def function_name(self, head: str) -> str:
        return _LITERAL_NEWLINES.sub("", head)
