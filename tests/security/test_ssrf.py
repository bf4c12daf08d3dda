"""SSRF: every spelling of "this machine" a model can write, against a loopback canary.

The attacker controls the model's output, so it chooses the URLs ``web_extract``,
``vision_analyze`` and the browser fetch, and the pages those URLs return choose redirects and
subresources. The operator's network is played by a canary: a raw TCP server on 127.0.0.1 and
[::1] (one port) that records every connection it accepts, whatever it carries. The public
internet is played by an "origin" on 127.0.0.2, which the policies below admit by that one
address; everything else on loopback is the operator's.

Each table runs twice per tool: under the policy the operator would run (the origin admitted,
loopback denied) every row must be refused with an error that says so and the canary must see
nothing; with loopback explicitly allowed the same rows must reach the canary, which shows the
rows are live attacks (and the refusals are the policy's, not a typo in the table).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from aiohttp import web

from trajforge.tools.base import ToolContext, ToolOutput
from trajforge.tools.browser import BrowserConfig, BrowserHost, browser_tools, find_chromium
from trajforge.tools.host_fetch import policy_fetcher
from trajforge.tools.model_endpoint import ModelEndpoint
from trajforge.tools.netpolicy import NetPolicy
from trajforge.tools.vision import VisionConfig, vision_tools
from trajforge.tools.web import WebConfig, web_tools

sys.path.insert(0, str(Path(__file__).parents[1] / "site"))
from localsite import png  # noqa: E402

ORIGIN_IP = "127.0.0.2"
# What an operator runs: the "internet" (the origin) admitted, the machine's own loopback not.
DENY = NetPolicy(allow_cidrs=[f"{ORIGIN_IP}/32"])
# The control: loopback (and the unspecified addresses, which connect to it) explicitly allowed.
ALLOW = NetPolicy(allow_cidrs=["127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128", "169.254.0.0/16", "::/96"])


# -- the canary: the operator's loopback service ------------------------------------------------


@dataclass
class Canary:
    """Every connection accepted on 127.0.0.1:port and [::1]:port, with its first line."""

    port: int = 0
    hits: list[str] = field(default_factory=list)
    servers: list[asyncio.base_events.Server] = field(default_factory=list)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
        except (TimeoutError, OSError):
            line = b""
        self.hits.append(f"{line.decode(errors='replace').strip() or '(no request)'} from {peer[0]}")
        body = png()
        with contextlib.suppress(OSError):
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        writer.close()

    def hit(self, row: str) -> bool:
        return any(f"/hit/{row} " in h or f"/hit/{row}?" in h for h in self.hits)


async def start_canary() -> Canary:
    canary = Canary()
    for _ in range(20):  # one port on both loopbacks: retry when [::1] has it taken
        v4 = await asyncio.start_server(canary._serve, "127.0.0.1", 0)
        port = v4.sockets[0].getsockname()[1]
        try:
            v6 = await asyncio.start_server(canary._serve, "::1", port, family=socket.AF_INET6)
        except OSError:
            v4.close()
            continue
        canary.port, canary.servers = port, [v4, v6]
        return canary
    raise RuntimeError("no port free on both 127.0.0.1 and ::1")


# -- the origin: a server on "the internet" the attacker controls --------------------------------


def _origin_app() -> web.Application:
    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def page(_: web.Request) -> web.Response:
        return web.Response(
            text="<html><title>origin</title><p>public page</p></html>", content_type="text/html"
        )

    app = web.Application()
    app.add_routes([web.get("/redirect", redirect), web.get("/page", page)])
    return app


@pytest.fixture
async def canary() -> AsyncIterator[Canary]:
    c = await start_canary()
    yield c
    for s in c.servers:
        s.close()
        await s.wait_closed()


@pytest.fixture
async def origin() -> AsyncIterator[str]:
    runner = web.AppRunner(_origin_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, ORIGIN_IP, 0)
    await site.start()
    yield f"http://{ORIGIN_IP}:{runner.addresses[0][1]}"
    await runner.cleanup()


# -- the spelling table ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    id: str
    template: str  # {port}: the canary's
    reaches: bool = True  # with loopback allowed, this spelling connects to the canary
    why_not: str = ""  # when it does not: what stops it then (never the policy)
    redirect: bool = False  # the URL is the target of a redirect from the admitted origin


P = "{port}"
ROWS: tuple[Row, ...] = (
    Row("plain", f"http://127.0.0.1:{P}/hit/plain"),
    Row("localhost", f"http://localhost:{P}/hit/localhost"),
    # Unicode forms that IDNA/UTS 46 maps onto ASCII digits and dots
    Row("fullwidth", f"http://１２７．０．０．１:{P}/hit/fullwidth"),
    Row("ideographic-stops", f"http://127。0。0。1:{P}/hit/ideographic-stops"),
    Row("halfwidth-stops", f"http://127｡0｡0｡1:{P}/hit/halfwidth-stops"),
    Row("circled", f"http://①②⑦.⓪.⓪.①:{P}/hit/circled"),
    Row("math-digits", f"http://𝟏𝟐𝟕.𝟎.𝟎.𝟏:{P}/hit/math-digits"),
    Row("circled-localhost", f"http://ⓛⓞⓒⓐⓛⓗⓞⓢⓣ:{P}/hit/circled-localhost"),
    Row("fullwidth-localhost", f"http://ｌｏｃａｌｈｏｓｔ:{P}/hit/fullwidth-localhost"),
    # the BSD inet_aton forms
    Row("decimal", f"http://2130706433:{P}/hit/decimal"),
    Row("octal", f"http://0177.0.0.1:{P}/hit/octal"),
    Row("hex-dotted", f"http://0x7f.0.0.1:{P}/hit/hex-dotted"),
    Row("short", f"http://127.1:{P}/hit/short"),
    Row("hex", f"http://0x7f000001:{P}/hit/hex"),
    Row("zero-padded", f"http://127.000.000.001:{P}/hit/zero-padded"),
    Row("fullwidth-hex", f"http://０ｘ７ｆ０００００１:{P}/hit/fullwidth-hex"),
    # IPv6
    Row("v6-loopback", f"http://[::1]:{P}/hit/v6-loopback"),
    Row("v4-mapped", f"http://[::ffff:127.0.0.1]:{P}/hit/v4-mapped"),
    Row("v4-mapped-hex", f"http://[::ffff:7f00:1]:{P}/hit/v4-mapped-hex"),
    Row(
        "v4-compatible",
        f"http://[::127.0.0.1]:{P}/hit/v4-compatible",
        reaches=False,
        why_not="::7f00:1 has no route on Linux",
    ),
    Row("v6-expanded", f"http://[0:0:0:0:0:0:0:1]:{P}/hit/v6-expanded"),
    Row("unspecified", f"http://0.0.0.0:{P}/hit/unspecified"),
    Row("unspecified-short", f"http://0:{P}/hit/unspecified-short"),
    Row("v6-unspecified", f"http://[::]:{P}/hit/v6-unspecified"),
    # spelling of names and literals
    Row("trailing-dot-name", f"http://localhost.:{P}/hit/trailing-dot-name"),
    Row("trailing-dot-literal", f"http://127.0.0.1.:{P}/hit/trailing-dot-literal"),
    Row("upper-case", f"http://LOCALHOST:{P}/hit/upper-case"),
    Row("percent-encoded", f"http://%31%32%37.0.0.1:{P}/hit/percent-encoded"),
    Row("percent-encoded-name", f"http://%6c%6f%63%61%6c%68%6f%73%74:{P}/hit/percent-encoded-name"),
    # userinfo and delimiter tricks: parsers that disagree on where the host is
    Row("userinfo", f"http://example.com@127.0.0.1:{P}/hit/userinfo"),
    Row("userinfo-port", f"http://example.com:80@127.0.0.1:{P}/hit/userinfo-port"),
    Row("fragment-at", f"http://127.0.0.1:{P}/hit/fragment-at#@example.com/"),
    Row("backslash-at", f"http://127.0.0.1:{P}\\@example.com/hit/backslash-at"),
    Row(
        "backslash-userinfo",
        f"http://example.com\\@127.0.0.1:{P}/hit/backslash-userinfo",
        reaches=False,
        why_not="a browser reads the host as example.com (a backslash ends the authority)",
    ),
    Row("tab-in-host", f"http://127.0.0\t.1:{P}/hit/tab-in-host"),
    # redirects from the admitted origin
    Row("redirect", f"http://127.0.0.1:{P}/hit/redirect", redirect=True),
    Row("redirect-unicode", f"http://①②⑦.⓪.⓪.①:{P}/hit/redirect-unicode", redirect=True),
    Row("redirect-v6", f"http://[::ffff:7f00:1]:{P}/hit/redirect-v6", redirect=True),
    Row("redirect-decimal", f"http://2130706433:{P}/hit/redirect-decimal", redirect=True),
    # the cloud metadata service (nothing answers it here)
    Row(
        "metadata",
        "http://169.254.169.254/latest/meta-data/hit/metadata",
        reaches=False,
        why_not="no metadata service on this machine",
    ),
    Row(
        "metadata-decimal",
        "http://2852039166/latest/meta-data/hit/metadata-decimal",
        reaches=False,
        why_not="no metadata service on this machine",
    ),
)


def url_of(row: Row, canary: Canary, origin: str) -> str:
    url = row.template.replace("{port}", str(canary.port))
    return f"{origin}/redirect?to={quote(url, safe='')}" if row.redirect else url


Call = Callable[[str], Awaitable[ToolOutput]]


@dataclass
class Outcome:
    row: Row
    ok: bool
    text: str
    hit: bool


async def run_table(call: Call, canary: Canary, origin: str) -> list[Outcome]:
    outcomes = []
    for row in ROWS:
        out = await call(url_of(row, canary, origin))
        await asyncio.sleep(0)  # a connection the canary accepted is recorded before we look
        outcomes.append(Outcome(row, out.ok, out.content, canary.hit(row.id)))
    return outcomes


def render(tool: str, policy: str, outcomes: list[Outcome]) -> str:
    lines = [f"{tool} under {policy}:"]
    for o in outcomes:
        verdict = "HIT" if o.hit else ("ok" if o.ok else "refused" if "refused" in o.text else "error")
        lines.append(f"  {o.row.id:22} {verdict:8} {o.text[:150]!r}")
    return "\n".join(lines)


def assert_denied(tool: str, outcomes: list[Outcome], canary: Canary) -> None:
    table = render(tool, "the default-deny policy", outcomes)
    print(table)
    wrong = [o.row.id for o in outcomes if o.hit or o.ok or "refused" not in o.text]
    assert not wrong and not canary.hits, f"not refused: {wrong}; canary hits: {canary.hits}\n{table}"


def assert_reached(tool: str, outcomes: list[Outcome], canary: Canary) -> None:
    table = render(tool, "loopback allowed", outcomes)
    print(table)
    missed = [o.row.id for o in outcomes if o.row.reaches and not o.hit]
    stray = [o.row.id for o in outcomes if not o.row.reaches and (o.hit or "refused" in o.text)]
    assert not missed and not stray, f"did not reach the canary: {missed}; refused: {stray}\n{table}"


# -- the tools ------------------------------------------------------------------------------------


def extract_call(policy: NetPolicy) -> Call:
    [tool] = [t for t in web_tools(WebConfig(policy=policy, timeout_s=5)) if t.name == "web_extract"]

    async def call(url: str) -> ToolOutput:
        out = await tool({"urls": [url]}, ToolContext("ssrf"))
        if not out.ok:
            return out
        result = orjson.loads(out.content)["results"][0]
        return ToolOutput(content=orjson.dumps(result).decode(), ok="error" not in result)

    return call


def vision_call(policy: NetPolicy, model_url: str) -> Call:
    config = VisionConfig(endpoint=ModelEndpoint(base_url=model_url, model="scripted", max_retries=0))
    [tool] = vision_tools(config, policy_fetcher(policy, timeout_s=5))

    async def call(url: str) -> ToolOutput:
        return await tool({"image_url": url, "question": "what is it?"}, ToolContext("ssrf"))

    return call


@pytest.mark.parametrize("allowed", [False, True], ids=["deny", "allow-loopback"])
async def test_web_extract_spelling_table(canary: Canary, origin: str, allowed: bool) -> None:
    outcomes = await run_table(extract_call(ALLOW if allowed else DENY), canary, origin)
    (assert_reached if allowed else assert_denied)("web_extract", outcomes, canary)


@pytest.mark.parametrize("allowed", [False, True], ids=["deny", "allow-loopback"])
async def test_vision_image_fetch_spelling_table(
    canary: Canary, origin: str, allowed: bool, scripted_server: Any
) -> None:
    from trajforge.testing.replies import Reply

    model = await scripted_server(lambda body: Reply(content="a red square"))
    outcomes = await run_table(vision_call(ALLOW if allowed else DENY, model.base_url), canary, origin)
    (assert_reached if allowed else assert_denied)("vision_analyze", outcomes, canary)
    if not allowed:
        assert model.requests == []  # nothing fetched, nothing sent to the model


needs_chromium = pytest.mark.skipif(
    find_chromium() is None, reason="chromium is not installed (make system-deps installs it)"
)


@needs_chromium
@pytest.mark.parametrize("allowed", [False, True], ids=["deny", "allow-loopback"])
async def test_browser_navigate_spelling_table(canary: Canary, origin: str, allowed: bool) -> None:
    config = BrowserConfig(policy=ALLOW if allowed else DENY, navigation_timeout_s=5, action_timeout_s=5)
    host = BrowserHost(config)
    [navigate] = [t for t in browser_tools(config, host=host) if t.name == "browser_navigate"]
    ctx = ToolContext("ssrf")

    async def call(url: str) -> ToolOutput:
        return await navigate({"url": url}, ctx)

    try:
        outcomes = await run_table(call, canary, origin)
    finally:
        await ctx.aclose()
        await host.aclose()
    (assert_reached if allowed else assert_denied)("browser_navigate", outcomes, canary)
