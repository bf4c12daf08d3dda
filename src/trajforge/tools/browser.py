"""The browser toolset: Playwright driving the distribution's Chromium, one context per rollout.

Process model: one :class:`BrowserHost` (one Chromium process) per worker process, launched on
first use and shared by the rollouts' contexts; each rollout gets its own
:class:`BrowserSession` (a browser *context*: its own cookies, storage and pages), kept in
``ToolContext.state`` and closed through ``ToolContext.on_close`` when the rollout ends.

Network: the browser never connects anywhere by itself. Every request of its pages (documents,
subresources, form posts, workers' fetches, each redirect hop) is intercepted and fetched by the
host through a :class:`~trajforge.tools.web_fetch.SafeFetcher`, the same URL gate as every other
host fetch, under the configured :class:`~trajforge.tools.netpolicy.NetPolicy`, then fulfilled; a
refused one is aborted and recorded (the model sees the reason). The route sees Chromium's own
canonical URL, and the gate parses that again into what it fetches, so a spelling Chromium and
the gate read differently cannot name one host to the check and another to the connection.
What interception does not cover is closed apart. Chromium runs in a network namespace of its
own (``isolate_network``, bubblewrap ``--unshare-net``): Playwright drives it over pipes and the
route fulfils its pages from here, so it needs no network, and what it sends by itself (shared
workers' fetches, workers' WebSockets, preconnects, WebRTC's STUN datagrams, its updater) reaches
nothing. Inside, its proxy is a sink of ours on loopback (:class:`_ProxySink`, unreachable from
the namespace; when isolation is off, it records the request line and hangs up), with no bypass
(not even for loopback); its resolver is given no name; service workers are blocked, WebSockets
refused, WebRTC's constructors removed from every frame, HTTPS-upgrade fallbacks, prefetch and
network prediction off. ``tests/security/test_ssrf.py`` tries each way against a canary, with
Chromium's net-log as the witness, isolated and not.

Refs: ``browser_snapshot`` returns Playwright's accessibility snapshot in its "ai" mode, where
each element carries ``[ref=eN]``; the other tools take such a ref and resolve it through
Playwright's ``aria-ref=`` selector against the page's latest snapshot.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import html
import os
import re
import shlex
import shutil
import tempfile
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field
from yarl import URL

from trajforge.tools._args import ArgumentError, opt_bool, opt_str, req_str
from trajforge.tools.base import FunctionTool, Handler, ToolContext, ToolOutput
from trajforge.tools.netpolicy import NetPolicy, NetPolicyError, Resolve, join_location
from trajforge.tools.toolsets import TOOLSETS
from trajforge.tools.web_fetch import FetchError, SafeFetcher

if TYPE_CHECKING:
    from playwright.async_api import Browser, BrowserContext, Page, Playwright, Route

    from trajforge.llm.types import SamplingParams
    from trajforge.protocols import ChatModel

VisionAsk = Callable[[bytes, str], Awaitable[str]]
"""``(png_bytes, question) -> answer``: how ``browser_vision`` asks a vision model."""

_STATE_KEY = "browser_session"
_REF = re.compile(r"(f\d+)?e\d+")
_HOP_REQUEST = frozenset({"host", "content-length", "connection", "accept-encoding", "keep-alive", "te"})
_HOP_RESPONSE = frozenset(
    {"content-encoding", "content-length", "transfer-encoding", "connection", "keep-alive"}
)
_REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})
USER_AGENT_SUFFIX = "trajforge-browser"


def find_chromium() -> str | None:
    """The distribution's Chromium (Playwright's own download is never used here)."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserConfig(BaseModel):
    """Settings of the browser toolset."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    executable: str | None = Field(
        None, description="Chromium binary (default: `chromium` on PATH, from the distribution package)"
    )
    headless: bool = True
    chromium_sandbox: bool | None = Field(
        None,
        description="Chromium's own sandbox; None: on, except when running as root (where Chromium "
        "refuses to start with it)",
    )
    viewport_width: int = Field(1280, ge=200, le=4096)
    viewport_height: int = Field(900, ge=200, le=4096)
    navigation_timeout_s: float = Field(30.0, gt=0, allow_inf_nan=False)
    action_timeout_s: float = Field(10.0, gt=0, allow_inf_nan=False)
    max_resource_bytes: int = Field(20_000_000, ge=1024, description="largest response a page may load")
    max_snapshot_chars: int = Field(20_000, ge=500, description="most characters of a snapshot returned")
    max_console_messages: int = Field(200, ge=1)
    max_images: int = Field(100, ge=1)
    policy: NetPolicy = Field(default_factory=NetPolicy, description="where the pages may fetch from")
    isolate_network: bool = Field(
        True,
        description="run Chromium in a network namespace of its own (bubblewrap --unshare-net): "
        "whatever Chromium sends by itself (WebRTC, workers, prefetch, its updater) reaches no "
        "network at all; the route is its only way out. Needs bwrap, as the sandbox does",
    )
    net_log_path: str | None = Field(
        None,
        description="write Chromium's net-log here (every socket, lookup and request Chromium made "
        "itself, written when the browser closes): for auditing that nothing bypassed the policy",
    )

    def chromium_path(self) -> str | None:
        return self.executable or find_chromium()

    def unready(self) -> str | None:
        """Why the browser cannot run here, or None."""
        path = self.chromium_path()
        if path is None or not os.access(path, os.X_OK):
            return "chromium is not installed (apt-get install chromium; `make system-deps` does it)"
        if self.isolate_network and shutil.which("bwrap") is None:
            return (
                "bubblewrap (bwrap) is not installed, and the browser runs Chromium in a network "
                "namespace of its own (apt-get install bubblewrap; or set tools.browser.isolate_network: false)"
            )
        try:
            import playwright  # noqa: F401
        except ImportError:
            return "playwright is not installed (pip install 'trajforge[tools]')"
        return None


class _ProxySink:
    """Chromium's proxy: a loopback port that records the first line of whatever reaches it and
    hangs up. Every request the route fulfils never gets here; anything that escaped
    interception does, and goes no further (``escaped`` says what it was)."""

    def __init__(self, keep: int = 200) -> None:
        self.escaped: deque[str] = deque(maxlen=keep)
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        if self._server is None:
            self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
        except (TimeoutError, OSError):
            line = b""
        self.escaped.append(line[:300].decode(errors="replace").strip() or "(a connection, no request)")
        writer.close()

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()


class BrowserHost:
    """One Chromium process for the worker, launched on first use, shared by all contexts.

    Playwright objects belong to the event loop that made them: if called from a new loop (a new
    ``asyncio.run``), the host launches a new browser there.
    """

    def __init__(self, config: BrowserConfig, *, resolve: Resolve | None = None) -> None:
        self.config = config
        self.resolve = resolve  # the fetchers' resolver (None: the system's); tests inject names
        self.sink = _ProxySink()
        self._pw: Playwright | None = None
        self._browser: Browser | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._wrapper_dir: str | None = None

    async def browser(self) -> Browser:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._pw, self._browser, self._loop, self._lock = None, None, loop, asyncio.Lock()
            self.sink = _ProxySink()
        assert self._lock is not None
        async with self._lock:
            if self._browser is not None and self._browser.is_connected():
                return self._browser
            await self._stop()
            self._browser = await self._launch()
            return self._browser

    async def _launch(self) -> Browser:
        from playwright.async_api import async_playwright

        why = self.config.unready()
        if why is not None:
            raise RuntimeError(why)
        sandbox = self.config.chromium_sandbox
        if sandbox is None:
            sandbox = os.geteuid() != 0
        port = await self.sink.start()
        args = [
            # Nothing may leave except through the intercepting route: whatever bypasses it goes
            # to our sink (loopback not exempted), Chromium resolves no name itself, nothing is
            # prefetched or predicted, and WebRTC sends no UDP outside the proxy.
            f"--proxy-server=http://127.0.0.1:{port}",
            "--proxy-bypass-list=<-loopback>",
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
            "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-domain-reliability",
            "--disable-sync",
            "--no-pings",
            "--dns-prefetch-disable",
            # HttpsUpgrades: Chromium retries a failed https:// upgrade as http:// on a request
            # that the route never sees (it went to the proxy; caught by the SSRF test's sink).
            "--disable-features=NetworkPrediction,AutofillServerCommunication,OptimizationHints,"
            "HttpsUpgrades,HttpsFirstBalancedModeAutoEnable,HttpsFirstModeV2ForTypicallySecureUsers,"
            "PrivacySandboxSettings4,InterestFeedContentSuggestions,MediaRouter,OptimizationGuideModelDownloading,"
            "NetworkTimeServiceQuerying",
            "--disable-dev-shm-usage",
        ]
        if self.config.net_log_path is not None:
            args.append(f"--log-net-log={self.config.net_log_path}")
        executable = self.config.chromium_path()
        if self.config.isolate_network:
            executable = self._netns_wrapper(executable)
        self._pw = await async_playwright().start()
        return await self._pw.chromium.launch(
            executable_path=executable,
            headless=self.config.headless,
            chromium_sandbox=sandbox,
            args=args,
        )

    def _netns_wrapper(self, chromium: str | None) -> str:
        """A script that runs ``chromium`` in an empty network namespace (only its own loopback),
        with the filesystem as it is: Playwright talks to it over inherited pipes, and every
        request of its pages comes back to us through the route, so it needs no network."""
        assert chromium is not None
        if self._wrapper_dir is None:
            self._wrapper_dir = tempfile.mkdtemp(prefix="trajforge-chromium-")
        path = os.path.join(self._wrapper_dir, "chromium-netns")
        argv = [
            shutil.which("bwrap") or "bwrap",
            "--dev-bind",
            "/",
            "/",
            "--unshare-net",
            "--die-with-parent",
        ]
        script = f'#!/bin/sh\nexec {shlex.join(argv)} -- {shlex.quote(chromium)} "$@"\n'
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o700)
        with os.fdopen(fd, "w") as f:
            f.write(script)
        return path

    async def _stop(self) -> None:
        browser, pw = self._browser, self._pw
        self._browser, self._pw = None, None
        if browser is not None:
            with contextlib.suppress(Exception):  # already gone
                await browser.close()
        if pw is not None:
            await pw.stop()
        await self.sink.close()
        if self._wrapper_dir is not None:
            shutil.rmtree(self._wrapper_dir, ignore_errors=True)
            self._wrapper_dir = None

    async def aclose(self) -> None:
        """Close the browser (call at worker exit, on the loop that used it)."""
        if self._loop is asyncio.get_running_loop():
            await self._stop()


@dataclass
class BrowserSession:
    """One rollout's browser context, its current page, console and refused requests."""

    config: BrowserConfig
    context: BrowserContext
    fetcher: SafeFetcher
    page: Page
    console: deque[dict[str, str]] = field(default_factory=deque)
    refused: dict[str, str] = field(default_factory=dict)
    redirect_target: str | None = None

    @classmethod
    async def open(cls, host: BrowserHost) -> BrowserSession:
        cfg = host.config
        browser = await host.browser()
        context = await browser.new_context(
            viewport={"width": cfg.viewport_width, "height": cfg.viewport_height},
            service_workers="block",
            accept_downloads=False,
        )
        fetcher = SafeFetcher(cfg.policy, user_agent=USER_AGENT_SUFFIX, resolve=host.resolve)
        try:
            context.set_default_timeout(cfg.action_timeout_s * 1000)
            context.set_default_navigation_timeout(cfg.navigation_timeout_s * 1000)
            page = await context.new_page()
            session = cls(cfg, context, fetcher, page, deque(maxlen=cfg.max_console_messages))
            await context.add_init_script(_NO_WEBRTC)
            await context.route("**/*", session._route)
            await context.route_web_socket("**/*", session._refuse_websocket)
            context.on("page", session._adopt)
            session._watch(page)
        except BaseException:
            await context.close()
            await fetcher.aclose()
            raise
        return session

    async def fresh_page(self) -> None:
        """Replace the current page by a blank one of the same context (after a failed
        navigation, whose error page would otherwise interrupt the next one)."""
        old, self.page = self.page, await self.context.new_page()
        self._watch(self.page)
        with contextlib.suppress(Exception):
            await old.close()

    def _watch(self, page: Page) -> None:
        page.on("console", lambda m: self.console.append({"type": m.type, "text": m.text}))
        page.on("pageerror", lambda e: self.console.append({"type": "pageerror", "text": str(e)}))

    def _adopt(self, page: Page) -> None:
        """A popup or new tab becomes the current page."""
        self._watch(page)
        self.page = page

    async def _refuse_websocket(self, ws: Any) -> None:
        self.console.append({"type": "blocked", "text": f"WebSocket {ws.url} refused: not supported"})
        await ws.close()

    async def _route(self, route: Route) -> None:
        """Fetch one request of the pages through the policy-checked fetcher, or abort it."""
        try:
            await self._serve(route)
        except Exception as exc:  # page closed under us, a body Chromium rejects: never let it out
            self.console.append({"type": "network", "text": f"{route.request.url}: {_error_text(exc)}"})
            with contextlib.suppress(Exception):
                await route.abort("failed")

    async def _serve(self, route: Route) -> None:
        request = route.request
        url = request.url
        if not url.lower().startswith(("http://", "https://")):
            self._note_refusal(url, f"refused {url[:100]!r}: only http and https may be loaded")
            await route.abort("blockedbyclient")
            return
        headers = {k: v for k, v in (await request.all_headers()).items() if k.lower() not in _HOP_REQUEST}
        headers = {k: v for k, v in headers.items() if not k.startswith(":")}
        navigation = request.is_navigation_request()
        try:
            resp = await self.fetcher.fetch(
                url,
                method=request.method,
                headers=headers,
                data=request.post_data_buffer,
                max_bytes=self.config.max_resource_bytes,
                timeout_s=self.config.navigation_timeout_s,
                # Chromium follows a *fulfilled* redirect with its own network stack, out of the
                # route's reach: subresources follow them here (each hop checked), navigations
                # get a page that moves on to the (checked) target, which comes back here.
                follow_redirects=not navigation,
            )
            location = resp.headers.get("Location")
            if navigation and resp.status in _REDIRECT_CODES and location:
                try:
                    target = await self.fetcher.preflight(join_location(resp.url, location))
                except NetPolicyError as exc:
                    raise NetPolicyError(f"{exc} (reached by a redirect from {url})") from None
                self.redirect_target = str(target.url)
                await route.fulfill(
                    status=200, headers={"content-type": "text/html"}, body=_moving_page(self.redirect_target)
                )
                return
        except NetPolicyError as exc:
            self._note_refusal(url, str(exc))
            await route.abort("blockedbyclient")
            return
        except (FetchError, OSError) as exc:
            self.console.append({"type": "network", "text": str(exc)})
            await route.abort("failed")
            return
        out: dict[str, str] = {}
        for key, value in resp.headers.items():
            low = key.lower()
            if low in _HOP_RESPONSE:
                continue
            out[low] = f"{out[low]}\n{value}" if low in out and low == "set-cookie" else value
        await route.fulfill(status=resp.status, headers=out, body=resp.body)

    def _note_refusal(self, url: str, why: str) -> None:
        self.refused[url] = why
        self.console.append({"type": "blocked", "text": why})

    async def snapshot(self) -> str:
        text: str = await self.page.locator("body").aria_snapshot(mode="ai")
        limit = self.config.max_snapshot_chars
        if len(text) > limit:
            text = (
                text[:limit]
                + f"\n... (snapshot cut at {limit} of {len(text)} characters; scroll or read parts)"
            )
        return text

    async def describe(self, *, with_snapshot: bool = True) -> str:
        """The current page for the model: title, URL, and (usually) the snapshot with refs."""
        title = await self.page.title()
        head = f"Page: {title}\nURL: {self.page.url}"
        if not with_snapshot:
            return head
        return (
            f"{head}\nSnapshot (pass a [ref=...] to browser_click / browser_type):\n{await self.snapshot()}"
        )

    async def settle(self) -> None:
        """Wait (up to the navigation timeout) for a navigation an action started, through any
        redirects, to reach its page."""
        timeout_ms = self.config.navigation_timeout_s * 1000
        if self.redirect_target is not None:
            with contextlib.suppress(Exception):  # refused or failed on the way: described as it is
                await self.page.wait_for_url(
                    lambda u: self.redirect_target is None or _same_url(u, self.redirect_target),
                    wait_until="domcontentloaded",
                    timeout=timeout_ms,
                )
            self.redirect_target = None
        with contextlib.suppress(Exception):  # a slow page still gets described as it is
            await self.page.wait_for_load_state("domcontentloaded", timeout=timeout_ms)

    async def aclose(self) -> None:
        try:
            await self.context.close()
        finally:
            await self.fetcher.aclose()


# WebRTC sends STUN/TURN datagrams from Chromium's own sockets, to any address a page names,
# outside the route (and, on this Chromium, despite --force-webrtc-ip-handling-policy): a page
# gets no peer connection. The network namespace is what closes it; this is for a browser run
# without one (isolate_network: false), in every frame before any page script.
_NO_WEBRTC = """(() => {
  for (const name of ["RTCPeerConnection", "webkitRTCPeerConnection", "RTCDataChannel",
                      "RTCRtpSender", "RTCRtpReceiver", "RTCIceCandidate", "RTCSessionDescription"]) {
    try { Object.defineProperty(globalThis, name, {value: undefined, writable: false, configurable: false}); }
    catch (e) {}
  }
})();"""


def _moving_page(target: str) -> bytes:
    """The stand-in for a navigation's redirect: it replaces itself (no history entry) by the
    target, whose request comes back through the route."""
    js = orjson.dumps(target).decode().replace("<", "\\u003c")
    attr = html.escape(target, quote=True)
    return (
        f'<!doctype html><meta http-equiv="refresh" content="0;url={attr}">'
        f"<script>location.replace({js})</script>"
    ).encode()


def _same_url(a: str, b: str) -> bool:
    return URL(a).with_fragment(None) == URL(b).with_fragment(None)


def chat_model_vision(model: ChatModel, sampling: SamplingParams | None = None) -> VisionAsk:
    """A :data:`VisionAsk` over any OpenAI-compatible multimodal :class:`ChatModel`: the screenshot
    goes inline as a ``data:`` URL in an ``image_url`` part."""

    async def ask(png: bytes, question: str) -> str:
        from trajforge.llm.types import SamplingParams

        url = "data:image/png;base64," + base64.b64encode(png).decode()
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": question},
                    {"type": "image_url", "image_url": {"url": url}},
                ],
            }
        ]
        turn = await model.complete(messages, None, sampling or SamplingParams())
        return (turn.content or "").strip()

    return ask


def _ref(args: dict[str, Any]) -> str:
    ref = req_str(args, "ref").strip().strip("[]").removeprefix("ref=")
    if not _REF.fullmatch(ref):
        raise ArgumentError(
            f"argument 'ref' must be an element ref from browser_snapshot such as 'e12'; got {ref!r}"
        )
    return ref


async def _element(s: BrowserSession, ref: str) -> Any:
    """The element ``ref`` names in the page's latest snapshot (an unknown ref fails at once,
    instead of after the action timeout)."""
    locator = s.page.locator(f"aria-ref={ref}")
    try:
        found = await locator.count()
    except Exception:
        found = 0
    if not found:
        raise ArgumentError(f"no element with ref {ref!r} on this page; take a new browser_snapshot")
    return locator


def _error_text(exc: Exception) -> str:
    return str(exc).split("\n", 1)[0][:500]


class _BrowserTools:
    """The handlers, sharing one host; each call finds its rollout's session in ``ctx.state``."""

    def __init__(self, host: BrowserHost, vision: VisionAsk | None) -> None:
        self.host = host
        self.ask_vision = vision

    async def session(self, ctx: ToolContext) -> BrowserSession:
        session: BrowserSession | None = ctx.state.get(_STATE_KEY)
        if session is None or session.context.browser is None or not session.context.browser.is_connected():
            session = await BrowserSession.open(self.host)
            ctx.state[_STATE_KEY] = session
            ctx.on_close(session.aclose)
        return session

    def handler(self, body: Callable[[BrowserSession, dict[str, Any]], Awaitable[ToolOutput]]) -> Handler:
        async def run(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
            try:
                session = await self.session(ctx)
            except Exception as exc:
                return ToolOutput.failure(f"the browser could not start: {_error_text(exc)}")
            try:
                return await body(session, args)
            except ArgumentError as exc:
                return ToolOutput.failure(str(exc))
            except Exception as exc:  # Playwright errors: timeouts, detached elements, stale refs
                text = _error_text(exc)
                if "aria-ref" in text or "not found" in text.lower():
                    text += " (the ref may be stale: take a new browser_snapshot)"
                return ToolOutput.failure(text)

        return run

    async def navigate(self, s: BrowserSession, args: dict[str, Any]) -> ToolOutput:
        url = req_str(args, "url").strip()
        if not re.match(r"^https?://", url, re.IGNORECASE):
            if "://" in url or url.lower().startswith(("file:", "data:", "javascript:", "chrome:", "about:")):
                return ToolOutput.failure(f"only http and https URLs may be opened, not {url[:100]!r}")
            url = "https://" + url
        try:  # the route gates every request again; this is for a clear answer up front
            url = str(s.config.policy.gate(url).url)
        except NetPolicyError as exc:
            return ToolOutput.failure(str(exc))
        try:
            resp = await s.page.goto(url, wait_until="domcontentloaded")
        except Exception as exc:
            if s.redirect_target is not None:  # interrupted by the redirect's own navigation
                await s.settle()
                return ToolOutput(content=await s.describe())
            await s.fresh_page()  # Chromium's error page keeps navigating behind us
            why = s.refused.get(url)
            if why is None and "ERR_BLOCKED_BY_CLIENT" in str(exc) and s.refused:
                why = list(s.refused.values())[-1]  # a redirect hop was refused
            return ToolOutput.failure(why or f"could not open {url}: {_error_text(exc)}")
        await s.settle()
        status = f"\nHTTP status: {resp.status}" if resp is not None and resp.status >= 400 else ""
        return ToolOutput(content=await s.describe() + status)

    async def snapshot(self, s: BrowserSession, args: dict[str, Any]) -> ToolOutput:
        return ToolOutput(content=await s.describe())

    async def click(self, s: BrowserSession, args: dict[str, Any]) -> ToolOutput:
        ref = _ref(args)
        await (await _element(s, ref)).click()
        await s.settle()
        return ToolOutput(content=f"Clicked {ref}.\n" + await s.describe())

    async def type(self, s: BrowserSession, args: dict[str, Any]) -> ToolOutput:
        ref = _ref(args)
        text = req_str(args, "text")
        submit = opt_bool(args, "submit")
        target = await _element(s, ref)
        await target.fill(text)
        if not submit:
            return ToolOutput(content=f"Typed {len(text)} characters into {ref}.")
        await target.press("Enter")
        await s.settle()
        return ToolOutput(content=f"Typed into {ref} and pressed Enter.\n" + await s.describe())

    async def scroll(self, s: BrowserSession, args: dict[str, Any]) -> ToolOutput:
        direction = (opt_str(args, "direction", "down") or "down").lower()
        if direction not in ("up", "down"):
            raise ArgumentError(f"argument 'direction' must be 'up' or 'down'; got {direction!r}")
        step = int(s.config.viewport_height * 0.8) * (1 if direction == "down" else -1)
        pos = await s.page.evaluate(
            "dy => { window.scrollBy(0, dy); return [Math.round(window.scrollY), "
            "Math.max(0, document.documentElement.scrollHeight - window.innerHeight)]; }",
            step,
        )
        return ToolOutput(content=f"Scrolled {direction}; now at {pos[0]} of {pos[1]} pixels.")

    async def back(self, s: BrowserSession, args: dict[str, Any]) -> ToolOutput:
        resp = await s.page.go_back(wait_until="domcontentloaded")
        if resp is None and s.page.url in ("about:blank", ""):
            return ToolOutput.failure("there is no previous page")
        return ToolOutput(content=await s.describe())

    async def press(self, s: BrowserSession, args: dict[str, Any]) -> ToolOutput:
        key = req_str(args, "key").strip()
        if not key or len(key) > 40:
            raise ArgumentError("argument 'key' must be a key name such as 'Enter', 'Tab' or 'Control+a'")
        await s.page.keyboard.press(key)
        await s.settle()
        return ToolOutput(content=f"Pressed {key}.\n" + await s.describe(with_snapshot=False))

    async def get_images(self, s: BrowserSession, args: dict[str, Any]) -> ToolOutput:
        images = await s.page.evaluate(
            "n => Array.from(document.images).slice(0, n).map(i => ({src: i.currentSrc || i.src, "
            "alt: i.alt, width: i.naturalWidth, height: i.naturalHeight}))",
            s.config.max_images,
        )
        return ToolOutput(content=orjson.dumps({"url": s.page.url, "images": images}).decode())

    async def vision(self, s: BrowserSession, args: dict[str, Any]) -> ToolOutput:
        question = req_str(args, "question")
        if self.ask_vision is None:
            return ToolOutput.failure(
                "browser_vision needs a vision model and none is configured (tools.vision); "
                "use browser_snapshot to read the page as text"
            )
        png = await s.page.screenshot(type="png")
        try:
            answer = await self.ask_vision(png, question)
        except Exception as exc:
            return ToolOutput.failure(f"the vision model failed: {_error_text(exc)}")
        return ToolOutput(content=answer)

    async def console(self, s: BrowserSession, args: dict[str, Any]) -> ToolOutput:
        messages = list(s.console)
        if opt_bool(args, "clear"):
            s.console.clear()
        return ToolOutput(content=orjson.dumps({"messages": messages}).decode())


def _schema(required: list[str], **props: tuple[str, str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": kind, "description": desc} for name, (kind, desc) in props.items()},
        "required": required,
    }


def browser_tools(
    config: BrowserConfig, *, host: BrowserHost | None = None, vision: VisionAsk | None = None
) -> list[FunctionTool]:
    """The ten browser tools over ``host`` (one per worker; made here if not given).

    ``vision`` answers ``browser_vision`` (see :func:`chat_model_vision`); without it that tool
    returns a clear error. Tools are not parallel-safe: a rollout's calls share one page.
    """
    t = _BrowserTools(host or BrowserHost(config), vision)
    ref = ("string", "Element ref from browser_snapshot, e.g. e12.")
    specs: list[tuple[str, str, dict[str, Any], Any]] = [
        (
            "browser_navigate",
            "Open a URL in the browser; returns the page title, URL and an accessibility snapshot with refs.",
            _schema(["url"], url=("string", "http(s) address to open.")),
            t.navigate,
        ),
        (
            "browser_snapshot",
            "Return the current page's accessibility snapshot with element refs.",
            _schema([]),
            t.snapshot,
        ),
        ("browser_click", "Click the element with this ref.", _schema(["ref"], ref=ref), t.click),
        (
            "browser_type",
            "Type text into the input with this ref (replacing its content); submit=true presses Enter.",
            _schema(
                ["ref", "text"],
                ref=ref,
                text=("string", "Text to type."),
                submit=("boolean", "Press Enter afterwards."),
            ),
            t.type,
        ),
        (
            "browser_scroll",
            "Scroll the page.",
            _schema(["direction"], direction=("string", "up or down.")),
            t.scroll,
        ),
        ("browser_back", "Go back to the previous page.", _schema([]), t.back),
        (
            "browser_press",
            "Press a key (e.g. Enter, Tab, Escape, ArrowDown).",
            _schema(["key"], key=("string", "Key name.")),
            t.press,
        ),
        (
            "browser_get_images",
            "List the images of the page: URL, alt text, size.",
            _schema([]),
            t.get_images,
        ),
        (
            "browser_vision",
            "Ask a question about a screenshot of the current page (layout, charts, pictures).",
            _schema(["question"], question=("string", "What you want to know.")),
            t.vision,
        ),
        (
            "browser_console",
            "Read the page's console messages, script errors and refused requests.",
            _schema([], clear=("boolean", "Clear the messages after reading.")),
            t.console,
        ),
    ]
    assert tuple(name for name, *_ in specs) == TOOLSETS["browser"]
    return [
        FunctionTool(
            name=name,
            toolset="browser",
            description=desc,
            parameters=schema,
            handler=t.handler(body),
            parallel_safe=False,
        )
        for name, desc, schema, body in specs
    ]
