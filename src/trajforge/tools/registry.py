"""Toolsets and a tool registry *instance* (no import-time global mutation).

``TOOLSETS`` is the fixed map of toolset -> tool names of the reference system (SPEC section 3).
``default_registry()`` builds a fresh registry holding every built-in tool; callers own it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from trajforge.tools.base import Tool, openai_schema

TOOLSETS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "web": ("web_search", "web_extract"),
        "vision": ("vision_analyze",),
        "image_gen": ("image_generate",),
        "terminal": ("terminal", "process"),
        "file": ("read_file", "write_file", "patch", "search_files"),
        "moa": ("mixture_of_agents",),
        "browser": (
            "browser_navigate",
            "browser_snapshot",
            "browser_click",
            "browser_type",
            "browser_scroll",
            "browser_back",
            "browser_press",
            "browser_get_images",
            "browser_vision",
            "browser_console",
        ),
        "rl": (
            "rl_list_environments",
            "rl_select_environment",
            "rl_get_current_config",
            "rl_edit_config",
            "rl_start_training",
            "rl_check_status",
            "rl_stop_training",
            "rl_get_results",
            "rl_list_runs",
            "rl_test_inference",
        ),
    }
)

TOOL_TO_TOOLSET: Mapping[str, str] = MappingProxyType(
    {tool: ts for ts, tools in TOOLSETS.items() for tool in tools}
)


class UnknownToolsetError(ValueError):
    """A toolset name that trajforge does not know."""


def check_toolsets(names: Iterable[str]) -> list[str]:
    """Validate toolset names, raising a message that lists the known ones."""
    out = []
    for name in names:
        if name not in TOOLSETS:
            raise UnknownToolsetError(
                f"unknown toolset {name!r}; known toolsets: {', '.join(sorted(TOOLSETS))}"
            )
        out.append(name)
    return out


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
