"""``--endpoint-dialect auto``: which server is behind a URL, from what it says about itself.

Every server of :data:`~trajforge.llm.dialects.DIALECTS` names itself somewhere: ``owned_by`` in
``/v1/models`` (``vllm``, ``sglang``, ``llamacpp``, ``trajforge``, llama-cpp-python's ``me``), a
``Server: llama.cpp`` header, or a route only it serves (llama-server's ``/props``, vLLM's
``/version``, SGLang's ``/get_server_info``, Ollama's ``/api/version``). The probe asks
``/v1/models`` first (one request; the model clients ask it at preflight anyway) and the other
routes together only when that said nothing; a server that answers none of it is spoken to as
plain OpenAI (:data:`~trajforge.llm.dialects.DIALECTS` ``openai``). Hosted APIs are known by
their host and never probed. What decided it travels with the result, so preflight can print it.

The context length the server states (``max_model_len``, llama-server's ``n_ctx``) is kept too:
a token budget larger than it can be refused before any sample instead of at every call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import aiohttp
import orjson

from trajforge.llm.dialects import Dialect, get_dialect

log = logging.getLogger(__name__)

_HOSTS = {"openrouter.ai": "openrouter", "api.openai.com": "openai"}
"""Hosted APIs known by their host name (or a subdomain of it)."""

_OWNED_BY = {
    "vllm": "vllm",
    "sglang": "sglang",
    "llamacpp": "llamacpp",
    "trajforge": "trajforge",
    "me": "llamacpp_python",
    "library": "ollama",
    "ollama": "ollama",
}
"""``/v1/models`` ``owned_by`` -> dialect (llama-cpp-python writes ``me``, Ollama ``library``)."""

_ROUTES = {
    "/props": "llamacpp",
    "/get_server_info": "sglang",
    "/api/version": "ollama",
    "/version": "vllm",
}
"""Routes only one kind of server answers with a JSON object, asked when ``/v1/models`` said nothing."""


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What the probe found: the dialect, why, and the context length the server states."""

    dialect: Dialect
    evidence: str
    context_length: int | None = None
    identified: bool = True
    """False: nothing named the server, and ``dialect`` is the plain-OpenAI fallback."""

    def describe(self, url: str) -> str:
        """The preflight line: which server, which dialect, and what said so."""
        ctx = f", context {self.context_length} tokens" if self.context_length else ""
        return f"endpoint {url}: {self.dialect.server} (dialect {self.dialect.name}: {self.evidence}{ctx})"


def server_root(base_url: str) -> str:
    """``http://host:port`` (and any path prefix) without a trailing ``/v1``."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


def by_host(base_url: str) -> ServerInfo | None:
    """A hosted API known by its host, or None."""
    host = (urlparse(base_url).hostname or "").lower()
    for known, name in _HOSTS.items():
        if host == known or host.endswith("." + known):
            return ServerInfo(get_dialect(name), f"host {host}")
    return None


def from_models(payload: Any, headers: Mapping[str, str] | None) -> ServerInfo | None:
    """The dialect a ``/v1/models`` answer names (its ``owned_by``, its ``Server`` header), or None."""
    cards = payload.get("data") if isinstance(payload, Mapping) else None
    cards = [c for c in cards if isinstance(c, Mapping)] if isinstance(cards, list) else []
    context = context_from_cards(cards)
    for card in cards:
        owner = card.get("owned_by")
        if isinstance(owner, str) and owner.lower() in _OWNED_BY:
            return ServerInfo(
                get_dialect(_OWNED_BY[owner.lower()]), f"/v1/models owned_by {owner!r}", context
            )
    server = (headers or {}).get("Server", "") or (headers or {}).get("server", "")
    if "llama.cpp" in server.lower():
        return ServerInfo(get_dialect("llamacpp"), f"Server header {server!r}", context)
    return None


_CONTEXT_KEYS = ("max_model_len", "context_length", "max_context_length", "context_window")
"""Where a ``/v1/models`` card states its context: vLLM / SGLang / ``trajforge serve``
(``max_model_len``), OpenRouter-style catalogues and others (the rest)."""


def context_from_cards(cards: list[Mapping[str, Any]]) -> int | None:
    """The context length ``/v1/models`` cards state (llama-server's: ``meta.n_ctx_train``)."""
    for key in _CONTEXT_KEYS:
        if found := _first_int(c.get(key) for c in cards):
            return found
    return _first_int(
        (c.get("meta") or {}).get("n_ctx_train") for c in cards if isinstance(c.get("meta"), Mapping)
    )


def context_from_props(payload: Any) -> int | None:
    """llama-server's ``/props``: the context each slot has (``n_ctx``), which ``--ctx-size`` set."""
    if not isinstance(payload, Mapping):
        return None
    settings = payload.get("default_generation_settings")
    nested = settings.get("n_ctx") if isinstance(settings, Mapping) else None
    return _first_int([payload.get("n_ctx"), nested])


def _first_int(values: Any) -> int | None:
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


_MAX_ANSWER = 1 << 20
"""Bytes of one probe answer read at most (llama-server's /props, the largest, is a few KiB)."""


class _Getter:
    """GETs of JSON objects below one root, with the client's headers and a short timeout."""

    def __init__(self, session: aiohttp.ClientSession, root: str) -> None:
        self.session = session
        self.root = root

    async def get(self, path: str) -> tuple[Any, Mapping[str, str]] | None:
        """``(decoded JSON, headers)`` of a 200 answer, or None for anything else."""
        try:
            # No redirects: the key in the headers goes to the endpoint's own host and nowhere else.
            async with self.session.get(self.root + path, allow_redirects=False) as resp:
                if resp.status != 200:
                    return None
                raw = await resp.content.read(_MAX_ANSWER + 1)
                headers = dict(resp.headers)
        except (aiohttp.ClientError, TimeoutError):
            return None
        if len(raw) > _MAX_ANSWER:  # a self-description is a few KiB; this is something else
            return None
        try:
            return orjson.loads(raw), headers
        except orjson.JSONDecodeError:
            return None


async def probe_server(
    base_url: str, *, headers: Mapping[str, str] | None = None, timeout_s: float = 5.0
) -> ServerInfo:
    """Which server answers at ``base_url`` (a chat ``.../v1`` URL or a server root).

    Never raises for what the server answers: an unreachable or silent server is ``openai``
    (the requests that follow say what is wrong with it). ``headers`` carry the key, when the
    server wants one, to the same host the model calls go to.
    """
    known = by_host(base_url)
    if known is not None:
        return known
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(headers=dict(headers or {}), timeout=timeout) as session:
        getter = _Getter(session, server_root(base_url))
        models = await getter.get("/v1/models")
        info = from_models(*models) if models is not None else None
        if info is None or info.dialect.name == "llamacpp":
            info = await _by_routes(getter, info)
    if info.context_length is None and models is not None:  # stated by a server nothing named
        cards = models[0].get("data") if isinstance(models[0], Mapping) else None
        if isinstance(cards, list):
            context = context_from_cards([c for c in cards if isinstance(c, Mapping)])
            info = dataclasses.replace(info, context_length=context)
    return info


async def _by_routes(getter: _Getter, found: ServerInfo | None) -> ServerInfo:
    """The routes only one server answers (llama-server's ``/props`` also gives its real context)."""
    paths = ["/props"] if found is not None else list(_ROUTES)
    answers = await asyncio.gather(*(getter.get(path) for path in paths))
    for path, answer in zip(paths, answers, strict=True):
        if answer is None or not isinstance(answer[0], Mapping):
            continue
        if path == "/props":
            context = context_from_props(answer[0]) or (found.context_length if found else None)
            evidence = found.evidence if found is not None else "/props answered"
            return ServerInfo(get_dialect("llamacpp"), evidence, context)
        return ServerInfo(get_dialect(_ROUTES[path]), f"{path} answered")
    return found or ServerInfo(
        get_dialect("openai"), "no server-specific answer; plain OpenAI assumed", identified=False
    )
