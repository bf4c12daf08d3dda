"""Async client for any OpenAI-compatible chat-completions endpoint.

Built on the ``openai`` SDK (aiohttp transport where installed) with the SDK's own retries
switched off: the retry policy is ours (:mod:`trajforge.llm.retry`, shared with the token-exact
client), so it is observable, logged and testable. Transient failures (429 honouring
``Retry-After``, 5xx, timeouts, connection errors, malformed bodies, truncated streams) are
retried with exponential backoff and jitter; permanent ones (400, 401, 403, 404, ...) raise at
once. Either way the caller gets a :class:`ModelError` whose message names the endpoint and the
status and never contains the API key.

Streaming and non-streaming calls produce the same :class:`AssistantTurn`. What goes on the wire
and how an answer is read back is :mod:`trajforge.llm.chat_wire` (and
:mod:`trajforge.llm.chat_stream` for streams); the config is :mod:`trajforge.llm.openai_config`.
Their public names stay importable from here.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import httpx
import openai

from trajforge.llm.chat_stream import StreamAssembler
from trajforge.llm.chat_wire import (
    MalformedResponseError,
    build_request_body,
    decode_json,
    turn_from_payload,
    usage_from,
)
from trajforge.llm.dialects import Dialect, ReasoningStyle, get_dialect
from trajforge.llm.keys import redact, resolve_api_key
from trajforge.llm.openai_config import OpenAIModelConfig
from trajforge.llm.parsers import ToolCallParser
from trajforge.llm.retry import (
    CallSite,
    TransientError,
    call_with_retries,
    exhausted_error,
    parse_retry_after,
    status_error,
)
from trajforge.llm.server_probe import ServerInfo, probe_server
from trajforge.llm.text_calls import recover_calls, text_call_parser
from trajforge.llm.types import AssistantTurn, ModelError, ModelErrorKind, SamplingParams

__all__ = [
    "NO_KEY_PLACEHOLDER",
    "MalformedResponseError",
    "OpenAIChatModel",
    "OpenAIModelConfig",
    "ReasoningStyle",
    "StreamAssembler",
    "build_request_body",
    "parse_retry_after",
    "turn_from_payload",
    "usage_from",
]

log = logging.getLogger(__name__)

_ERROR_TEXT_LIMIT = 500
NO_KEY_PLACEHOLDER = "EMPTY"


def _http_error_types() -> tuple[type[Exception], ...]:
    """The HTTP library's error base class (``httpx2`` for openai 3.x, ``httpx`` before).

    Errors raised while iterating a stream come straight from it, not wrapped by the SDK.
    """
    found: list[type[Exception]] = []
    for module in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(module).HTTPError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


_HTTP_ERRORS = _http_error_types()
_UNREACHABLE: tuple[type[Exception], ...] = (openai.APIConnectionError, *_HTTP_ERRORS)
_ATTEMPT_FAILURES: tuple[type[Exception], ...] = (
    openai.APIError,
    *_HTTP_ERRORS,
    json.JSONDecodeError,
    MalformedResponseError,
)
"""What one attempt may raise that :meth:`OpenAIChatModel._failure` turns into an error of ours."""


def _error_text(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping):
            message = inner.get("message") or inner.get("code")
            if message:
                return str(message)[:_ERROR_TEXT_LIMIT]
        return str(inner)[:_ERROR_TEXT_LIMIT]
    if isinstance(body, str) and body:
        return body[:_ERROR_TEXT_LIMIT]
    return exc.message[:_ERROR_TEXT_LIMIT]


def _error_code(exc: openai.APIStatusError) -> str | None:
    """The ``error.code`` of an OpenAI-style error body, when there is one."""
    body = exc.body if isinstance(exc.body, Mapping) else {}
    inner = body.get("error", body) if body else {}
    code = inner.get("code") if isinstance(inner, Mapping) else None
    return str(code) if code else None


class OpenAIChatModel:
    """A :class:`trajforge.protocols.ChatModel` over an OpenAI-compatible HTTP endpoint.

    One instance per endpoint and model, shared by all rollouts of a process: it holds the
    connection pool, the concurrency semaphore (``max_concurrency`` requests in flight) and the
    optional request-rate limiter. The SDK client is created on first use, inside the running
    event loop.
    """

    def __init__(self, config: OpenAIModelConfig, *, environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self._key = resolve_api_key(config.api_key_env, config.base_url, environ)
        self._semaphore = asyncio.Semaphore(config.max_concurrency)
        self._limiter = _RateLimiter(config.requests_per_second) if config.requests_per_second else None
        self._client: openai.AsyncOpenAI | None = None
        self._chat_url = ""  # absolute, set with the client
        self._site = CallSite("model call", config.base_url, f"model {config.model!r}")
        # The endpoint's dialect (llm/dialects.py): named in the config, or probed once, on first use.
        self.server: ServerInfo | None = None
        self._dialect: Dialect | None = None
        self._text_parser: ToolCallParser | None = None
        self._probing = asyncio.Lock()
        if config.endpoint_dialect != "auto":
            self._use(ServerInfo(get_dialect(config.endpoint_dialect), "--endpoint-dialect"))

    @property
    def name(self) -> str:
        return self.config.model

    @property
    def endpoint(self) -> str:
        return self.config.base_url

    def __repr__(self) -> str:
        return f"OpenAIChatModel(model={self.config.model!r}, base_url={self.config.base_url!r}, {self._key.describe()})"

    # -- public API ------------------------------------------------------------------------

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
    ) -> AssistantTurn:
        """One assistant turn, after up to ``max_retries`` retries of transient failures.

        ``latency_s`` on the result is the whole call as the caller waited for it, retries and
        backoff included.
        """
        dialect = self._dialect or await self.dialect()
        body = build_request_body(self.config, messages, tools, sampling, dialect)
        started = time.perf_counter()
        turn = await call_with_retries(lambda: self._attempt(body), self.config, self._site)
        if self._text_parser is not None and tools and not turn.tool_calls:
            turn = recover_calls(turn, self._text_parser, tools)
        turn.latency_s = time.perf_counter() - started
        return turn

    async def dialect(self) -> Dialect:
        """The endpoint's dialect: the configured one, or what the server says it is (probed once)."""
        if self._dialect is None:
            async with self._probing:
                if self._dialect is None:
                    headers = dict(self.config.extra_headers)
                    if self._key.secret is not None:
                        headers["Authorization"] = f"Bearer {self._key.secret.get_secret_value()}"
                    info = await probe_server(
                        self.config.base_url, headers=headers, timeout_s=self.config.check_timeout_s
                    )
                    self._use(info)
                    log.info("%s", info.describe(self.endpoint))
        assert self._dialect is not None
        return self._dialect

    def _use(self, info: ServerInfo) -> None:
        self.server = info
        self._text_parser = text_call_parser(self.config.tool_call_parser, info.dialect.parses_tool_calls)
        self._dialect = info.dialect

    @property
    def endpoint_summary(self) -> str | None:
        """One line for preflight: which server, which dialect and why, whether calls returned as text
        are parsed (None before the dialect is known)."""
        if self.server is None:
            return None
        parser = self._text_parser
        calls = f"; calls returned as text parsed with {parser.name!r}" if parser is not None else ""
        return self.server.describe(self.endpoint) + calls

    async def check(self, *, chat_probe: bool = False) -> list[str]:
        """Cheap preflight: fail fast on an unreachable endpoint or a rejected key.

        Lists ``/models`` and returns the ids. Endpoints without that route -- and every
        endpoint when ``chat_probe`` is set -- also get a one-token chat request, the only way
        to prove a key where ``/models`` is public (OpenRouter). Never retries.
        """
        ids = await self._list_models()
        if ids and self.config.model not in ids:
            log.warning(
                "model %r is not listed by %s/models; requests may fail", self.config.model, self.endpoint
            )
        await self.dialect()
        if ids is None or chat_probe:
            await self._probe_chat()
        return ids or []

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    # -- preflight -------------------------------------------------------------------------

    async def _list_models(self) -> list[str] | None:
        """Model ids from ``/models``; None when the route is missing or answers oddly.

        A plain GET decoded here, as the chat calls are: ``client.models`` would import every
        resource module of the SDK (~0.5 s of CPU at each batch and worker start) for one list.
        """
        options: openai.RequestOptions = {"timeout": self.config.check_timeout_s}
        try:
            payload = decode_json(await self._sdk().get("/models", cast_to=bytes, options=options))
        except openai.APIStatusError as exc:
            if exc.status_code in (401, 403):
                raise self._status_error(exc) from None
            return None
        except _UNREACHABLE as exc:
            raise self._unreachable(exc) from None
        except (openai.APIError, json.JSONDecodeError, MalformedResponseError):
            return None
        if not isinstance(payload, Mapping):
            return None
        listed = payload.get("data")
        if not isinstance(listed, list):
            return []
        return [m["id"] for m in listed if isinstance(m, Mapping) and m.get("id")]

    async def _probe_chat(self) -> None:
        config = self.config.model_copy(update={"stream": False})
        body = build_request_body(
            config, [{"role": "user", "content": "ping"}], None, SamplingParams(max_tokens=1), self._dialect
        )
        try:
            await self._attempt(body, read_timeout_s=self.config.check_timeout_s)
        except TransientError as exc:
            raise exhausted_error(self._site, exc, attempts=1) from None

    # -- one attempt -----------------------------------------------------------------------

    def _sdk(self) -> openai.AsyncOpenAI:
        if self._client is None:
            timeout = openai.Timeout(self.config.request_timeout_s, connect=self.config.connect_timeout_s)
            # No key found: send the placeholder local servers (vLLM, SGLang) conventionally accept.
            api_key = self._key.secret.get_secret_value() if self._key.secret else NO_KEY_PLACEHOLDER
            self._client = openai.AsyncOpenAI(
                api_key=api_key,
                base_url=self.config.base_url,
                timeout=timeout,
                max_retries=0,
                default_headers=self.config.extra_headers,
                http_client=_http_client(timeout),
            )
            # The SDK joins a relative path to its base URL by parsing both again on every
            # request (~50 us); an absolute URL, joined here once as the SDK joins it (its base
            # URL ends in "/"), is taken as it is.
            self._chat_url = f"{self._client.base_url}chat/completions"
        return self._client

    async def _attempt(self, body: dict[str, Any], read_timeout_s: float | None = None) -> AssistantTurn:
        """One HTTP request; transient failures become :class:`TransientError`, permanent ModelError."""
        if self._limiter is not None:
            await self._limiter.acquire()
        async with self._semaphore:
            try:
                return await self._request(body, read_timeout_s)
            except _ATTEMPT_FAILURES as exc:
                raise self._failure(exc, read_timeout_s) from None

    def _failure(self, exc: Exception, read_timeout_s: float | None) -> TransientError | ModelError:
        """What a failed attempt is: the final error for permanent statuses, else one to retry."""
        if isinstance(exc, openai.APIStatusError):
            return self._status_error(exc)
        if isinstance(exc, openai.APITimeoutError):
            return TransientError(f"timed out after {read_timeout_s or self.config.request_timeout_s:g}s")
        if isinstance(exc, openai.APIConnectionError):
            return TransientError(f"connection error: {exc.__cause__ or exc}")
        if isinstance(exc, _HTTP_ERRORS):  # raised mid-stream, after the SDK handed us the stream
            return TransientError(f"connection error while streaming: {type(exc).__name__}: {exc}")
        if isinstance(exc, openai.APIError):  # e.g. an error event inside an SSE stream
            return TransientError(f"endpoint reported an error: {exc.message}")
        return TransientError(f"malformed response: {exc}")

    async def _request(self, body: dict[str, Any], read_timeout_s: float | None) -> AssistantTurn:
        if body.get("stream"):
            return await self._request_stream(body, read_timeout_s)
        # The SDK's typed request transform and response models cost ~4 ms of CPU per call
        # (measured in benchmarks/batch_throughput.py) -- more than the rest of a rollout's
        # bookkeeping. The body is already wire-ready JSON, so post it as is and decode the
        # answer with orjson; errors, auth, timeouts and the transport stay the SDK's.
        options: openai.RequestOptions = {} if read_timeout_s is None else {"timeout": read_timeout_s}
        client = self._sdk()
        raw = await client.post(self._chat_url, body=body, cast_to=bytes, options=options)
        return turn_from_payload(decode_json(raw), self.config.model)

    async def _request_stream(self, body: dict[str, Any], read_timeout_s: float | None) -> AssistantTurn:
        extra = {k: v for k, v in body.items() if k not in ("model", "messages", "stream")}
        kwargs: dict[str, Any] = {"model": body["model"], "messages": body["messages"], "extra_body": extra}
        if read_timeout_s is not None:
            kwargs["timeout"] = read_timeout_s
        assembler = StreamAssembler(self.config.model)
        stream = await self._sdk().chat.completions.create(stream=True, **kwargs)
        try:
            async for chunk in stream:
                assembler.add(chunk)
        finally:
            await stream.close()
        return assembler.turn()

    # -- errors ----------------------------------------------------------------------------

    def _status_error(self, exc: openai.APIStatusError) -> TransientError | ModelError:
        return status_error(
            self._site,
            exc.status_code,
            redact(_error_text(exc), self._key.secret),
            retry_after=parse_retry_after(exc.response.headers if exc.response is not None else None),
            error_code=_error_code(exc),
            auth_hint=f" [{self._key.describe()}]",
        )

    def _unreachable(self, exc: Exception) -> ModelError:
        return ModelError(
            f"cannot reach {self.endpoint}: {type(exc).__name__}: {exc} -- is the server running and the URL right?",
            kind=ModelErrorKind.TRANSIENT,
            endpoint=self.endpoint,
        )


def _http_client(timeout: openai.Timeout) -> openai.DefaultAioHttpClient | openai.DefaultAsyncHttpxClient:
    """The SDK's aiohttp transport, or its httpx one when installed without the aiohttp extra."""
    try:
        client = openai.DefaultAioHttpClient(timeout=timeout)
    except RuntimeError:
        client = openai.DefaultAsyncHttpxClient(timeout=timeout)
    _read_cookies_only_when_set(client)
    return client


class _SetCookieOnly(httpx.Cookies):
    """The client's cookie jar, read from a response only when the response sets a cookie.

    httpx hands every response to the jar through stand-ins for ``urllib`` request and response
    objects (an ``email`` message of all headers, a ``urllib.request.Request``) before the jar
    looks for ``Set-Cookie``: ~0.2 ms of CPU per model call, about a sixth of the SDK's share,
    for answers that set none. With a ``Set-Cookie`` (or ``Set-Cookie2``) header the jar reads
    the response exactly as before -- a sticky load balancer's cookie still comes back on the
    next request -- and without one the jar would have found nothing to store.
    """

    def extract_cookies(self, response: httpx.Response) -> None:
        headers = response.headers
        if "set-cookie" in headers or "set-cookie2" in headers:
            super().extract_cookies(response)


def _read_cookies_only_when_set(client: object) -> None:
    """Put :class:`_SetCookieOnly` under an httpx client built just now (its jar is empty).

    httpx has no public hook for this (its ``cookies`` setter copies into a plain ``Cookies``),
    so the attribute is checked first: a client of another make or a future httpx that keeps
    its cookies elsewhere is left as it is, and only costs the CPU back.
    """
    if type(getattr(client, "_cookies", None)) is httpx.Cookies:
        client._cookies = _SetCookieOnly(client._cookies)  # type: ignore[attr-defined]


class _RateLimiter:
    """Spaces request starts ``1/rate`` seconds apart (per client, within one event loop)."""

    def __init__(self, rate: float) -> None:
        self._interval = 1.0 / rate
        self._next = 0.0

    async def acquire(self) -> None:
        now = asyncio.get_running_loop().time()
        start = max(now, self._next)
        self._next = start + self._interval
        if start > now:
            await asyncio.sleep(start - now)
