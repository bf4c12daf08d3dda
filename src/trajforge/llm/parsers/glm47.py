"""GLM-4.7 format: GLM-4.5's tags with looser layout.

GLM-4.7 writes ``<tool_call>NAME<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>`` with
no newline after the name, and sometimes a literal ``\\n`` (backslash, n) between tags; both
are accepted. Values are typed by the tool schema as for GLM-4.5.
"""

from __future__ import annotations

import re

from trajforge.llm.parsers.glm45 import Glm45Parser


class Glm47Parser(Glm45Parser):
    """GLM-4.5 parsing without the newline rule; ``\\n`` escapes count as layout."""

    name = "glm47"
    newline_after_name = False
    separator = re.compile(r"(?:\s|\\n)*")
    layout = ""
