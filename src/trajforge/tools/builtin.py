"""The built-in tools, assembled for one configuration (a fixed list, never a global registry).

:func:`build_registry` registers each toolset whose backend is configured and marks the others
unavailable with the reason, so a tool that cannot run is never offered to a model.
:func:`toolset_availability` is what a run says about that, once, before it starts: an explicit
toolset choice that needs an unconfigured backend is an error; a distribution that merely samples
it is told the toolset is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from trajforge.tools.base import FunctionTool
from trajforge.tools.config import ToolsConfig
from trajforge.tools.files import file_tools
from trajforge.tools.pending import pending_tools
from trajforge.tools.registry import ToolRegistry
from trajforge.tools.terminal import terminal_tools
from trajforge.tools.toolsets import TOOLSETS


def builtin_tools() -> list[FunctionTool]:
    """The tools that need no backend: terminal and file (and the declared-but-pending ones)."""
    return [*terminal_tools(), *file_tools(), *pending_tools()]


def _offer(
    registry: ToolRegistry, toolset: str, ready: bool, reason: str, build: Callable[[], list[FunctionTool]]
) -> None:
    """Register what ``build`` makes (when ``ready``); every other tool of ``toolset`` is marked
    unavailable with ``reason`` (a toolset may be partly ready: web_extract without a search
    provider)."""
    built = build() if ready else []
    for tool in built:
        registry.register(tool)
    for name in TOOLSETS[toolset]:
        if name not in registry:
            registry.mark_unavailable(name, reason)


def build_registry(config: ToolsConfig | None = None) -> ToolRegistry:
    """A new registry of the tools ``config`` can run; the rest are marked unavailable, with why."""
    from trajforge.tools.host_fetch import policy_fetcher
    from trajforge.tools.image_gen import image_gen_tools
    from trajforge.tools.moa import moa_tools
    from trajforge.tools.vision import vision_tools
    from trajforge.tools.web import web_tools

    cfg = config or ToolsConfig()
    registry = ToolRegistry(builtin_tools())
    fetch = policy_fetcher(cfg.web.policy, timeout_s=cfg.image_fetch_timeout_s)
    _offer(
        registry,
        "web",
        True,  # web_extract needs no backend; web_search needs a provider
        cfg.web.search_unready() or "not offered",
        lambda: [t for t in web_tools(cfg.web) if t.name != "web_search" or not cfg.web.search_unready()],
    )
    _offer(
        registry,
        "vision",
        cfg.vision.ready,
        "no vision model configured (set tools.vision.endpoint: base_url and model)",
        lambda: vision_tools(cfg.vision, fetch),
    )
    _offer(
        registry,
        "image_gen",
        cfg.image_gen.ready,
        "no image generation endpoint configured (set tools.image_gen.base_url and model)",
        lambda: image_gen_tools(cfg.image_gen, fetch),
    )
    _offer(
        registry,
        "moa",
        cfg.moa.ready,
        "no mixture-of-agents models configured (set tools.moa.reference_models and aggregator)",
        lambda: moa_tools(cfg.moa),
    )
    return registry


@dataclass(frozen=True)
class Availability:
    """What a run says at start about toolsets it may offer but cannot: ``error`` stops it,
    ``warning`` is said once."""

    error: str | None = None
    warning: str | None = None


def toolset_availability(registry: ToolRegistry, toolsets: Iterable[str], *, explicit: bool) -> Availability:
    """Whether ``toolsets`` can all be offered. ``explicit``: the user named them (--toolsets),
    so a missing backend is an error; otherwise (a distribution samples them) it is a warning and
    the toolset is dropped from every sample."""
    missing = registry.unavailable_toolsets(toolsets)
    if not missing:
        return Availability()
    none_ready = [ts for ts, tools in missing.items() if len(tools) == len(TOOLSETS[ts])]
    lines = "; ".join(_describe(ts, tools, ts in none_ready) for ts, tools in missing.items())
    hint = "configure them in the tools section (--tools-config); `trajforge tools list` shows what is ready"
    if explicit and none_ready:
        return Availability(
            error=f"--toolsets asks for toolsets that cannot run here: {lines}. Either {hint}, "
            "or leave them out of --toolsets"
        )
    return Availability(warning=f"warning: not offered in this run: {lines}. To offer them, {hint}")


def _describe(toolset: str, tools: dict[str, str], whole: bool) -> str:
    reasons = sorted(set(tools.values()))
    what = f"toolset {toolset}" if whole else f"{toolset} tools {', '.join(tools)}"
    return f"{what} ({'; '.join(reasons)})"
