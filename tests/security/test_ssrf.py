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

import ast
import asyncio
import contextlib
import ipaddress
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
from yarl import URL

from trajforge.tools.base import ToolContext, ToolOutput
from trajforge.tools.browser import BrowserConfig, BrowserHost, browser_tools, find_chromium
from trajforge.tools.host_fetch import policy_fetcher
from trajforge.tools.model_endpoint import ModelEndpoint
from trajforge.tools.netpolicy import IPAddress, NetPolicy, system_resolve
from trajforge.tools.vision import VisionConfig, vision_tools
from trajforge.tools.web import WebConfig, web_tools

sys.path.insert(0, str(Path(__file__).parents[1] / "site"))
from localsite import png  # noqa: E402

ORIGIN_IP = "127.0.0.2"
# What an operator runs: the "internet" (the origin) admitted, the machine's own loopback not.
DENY = NetPolicy(allow_cidrs=[f"{ORIGIN_IP}/32"])
# The control: loopback (and the unspecified addresses, which connect to it) explicitly allowed.
# Link-local stays denied even here: a cloud machine's 169.254.169.254 answers (this one's does),
# and a test must not send it requests, so the metadata rows are refused in both tables.
ALLOW = NetPolicy(allow_cidrs=["127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128"])


# Public-looking names that resolve to this machine (a hosts file an attacker's DNS would serve).
HOSTS: dict[str, list[str]] = {
    "intranet.example.com": ["127.0.0.1"],
    "rebind.example.com": [ORIGIN_IP, "127.0.0.1"],  # one admitted address (nothing listens), one not
    "mapped.example.com": ["::ffff:127.0.0.1"],
    "v6.example.com": ["::1"],
    "metadata.example.com": ["169.254.169.254"],
}


async def hosts_resolve(host: str, port: int) -> list[IPAddress]:
    """The test's resolver: :data:`HOSTS`, else the system's (``localhost`` and literals)."""
    if host in HOSTS:
        return [ipaddress.ip_address(a) for a in HOSTS[host]]
    return await system_resolve(host, port)


# -- the canary: the operator's loopback service ------------------------------------------------


@dataclass
class Canary:
    """Every connection accepted on 127.0.0.1:port and [::1]:port (TCP, with its first line),
    and every datagram sent to 127.0.0.1:port (UDP: WebRTC's STUN, say)."""

    port: int = 0
    hits: list[str] = field(default_factory=list)
    servers: list[asyncio.base_events.Server] = field(default_factory=list)
    udp: asyncio.DatagramTransport | None = None

    def close(self) -> None:
        for s in self.servers:
            s.close()
        if self.udp is not None:
            self.udp.close()

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


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, canary: Canary) -> None:
        self.canary = canary

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.canary.hits.append(f"UDP datagram of {len(data)} bytes from {addr[0]}")


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
        try:
            udp, _ = await asyncio.get_running_loop().create_datagram_endpoint(
                lambda: _Datagrams(canary), local_addr=("127.0.0.1", port)
            )
        except OSError:
            v4.close()
            v6.close()
            continue
        canary.port, canary.servers, canary.udp = port, [v4, v6], udp
        return canary
    raise RuntimeError("no port free on both 127.0.0.1 and ::1")


# -- the origin: a server on "the internet" the attacker controls --------------------------------


def _origin_app() -> web.Application:
    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": request.query["to"]})  # verbatim

    async def page(_: web.Request) -> web.Response:
        return web.Response(
            text="<html><title>origin</title><p>public page</p></html>", content_type="text/html"
        )

    async def attack(request: web.Request) -> web.Response:
        origin = f"http://{request.host}"
        return web.Response(text=attack_page(origin, int(request.query["port"])), content_type="text/html")

    async def csp(request: web.Request) -> web.Response:
        report = f"http://127.0.0.1:{int(request.query['port'])}/hit/v-csp-report"
        return web.Response(
            text="<!doctype html><p>csp</p><img src='/nothing.png'>",
            content_type="text/html",
            headers={"Content-Security-Policy": f"img-src 'none'; report-uri {report}"},
        )

    async def sw(request: web.Request) -> web.Response:
        return web.Response(text=_sw_js(int(request.query["port"])), content_type="text/javascript")

    app = web.Application()
    app.add_routes(
        [
            web.get("/redirect", redirect),
            web.get("/page", page),
            web.get("/attack", attack),
            web.get("/csp", csp),
            web.get("/sw.js", sw),
        ]
    )
    return app


def attack_page(origin: str, port: int) -> str:
    """Every way we know for a page to make Chromium send something to the canary: each vector
    asks for ``/hit/v-NAME`` (or sends UDP to its port)."""
    C = f"http://127.0.0.1:{port}"
    redirect = f"{origin}/redirect?to=" + quote(f"{C}/hit/v-img-redirect", safe="")
    return f"""<!doctype html><html><head><title>attack</title>
<link rel="stylesheet" href="{C}/hit/v-css">
<link rel="prefetch" href="{C}/hit/v-prefetch">
<link rel="preload" as="image" href="{C}/hit/v-preload">
<link rel="preconnect" href="{C}">
<link rel="dns-prefetch" href="//dns-prefetch-probe.example">
<link rel="icon" href="{C}/hit/v-favicon">
<script type="speculationrules">{{"prefetch":[{{"source":"list","urls":["{C}/hit/v-spec-prefetch"]}}],"prerender":[{{"source":"list","urls":["{C}/hit/v-spec-prerender"]}}]}}</script>
<style>body{{background:url({C}/hit/v-css-url)}} @font-face{{font-family:x;src:url({C}/hit/v-font)}} p{{font-family:x}}</style>
</head><body><p>attack</p>
<img src="{C}/hit/v-img">
<img src="http://①②⑦.⓪.⓪.①:{port}/hit/v-img-circled">
<img src="http://0x7f.1:{port}/hit/v-img-hex">
<img src="http://[::ffff:7f00:1]:{port}/hit/v-img-mapped">
<img src="http://[::1]:{port}/hit/v-img-v6">
<img src="{redirect}">
<iframe src="{C}/hit/v-iframe"></iframe>
<iframe src="{origin}/csp?port={port}"></iframe>
<iframe srcdoc="<meta http-equiv=refresh content='0;url={C}/hit/v-meta-refresh'>"></iframe>
<iframe name="f"></iframe>
<form id="form" target="f" method="post" action="{C}/hit/v-form"><input name="a" value="b"></form>
<video src="{C}/hit/v-video"></video>
<audio src="{C}/hit/v-audio"></audio>
<object data="{C}/hit/v-object"></object>
<embed src="{C}/hit/v-embed">
<a id="ping" href="#x" ping="{C}/hit/v-ping">ping</a>
<script>
const C = "{C}";
fetch(C + "/hit/v-fetch").catch(() => {{}});
fetch(C + "/hit/v-fetch-nocors", {{mode: "no-cors"}}).catch(() => {{}});
fetch(C + "/hit/v-fetch-keepalive", {{method: "POST", body: "x", keepalive: true}}).catch(() => {{}});
const x = new XMLHttpRequest(); x.open("GET", C + "/hit/v-xhr"); x.send();
navigator.sendBeacon(C + "/hit/v-beacon", "x");
try {{ new EventSource(C + "/hit/v-eventsource"); }} catch (e) {{}}
try {{ new WebSocket("ws://127.0.0.1:{port}/hit/v-ws"); }} catch (e) {{}}
const src = `fetch("${{C}}/hit/v-worker-fetch").catch(() => {{}}); try {{ new WebSocket("ws://127.0.0.1:{port}/hit/v-worker-ws"); }} catch (e) {{}}`;
try {{ new Worker(URL.createObjectURL(new Blob([src], {{type: "text/javascript"}}))); }} catch (e) {{}}
try {{ new SharedWorker(URL.createObjectURL(new Blob([`fetch("${{C}}/hit/v-sharedworker").catch(() => {{}})`], {{type: "text/javascript"}}))); }} catch (e) {{}}
if (navigator.serviceWorker) navigator.serviceWorker.register("/sw.js?port={port}").catch(() => {{}});
document.getElementById("form").submit();
document.getElementById("ping").click();
try {{ window.open(C + "/hit/v-window-open"); }} catch (e) {{}}
new Image().src = C + "/hit/v-image-js";
try {{
  const pc = new RTCPeerConnection({{iceServers: [{{urls: "stun:127.0.0.1:{port}"}}, {{urls: "turn:127.0.0.1:{port}?transport=tcp", username: "u", credential: "c"}}]}});
  pc.createDataChannel("x"); pc.createOffer().then(o => pc.setLocalDescription(o));
}} catch (e) {{}}
try {{
  const f = document.createElement("iframe"); document.body.appendChild(f);
  const P = f.contentWindow.RTCPeerConnection;
  const pc2 = new P({{iceServers: [{{urls: "stun:127.0.0.1:{port}"}}]}});
  pc2.createDataChannel("y"); pc2.createOffer().then(o => pc2.setLocalDescription(o));
}} catch (e) {{ console.log("iframe webrtc: " + e); }}
</script></body></html>"""


def _sw_js(port: int) -> str:
    return f"self.addEventListener('install', e => fetch('http://127.0.0.1:{port}/hit/v-service-worker'));"


@pytest.fixture
async def canary() -> AsyncIterator[Canary]:
    c = await start_canary()
    yield c
    c.close()


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
    refused: bool = True  # under the deny policy the policy refuses it (else it fails elsewhere)
    control_refused: bool = False  # refused by the loopback-allowing control too (link-local)


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
        refused=False,  # it names example.com, and fetches (here: fails to resolve) that
        why_not="a browser reads the host as example.com (a backslash ends the authority)",
    ),
    Row("tab-in-host", f"http://127.0.0\t.1:{P}/hit/tab-in-host"),
    # public-looking names whose DNS answers loopback (the resolver is the test's hosts table)
    Row("name-to-loopback", f"http://intranet.example.com:{P}/hit/name-to-loopback"),
    Row(
        "name-rebind",
        f"http://rebind.example.com:{P}/hit/name-rebind",
        refused=False,  # the admitted address is tried (and refuses the connection): never 127.0.0.1
    ),
    Row("name-to-mapped", f"http://mapped.example.com:{P}/hit/name-to-mapped"),
    Row("name-to-v6", f"http://v6.example.com:{P}/hit/name-to-v6"),
    Row("idn-name", f"http://ＩＮＴＲＡＮＥＴ．ｅｘａｍｐｌｅ．ｃｏｍ:{P}/hit/idn-name"),
    Row("name-trailing-dot", f"http://intranet.example.com.:{P}/hit/name-trailing-dot"),
    # redirects from the admitted origin
    Row("redirect", f"http://127.0.0.1:{P}/hit/redirect", redirect=True),
    Row("redirect-unicode", f"http://①②⑦.⓪.⓪.①:{P}/hit/redirect-unicode", redirect=True),
    Row("redirect-v6", f"http://[::ffff:7f00:1]:{P}/hit/redirect-v6", redirect=True),
    Row("redirect-decimal", f"http://2130706433:{P}/hit/redirect-decimal", redirect=True),
    Row("redirect-name", f"http://intranet.example.com:{P}/hit/redirect-name", redirect=True),
    Row("redirect-backslash", f"/\\127.0.0.1:{P}/hit/redirect-backslash", redirect=True),
    # the cloud metadata service
    Row(
        "metadata",
        "http://169.254.169.254/latest/meta-data/hit/metadata",
        reaches=False,
        control_refused=True,
        why_not="link-local stays denied in the control: a real metadata service is never touched",
    ),
    Row(
        "metadata-decimal",
        "http://2852039166/latest/meta-data/hit/metadata-decimal",
        reaches=False,
        control_refused=True,
        why_not="link-local stays denied in the control: a real metadata service is never touched",
    ),
    Row(
        "metadata-name",
        "http://metadata.example.com/latest/meta-data/hit/metadata-name",
        reaches=False,
        control_refused=True,
        why_not="link-local stays denied in the control: a real metadata service is never touched",
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
    wrong = [o.row.id for o in outcomes if o.hit or o.ok or (o.row.refused and "refused" not in o.text)]
    assert not wrong and not canary.hits, f"not refused: {wrong}; canary hits: {canary.hits}\n{table}"


def assert_reached(tool: str, outcomes: list[Outcome], canary: Canary) -> None:
    table = render(tool, "loopback allowed", outcomes)
    print(table)
    missed = [o.row.id for o in outcomes if o.row.reaches and not o.hit]
    stray = [
        o.row.id
        for o in outcomes
        if not o.row.reaches and (o.hit or ("refused" in o.text) != o.row.control_refused)
    ]
    assert not missed and not stray, f"did not reach the canary: {missed}; refused: {stray}\n{table}"


# -- the tools ------------------------------------------------------------------------------------


def extract_call(policy: NetPolicy) -> Call:
    tools = web_tools(WebConfig(policy=policy, timeout_s=5), resolve=hosts_resolve)
    [tool] = [t for t in tools if t.name == "web_extract"]

    async def call(url: str) -> ToolOutput:
        out = await tool({"urls": [url]}, ToolContext("ssrf"))
        if not out.ok:
            return out
        result = orjson.loads(out.content)["results"][0]
        return ToolOutput(content=orjson.dumps(result).decode(), ok="error" not in result)

    return call


def vision_call(policy: NetPolicy, model_url: str) -> Call:
    config = VisionConfig(endpoint=ModelEndpoint(base_url=model_url, model="scripted", max_retries=0))
    [tool] = vision_tools(config, policy_fetcher(policy, timeout_s=5, resolve=hosts_resolve))

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
    host = BrowserHost(config, resolve=hosts_resolve)
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


# -- what Chromium sends by itself ----------------------------------------------------------------

# Vectors the route never sees (Chromium's own sockets): they must reach nothing, whatever the
# policy says. The plain-Chromium control below shows each is live.
UNROUTED = {"v-ws", "v-worker-ws", "v-sharedworker", "v-service-worker", "udp"}
# Vectors the route fulfils: with loopback allowed they reach the canary through the gate.
ROUTED = {
    "v-img",
    "v-img-circled",
    "v-img-hex",
    "v-img-mapped",
    "v-img-v6",
    "v-img-redirect",
    "v-iframe",
    "v-fetch",
    "v-xhr",
    "v-beacon",
    "v-css",
    "v-form",
    "v-worker-fetch",
    "v-prefetch",
    "v-csp-report",
}


def vectors_hit(canary: Canary) -> set[str]:
    out = set()
    for h in canary.hits:
        if h.startswith("UDP"):
            out.add("udp")
        elif "/hit/v-" in h:
            out.add(h.split("/hit/", 1)[1].split()[0].split("?")[0])
        else:
            out.add("connection")  # a preconnect: a TCP connection and no request
    return out


@dataclass
class NetLog:
    """What Chromium's net-log says Chromium itself did."""

    tcp: list[str]  # every address it tried to connect a TCP socket to
    udp_sent: list[str]  # every address it sent a datagram to
    lookups: list[str]  # every host its resolver was asked for


def read_net_log(path: Path) -> NetLog:
    data = orjson.loads(path.read_bytes())
    names = {v: k for k, v in data["constants"]["logEventTypes"].items()}
    log = NetLog([], [], [])
    for event in data["events"]:
        kind, params = names.get(event["type"]), event.get("params") or {}
        if kind == "TCP_CONNECT_ATTEMPT" and "address" in params:
            log.tcp.append(params["address"])
        elif kind == "UDP_BYTES_SENT" and "address" in params:
            log.udp_sent.append(params["address"])
        elif kind == "HOST_RESOLVER_MANAGER_REQUEST" and "host" in params:
            log.lookups.append(params["host"])
    return log


async def settle(done: Callable[[], bool], *, patience_s: float = 30.0, grace_s: float = 2.0) -> None:
    """Wait until ``done()`` (the page's vectors have fired), then ``grace_s`` more for stragglers
    (beacons, ICE gathering, CSP reports); give up waiting after ``patience_s``: the assertions
    then say what did not happen. Never a timing assertion."""
    for _ in range(int(patience_s / 0.25)):
        if done():
            break
        await asyncio.sleep(0.25)
    await asyncio.sleep(grace_s)


async def open_attack(
    policy: NetPolicy, canary: Canary, origin: str, tmp_path: Path, *, isolate: bool
) -> tuple[BrowserHost, NetLog, str]:
    """The attack page through browser_navigate; returns the host, the net-log and the console.

    It waits until the routed vectors have each been answered (refused, or fetched), so the page
    has really run before anything is concluded from silence."""
    config = BrowserConfig(
        policy=policy,
        navigation_timeout_s=5,
        action_timeout_s=5,
        isolate_network=isolate,
        net_log_path=str(tmp_path / "netlog.json"),
    )
    host = BrowserHost(config, resolve=hosts_resolve)
    tools = {t.name: t for t in browser_tools(config, host=host)}
    ctx = ToolContext("ssrf")
    try:
        out = await tools["browser_navigate"]({"url": f"{origin}/attack?port={canary.port}"}, ctx)
        assert out.ok, out.content
        session = ctx.state["browser_session"]

        def answered() -> bool:
            said = " ".join(m["text"] for m in session.console)
            return all(f"/hit/{v}" in said for v in ROUTED) or vectors_hit(canary) >= ROUTED

        await settle(answered)
        console = (await tools["browser_console"]({}, ctx)).content
    finally:
        await ctx.aclose()
        await host.aclose()  # Chromium writes its net-log as it exits
    return host, read_net_log(tmp_path / "netlog.json"), console


@needs_chromium
async def test_the_attack_page_is_live_in_a_plain_chromium(canary: Canary, origin: str) -> None:
    """The control: without trajforge's browser around it, Chromium sends every vector."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=find_chromium(), chromium_sandbox=False)
        try:
            page = await (await browser.new_context()).new_page()
            await page.goto(f"{origin}/attack?port={canary.port}")
            await settle(lambda: vectors_hit(canary) >= ROUTED | UNROUTED)
        finally:
            await browser.close()
    hit = vectors_hit(canary)
    print(f"plain Chromium reached the canary by {len(hit)} vectors: {sorted(hit)}")
    assert hit >= UNROUTED | ROUTED, sorted((UNROUTED | ROUTED) - hit)


@needs_chromium
@pytest.mark.parametrize("isolate", [True, False], ids=["netns", "no-netns"])
async def test_nothing_chromium_sends_reaches_a_denied_address(
    canary: Canary, origin: str, tmp_path: Path, isolate: bool
) -> None:
    host, log, console = await open_attack(DENY, canary, origin, tmp_path, isolate=isolate)
    sink = f"127.0.0.1:{host.sink.port}"
    print(f"net-log: tcp {sorted(set(log.tcp))}, udp {log.udp_sent}, lookups {sorted(set(log.lookups))}")
    print(f"sink saw: {list(host.sink.escaped)}")
    assert canary.hits == []
    # Chromium itself connected to nothing but its proxy (the sink; in a netns, not even that),
    # sent no datagram, and asked its resolver for no name (an IP literal is no lookup).
    assert set(log.tcp) <= {sink}, log.tcp
    assert log.udp_sent == []
    assert all(_no_name(h) for h in log.lookups), log.lookups
    if isolate:
        assert not host.sink.escaped  # the sink is out of the namespace's reach
    for vector in ("v-img", "v-img-circled", "v-img-hex", "v-img-redirect", "v-fetch", "v-iframe"):
        assert f"/hit/{vector}" in console and "refused" in console  # the model is told


def _no_name(lookup: str) -> bool:
    host = URL(lookup).raw_host or ""
    return host == "~notfound" or _is_literal(host)


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@needs_chromium
async def test_with_loopback_allowed_only_the_route_reaches_the_canary(
    canary: Canary, origin: str, tmp_path: Path
) -> None:
    await open_attack(ALLOW, canary, origin, tmp_path, isolate=True)
    hit = vectors_hit(canary)
    print(f"through the gate, allowed: {sorted(hit)}")
    assert hit >= ROUTED, sorted(ROUTED - hit)  # the gate is what stops them under DENY
    assert not hit & UNROUTED, sorted(hit & UNROUTED)  # these have no way out at all


# -- one way out: no tool fetches except through the gate ------------------------------------------

SRC = Path(__file__).parents[2] / "src" / "trajforge"
# What opens connections: HTTP clients, sockets, browsers, and our own model clients.
NETWORK_MODULES = (
    "aiohttp",
    "httpx",
    "requests",
    "urllib3",
    "urllib.request",
    "http.client",
    "socket",
    "ssl",
    "websockets",
    "openai",
    "playwright",
    "pycurl",
    "ftplib",
    "smtplib",
    "xmlrpc.client",
    "trajforge.llm.openai_client",
    "trajforge.llm.completion_model",
    "trajforge.endpoint",
    "trajforge.serve.launcher",
)
NETWORK_CALLS = frozenset(
    {
        "open_connection",
        "create_connection",
        "sock_connect",
        "getaddrinfo",
        "ClientSession",
        "TCPConnector",
        "import_module",  # a module imported by name is not seen by the scan: none may be
        "__import__",
    }
)
# The only places allowed to: each with why it is not a way around the gate.
ALLOWED: dict[str, dict[str, str]] = {
    "tools/web_fetch.py": {
        "aiohttp": "SafeFetcher itself: the one session, its connector built from the gate",
        "ClientSession": "SafeFetcher's session",
        "TCPConnector": "SafeFetcher's connector (the gate's resolver and socket factory)",
    },
    "tools/netpolicy.py": {
        "aiohttp.abc": "the resolver's base class",
        "socket": "getaddrinfo for the gate's resolver; sockets made by the connect-time check",
        "getaddrinfo": "system_resolve: the one lookup of a gated name",
    },
    "tools/browser.py": {
        "playwright": "Chromium, in a network namespace of its own; the route fetches through SafeFetcher",
    },
    "tools/image_gen.py": {
        "openai": "the operator's image endpoint (tools.image_gen.base_url), never a model's URL",
        "trajforge.llm.openai_client": "a constant (the placeholder key)",
    },
    "tools/model_endpoint.py": {
        "trajforge.llm.openai_client": "the operator's model endpoints (vision, moa), never a model's URL",
    },
    "rl/runs/tools.py": {
        "trajforge.endpoint": "the embedded policy or a checkpoint it serves itself on loopback",
        "trajforge.serve.launcher": "that checkpoint's server, started by the tool itself",
    },
}


def _tool_modules() -> list[Path]:
    """Every module of the tools package, and every other module that defines model tools."""
    out = sorted((SRC / "tools").rglob("*.py"))
    for path in sorted(SRC.rglob("*.py")):
        if path not in out and "FunctionTool(" in path.read_text(encoding="utf-8"):
            out.append(path)
    return out


def _network_uses(path: Path) -> set[str]:
    """The network modules ``path`` imports (lazily too) and the connecting calls it names."""
    uses: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute) and node.attr in NETWORK_CALLS:
            uses.add(node.attr)
        elif isinstance(node, ast.Name) and node.id in NETWORK_CALLS:
            uses.add(node.id)
        for name in names:
            for mod in NETWORK_MODULES:
                if name == mod or name.startswith(mod + "."):
                    uses.add(mod if not name.startswith("aiohttp.abc") else "aiohttp.abc")
    return uses


def test_no_tool_reaches_the_network_except_through_the_gate() -> None:
    modules = _tool_modules()
    assert SRC / "rl" / "runs" / "tools.py" in modules  # tools defined outside the package are found too
    stray = {}
    for path in modules:
        rel = str(path.relative_to(SRC))
        extra = _network_uses(path) - set(ALLOWED.get(rel, {}))
        if extra:
            stray[rel] = sorted(extra)
    assert not stray, (
        f"these tool modules open connections without SafeFetcher: {stray}. Fetch through "
        "trajforge.tools.web_fetch.SafeFetcher (or host_fetch.policy_fetcher), or, for an endpoint "
        "the operator configured, add it to ALLOWED with why it is not a model's URL"
    )
    # and the table holds no stale excuse for the tools package
    for rel, allowed in ALLOWED.items():
        if not rel.startswith("tools/"):
            continue
        assert set(allowed) <= _network_uses(SRC / rel), (rel, set(allowed) - _network_uses(SRC / rel))


def test_the_scan_sees_a_fetch_around_the_gate(tmp_path: Path) -> None:
    """The scan above can fail: a tool that fetches by itself is caught, lazily imported or not."""
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text(
        "async def handler(args, ctx):\n"
        "    import httpx\n"
        "    from urllib.request import urlopen\n"
        "    from aiohttp import ClientSession\n"
        "    async with ClientSession() as s:\n"
        "        return await s.get(args['url'])\n"
        "def later():\n"
        "    return __import__('importlib').import_module('requests')\n"
    )
    assert _network_uses(sneaky) == {
        "httpx",
        "urllib.request",
        "aiohttp",
        "ClientSession",
        "import_module",
        "__import__",
    }
