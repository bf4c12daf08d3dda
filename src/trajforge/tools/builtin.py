"""The built-in tools, assembled for one configuration (a fixed list, never a global registry).

:func:`build_registry` registers each toolset whose backend is configured and marks the others
unavailable with the reason, so a tool that cannot run is never offered to a model.
:func:`toolset_availability` is what a run says about that, once, before it starts: an explicit
toolset choice that needs an unconfigured backend is an error; a distribution that merely samples
it is told the toolset is dropped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
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
    from trajforge.tools.browser import BrowserHost, browser_tools
    from trajforge.tools.host_fetch import policy_fetcher
    from trajforge.tools.image_gen import image_gen_tools
    from trajforge.tools.moa import moa_tools
    from trajforge.tools.vision import vision_tools
    from trajforge.tools.web import web_tools

    cfg = config or ToolsConfig()
    registry = ToolRegistry(builtin_tools())
    fetch = policy_fetcher(cfg.network, timeout_s=cfg.image_fetch_timeout_s)
    web = cfg.web_config()
    _offer(
        registry,
        "web",
        True,  # web_extract needs no backend; web_search needs a provider
        web.search_unready() or "not offered",
        lambda: [t for t in web_tools(web) if t.name != "web_search" or not web.search_unready()],
    )
    browser = cfg.browser_config()
    browser_unready = browser.unready()
    host: BrowserHost | None = None
    if browser_unready is None:
        host = BrowserHost(browser)
        registry.on_close(host.aclose)
    vision_ask = _vision_ask(cfg)
    _offer(
        registry,
        "browser",
        browser_unready is None,
        # only browser_vision is left out when the browser runs but no vision model is configured
        browser_unready or "no vision model configured for browser_vision (set tools.vision.endpoint)",
        lambda: [
            t
            for t in browser_tools(browser, host=host, vision=vision_ask)
            if t.name != "browser_vision" or vision_ask is not None
        ],
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


def _vision_ask(cfg: ToolsConfig) -> Callable[[bytes, str], Awaitable[str]] | None:
    """``browser_vision``'s question to the configured vision model (a screenshot, a question)."""
    endpoint = cfg.vision.endpoint
    if endpoint is None:
        return None
    from trajforge.tools.images import data_url
    from trajforge.tools.vision import ask_about_image

    async def ask(png: bytes, question: str) -> str:
        return await ask_about_image(endpoint, data_url(png, "the screenshot"), question)

    return ask


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


def default_registry() -> ToolRegistry:
    """A new registry for an empty tools configuration: terminal and file tools (and the pending
    rl toolset); every toolset that needs a backend is marked unavailable. See ``build_registry``."""
    return build_registry(None)
