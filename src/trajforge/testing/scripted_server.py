"""A scripted OpenAI-compatible chat-completions server on loopback, for tests and benchmarks.

Why a real server instead of a mock: the model client, the agent loop and the batch factory must
survive what real endpoints do on the wire -- SSE streams cut into fragments, tool calls
assembled from deltas, reasoning under four different field names, 429 with ``Retry-After``,
5xx, hangs and malformed bodies. A mock of the SDK would test none of that.

Usage::

    async with ScriptedServer(tool_then_answer(calls_per_sample=2)) as srv:
        model = OpenAIChatModel(OpenAIModelConfig(base_url=srv.base_url, model="scripted"))

    with ScriptedServer([Reply(content="hi")]).in_thread() as srv:   # for sync code / subprocesses
        ...

    python -m trajforge.testing.server_cli --port 8000 --latency 0.2 --policy tool_then_answer

A *policy* decides each reply (:mod:`trajforge.testing.policies`): a callable
``(request body) -> Reply`` (or an awaitable Reply), or a list of replies served in order *per
conversation*. Injected faults (:class:`FaultConfig`) are decided before the policy and never
consume a scripted reply, so a retried request gets the reply the failed one would have had.

This module is the aiohttp server; the pieces it serves are in their own modules and importable
from here too: the reply vocabulary (:mod:`~trajforge.testing.replies`), the wire encoding
(:mod:`~trajforge.testing.wire`), request validation (:mod:`~trajforge.testing.validation`) and
the command line (:mod:`~trajforge.testing.server_cli`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from typing import Any

import orjson
from aiohttp import web

from trajforge.testing.identities import IDENTITIES, Identity
from trajforge.testing.policies import (
    POLICIES,
    Script,
    as_policy,
    conversation_key,
    count_assistant_turns,
    echo_policy,
    last_user_text,
    tool_then_answer,
)
from trajforge.testing.replies import (
    FaultConfig,
    PolicyFn,
    ReasoningField,
    Reply,
    ToolCallSpec,
    retry_after_headers,
)
from trajforge.testing.validation import validate_request
from trajforge.testing.wire import CUT_EVENT, MALFORMED_JSON, SSE_DONE, WireEncoder, error_body, sse_event

__all__ = [
    "POLICIES",
    "IDENTITIES",
    "FaultConfig",
    "Identity",
    "PolicyFn",
    "ReasoningField",
    "Reply",
    "RequestRecord",
    "Script",
    "ScriptedServer",
    "ToolCallSpec",
    "conversation_key",
    "count_assistant_turns",
    "echo_policy",
    "last_user_text",
    "tool_then_answer",
    "validate_request",
]

log = logging.getLogger(__name__)


@dataclasses.dataclass(kw_only=True)
class RequestRecord:
    """One chat request as the server saw it; ``t`` is ``time.monotonic()`` at arrival."""

    t: float
    key: str
    body: dict[str, Any]
    stream: bool
    status: int
    fault: str | None


@dataclasses.dataclass(slots=True)
class _Exchange:
    """One chat request on its way through the server."""

    request: web.Request
    arrived: float
    body: Any = dataclasses.field(default_factory=dict)  # the decoded JSON; an object once validated
    key: str = ""
    fault: str | None = None

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))


class ScriptedServer:
    """An OpenAI-compatible endpoint on 127.0.0.1 that answers from a policy.

    Use as ``async with`` (same event loop as the test) or ``with srv.in_thread()`` (own loop in a
    background thread, for sync code and subprocess tests). ``base_url`` ends in ``/v1``.
    ``requests`` holds every chat request body (unless ``keep_requests=False``), ``records``
    the same with arrival time, status and injected fault (only for requests answered: one the
    client abandoned while the server waited has no record), ``counters`` running totals.
    ``api_key`` set means requests must carry ``Authorization: Bearer <api_key>`` or get 401.
    ``identity`` is what it says about itself (default: ``owned_by: trajforge``): pass one of
    :data:`~trajforge.testing.identities.IDENTITIES` to stand in for another kind of server.
    ``context_length`` set makes it a model of that context, as vLLM is one: ``/v1/models`` says
    ``max_model_len``, and a request whose ``max_tokens`` and prompt (counted as a token per 4
    bytes of its JSON) do not fit is refused with vLLM's 400 before the policy sees it.
    """

    def __init__(
        self,
        policy: PolicyFn | Sequence[Reply],
        *,
        faults: FaultConfig | None = None,
        latency_s: float = 0.0,
        model: str = "scripted",
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        strict: bool = True,
        chunk_chars: int = 16,
        keep_requests: bool = True,
        identity: Identity | None = None,
        context_length: int | None = None,
    ) -> None:
        self.context_length = context_length
        self.faults = faults or FaultConfig()
        self.identity = identity or Identity()
        self.latency_s = latency_s
        self.model = model
        self.host = host
        self.port = port
        self.strict = strict
        self.keep_requests = keep_requests
        self.requests: list[dict[str, Any]] = []
        self.records: list[RequestRecord] = []
        self.counters: collections.Counter[str] = collections.Counter()
        self._policy = as_policy(policy)
        self._seen: collections.Counter[str] = collections.Counter()
        self._auth = f"Bearer {api_key}" if api_key is not None else None
        self._wire = WireEncoder(model, chunk_chars)
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        if self._runner is None:
            raise RuntimeError("ScriptedServer is not running; use 'async with' or 'with srv.in_thread()'")
        return f"http://{self.host}:{self.port}/v1"

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> ScriptedServer:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self._identity_headers])
        routes = [web.post("/v1/chat/completions", self._chat), web.get("/_scripted/stats", self._stats)]
        if self.identity.models_route:
            routes.append(web.get("/v1/models", self._models))
        routes += [web.get(path, self._route(answer)) for path, answer in self.identity.routes.items()]
        app.add_routes(routes)
        # handler_cancellation: a client that gives up (timeout) cancels the hanging handler.
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = runner.addresses[0][1]
        self._runner = runner
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> ScriptedServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @contextlib.contextmanager
    def in_thread(self) -> Iterator[ScriptedServer]:
        """Run the server on its own event loop in a daemon thread for the ``with`` block."""
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []
        thread = threading.Thread(
            target=self._serve_on, args=(loop, ready, failure), name="scripted-server", daemon=True
        )
        thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)

    def _serve_on(
        self, loop: asyncio.AbstractEventLoop, ready: threading.Event, failure: list[BaseException]
    ) -> None:
        """The thread of :meth:`in_thread`: start (or report why not), serve until stopped, stop."""
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self.start())
        except BaseException as exc:  # reported to the caller by in_thread
            failure.append(exc)
            ready.set()
            loop.close()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(self.stop())
        loop.close()

    # -- handlers ----------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.StreamResponse:
        if denied := self._check_auth(request):
            return denied
        card: dict[str, Any] = {
            "id": self.model,
            "object": "model",
            "owned_by": self.identity.owned_by,
            **self.identity.card,
        }
        if self.context_length is not None:
            card["max_model_len"] = self.context_length
        data = {"object": "list", "data": [card]}
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    def _route(self, answer: Any) -> Any:
        async def handler(request: web.Request) -> web.StreamResponse:
            self.counters["identity_requests"] += 1
            return web.Response(body=orjson.dumps(answer), content_type="application/json")

        return handler

    @web.middleware
    async def _identity_headers(self, request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request)
        if self.identity.headers and not response.prepared:
            response.headers.update(self.identity.headers)
        return response

    async def _stats(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=orjson.dumps(dict(self.counters)), content_type="application/json")

    def _check_auth(self, request: web.Request) -> web.Response | None:
        if self._auth is None or request.headers.get("Authorization") == self._auth:
            return None
        self.counters["status_401"] += 1
        return _json_error(401, "Incorrect API key provided.", "invalid_api_key")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        exchange = _Exchange(request, time.monotonic())
        self.counters["requests"] += 1
        if denied := self._check_auth(request):
            return denied
        try:
            exchange.body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return self._finish(exchange, _json_error(400, "request body is not valid JSON"))
        if self.strict and (problem := validate_request(exchange.body)):
            return self._finish(exchange, _json_error(400, problem))
        self._admit(exchange)
        return self._finish(exchange, await self._respond(exchange))

    def _admit(self, exchange: _Exchange) -> None:
        """Key the request to its conversation, draw its fault, and keep it."""
        exchange.key = key = conversation_key(exchange.body)
        exchange.fault = self.faults.draw(key, self._seen[key])
        self._seen[key] += 1
        if self.keep_requests:
            self.requests.append(exchange.body)
        if exchange.fault is not None:
            self.counters[f"fault_{exchange.fault}"] += 1

    async def _respond(self, exchange: _Exchange) -> web.StreamResponse:
        fault = exchange.fault
        if fault == "500":
            return _json_error(500, "injected server error")
        if fault == "429":
            response = _json_error(429, "injected rate limit", "rate_limit_exceeded")
            response.headers.update(retry_after_headers(self.faults.retry_after_s))
            return response
        if fault == "timeout":
            await asyncio.sleep(self.faults.timeout_hang_s)
        if (refused := self._over_context(exchange.body)) is not None:
            return refused
        reply = Reply(malformed=True) if fault == "malformed" else await self._ask_policy(exchange.body)
        delay = self.latency_s + reply.delay_s
        if delay > 0:
            await asyncio.sleep(delay)
        return await self._send(exchange, reply)

    def _over_context(self, body: dict[str, Any]) -> web.Response | None:
        """vLLM's refusal of a request that cannot fit the context, or None."""
        if self.context_length is None:
            return None
        prompt = len(orjson.dumps([body.get("messages"), body.get("tools")])) // 4
        wanted = body.get("max_tokens") or body.get("max_completion_tokens") or 0
        if prompt + wanted <= self.context_length:
            return None
        self.counters["context_refusals"] += 1
        return _json_error(
            400,
            f"This model's maximum context length is {self.context_length} tokens. However, you requested "
            f"{prompt + wanted} tokens ({prompt} in the messages, {wanted} in the completion). Please reduce "
            "the length of the messages or completion.",
        )

    async def _ask_policy(self, body: dict[str, Any]) -> Reply:
        """The policy's reply; a policy that raises or returns junk becomes a clear 500."""
        try:
            result: Reply | Awaitable[Reply] = self._policy(body)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # a bug in a test's policy: make it visible to the client
            log.exception("scripted server policy failed")
            self.counters["policy_errors"] += 1
            return Reply.fail(500, f"scripted server: policy raised {type(exc).__name__}: {exc}")
        if not isinstance(result, Reply):
            self.counters["policy_errors"] += 1
            return Reply.fail(
                500, f"scripted server: policy returned {type(result).__name__}, expected Reply"
            )
        return result

    async def _send(self, exchange: _Exchange, reply: Reply) -> web.StreamResponse:
        if reply.malformed:
            if exchange.stream:
                return await self._send_cut_stream(exchange)
            return _json_response(MALFORMED_JSON)
        if reply.status != 200:
            message = reply.error or f"scripted error {reply.status}"
            response = _json_error(reply.status, message, reply.error_code)
            response.headers.update(reply.headers)
            return response
        if exchange.stream:
            return await self._send_stream(exchange, reply)
        return _json_response(self._wire.completion(exchange.body, reply), reply.headers)

    async def _send_stream(self, exchange: _Exchange, reply: Reply) -> web.StreamResponse:
        response = _sse_response({**self.identity.headers, **reply.headers})
        await response.prepare(exchange.request)
        body = exchange.body
        if not self.identity.stream_usage:  # a server that ignores it (llama-cpp-python)
            body = {k: v for k, v in body.items() if k != "stream_options"}
        payload = b"".join(sse_event(chunk) for chunk in self._wire.chunks(body, reply))
        await response.write(payload + SSE_DONE)
        await response.write_eof()
        return response

    async def _send_cut_stream(self, exchange: _Exchange) -> web.StreamResponse:
        """A stream that starts well and then breaks: an unterminated, invalid JSON event, no [DONE]."""
        response = _sse_response({})
        await response.prepare(exchange.request)
        first = next(self._wire.chunks(exchange.body, Reply(content="partial")))
        await response.write(sse_event(first) + CUT_EVENT)
        await response.write_eof()
        return response

    def _finish(self, exchange: _Exchange, response: web.StreamResponse) -> web.StreamResponse:
        """Count the answer's status and record the exchange (when requests are kept)."""
        self.counters[f"status_{response.status}"] += 1
        if self.keep_requests:
            record = RequestRecord(
                t=exchange.arrived,
                key=exchange.key,
                body=exchange.body,
                stream=exchange.stream,
                status=response.status,
                fault=exchange.fault,
            )
            self.records.append(record)
        return response


def _json_response(body: bytes, headers: Mapping[str, str] | None = None) -> web.Response:
    response = web.Response(body=body, headers=headers)
    response.content_type = "application/json"
    return response


def _json_error(status: int, message: str, code: str | None = None) -> web.Response:
    return web.Response(
        status=status, body=error_body(message, status, code), content_type="application/json"
    )


def _sse_response(headers: Mapping[str, str]) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers={"Cache-Control": "no-cache", **headers})
    response.content_type = "text/event-stream"
    return response
