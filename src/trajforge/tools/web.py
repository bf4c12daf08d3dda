"""The web toolset: ``web_search`` (pluggable providers) and ``web_extract`` (pages to markdown).

Both run in the host process (the sandbox has no network). Every URL a model or a search result
names is fetched through :class:`~trajforge.tools.web_fetch.SafeFetcher` under the configured
:class:`~trajforge.tools.netpolicy.NetPolicy`, so neither can reach the operator's own network.
The search endpoint itself is the operator's choice (a SearXNG on the intranet is normal): it is
fetched through the same fetcher with its own host admitted (:meth:`NetPolicy.trusting`), so a
redirect it answers is checked like any other; the results it returns are held to the policy.

Providers: ``searxng`` (its JSON API, ``format=json`` enabled on the instance), ``brave`` (Brave
Search API) and ``tavily`` (Tavily Search API). The hosted ones read their key from the
environment variable named in the config, at call time; it never appears in a result or an error.
"""

from __future__ import annotations

import asyncio
import functools
import io
import os
import re
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, HttpUrl, model_validator
from yarl import URL

from trajforge.tools._args import ArgumentError, req_str
from trajforge.tools.base import FunctionTool, ToolContext, ToolOutput
from trajforge.tools.netpolicy import NetPolicy, NetPolicyError, Resolve
from trajforge.tools.toolsets import TOOLSETS
from trajforge.tools.web_fetch import FetchError, FetchResponse, SafeFetcher

Provider = Literal["searxng", "brave", "tavily"]

DEFAULT_ENDPOINTS: dict[str, str] = {
    "brave": "https://api.search.brave.com/res/v1/web/search",
    "tavily": "https://api.tavily.com/search",
}
DEFAULT_KEY_ENVS: dict[str, str] = {"brave": "BRAVE_API_KEY", "tavily": "TAVILY_API_KEY"}
USER_AGENT = "Mozilla/5.0 (compatible; trajforge-web/0.1)"


class WebConfig(BaseModel):
    """Settings of the web toolset. Without a ``provider`` only ``web_extract`` is offered."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    provider: Provider | None = Field(None, description="search backend: searxng, brave or tavily")
    endpoint: HttpUrl | None = Field(
        None,
        description="search API URL: a SearXNG base URL (required for searxng), or an override of "
        "the hosted API's URL",
    )
    api_key_env: str | None = Field(
        None,
        description="environment variable holding the hosted API's key (brave: BRAVE_API_KEY, "
        "tavily: TAVILY_API_KEY by default)",
    )
    max_results: int = Field(8, ge=1, le=50, description="most search results returned")
    max_urls: int = Field(5, ge=1, le=50, description="most URLs one web_extract call may fetch")
    max_bytes: int = Field(5_000_000, ge=1024, description="largest body fetched per URL (bytes)")
    max_chars: int = Field(20_000, ge=100, description="most characters of text returned per URL")
    timeout_s: float = Field(20.0, gt=0, allow_inf_nan=False, description="deadline per URL / search")
    max_redirects: int = Field(5, ge=0, le=20)
    policy: NetPolicy = Field(default_factory=NetPolicy, description="where fetches may go")

    @model_validator(mode="after")
    def _complete(self) -> WebConfig:
        if self.provider == "searxng" and self.endpoint is None:
            raise ValueError("provider 'searxng' needs endpoint: the base URL of your SearXNG instance")
        if self.api_key_env is not None and not self.api_key_env.replace("_", "").isalnum():
            raise ValueError(
                f"api_key_env must be the *name* of an environment variable (letters, digits, _), "
                f"not {self.api_key_env!r}; never put the key itself in the config"
            )
        return self

    @property
    def search_url(self) -> str | None:
        if self.provider is None:
            return None
        if self.endpoint is not None:
            base = str(self.endpoint)
            return base.rstrip("/") + "/search" if self.provider == "searxng" else base
        return DEFAULT_ENDPOINTS[self.provider]

    @property
    def key_env(self) -> str | None:
        if self.provider in DEFAULT_KEY_ENVS:
            return self.api_key_env or DEFAULT_KEY_ENVS[self.provider]
        return self.api_key_env

    def search_unready(self) -> str | None:
        """Why ``web_search`` cannot run here (no provider, key variable unset), or None."""
        if self.provider is None:
            return "no search provider configured (tools.web.provider)"
        if self.provider in DEFAULT_KEY_ENVS and not os.environ.get(self.key_env or ""):
            return f"the {self.provider} API key variable {self.key_env} is not set"
        return None


class SearchResult(BaseModel):
    title: str
    url: str
    snippet: str = ""


class SearchError(Exception):
    """The search backend failed; the message never contains the key."""


# ---------------------------------------------------------------------------------------------
# search providers: (config, query, key) -> results


async def _provider_request(
    cfg: WebConfig,
    method: str,
    url: str,
    *,
    resolve: Resolve | None,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    json: Any = None,
) -> Any:
    """One request to the search API, through the same fetcher as everything else: the
    operator's endpoint is admitted by name (:meth:`NetPolicy.trusting`), its redirects are not."""
    if params:
        url = str(URL(url).update_query(params))
    body = None
    if json is not None:
        body = orjson.dumps(json)
        headers = {**(headers or {}), "Content-Type": "application/json"}
    policy = cfg.policy.trusting(url)
    try:
        async with SafeFetcher(
            policy, user_agent=USER_AGENT, max_redirects=cfg.max_redirects, resolve=resolve
        ) as f:
            resp = await f.fetch(
                url,
                method=method,
                headers=headers,
                data=body,
                max_bytes=cfg.max_bytes,
                timeout_s=cfg.timeout_s,
            )
    except NetPolicyError as exc:
        raise SearchError(f"the search API was refused by the network policy: {_keyless(exc)}") from None
    except FetchError as exc:
        raise SearchError(f"the search API failed: {_keyless(exc)}") from None
    if resp.status != 200:
        raise SearchError(f"the search API answered HTTP {resp.status}")
    try:
        return orjson.loads(resp.body)
    except orjson.JSONDecodeError:
        raise SearchError("the search API did not answer JSON") from None


def _keyless(exc: Exception) -> str:
    """An error about the search API without what a URL may carry besides its place: userinfo
    and the query (the search terms, and for some self-hosted endpoints a token)."""
    text = re.sub(r"//[^/@\s']*@", "//", str(exc))
    return re.sub(r"\?[^\s']*", "?...", text)


async def _searxng(
    cfg: WebConfig, query: str, key: str | None, resolve: Resolve | None
) -> list[SearchResult]:
    assert cfg.search_url is not None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = await _provider_request(
        cfg, "GET", cfg.search_url, resolve=resolve, params={"q": query, "format": "json"}, headers=headers
    )
    items = data.get("results", []) if isinstance(data, dict) else []
    return [
        SearchResult(title=str(i.get("title", "")), url=str(i["url"]), snippet=str(i.get("content") or ""))
        for i in items
        if isinstance(i, dict) and i.get("url")
    ]


async def _brave(cfg: WebConfig, query: str, key: str | None, resolve: Resolve | None) -> list[SearchResult]:
    assert cfg.search_url is not None
    data = await _provider_request(
        cfg,
        "GET",
        cfg.search_url,
        resolve=resolve,
        params={"q": query, "count": str(min(cfg.max_results, 20))},
        headers={"X-Subscription-Token": key or "", "Accept": "application/json"},
    )
    web = data.get("web", {}) if isinstance(data, dict) else {}
    items = web.get("results", []) if isinstance(web, dict) else []
    return [
        SearchResult(
            title=str(i.get("title", "")), url=str(i["url"]), snippet=str(i.get("description") or "")
        )
        for i in items
        if isinstance(i, dict) and i.get("url")
    ]


async def _tavily(cfg: WebConfig, query: str, key: str | None, resolve: Resolve | None) -> list[SearchResult]:
    assert cfg.search_url is not None
    data = await _provider_request(
        cfg,
        "POST",
        cfg.search_url,
        resolve=resolve,
        json={"query": query, "max_results": cfg.max_results},
        headers={"Authorization": f"Bearer {key or ''}"},
    )
    items = data.get("results", []) if isinstance(data, dict) else []
    return [
        SearchResult(title=str(i.get("title", "")), url=str(i["url"]), snippet=str(i.get("content") or ""))
        for i in items
        if isinstance(i, dict) and i.get("url")
    ]


_PROVIDERS: dict[
    str, Callable[[WebConfig, str, str | None, Resolve | None], Awaitable[list[SearchResult]]]
] = {
    "searxng": _searxng,
    "brave": _brave,
    "tavily": _tavily,
}


async def _refusal(fetcher: SafeFetcher, url: str) -> str | None:
    """Why the gate refuses a result's URL, or None (an unresolvable host is not a refusal)."""
    try:
        async with asyncio.timeout(5):
            await fetcher.preflight(url)
    except NetPolicyError as exc:
        return str(exc)
    except (OSError, TimeoutError):
        return None
    return None


async def search(cfg: WebConfig, query: str, *, resolve: Resolve | None = None) -> dict[str, Any]:
    """Results of ``query``, those pointing at refused addresses listed apart with the reason."""
    if cfg.provider is None:
        raise SearchError("no search provider is configured")
    key = os.environ.get(cfg.key_env) if cfg.key_env else None
    if cfg.provider in DEFAULT_KEY_ENVS and not key:
        raise SearchError(f"the {cfg.provider} API key variable {cfg.key_env} is not set")
    results = (await _PROVIDERS[cfg.provider](cfg, query, key, resolve))[: cfg.max_results]
    async with SafeFetcher(cfg.policy, user_agent=USER_AGENT, resolve=resolve) as fetcher:
        refusals = await asyncio.gather(*(_refusal(fetcher, r.url) for r in results))
    kept = [r.model_dump() for r, why in zip(results, refusals, strict=True) if why is None]
    out: dict[str, Any] = {"query": query, "results": kept}
    refused = [{"url": r.url, "error": why} for r, why in zip(results, refusals, strict=True) if why]
    if refused:
        out["refused"] = refused
    return out


# ---------------------------------------------------------------------------------------------
# extraction


@functools.cache
def _trafilatura_config() -> Any:
    """trafilatura's settings with a small minimum size: by default it gives up on pages under 250
    characters of main text, which are common (a short answer page) and still worth reading."""
    from trafilatura.settings import use_config

    config = use_config()
    config.set("DEFAULT", "MIN_EXTRACTED_SIZE", "20")
    return config


def _html_to_markdown(html: bytes, url: str) -> tuple[str | None, str]:
    """(title, markdown) of an HTML page: trafilatura's main-content extraction, with a plain
    full-text fallback for pages too small or too odd for it."""
    import trafilatura

    text = trafilatura.extract(
        html,
        url=url,
        output_format="markdown",
        include_links=True,
        include_tables=True,
        include_comments=False,
        favor_recall=True,
        config=_trafilatura_config(),
    )
    meta = trafilatura.extract_metadata(html)
    title = meta.title if meta is not None else None
    if not text:
        text = trafilatura.html2txt(html) or ""
    return title, text


def _pdf_to_text(data: bytes) -> tuple[str | None, str]:
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    title = reader.metadata.title if reader.metadata is not None else None
    pages = [page.extract_text() or "" for page in reader.pages]
    return title, "\n\n".join(p.strip() for p in pages if p.strip())


def _convert(resp: FetchResponse) -> tuple[str | None, str, str]:
    """(title, text, kind) of a fetched body; raises FetchError for what cannot be read as text."""
    ctype = resp.content_type
    head = resp.body[:1024].lstrip()
    if ctype == "application/pdf" or head.startswith(b"%PDF-"):
        try:
            title, text = _pdf_to_text(resp.body)
        except Exception as exc:
            raise FetchError(f"{resp.url} is a PDF that could not be read: {exc}") from None
        return title, text, "pdf"
    if ctype in ("text/html", "application/xhtml+xml") or head[:15].lower().startswith(
        (b"<!doctype", b"<html")
    ):
        title, text = _html_to_markdown(resp.body, resp.url)
        return title, text, "html"
    if ctype.startswith("text/") or ctype in ("application/json", "application/xml", ""):
        return None, resp.body.decode(errors="replace"), "text"
    raise FetchError(f"{resp.url} is {ctype}, which web_extract cannot turn into text")


async def extract_one(cfg: WebConfig, fetcher: SafeFetcher, url: str) -> dict[str, Any]:
    """One URL's result: title, final URL and markdown, or its error."""
    try:
        resp = await fetcher.fetch(url, max_bytes=cfg.max_bytes, timeout_s=cfg.timeout_s)
        if resp.status >= 400:
            return {"url": url, "final_url": resp.url, "error": f"HTTP {resp.status}"}
        title, text, kind = await asyncio.to_thread(_convert, resp)
    except (NetPolicyError, FetchError) as exc:
        return {"url": url, "error": str(exc)}
    out: dict[str, Any] = {"url": url, "final_url": resp.url, "title": title, "type": kind}
    if len(text) > cfg.max_chars:
        out["truncated"] = f"text was {len(text)} characters; the first {cfg.max_chars} are kept"
        text = text[: cfg.max_chars]
    out["content"] = text
    return out


def _urls(args: dict[str, Any], limit: int) -> list[str]:
    raw = args.get("urls", args.get("url"))
    if isinstance(raw, str):
        urls = [u.strip() for u in raw.replace("\n", ",").split(",")]
    elif isinstance(raw, list) and all(isinstance(u, str) for u in raw):
        urls = [u.strip() for u in raw]
    else:
        raise ArgumentError("argument 'urls' is required: a list of URLs (or one comma-separated string)")
    urls = [u for u in urls if u]
    if not urls:
        raise ArgumentError("argument 'urls' holds no URL")
    if len(urls) > limit:
        raise ArgumentError(f"at most {limit} URLs per call; got {len(urls)}. Split them over several calls")
    return urls


def web_tools(config: WebConfig, *, resolve: Resolve | None = None) -> list[FunctionTool]:
    """The web tools for ``config``: ``web_extract`` always, ``web_search`` when a provider is set.

    ``resolve`` replaces the system resolver of every fetch (tests map names onto loopback)."""
    names = TOOLSETS["web"]

    async def web_search(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        try:
            query = req_str(args, "query").strip()
            if not query:
                raise ArgumentError("argument 'query' is empty")
        except ArgumentError as exc:
            return ToolOutput.failure(str(exc))
        try:
            out = await search(config, query, resolve=resolve)
        except SearchError as exc:
            return ToolOutput.failure(str(exc))
        return ToolOutput(content=orjson.dumps(out).decode())

    async def web_extract(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        try:
            urls = _urls(args, config.max_urls)
        except ArgumentError as exc:
            return ToolOutput.failure(str(exc))
        async with SafeFetcher(
            config.policy, user_agent=USER_AGENT, max_redirects=config.max_redirects, resolve=resolve
        ) as f:
            results = await asyncio.gather(*(extract_one(config, f, u) for u in urls))
        body = orjson.dumps({"results": results}).decode()
        failed = [r for r in results if "error" in r]
        if len(failed) == len(results):
            return ToolOutput(content=body, ok=False, error="; ".join(r["error"] for r in failed))
        return ToolOutput(content=body)

    tools = [
        FunctionTool(
            name=names[1],
            toolset="web",
            description="Fetch one or more web pages (or PDFs) and return their main content as "
            "markdown, with each page's title and final URL after redirects.",
            parameters={
                "type": "object",
                "properties": {
                    "urls": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": f"http(s) URLs to read (at most {config.max_urls}).",
                    }
                },
                "required": ["urls"],
            },
            handler=web_extract,
        )
    ]
    if config.provider is not None:
        tools.insert(
            0,
            FunctionTool(
                name=names[0],
                toolset="web",
                description="Search the web; returns result titles, URLs and snippets.",
                parameters={
                    "type": "object",
                    "properties": {"query": {"type": "string", "description": "Search query."}},
                    "required": ["query"],
                },
                handler=web_search,
            ),
        )
    return tools


__all__ = ["SearchError", "SearchResult", "WebConfig", "extract_one", "search", "web_tools"]
