"""The browser toolset: real headless Chromium (the distribution's) on a real site on 127.0.0.1."""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from trajforge.tools.base import FunctionTool, ToolContext
from trajforge.tools.browser import (
    BrowserConfig,
    BrowserHost,
    browser_tools,
    chat_model_vision,
    find_chromium,
)
from trajforge.tools.netpolicy import NetPolicy

sys.path.insert(0, str(Path(__file__).parent / "site"))
from localsite import Site, start_site  # noqa: E402

pytestmark = pytest.mark.skipif(
    find_chromium() is None, reason="chromium is not installed (make system-deps installs it)"
)

LOOPBACK = NetPolicy(allow_cidrs=["127.0.0.0/8"])


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    s = await start_site()
    yield s
    await s.runner.cleanup()


@pytest.fixture
async def host() -> AsyncIterator[BrowserHost]:
    h = BrowserHost(BrowserConfig(policy=LOOPBACK, navigation_timeout_s=5, action_timeout_s=5))
    yield h
    await h.aclose()


def _tools(host: BrowserHost, **kw: Any) -> dict[str, FunctionTool]:
    return {t.name: t for t in browser_tools(host.config, host=host, **kw)}


def _ref(snapshot: str, role: str, name: str) -> str:
    m = re.search(rf'- {role} "{re.escape(name)}"[^\n]*\[ref=(\w+)\]', snapshot)
    assert m, f"no {role} {name!r} in:\n{snapshot}"
    return m.group(1)


async def test_navigate_fill_submit_and_read_through_refs(site: Site, host: BrowserHost) -> None:
    tools = _tools(host)
    ctx = ToolContext(task_id="t")
    out = await tools["browser_navigate"]({"url": site.url("/")}, ctx)
    assert out.ok, out.content
    assert "Page: Skerry Point home" in out.content
    # follow a link by its ref
    out = await tools["browser_click"]({"ref": _ref(out.content, "link", "Contact form")}, ctx)
    assert out.ok and f"URL: {site.url('/form')}" in out.content
    snap = out.content
    out = await tools["browser_type"](
        {"ref": _ref(snap, "textbox", "Your name"), "text": "Ada Lovelace"}, ctx
    )
    assert out.ok, out.content
    out = await tools["browser_type"]({"ref": _ref(snap, "textbox", "Message"), "text": "Lamp & lens"}, ctx)
    assert out.ok
    out = await tools["browser_click"]({"ref": _ref(snap, "button", "Send")}, ctx)
    assert out.ok, out.content
    assert f"URL: {site.url('/echo')}" in out.content
    assert "name = Ada Lovelace" in out.content and "message = Lamp & lens" in out.content
    assert "POST" not in out.content and "/echo" in site.requests  # the POST reached the server
    # back to the form, and a snapshot of it
    out = await tools["browser_back"]({}, ctx)
    assert out.ok and "Page: Contact form" in out.content
    snap = (await tools["browser_snapshot"]({}, ctx)).content
    assert 'textbox "Your name"' in snap
    await ctx.aclose()
    assert ctx.state["browser_session"].context.pages == []  # the context was closed with the rollout


async def test_redirect_images_scroll_press_and_console(site: Site, host: BrowserHost) -> None:
    tools = _tools(host)
    ctx = ToolContext(task_id="t")
    out = await tools["browser_navigate"]({"url": site.url("/redirect")}, ctx)
    assert out.ok and f"URL: {site.url('/page1')}" in out.content  # redirect followed, hop by hop
    out = await tools["browser_scroll"]({"direction": "down"}, ctx)
    assert out.ok and out.content.startswith("Scrolled down")
    out = await tools["browser_press"]({"key": "End"}, ctx)
    assert out.ok
    await tools["browser_navigate"]({"url": site.url("/images")}, ctx)
    out = await tools["browser_get_images"]({}, ctx)
    images = orjson.loads(out.content)["images"]
    assert [(i["src"], i["alt"], i["width"]) for i in images] == [
        (site.url("/img/red.png"), "A red square", 4),
        (site.url("/img/blue.png"), "A blue square", 4),
    ]  # naturalWidth 4: the PNG bytes were fetched and decoded
    await tools["browser_navigate"]({"url": site.url("/console")}, ctx)
    msgs = orjson.loads((await tools["browser_console"]({"clear": True}, ctx)).content)["messages"]
    assert {"type": "log", "text": "hello from the page"} in msgs
    assert {"type": "error", "text": "something broke"} in msgs
    assert orjson.loads((await tools["browser_console"]({}, ctx)).content)["messages"] == []
    out = await tools["browser_click"]({"ref": "e9999"}, ctx)
    assert not out.ok and "snapshot" in out.content
    out = await tools["browser_click"]({"ref": "#id; drop"}, ctx)
    assert not out.ok and "element ref" in out.content
    await ctx.aclose()


async def test_navigation_policy_refuses_denied_pages_redirects_and_subresources(site: Site) -> None:
    default = BrowserHost(BrowserConfig(navigation_timeout_s=5))  # default policy: loopback denied
    try:
        ctx = ToolContext(task_id="t")
        out = await _tools(default)["browser_navigate"]({"url": site.url("/")}, ctx)
        assert not out.ok and "127.0.0.1 is a loopback address" in out.content
        out = await _tools(default)["browser_navigate"]({"url": "file:///etc/passwd"}, ctx)
        assert not out.ok and "only http and https" in out.content
        await ctx.aclose()
    finally:
        await default.aclose()
    assert site.requests == []

    host = BrowserHost(BrowserConfig(policy=LOOPBACK, navigation_timeout_s=5))
    try:
        tools = _tools(host)
        ctx = ToolContext(task_id="t")
        meta = "http://169.254.169.254/latest/meta-data/"
        out = await tools["browser_navigate"]({"url": site.url(f"/redirect-to?target={meta}")}, ctx)
        assert not out.ok and "169.254.169.254" in out.content and "cloud metadata" in out.content
        # a page that embeds a denied address: the page loads, the subresource is refused
        out = await tools["browser_navigate"](
            {"url": site.url("/ssrf-image?target=http://10.0.0.1/x.png")}, ctx
        )
        assert out.ok and "Innocent page" in out.content
        msgs = orjson.loads((await tools["browser_console"]({}, ctx)).content)["messages"]
        assert any(
            m["type"] == "blocked" and "10.0.0.1" in m["text"] and "private" in m["text"] for m in msgs
        )
        await ctx.aclose()
    finally:
        await host.aclose()


async def test_contexts_are_per_rollout_on_one_browser(site: Site, host: BrowserHost) -> None:
    tools = _tools(host)
    a, b = ToolContext(task_id="a"), ToolContext(task_id="b")
    await tools["browser_navigate"]({"url": site.url("/page1")}, a)
    await tools["browser_navigate"]({"url": site.url("/page2")}, b)
    sa, sb = a.state["browser_session"], b.state["browser_session"]
    assert sa.context is not sb.context and sa.context.browser is sb.context.browser
    assert "Page: The lighthouse keeper" in (await tools["browser_snapshot"]({}, a)).content
    assert "Page: Second page" in (await tools["browser_snapshot"]({}, b)).content
    await a.aclose()
    assert sb.context.pages  # b is untouched by a's end
    await b.aclose()


async def test_browser_vision_sends_the_screenshot_to_the_vision_model(
    site: Site, host: BrowserHost, scripted_server: Any
) -> None:
    from trajforge.llm.openai_client import OpenAIChatModel, OpenAIModelConfig
    from trajforge.testing.replies import Reply

    server = await scripted_server(lambda req: Reply(content="A red square and a blue square."))
    model = OpenAIChatModel(OpenAIModelConfig(model="vision-test", base_url=server.base_url))
    try:
        tools = _tools(host, vision=chat_model_vision(model))
        ctx = ToolContext(task_id="t")
        await tools["browser_navigate"]({"url": site.url("/images")}, ctx)
        out = await tools["browser_vision"]({"question": "What shapes are there?"}, ctx)
        assert out.ok and out.content == "A red square and a blue square."
        (request,) = server.requests
        parts = request["messages"][0]["content"]
        assert parts[0] == {"type": "text", "text": "What shapes are there?"}
        assert parts[1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")
        # without a vision model: a clear tool error
        out = await _tools(host)["browser_vision"]({"question": "x"}, ctx)
        assert not out.ok and "needs a vision model" in out.content
        await ctx.aclose()
    finally:
        await model.aclose()


def test_isolation_needs_bubblewrap_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chromium runs in a network namespace of its own by default; without bwrap the browser is
    not offered, with the reason and the way out."""
    chromium = find_chromium()
    monkeypatch.setenv("PATH", "/nonexistent")
    why = BrowserConfig(executable=chromium).unready()
    assert why is not None and "bubblewrap" in why and "isolate_network: false" in why
    assert BrowserConfig(executable=chromium, isolate_network=False).unready() is None
