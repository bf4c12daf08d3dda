"""What ``trajforge tools list`` and ``tools check`` report: every tool's readiness, and a live
probe of each configured backend.

``tools_status`` reads the registry (no I/O); ``probe_backends`` talks to each backend once --
model endpoints list their models (no tokens spent), the image endpoint too, the search provider
answers one query, the browser launches and opens a blank page -- each under a deadline, so a
dead backend is found before a run, not in its first thousand samples.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from trajforge.tools.config import ToolsConfig
from trajforge.tools.model_endpoint import ModelEndpoint
from trajforge.tools.registry import ToolRegistry
from trajforge.tools.toolsets import TOOLSETS


@dataclass(frozen=True)
class ToolStatus:
    name: str
    toolset: str
    status: str  # "ready" | "pending" | "unavailable"
    reason: str | None = None


def tools_status(registry: ToolRegistry) -> list[ToolStatus]:
    """Every declared tool, in toolset order, with whether it is offered here and why not."""
    out = []
    for toolset, names in TOOLSETS.items():
        for name in names:
            tool = registry.get(name)
            if tool is None:
                why = registry.unavailable_reason(name) or "not registered"
                out.append(ToolStatus(name, toolset, "unavailable", why))
            elif not getattr(tool, "implemented", True):
                out.append(ToolStatus(name, toolset, "pending", "not implemented in this version"))
            else:
                out.append(ToolStatus(name, toolset, "ready"))
    return out


@dataclass(frozen=True)
class ProbeResult:
    backend: str  # e.g. "vision", "moa reference 2", "browser"
    target: str
    ok: bool
    detail: str


async def _model(endpoint: ModelEndpoint) -> str:
    from trajforge.tools.model_endpoint import open_chat_client

    async with open_chat_client(endpoint) as client:
        ids = await client.check()
    if ids and endpoint.model not in ids:
        return f"answers, but model {endpoint.model!r} is NOT listed ({len(ids)} models)"
    return "answers" + (f"; model {endpoint.model!r} listed" if ids else "")


async def _search(cfg: ToolsConfig) -> str:
    from trajforge.tools.web import search

    out = await search(cfg.web_config(), "trajforge")
    return f"answers ({len(out['results'])} results for a test query)"


async def _browser(cfg: ToolsConfig) -> str:
    from trajforge.tools.browser import BrowserHost

    host = BrowserHost(cfg.browser_config())
    try:
        browser = await host.browser()
        context = await browser.new_context()
        try:
            page = await context.new_page()
            await page.goto("about:blank")
        finally:
            await context.close()
        return f"launches (Chromium {browser.version})"
    finally:
        await host.aclose()


def _checks(cfg: ToolsConfig) -> list[tuple[str, str, Callable[[], Awaitable[str]]]]:
    checks: list[tuple[str, str, Callable[[], Awaitable[str]]]] = []
    if cfg.vision.endpoint is not None:
        ep = cfg.vision.endpoint
        checks.append(("vision", ep.label, lambda: _model(ep)))
    if cfg.image_gen.ready:
        from trajforge.tools.image_gen import image_provider

        checks.append(
            (
                "image_gen",
                f"{cfg.image_gen.model}@{cfg.image_gen.base_url}",
                image_provider(cfg.image_gen).check,
            )
        )
    for i, ref in enumerate(cfg.moa.reference_models, 1):
        checks.append((f"moa reference {i}", ref.label, lambda ref=ref: _model(ref)))  # type: ignore[misc]
    if cfg.moa.aggregator is not None:
        agg = cfg.moa.aggregator
        checks.append(("moa aggregator", agg.label, lambda: _model(agg)))
    if cfg.web.provider is not None:
        checks.append(("web search", f"{cfg.web.provider} {cfg.web.search_url}", lambda: _search(cfg)))
    if cfg.browser_config().unready() is None:
        checks.append(("browser", cfg.browser_config().chromium_path() or "chromium", lambda: _browser(cfg)))
    return checks


async def probe_backends(cfg: ToolsConfig, *, timeout_s: float = 30.0) -> list[ProbeResult]:
    """Probe every configured backend at once; each result says what answered or why not."""

    async def one(backend: str, target: str, check: Callable[[], Awaitable[str]]) -> ProbeResult:
        try:
            async with asyncio.timeout(timeout_s):
                return ProbeResult(backend, target, True, await check())
        except TimeoutError:
            return ProbeResult(backend, target, False, f"no answer within {timeout_s:g}s")
        except Exception as exc:  # every failure is the probe's result, reported per backend
            return ProbeResult(backend, target, False, f"{type(exc).__name__}: {str(exc)[:300]}")

    return list(await asyncio.gather(*(one(*c) for c in _checks(cfg))))
