"""A tool registry *instance* (no import-time global mutation).

``default_registry()`` builds a fresh registry holding every built-in tool; callers own it. The
toolset tables it selects by live one floor down, in :mod:`trajforge.tools.toolsets`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from trajforge.tools.base import Tool, openai_schema
from trajforge.tools.toolsets import TOOLSETS, check_toolsets


class ToolRegistry:
    """Holds tools by name. Build one per process (or per run) and pass it around."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def names(self) -> list[str]:
        return list(self._tools)

    def for_toolsets(self, toolsets: Iterable[str]) -> list[Tool]:
        """The registered tools of the given toolsets, in toolset declaration order."""
        selected = set(check_toolsets(toolsets))
        return [
            self._tools[name]
            for ts, names in TOOLSETS.items()
            if ts in selected
            for name in names
            if name in self._tools
        ] + [t for t in self._tools.values() if t.toolset in selected and t.toolset not in TOOLSETS]

    def schemas(self, tools: Iterable[Tool]) -> list[dict[str, Any]]:
        return [openai_schema(t) for t in tools]


def default_registry() -> ToolRegistry:
    """A new registry with every built-in tool (unimplemented toolsets say so when called)."""
    from trajforge.tools.builtin import builtin_tools

    return ToolRegistry(builtin_tools())
