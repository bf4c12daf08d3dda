"""A token-exact :class:`~trajforge.protocols.ChatModel` over raw completion endpoints.

The conversation is rendered with the model's own chat template (a transformers tokenizer from a
local directory), sent as token ids to a completion endpoint -- OpenAI ``/v1/completions``,
vLLM-style ``/generate`` or SGLang ``/generate`` -- and the sampled ids and their logprobs come
back. We decode them, split ``<think>`` reasoning off, and parse tool calls with the configured
parser (:mod:`trajforge.llm.parsers`). A malformed call becomes a ``parse_errors`` entry the
agent loop shows the model; it is never a silent "no call". How each endpoint kind spells
request and response is :mod:`trajforge.llm.completion_wire`; the retry policy and the error
kinds are :mod:`trajforge.llm.retry` (shared with the OpenAI chat client).

Exact tokens across turns, without changing the agent loop: the loop calls
``complete(messages, ...)`` with the whole history each turn and appends
``turn.to_message()``. This model remembers, per conversation prefix, the exact ids that prefix
stands for (prompt + sampled completion). The key is a hash chain over a fingerprint of each
message (role, text, reasoning, tool-call names/arguments) seeded with the tools, so the key of
"history + the assistant message we just returned" is known when we return it. On the next
call the longest remembered prefix that ends in one of our assistant turns is found; the new
prompt is its ids, then the template segment for what followed (tool results, user turns, the
generation prompt) tokenized on its own -- sampled text is never re-tokenized. The memory is an
LRU (``cache_size`` prefixes), one per model instance. If no prefix is remembered (another model
wrote the history, or it was edited), the prompt is rendered afresh and a warning is logged;
:func:`trajforge.llm.token_trace.build_episode_trace` then reports the break instead of
producing a wrong trace.
"""

from __future__ import annotations

import array
import asyncio
import collections
import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp
import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from trajforge.llm.chat_template import ChatTemplate
from trajforge.llm.completion_wire import (
    BadResponse,
    EndpointKind,
    Sampled,
    build_body,
    endpoint_path,
    openai_finish_reason,
    parse_response,
)
from trajforge.llm.dialects import DialectChoice, get_dialect
from trajforge.llm.keys import redact, resolve_api_key
from trajforge.llm.parsers import ToolCallParser, get_parser, to_tool_calls
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
from trajforge.llm.server_probe import ServerInfo, probe_server
from trajforge.llm.types import AssistantTurn, ModelError, ModelErrorKind, SamplingParams, TokenTrace, Usage
from trajforge.messages import content_text, message_reasoning, split_think

log = logging.getLogger(__name__)


class CompletionModelConfig(BaseModel):
    """How to reach one model served by a raw completion endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    tokenizer_path: str = Field(description="LOCAL directory with the model's tokenizer and chat template")
    base_url: str = Field(description="server root, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)")
    endpoint: EndpointKind | Literal["auto"] = Field(
        default="auto",
        description="openai_completions (/v1/completions, prompt as ids: vLLM with return_tokens_as_token_ids, "
        "llama-server), vllm_generate (/generate with prompt_token_ids) or sglang_generate (/generate with "
        "input_ids); auto: the one the server's dialect serves (vllm_generate for a server that does not "
        "say what it is)",
    )
    endpoint_dialect: DialectChoice = Field(
        default="auto", description="which server this is (trajforge.llm.dialects); auto: probe it"
    )
    model: str | None = Field(
        default=None, description="model name sent to /v1/completions; default: dir name"
    )
    parser: str = Field(
        default="hermes", description="tool-call parser name (trajforge.llm.parsers); none: no parsing"
    )
    api_key_env: str | None = Field(default=None, description="env var holding a key; None sends no auth")
    end_of_turn: str | None = Field(
        default=None, description="end-of-turn token; default tokenizer.eos_token"
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra template variables, e.g. {'enable_thinking': False}"
    )
    default_max_tokens: int = Field(default=4096, gt=0, description="when SamplingParams.max_tokens is None")
    max_context_tokens: int | None = Field(default=None, gt=0, description="refuse prompts that do not fit")
    request_timeout_s: float = Field(default=600.0, gt=0)
    max_retries: MaxRetries = 5
    backoff_base_s: BackoffBase = 1.0
    backoff_max_s: BackoffMax = 30.0
    max_retry_after_s: MaxRetryAfter = 300.0
    max_concurrency: int = Field(default=256, ge=1, description="requests in flight through this client")
    cache_size: int = Field(default=1024, ge=1, description="conversation prefixes whose ids are remembered")

    @field_validator("base_url")
    @classmethod
    def _root(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL like http://127.0.0.1:8000, got {value!r}")
        value = value.rstrip("/")
        return value[: -len("/v1")] if value.endswith("/v1") else value

    def url(self, kind: EndpointKind | None = None) -> str:
        """The route of ``kind`` (default: the configured one) below the server root."""
        kind = kind or (None if self.endpoint == "auto" else self.endpoint)
        return self.base_url + (endpoint_path(kind) if kind is not None else "")


# --------------------------------------------------------------------------------------------
# Conversation memory: message-prefix hash -> exact token ids


def _fingerprint(msg: Mapping[str, Any]) -> bytes:
    """What identifies a message for the token cache: the fields a template renders."""
    fp: dict[str, Any] = {"role": msg.get("role"), "content": content_text(msg.get("content"))}
    if msg.get("role") == "assistant":
        fp["reasoning"] = message_reasoning(msg) or ""
        fp["calls"] = [
            [(tc.get("function") or {}).get("name"), (tc.get("function") or {}).get("arguments")]
            for tc in msg.get("tool_calls") or []
        ]
    else:
        fp["tool_call_id"] = msg.get("tool_call_id")
        fp["name"] = msg.get("name")
    return orjson.dumps(fp, option=orjson.OPT_SORT_KEYS, default=str)


def _chain(seed: bytes, messages: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """Prefix keys: ``keys[i]`` identifies ``messages[: i + 1]`` (with the tools in ``seed``)."""
    keys, h = [], seed
    for msg in messages:
        h = hashlib.sha256(h + _fingerprint(msg)).digest()
        keys.append(h)
    return keys


def _tools_seed(tools: Sequence[Mapping[str, Any]] | None) -> bytes:
    return hashlib.sha256(orjson.dumps(list(tools or []), option=orjson.OPT_SORT_KEYS, default=str)).digest()


@dataclass(frozen=True, slots=True)
class _Remembered:
    ids: array.array[int]  # prompt + completion, int32
    ended_turn: bool  # the completion ended with the end-of-turn token


class _PrefixMemory:
    """A bounded LRU of conversation prefixes; one per model instance, no globals."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: collections.OrderedDict[bytes, _Remembered] = collections.OrderedDict()

    def get(self, key: bytes) -> _Remembered | None:
        item = self._items.get(key)
        if item is not None:
            self._items.move_to_end(key)
        return item

    def put(self, key: bytes, item: _Remembered) -> None:
        self._items[key] = item
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


# --------------------------------------------------------------------------------------------
# The model


class CompletionChatModel:
    """A :class:`trajforge.protocols.ChatModel` that is token-exact across turns.

    One instance per endpoint, shared by the rollouts of a process (it holds the HTTP session,
    the concurrency limit and the prefix memory). ``AssistantTurn.token_trace`` carries the
    prompt ids, the sampled ids and their logprobs of every turn; consecutive turns of one
    conversation extend each other exactly (see the module docstring).
    """

    def __init__(self, config: CompletionModelConfig, *, template: ChatTemplate | None = None) -> None:
        self.config = config
        self.template = template or ChatTemplate.from_path(
            config.tokenizer_path,
            end_of_turn=config.end_of_turn,
            template_kwargs=config.chat_template_kwargs,
        )
        self.parser: ToolCallParser | None = None if config.parser == "none" else get_parser(config.parser)
        self._key = resolve_api_key(config.api_key_env, config.base_url) if config.api_key_env else None
        self._memory = _PrefixMemory(config.cache_size)
        self._semaphore = asyncio.Semaphore(config.max_concurrency)
        self._session: aiohttp.ClientSession | None = None
        self._site = CallSite("completion call", config.url(), repr(self.name))
        # Which completion API: configured, or the server's dialect's (probed once, on first use).
        self.server: ServerInfo | None = None
        self._kind: EndpointKind | None = None if config.endpoint == "auto" else config.endpoint
        self._probing = asyncio.Lock()
        if config.endpoint_dialect != "auto":
            self.server = ServerInfo(get_dialect(config.endpoint_dialect), "--endpoint-dialect")

    @property
    def name(self) -> str:
        return self.config.model or Path(self.config.tokenizer_path).name

    @property
    def endpoint(self) -> str:
        return self.config.url(self._kind)

    def __repr__(self) -> str:
        return (
            f"CompletionChatModel({self.name!r} via {self._kind or self.config.endpoint} at {self.endpoint})"
        )

    async def kind(self) -> EndpointKind:
        """The completion API requests go to: configured, or the one the server's dialect serves."""
        if self._kind is None:
            async with self._probing:
                if self._kind is None:
                    self._kind = await self._resolve_kind()
                    self._site = CallSite("completion call", self.endpoint, repr(self.name))
        return self._kind

    async def _resolve_kind(self) -> EndpointKind:
        if self.server is None:
            headers = {}
            if self._key is not None and self._key.secret is not None:
                headers["Authorization"] = f"Bearer {self._key.secret.get_secret_value()}"
            self.server = await probe_server(self.config.base_url, headers=headers)
            log.info("%s", self.server.describe(self.config.base_url))
        dialect = self.server.dialect
        if not self.server.identified:
            return "vllm_generate"  # the default before dialects: Atropos' vllm_api_server.py
        # A server without a token-id API gets the OpenAI route: preflight shows how it refuses.
        return dialect.token_endpoint or "openai_completions"

    @property
    def endpoint_summary(self) -> str | None:
        """One line for preflight: which server, which dialect, which completion API."""
        if self.server is None or self._kind is None:
            return None
        return f"{self.server.describe(self.config.base_url)}; token-exact via {self._kind} ({self.endpoint})"

    async def check(self) -> None:
        """Preflight: one short token-id request, so a server that cannot do token-exact sampling is
        refused before any sample, with its reason, not after every sample's retries.

        The prompt is a one-message conversation through the chat template; one token is sampled
        and its id and logprob must come back in a shape this client reads."""
        kind = await self.kind()
        ids = await asyncio.to_thread(self.template.prompt_ids, [{"role": "user", "content": "ping"}], None)
        body = self._with_defaults(build_body(kind, ids, SamplingParams(temperature=0.0), 1, self.name))
        try:
            await self._attempt(body)
        except TransientError as exc:
            raise self._refused(exhausted_error(self._site, exc, attempts=1)) from None
        except ModelError as exc:
            raise self._refused(exc) from None

    def _with_defaults(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with the dialect's sampling defaults where it sets nothing (llama.cpp's samplers
        off: the logprobs and samples are the model's own distribution, as on the other servers)."""
        defaults = self.server.dialect.sampling_defaults if self.server is not None else {}
        return {**defaults, **body} if defaults else body

    def _refused(self, exc: ModelError) -> ModelError:
        server = self.server.dialect if self.server is not None else None
        why = (
            f" {server.server} takes no token-id prompts (dialect {server.name}); serve the model with "
            "llama-server, vLLM, SGLang or trajforge serve for token-exact records, or drop --tokenizer"
            if server is not None and server.token_endpoint is None and self.config.endpoint == "auto"
            else ""
        )
        return ModelError(
            f"token-exact preflight: {self.endpoint} cannot sample from token ids: {exc}.{why}",
            kind=exc.kind,
            endpoint=self.endpoint,
            status=exc.status,
        )

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
    ) -> AssistantTurn:
        sampling = sampling or SamplingParams()
        seed = _tools_seed(tools)
        recalled = self._recall(messages, seed)
        prompt_ids = await asyncio.to_thread(self._prompt_ids, messages, tools, recalled)
        max_tokens = self._max_tokens(len(prompt_ids), sampling)
        kind = self._kind or await self.kind()
        body = self._with_defaults(build_body(kind, prompt_ids, sampling, max_tokens, self.name))
        started = time.perf_counter()
        sampled = await call_with_retries(lambda: self._attempt(body), self.config, self._site)
        latency = time.perf_counter() - started
        turn = await asyncio.to_thread(self._turn, messages, tools, prompt_ids, sampled, latency)
        key = _chain(seed, [*messages, turn.to_message()])[-1]
        ended = bool(sampled.ids) and sampled.ids[-1] in self.template.stop_ids
        self._memory.put(key, _Remembered(array.array("i", prompt_ids + sampled.ids), ended))
        return turn

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    # -- prompt ------------------------------------------------------------------------------

    def _recall(self, messages: list[dict[str, Any]], seed: bytes) -> tuple[int, _Remembered] | None:
        """The longest remembered prefix ending in one of our assistant turns (event-loop thread only)."""
        keys = _chain(seed, messages)
        for j in range(len(messages) - 1, -1, -1):
            if messages[j].get("role") == "assistant":
                known = self._memory.get(keys[j])
                if known is not None:
                    return j, known
        return None

    def _prompt_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        recalled: tuple[int, _Remembered] | None,
    ) -> list[int]:
        """Remembered ids + the template segment after them; a fresh render when nothing is known."""
        if recalled is not None:
            j, known = recalled
            segment = self.template.continuation_ids(
                messages[: j + 1], messages[j + 1 :], tools, sampled_end_of_turn=known.ended_turn
            )
            return known.ids.tolist() + segment
        if any(m.get("role") == "assistant" for m in messages):
            log.warning(
                "%r: no token history for this conversation (written by another model, edited, or "
                "evicted from a cache of %d); rendering it afresh, so its token trace is not exact",
                self,
                self.config.cache_size,
            )
        return self.template.prompt_ids(messages, tools)

    def _max_tokens(self, prompt_len: int, sampling: SamplingParams) -> int:
        wanted = sampling.max_tokens or self.config.default_max_tokens
        limit = self.config.max_context_tokens
        if limit is None:
            return wanted
        if prompt_len >= limit:
            raise ModelError(
                f"prompt of {prompt_len} tokens does not fit max_context_tokens={limit} of {self.name!r}",
                kind=ModelErrorKind.CONTEXT_LENGTH,
                endpoint=self.endpoint,
            )
        return min(wanted, limit - prompt_len)

    # -- response ----------------------------------------------------------------------------

    def _turn(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        prompt_ids: list[int],
        sampled: Sampled,
        latency: float,
    ) -> AssistantTurn:
        ids = sampled.ids
        body = ids[:-1] if ids and ids[-1] in self.template.stop_ids else ids
        text = self.template.decode(body)
        content, reasoning = split_think(text)
        calls, errors = [], []
        if content is not None and self.parser is not None:
            parsed = self.parser.parse(content, tools)
            content = parsed.content
            previous = sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
            calls = to_tool_calls(parsed, start=previous)
            errors = [e.describe() for e in parsed.errors]
        finish = openai_finish_reason(sampled.finish_reason)
        return AssistantTurn(
            content=content,
            reasoning=reasoning,
            tool_calls=calls,
            finish_reason="tool_calls" if calls and finish == "stop" else finish,
            usage=Usage(
                prompt_tokens=len(prompt_ids),
                completion_tokens=len(ids),
                total_tokens=len(prompt_ids) + len(ids),
            ),
            model=self.name,
            latency_s=latency,
            parse_errors=errors,
            token_trace=TokenTrace(
                prompt_ids=prompt_ids,
                completion_ids=ids,
                completion_logprobs=sampled.logprobs,
                finish_reason=sampled.finish_reason,
                model_version=sampled.version,
            ),
        )

    # -- HTTP --------------------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {}
            if self._key is not None and self._key.secret is not None:
                headers["Authorization"] = f"Bearer {self._key.secret.get_secret_value()}"
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_s)
            )
        return self._session

    async def _attempt(self, body: dict[str, Any]) -> Sampled:
        async with self._semaphore:
            try:
                async with self._http().post(self.endpoint, json=body) as resp:
                    raw = await resp.read()
                    status = resp.status
                    retry_after = parse_retry_after(resp.headers)
            except TimeoutError:
                raise TransientError(f"timed out after {self.config.request_timeout_s:g}s") from None
            except aiohttp.ClientError as exc:
                raise TransientError(f"connection error: {type(exc).__name__}: {exc}") from None
        text = self._redact(raw.decode("utf-8", "replace")[:500])
        if status != 200:
            raise status_error(self._site, status, text, retry_after=retry_after)
        try:
            sampled = parse_response(self._kind or "openai_completions", orjson.loads(raw))
        except orjson.JSONDecodeError:
            raise TransientError(f"malformed response (not JSON): {text[:200]!r}") from None
        except BadResponse as exc:
            if exc.permanent:
                raise ModelError(
                    f"unusable response from {self.endpoint}: {exc}",
                    kind=ModelErrorKind.PERMANENT,
                    endpoint=self.endpoint,
                    status=status,
                ) from None
            raise TransientError(f"malformed response: {exc}") from None
        if sampled.finish_reason == "abort":
            raise TransientError("the server aborted the request")
        return sampled

    def _redact(self, text: str) -> str:
        return redact(text, self._key.secret) if self._key is not None else text
