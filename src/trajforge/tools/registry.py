"""A tool registry *instance* (no import-time global mutation).

``build_registry(config)`` (in :mod:`trajforge.tools.builtin`) builds a fresh registry of the
tools whose backends are configured; callers own it. A declared tool that cannot run here is not
registered but *marked unavailable* with the reason, so listings and run start-up can say why it is
not offered. The toolset tables it selects by live one floor down, in
:mod:`trajforge.tools.toolsets`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from trajforge.tools.base import Tool, openai_schema
from trajforge.tools.toolsets import TOOLSETS, check_toolsets


class ToolRegistry:
    """Holds tools by name. Build one per process (or per run) and pass it around."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._unavailable: dict[str, str] = {}  # declared tool -> why it is not offered here
        self._closers: list[Callable[[], Awaitable[None]]] = []
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        self._unavailable.pop(tool.name, None)

    def replace(self, tool: Tool) -> None:
        """Offer ``tool`` in place of the one registered under its name (a declared placeholder, e.g.
        the ``rl`` schemas of ``tools/pending.py``, replaced by the real tools where their backend
        -- the run manager, above this package -- exists: the CLI assembles them)."""
        if tool.name not in self._tools:
            raise ValueError(f"tool {tool.name!r} is not registered; register it instead")
        self._tools[tool.name] = tool

    def mark_unavailable(self, name: str, reason: str) -> None:
        """Declare that ``name`` is not offered here, and why (e.g. its backend is not configured)."""
        if name in self._tools:
            raise ValueError(f"tool {name!r} is registered; it cannot also be unavailable")
        self._unavailable[name] = reason

    def unavailable_reason(self, name: str) -> str | None:
        """Why a declared tool is not offered here; None when it is (or is unknown)."""
        return self._unavailable.get(name)

    def unavailable_toolsets(self, toolsets: Iterable[str]) -> dict[str, dict[str, str]]:
        """toolset -> {tool: why} for each of ``toolsets`` with declared tools not offered here."""
        out: dict[str, dict[str, str]] = {}
        for ts in check_toolsets(toolsets):
            missing = {n: self._unavailable[n] for n in TOOLSETS.get(ts, ()) if n in self._unavailable}
            if missing:
                out[ts] = missing
        return out

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

    def on_close(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Run ``closer`` in :meth:`aclose` (a resource the tools share, e.g. the worker's browser)."""
        self._closers.append(closer)

    async def aclose(self) -> None:
        """Release what the tools share; call once, on the event loop that used them."""
        closers, self._closers = self._closers[::-1], []
        for closer in closers:
            await closer()

    def schemas(self, tools: Iterable[Tool]) -> list[dict[str, Any]]:
        return [openai_schema(t) for t in tools]
