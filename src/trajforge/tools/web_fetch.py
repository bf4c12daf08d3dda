"""The one way the host fetches a URL for a model: :class:`SafeFetcher`, behind the URL gate.

Every host-side fetch a tool makes on a model's behalf goes through here: ``web_extract``, the
result and endpoint requests of ``web_search``, the image URLs of ``vision_analyze`` and
``image_generate`` (:mod:`~trajforge.tools.host_fetch`), and every request the browser's pages
make (its route fulfils them from a fetcher, so Chromium itself never connects anywhere). No
other module of the tools opens a connection (``tests/security/test_ssrf.py`` scans their
imports and calls); the only exceptions are the clients of endpoints the *operator* configured
(the vision, MoA and image-generation models), each listed there with why, so no tool can fetch
a model's URL without the gate.

What a fetch does: the URL goes through :meth:`NetPolicy.gate
<trajforge.tools.netpolicy.NetPolicy.gate>`, which parses it once into the
:class:`~trajforge.tools.netpolicy.Target` handed to aiohttp unchanged; the session's connector
resolves only that host and creates every socket through the policy's connect-time check
(:class:`~trajforge.tools.netpolicy.GatedConnector`). Redirects are followed here, one hop at a
time, each through the same gate (a hop to another origin keeps none of the caller's headers but
content negotiation: no key or cookie follows a redirect elsewhere); the body is read up to a
byte limit; the whole fetch (all hops and the body) runs under one deadline. No proxy from the
environment is used (a proxy would make the address check meaningless), no cookies are kept.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import TracebackType

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

from trajforge.tools.netpolicy import (
    ConnectRefused,
    GatedConnector,
    NetPolicy,
    NetPolicyError,
    Resolve,
    Target,
    join_location,
)

_REDIRECTS = frozenset({301, 302, 303, 307, 308})


class FetchError(Exception):
    """A fetch that did not produce a response the caller can use; the message is for the model."""


class TooLargeError(FetchError):
    """The body is larger than the byte limit."""


@dataclass
class FetchResponse:
    url: str  # the final URL, after redirects
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes
    redirects: list[str] = field(default_factory=list)

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()


class SafeFetcher:
    """One aiohttp session whose every request is gated and every connection checked.

    Use as ``async with SafeFetcher(policy, user_agent=...) as f``; one instance belongs to one
    event loop. ``resolve`` replaces the system resolver (tests map public-looking names onto
    loopback with it).
    """

    def __init__(
        self,
        policy: NetPolicy,
        *,
        user_agent: str,
        max_redirects: int = 5,
        resolve: Resolve | None = None,
    ) -> None:
        self.policy = policy
        self._gate = GatedConnector(policy, resolve)
        self._user_agent = user_agent
        self._max_redirects = max_redirects
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> SafeFetcher:
        self._open()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                resolver=self._gate.resolver,
                use_dns_cache=False,
                socket_factory=self._gate.socket_factory,
                happy_eyeballs_delay=None,  # one address at a time: a refusal keeps its reason
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                trust_env=False,
                headers={"User-Agent": self._user_agent},
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def preflight(self, url: str) -> Target:
        """Gate ``url`` and resolve it as a fetch would, without connecting: the answer to
        "would this be fetched?" (search results, a navigation's redirect). Raises
        :class:`NetPolicyError` (refused) or ``OSError`` (does not resolve)."""
        target = self.policy.gate(url)
        await self.policy.resolve_checked(target, self._gate.resolve)
        return target

    async def fetch(
        self,
        url: str,
        *,
        max_bytes: int,
        timeout_s: float,
        method: str = "GET",
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
        follow_redirects: bool = True,
    ) -> FetchResponse:
        """Fetch ``url``; raises :class:`NetPolicyError` (refused), :class:`TooLargeError`,
        :class:`FetchError` (network, timeout) -- each with a message a model can act on."""
        try:
            async with asyncio.timeout(timeout_s):
                return await self._fetch(url, max_bytes, method, headers, data, follow_redirects)
        except TimeoutError:
            raise FetchError(f"fetching {url} took longer than the {timeout_s:g}s allowed") from None

    async def _fetch(
        self,
        url: str,
        max_bytes: int,
        method: str,
        headers: dict[str, str] | None,
        data: bytes | None,
        follow_redirects: bool,
    ) -> FetchResponse:
        session = self._open()
        redirects: list[str] = []
        target = self.policy.gate(url)
        while True:
            shown = str(target.url)
            token = self._gate.hop(target)
            try:
                async with session.request(
                    method, target.url, headers=headers, data=data, allow_redirects=False, compress=None
                ) as resp:
                    location = resp.headers.get("Location")
                    if follow_redirects and resp.status in _REDIRECTS and location:
                        if len(redirects) >= self._max_redirects:
                            raise FetchError(f"{shown}: more than {self._max_redirects} redirects")
                        redirects.append(shown)
                        before = target
                        try:
                            target = self.policy.gate(join_location(target.url, location))
                        except NetPolicyError as exc:
                            raise NetPolicyError(f"{exc} (reached by a redirect from {shown})") from None
                        if headers and _origin(target) != _origin(before):
                            # the caller's credentials were for that origin (a search API key,
                            # a page's cookies): another origin gets none of them
                            headers = {k: v for k, v in headers.items() if k.lower() in _CROSS_ORIGIN_KEEP}
                        if resp.status == 303 or (resp.status in (301, 302) and method == "POST"):
                            method, data = "GET", None
                        continue
                    body = await _read_capped(resp, max_bytes, shown)
                    return FetchResponse(
                        url=shown,
                        status=resp.status,
                        headers=CIMultiDictProxy(CIMultiDict(resp.headers)),
                        body=body,
                        redirects=redirects,
                    )
            except (aiohttp.ClientError, OSError) as exc:
                refused = _refused_in(exc)
                if refused is not None:
                    where = f" (reached by a redirect from {redirects[-1]})" if redirects else ""
                    raise NetPolicyError(f"{refused}{where}") from None
                raise FetchError(f"could not fetch {shown}: {exc or type(exc).__name__}") from None
            finally:
                self._gate.done(token)


# What a redirect to another origin keeps of the caller's request headers.
_CROSS_ORIGIN_KEEP = frozenset(
    {"accept", "accept-language", "content-language", "content-type", "user-agent"}
)


def _origin(target: Target) -> tuple[str, str, int]:
    return (target.url.scheme, target.host, target.port)


def _refused_in(exc: BaseException) -> ConnectRefused | None:
    """The connect-time refusal behind an aiohttp error (it wraps the ``OSError`` it got)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ConnectRefused):
            return e
        todo += [getattr(e, "os_error", None), e.__cause__, e.__context__]
    return None


async def _read_capped(resp: aiohttp.ClientResponse, max_bytes: int, url: str) -> bytes:
    declared = resp.content_length
    if declared is not None and declared > max_bytes:
        raise TooLargeError(f"{url} is {declared} bytes, more than the {max_bytes} bytes allowed")
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > max_bytes:
            raise TooLargeError(f"{url} is larger than the {max_bytes} bytes allowed")
        chunks.append(chunk)
    return b"".join(chunks)
