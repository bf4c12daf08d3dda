"""Async client for any OpenAI-compatible chat-completions endpoint.

Built on the ``openai`` SDK (aiohttp transport where installed) with the SDK's own retries
switched off: the retry policy is ours (:mod:`trajforge.llm.retry`, shared with the token-exact
client), so it is observable, logged and testable. Transient failures (429 honouring
``Retry-After``, 5xx, timeouts, connection errors, malformed bodies, truncated streams) are
retried with exponential backoff and jitter; permanent ones (400, 401, 403, 404, ...) raise at
once. Either way the caller gets a :class:`ModelError` whose message names the endpoint and the
status and never contains the API key.

Streaming and non-streaming calls produce the same :class:`AssistantTurn`.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlparse

import openai
import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from trajforge.llm.keys import redact, resolve_api_key
from trajforge.llm.retry import (
    BackoffBase,
    BackoffMax,
    CallSite,
    MaxRetries,
    MaxRetryAfter,
    TransientError,
    call_with_retries,
    exhausted_error,
    parse_retry_after,
    status_error,
)
from trajforge.llm.types import AssistantTurn, ModelError, ModelErrorKind, SamplingParams, ToolCall, Usage
from trajforge.messages import extract_reasoning, reasoning_from_fields

log = logging.getLogger(__name__)

ReasoningStyle = Literal["auto", "openai", "openrouter", "chat_template", "none"]

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


class OpenAIModelConfig(BaseModel):
    """How to reach one model on one OpenAI-compatible endpoint.

    The API key itself is never part of the config (configs get logged and saved): only the
    *name* of the environment variable holding it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(description="endpoint root, e.g. https://openrouter.ai/api/v1")
    model: str = Field(description="model name sent in every request")
    api_key_env: str | None = Field(
        default=None,
        description="env var holding the key; None tries OPENAI_API_KEY then OPENROUTER_API_KEY",
    )
    stream: bool = Field(default=False, description="use SSE streaming (same AssistantTurn either way)")
    request_timeout_s: float = Field(default=600.0, gt=0, description="read timeout of one attempt")
    connect_timeout_s: float = Field(default=10.0, gt=0, description="TCP/TLS connect timeout")
    max_retries: MaxRetries = 5
    backoff_base_s: BackoffBase = 1.0
    backoff_max_s: BackoffMax = 60.0
    max_retry_after_s: MaxRetryAfter = 300.0
    max_concurrency: int = Field(default=256, ge=1, description="requests in flight through this client")
    requests_per_second: float | None = Field(default=None, gt=0, description="request start rate limit")
    reasoning_style: ReasoningStyle = Field(
        default="auto",
        description="how reasoning_effort/reasoning_disabled go on the wire: openai (top-level "
        "reasoning_effort), openrouter (reasoning: {...}), chat_template (vLLM/SGLang "
        "chat_template_kwargs), none; auto picks openrouter for openrouter.ai, else openai",
    )
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = Field(
        default="max_tokens", description="OpenAI's reasoning models want max_completion_tokens"
    )
    stream_include_usage: bool = Field(default=True, description="ask for a usage chunk when streaming")
    extra_headers: dict[str, str] = Field(default_factory=dict, description="sent with every request")
    check_timeout_s: float = Field(default=15.0, gt=0, description="timeout of the check() preflight")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"base_url must be an http(s) URL like https://host/v1, got {value!r}")
        return value.rstrip("/")

    def resolved_reasoning_style(self) -> ReasoningStyle:
        if self.reasoning_style != "auto":
            return self.reasoning_style
        host = urlparse(self.base_url).hostname or ""
        return "openrouter" if host.endswith("openrouter.ai") else "openai"


# --------------------------------------------------------------------------------------------
# Request


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _reasoning_body(style: ReasoningStyle, effort: str | None, disabled: bool) -> dict[str, Any]:
    if style == "none" or (effort is None and not disabled):
        return {}
    if style == "openrouter":
        return {"reasoning": {"enabled": False} if disabled else {"effort": effort}}
    if style == "chat_template":
        return {
            "chat_template_kwargs": {"enable_thinking": False} if disabled else {"reasoning_effort": effort}
        }
    return {"reasoning_effort": "none" if disabled else effort}


def build_request_body(
    config: OpenAIModelConfig,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    sampling: SamplingParams | None,
) -> dict[str, Any]:
    """The JSON body of one chat-completions request, exactly as it goes on the wire.

    Built as a plain dict (and handed to the SDK whole) so what is sent is what this returns:
    provider-specific keys (``reasoning``, ``provider``, ``chat_template_kwargs``) need no
    special casing, and ``sampling.extra_body`` is merged last, one level deep.
    """
    s = sampling or SamplingParams()
    body: dict[str, Any] = {"model": config.model, "messages": messages}
    if tools:
        body["tools"] = tools
    optional = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        config.max_tokens_field: s.max_tokens,
        "stop": s.stop,
        "seed": s.seed,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    body.update(_reasoning_body(config.resolved_reasoning_style(), s.reasoning_effort, s.reasoning_disabled))
    if config.stream:
        body["stream"] = True
        if config.stream_include_usage:
            body["stream_options"] = {"include_usage": True}
    return _deep_merge(body, s.extra_body) if s.extra_body else body


# --------------------------------------------------------------------------------------------
# Response


class MalformedResponseError(Exception):
    """The endpoint answered 200 with something that is not a usable completion."""


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _decode_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MalformedResponseError(f"response body is not JSON ({exc}): {raw[:200]!r}") from None


def usage_from(raw: Any) -> Usage:
    """Usage from a decoded JSON ``usage`` object or the SDK's ``CompletionUsage`` (or None)."""
    if hasattr(raw, "model_dump"):
        raw = raw.model_dump()
    if not isinstance(raw, Mapping):
        return Usage()
    details = raw.get("completion_tokens_details") or {}
    prompt_details = raw.get("prompt_tokens_details") or {}
    return Usage(
        prompt_tokens=raw.get("prompt_tokens") or 0,
        completion_tokens=raw.get("completion_tokens") or 0,
        total_tokens=raw.get("total_tokens") or 0,
        reasoning_tokens=(details.get("reasoning_tokens") or 0) if isinstance(details, Mapping) else 0,
        cached_tokens=(prompt_details.get("cached_tokens") or 0)
        if isinstance(prompt_details, Mapping)
        else 0,
    )


def turn_from_payload(payload: Any, default_model: str) -> AssistantTurn:
    """An :class:`AssistantTurn` from a decoded (non-streamed) chat-completion JSON body."""
    if not isinstance(payload, Mapping):
        raise MalformedResponseError(f"response is a JSON {type(payload).__name__}, not an object")
    if isinstance(payload.get("error"), Mapping):  # some proxies answer 200 with an error body
        raise MalformedResponseError(f"endpoint answered with an error: {payload['error'].get('message')}")
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise MalformedResponseError("response has no choices")
    message = choices[0].get("message")
    if not isinstance(message, Mapping):
        raise MalformedResponseError("response choice has no message")
    raw_content = message.get("content")
    content, reasoning = extract_reasoning(
        message, raw_content if isinstance(raw_content, str) and raw_content else None
    )
    calls = []
    for tc in message.get("tool_calls") or ():
        fn = tc.get("function") if isinstance(tc, Mapping) else None
        if not isinstance(fn, Mapping) or not fn.get("name"):
            raise MalformedResponseError("tool call without a function name")
        args = fn.get("arguments")
        if not isinstance(args, str):  # a few servers send an object; keep the wire form
            args = orjson.dumps(args).decode() if args is not None else "{}"
        calls.append(ToolCall(id=tc.get("id") or _new_call_id(), name=fn["name"], arguments=args or "{}"))
    return AssistantTurn(
        content=content,
        reasoning=reasoning,
        tool_calls=calls,
        finish_reason=choices[0].get("finish_reason"),
        usage=usage_from(payload.get("usage")),
        model=payload.get("model") or default_model,
    )


class _PartialCall:
    __slots__ = ("arguments", "id", "name")

    def __init__(self, call_id: str | None) -> None:
        self.id = call_id
        self.name = ""
        self.arguments: list[str] = []


class StreamAssembler:
    """Folds ``ChatCompletionChunk``s into one :class:`AssistantTurn`.

    Tool calls arrive as fragments keyed by ``index`` (id and name first, arguments in pieces);
    some providers omit the index or reuse index 0 for a new call with a new id, so a changed id
    starts a new call. A stream that ends without any ``finish_reason`` was cut off and is
    reported as malformed (and so retried) rather than returned half-done.
    """

    def __init__(self, default_model: str) -> None:
        self.model = default_model
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, _PartialCall] = {}
        self.finish_reason: str | None = None
        self.usage: Any = None
        self._last_key: int | None = None

    def add(self, chunk: Any) -> None:
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        self.model = getattr(chunk, "model", None) or self.model
        for choice in getattr(chunk, "choices", None) or ():
            if choice.index not in (0, None):
                continue
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
            delta = choice.delta
            if delta is None:
                continue
            if delta.content:
                self.content.append(delta.content)
            if (piece := reasoning_from_fields(delta.model_extra)) is not None:
                self.reasoning.append(piece)
            for fragment in delta.tool_calls or ():
                self._add_call_fragment(fragment)

    def _add_call_fragment(self, fragment: Any) -> None:
        key = fragment.index
        if key is None:
            key = len(self.calls) if fragment.id or self._last_key is None else self._last_key
        call = self.calls.get(key)
        if call is not None and fragment.id and call.id and fragment.id != call.id:
            key = max(self.calls) + 1
            call = None
        if call is None:
            call = self.calls[key] = _PartialCall(fragment.id)
        self._last_key = key
        fn = fragment.function
        if fn is not None:
            if fn.name:
                call.name = fn.name
            if fn.arguments:
                call.arguments.append(fn.arguments)

    def turn(self) -> AssistantTurn:
        if self.finish_reason is None:
            raise MalformedResponseError("stream ended before a finish_reason (truncated)")
        calls = []
        for _, partial in sorted(self.calls.items()):
            if not partial.name:
                raise MalformedResponseError("streamed tool call without a function name")
            arguments = "".join(partial.arguments) or "{}"
            calls.append(ToolCall(id=partial.id or _new_call_id(), name=partial.name, arguments=arguments))
        fields = {"reasoning_content": "".join(self.reasoning)} if self.reasoning else None
        content, reasoning = extract_reasoning(fields, "".join(self.content) or None)
        return AssistantTurn(
            content=content,
            reasoning=reasoning,
            tool_calls=calls,
            finish_reason=self.finish_reason,
            usage=usage_from(self.usage),
            model=self.model,
        )


# --------------------------------------------------------------------------------------------
# Errors (the retry policy itself is trajforge.llm.retry)


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
        self._site = CallSite("model call", config.base_url, f"model {config.model!r}")

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
        body = build_request_body(self.config, messages, tools, sampling)
        started = time.perf_counter()
        turn = await call_with_retries(lambda: self._attempt(body), self.config, self._site)
        turn.latency_s = time.perf_counter() - started
        return turn

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
        if ids is None or chat_probe:
            await self._probe_chat()
        return ids or []

    async def _list_models(self) -> list[str] | None:
        """Model ids from ``/models``; None when the route is missing or answers oddly."""
        try:
            page = await self._sdk().models.list(timeout=self.config.check_timeout_s)
        except openai.APIStatusError as exc:
            if exc.status_code in (401, 403):
                raise self._status_error(exc) from None
            return None
        except (openai.APIConnectionError, *_HTTP_ERRORS) as exc:
            raise self._unreachable(exc) from None
        except (openai.APIError, json.JSONDecodeError):
            return None
        return [m.id for m in getattr(page, "data", None) or () if getattr(m, "id", None)]

    async def _probe_chat(self) -> None:
        config = self.config.model_copy(update={"stream": False})
        body = build_request_body(
            config, [{"role": "user", "content": "ping"}], None, SamplingParams(max_tokens=1)
        )
        try:
            await self._attempt(body, read_timeout_s=self.config.check_timeout_s)
        except TransientError as exc:
            raise exhausted_error(self._site, exc, attempts=1) from None

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    # -- internals -------------------------------------------------------------------------

    def _sdk(self) -> openai.AsyncOpenAI:
        if self._client is None:
            timeout = openai.Timeout(self.config.request_timeout_s, connect=self.config.connect_timeout_s)
            try:
                http_client = openai.DefaultAioHttpClient(timeout=timeout)
            except RuntimeError:  # SDK installed without the aiohttp extra
                http_client = openai.DefaultAsyncHttpxClient(timeout=timeout)
            # No key found: send the placeholder local servers (vLLM, SGLang) conventionally accept.
            api_key = self._key.secret.get_secret_value() if self._key.secret else NO_KEY_PLACEHOLDER
            self._client = openai.AsyncOpenAI(
                api_key=api_key,
                base_url=self.config.base_url,
                timeout=timeout,
                max_retries=0,
                default_headers=self.config.extra_headers,
                http_client=http_client,
            )
        return self._client

    async def _attempt(self, body: dict[str, Any], read_timeout_s: float | None = None) -> AssistantTurn:
        """One HTTP request; transient failures become :class:`TransientError`, permanent ModelError."""
        if self._limiter is not None:
            await self._limiter.acquire()
        async with self._semaphore:
            try:
                return await self._request(body, read_timeout_s)
            except openai.APIStatusError as exc:
                raise self._status_error(exc) from None
            except openai.APITimeoutError:
                raise TransientError(
                    f"timed out after {read_timeout_s or self.config.request_timeout_s:g}s"
                ) from None
            except openai.APIConnectionError as exc:
                raise TransientError(f"connection error: {exc.__cause__ or exc}") from None
            except _HTTP_ERRORS as exc:  # raised mid-stream, after the SDK handed us the stream
                raise TransientError(
                    f"connection error while streaming: {type(exc).__name__}: {exc}"
                ) from None
            except openai.APIError as exc:  # e.g. an error event inside an SSE stream
                raise TransientError(f"endpoint reported an error: {exc.message}") from None
            except (json.JSONDecodeError, MalformedResponseError) as exc:
                raise TransientError(f"malformed response: {exc}") from None

    async def _request(self, body: dict[str, Any], read_timeout_s: float | None) -> AssistantTurn:
        extra = {k: v for k, v in body.items() if k not in ("model", "messages", "stream")}
        create = self._sdk().chat.completions.create
        kwargs: dict[str, Any] = {"model": body["model"], "messages": body["messages"], "extra_body": extra}
        if read_timeout_s is not None:
            kwargs["timeout"] = read_timeout_s
        if not body.get("stream"):
            # The SDK's typed request transform and response models cost ~4 ms of CPU per call
            # (measured in benchmarks/batch_throughput.py) -- more than the rest of a rollout's
            # bookkeeping. The body is already wire-ready JSON, so post it as is and decode the
            # answer with orjson; errors, auth, timeouts and the transport stay the SDK's.
            options: dict[str, Any] = {} if read_timeout_s is None else {"timeout": read_timeout_s}
            raw = await self._sdk().post(
                "/chat/completions",
                body=body,
                cast_to=bytes,
                options=options,  # type: ignore[arg-type]
            )
            return turn_from_payload(_decode_json(raw), self.config.model)
        assembler = StreamAssembler(self.config.model)
        stream = await create(stream=True, **kwargs)
        try:
            async for chunk in stream:
                assembler.add(chunk)
        finally:
            await stream.close()
        return assembler.turn()

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
