"""The list of built-in tools (a fixed list, assembled on demand, never a global registry)."""

from __future__ import annotations

from trajforge.tools.base import FunctionTool
from trajforge.tools.files import file_tools
from trajforge.tools.pending import pending_tools
from trajforge.tools.terminal import terminal_tools


def builtin_tools() -> list[FunctionTool]:
    return [*terminal_tools(), *file_tools(), *pending_tools()]
