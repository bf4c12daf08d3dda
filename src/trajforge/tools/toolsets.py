"""The toolsets: which tool names each toolset holds, and checking toolset names.

``TOOLSETS`` is the fixed map of toolset -> tool names of the reference system (its toolset
distributions sample these names). A table, not a registry: it imports nothing of ours, so tool
modules, the registry and the distributions can all stand on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

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
