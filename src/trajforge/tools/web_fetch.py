"""Fetching a URL for a model under a :class:`~trajforge.tools.netpolicy.NetPolicy`, with limits.

Shared by ``web_extract`` and the browser (which fulfils every request of its pages through a
fetcher, so the browser itself never connects anywhere). Redirects are followed here, one hop at
a time, so every hop is checked; the body is read up to a byte limit; the whole fetch (all hops
and the body) runs under one deadline. No proxy from the environment is used (a proxy would make
the address check meaningless).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import TracebackType
from urllib.parse import urljoin

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

from trajforge.tools.netpolicy import NetPolicy, NetPolicyError, PolicyResolver

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
    """One aiohttp session whose every connection goes through the policy's resolver.

    Use as ``async with SafeFetcher(policy) as f``; one instance belongs to one event loop.
    """

    def __init__(self, policy: NetPolicy, *, user_agent: str, max_redirects: int = 5) -> None:
        self.policy = policy
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
            connector = aiohttp.TCPConnector(resolver=PolicyResolver(self.policy), use_dns_cache=False)
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
        while True:
            try:
                self.policy.check_url(url)
                async with session.request(
                    method, url, headers=headers, data=data, allow_redirects=False, compress=None
                ) as resp:
                    location = resp.headers.get("Location")
                    if follow_redirects and resp.status in _REDIRECTS and location:
                        if len(redirects) >= self._max_redirects:
                            raise FetchError(f"{url}: more than {self._max_redirects} redirects")
                        redirects.append(url)
                        url = urljoin(url, location)
                        if resp.status == 303 or (resp.status in (301, 302) and method == "POST"):
                            method, data = "GET", None
                        continue
                    body = await _read_capped(resp, max_bytes, url)
                    return FetchResponse(
                        url=url,
                        status=resp.status,
                        headers=CIMultiDictProxy(CIMultiDict(resp.headers)),
                        body=body,
                        redirects=redirects,
                    )
            except NetPolicyError as exc:
                if redirects:
                    raise NetPolicyError(f"{exc} (reached by a redirect from {redirects[-1]})") from None
                raise
            except (aiohttp.ClientError, OSError) as exc:
                raise FetchError(f"could not fetch {url}: {exc or type(exc).__name__}") from None


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
