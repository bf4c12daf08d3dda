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

    python -m trajforge.testing.scripted_server --port 8000 --latency 0.2 --policy tool_then_answer

A *policy* decides each reply: either a callable ``(request body) -> Reply`` (or an awaitable
Reply), or a list of replies served in order *per conversation* (keyed by the first user
message, so concurrent conversations each walk the whole script). Injected faults
(:class:`FaultConfig`) are decided before the policy and never consume a scripted reply, so a
retried request gets the reply the failed one would have had.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import inspect
import itertools
import logging
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import orjson
from aiohttp import web

from trajforge.messages import content_text

ReasoningField = Literal["reasoning_content", "reasoning", "reasoning_details", "think"]
PolicyFn = Callable[[dict[str, Any]], "Reply | Awaitable[Reply]"]

log = logging.getLogger(__name__)

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


@dataclasses.dataclass
class ToolCallSpec:
    """One tool call the server will emit. ``arguments`` may be a dict or raw (even invalid) JSON."""

    name: str
    arguments: dict[str, Any] | str = dataclasses.field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return orjson.dumps(self.arguments).decode()


@dataclasses.dataclass(kw_only=True)
class Reply:
    """What the server answers to one request.

    A ``status`` other than 200 sends an OpenAI-shaped error body with ``error`` as its message.
    ``reasoning_field`` picks how reasoning travels: ``reasoning_content`` (DeepSeek/vLLM),
    ``reasoning`` (OpenRouter), ``reasoning_details`` (OpenRouter's structured list) or
    ``think`` (inline ``<think>...</think>`` at the start of the content). ``malformed`` sends a
    broken body instead (truncated JSON, or a cut SSE stream), ``delay_s`` waits before answering
    (longer than the client's timeout, it scripts a timeout).
    """

    content: str | None = None
    reasoning: str | None = None
    reasoning_field: ReasoningField = "reasoning_content"
    tool_calls: list[ToolCallSpec] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    status: int = 200
    error: str | None = None
    error_code: str | None = None
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    delay_s: float = 0.0
    usage: dict[str, Any] | None = None
    malformed: bool = False

    @classmethod
    def fail(
        cls,
        status: int,
        message: str | None = None,
        *,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> Reply:
        """An error reply; ``retry_after_s`` sets both ``Retry-After`` and ``retry-after-ms``."""
        headers = _retry_after_headers(retry_after_s) if retry_after_s is not None else {}
        return cls(
            status=status, error=message or f"scripted error {status}", error_code=code, headers=headers
        )

    def resolved_finish_reason(self) -> str:
        return self.finish_reason or ("tool_calls" if self.tool_calls else "stop")


@dataclasses.dataclass(kw_only=True)
class FaultConfig:
    """Random failures injected before the policy runs, seeded for reproducible tests.

    Each chat request draws once from an RNG seeded by ``(seed, conversation key, request number
    within that conversation)``, so a conversation sees the same faults whatever the interleaving
    of concurrent requests. ``p_timeout`` makes the server hang for ``timeout_hang_s`` (longer
    than the client's timeout, but bounded so a test never hangs) before answering normally.
    ``p_malformed`` sends a truncated JSON body, or a cut SSE stream when streaming.
    """

    p_500: float = 0.0
    p_429: float = 0.0
    retry_after_s: float = 1.0
    p_timeout: float = 0.0
    timeout_hang_s: float = 5.0
    p_malformed: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        total = self.p_500 + self.p_429 + self.p_timeout + self.p_malformed
        if any(p < 0 for p in (self.p_500, self.p_429, self.p_timeout, self.p_malformed)) or total > 1:
            raise ValueError(f"fault probabilities must be >= 0 and sum to at most 1 (got {total:.3f})")

    def draw(self, key: str, n: int) -> str | None:
        """The fault for request ``n`` of conversation ``key``: 500, 429, timeout, malformed or None."""
        if not (self.p_500 or self.p_429 or self.p_timeout or self.p_malformed):
            return None
        u = random.Random(f"{self.seed}:{key}:{n}").random()
        for name, p in (
            ("500", self.p_500),
            ("429", self.p_429),
            ("timeout", self.p_timeout),
            ("malformed", self.p_malformed),
        ):
            if u < p:
                return name
            u -= p
        return None


@dataclasses.dataclass(kw_only=True)
class RequestRecord:
    """One chat request as the server saw it; ``t`` is ``time.monotonic()`` at arrival."""

    t: float
    key: str
    body: dict[str, Any]
    stream: bool
    status: int
    fault: str | None


# --------------------------------------------------------------------------------------------
# Ready-made policies


def count_assistant_turns(body: Mapping[str, Any]) -> int:
    """How many assistant messages the conversation already has (= model calls answered so far)."""
    return sum(1 for m in body.get("messages", ()) if isinstance(m, dict) and m.get("role") == "assistant")


def last_user_text(body: Mapping[str, Any]) -> str:
    for m in reversed(body.get("messages", ())):
        if isinstance(m, dict) and m.get("role") == "user":
            return content_text(m.get("content"))
    return ""


def echo_policy(body: dict[str, Any]) -> Reply:
    """Answers with the last user message, no tools, no reasoning."""
    return Reply(content=last_user_text(body))


def tool_then_answer(
    calls_per_sample: int = 2,
    tool: str = "terminal",
    command: str = "echo hi",
    answer: str = "done",
    *,
    arguments: dict[str, Any] | str | None = None,
    reasoning: str | None = "Let me work through this step by step.",
    reasoning_field: ReasoningField = "reasoning_content",
) -> PolicyFn:
    """Each sample makes ``calls_per_sample`` tool calls (one per turn), then answers.

    The turn number comes from the assistant messages already in the conversation, so retried
    requests and concurrent samples all get the right step. Every turn carries reasoning (so the
    batch factory's reasoning filter passes) unless ``reasoning`` is None.
    """
    args = {"command": command} if arguments is None else arguments

    def policy(body: dict[str, Any]) -> Reply:
        step = count_assistant_turns(body)
        text = f"{reasoning} (step {step + 1})" if reasoning else None
        if step < calls_per_sample:
            return Reply(
                reasoning=text, reasoning_field=reasoning_field, tool_calls=[ToolCallSpec(tool, args)]
            )
        return Reply(content=answer, reasoning=text, reasoning_field=reasoning_field)

    return policy


POLICIES: Mapping[str, Callable[..., PolicyFn]] = {
    "echo": lambda **_: echo_policy,
    "tool_then_answer": tool_then_answer,
}


# --------------------------------------------------------------------------------------------
# Wire format helpers


def _retry_after_headers(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(0, round(seconds))), "retry-after-ms": str(int(seconds * 1000))}


def _error_body(message: str, status: int, code: str | None = None) -> bytes:
    kind = {
        400: "invalid_request_error",
        401: "invalid_request_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_exceeded",
    }.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"error": {"message": message, "type": kind, "code": code, "param": None}})


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _usage(body: Mapping[str, Any], reply: Reply) -> dict[str, Any]:
    if reply.usage is not None:
        return reply.usage
    prompt = _estimate_tokens(orjson.dumps(body.get("messages", [])).decode())
    reasoning = _estimate_tokens(reply.reasoning) if reply.reasoning else 0
    answer = _estimate_tokens(reply.content or "") + sum(
        _estimate_tokens(tc.name + tc.arguments_json()) for tc in reply.tool_calls
    )
    return {
        "prompt_tokens": prompt,
        "completion_tokens": reasoning + answer,
        "total_tokens": prompt + reasoning + answer,
        "completion_tokens_details": {"reasoning_tokens": reasoning},
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def _reasoning_fields(reply: Reply, text: str) -> dict[str, Any]:
    if reply.reasoning_field == "reasoning_details":
        return {
            "reasoning_details": [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]
        }
    if reply.reasoning_field == "think":
        return {}
    return {reply.reasoning_field: text}


def _content_with_think(reply: Reply) -> str | None:
    if reply.reasoning_field == "think" and reply.reasoning:
        return f"<think>{reply.reasoning}</think>\n{reply.content or ''}"
    return reply.content


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class _Wire:
    """Renders a :class:`Reply` as a chat.completion body or as SSE chunks."""

    def __init__(self, model: str, chunk_chars: int) -> None:
        self.model = model
        self.chunk_chars = chunk_chars
        self._ids = itertools.count(1)

    def tool_call_ids(self, reply: Reply) -> list[str]:
        return [tc.id or f"call_{next(self._ids)}" for tc in reply.tool_calls]

    def completion(self, body: Mapping[str, Any], reply: Reply) -> bytes:
        message: dict[str, Any] = {"role": "assistant", "content": _content_with_think(reply)}
        if reply.reasoning and reply.reasoning_field != "think":
            message.update(_reasoning_fields(reply, reply.reasoning))
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": tc.name, "arguments": tc.arguments_json()},
                }
                for cid, tc in zip(self.tool_call_ids(reply), reply.tool_calls, strict=True)
            ]
        return orjson.dumps(
            {
                "id": f"chatcmpl-{next(self._ids)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [
                    {"index": 0, "message": message, "finish_reason": reply.resolved_finish_reason()}
                ],
                "usage": _usage(body, reply),
            }
        )

    def chunks(self, body: Mapping[str, Any], reply: Reply) -> Iterator[dict[str, Any]]:
        """The chunk dicts of a streamed reply, in order (without the ``[DONE]`` sentinel)."""
        yield self._chunk({"role": "assistant", "content": ""})
        if reply.reasoning and reply.reasoning_field != "think":
            for piece in _pieces(reply.reasoning, self.chunk_chars):
                yield self._chunk(_reasoning_fields(reply, piece))
        content = _content_with_think(reply)
        if content:
            for piece in _pieces(content, self.chunk_chars):
                yield self._chunk({"content": piece})
        for index, (cid, tc) in enumerate(zip(self.tool_call_ids(reply), reply.tool_calls, strict=True)):
            head = {
                "index": index,
                "id": cid,
                "type": "function",
                "function": {"name": tc.name, "arguments": ""},
            }
            yield self._chunk({"tool_calls": [head]})
            for piece in _pieces(tc.arguments_json(), self.chunk_chars):
                yield self._chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        yield self._chunk({}, finish_reason=reply.resolved_finish_reason())
        options = body.get("stream_options") or {}
        if isinstance(options, dict) and options.get("include_usage"):
            yield {**self._envelope(), "choices": [], "usage": _usage(body, reply)}

    def _envelope(self) -> dict[str, Any]:
        return {"id": "chatcmpl-stream", "object": "chat.completion.chunk", "created": 0, "model": self.model}

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**self._envelope(), "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}


def validate_request(body: Any) -> str | None:
    """What a strict real endpoint would reject in a chat request, or None when it is fine.

    Catching these here means an agent-loop bug (a tool message answering no call, arguments
    sent as a dict) fails in tests instead of only against a real provider.
    """
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "'model' is required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            return f"messages[{i}] must be an object with a valid 'role'"
        for tc in m.get("tool_calls") or ():
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str) or not tc.get("id"):
                return f"messages[{i}].tool_calls: each call needs an 'id' and string 'function.arguments'"
            open_calls.add(tc["id"])
        if m["role"] == "tool" and m.get("tool_call_id") not in open_calls:
            return f"messages[{i}]: tool message answers unknown tool_call_id {m.get('tool_call_id')!r}"
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "'tools' must be an array"
    return None


def conversation_key(body: Mapping[str, Any]) -> str:
    """The conversation a request belongs to: its first user message."""
    for m in body.get("messages", ()):
        if isinstance(m, dict) and m.get("role") == "user":
            return content_text(m.get("content"))
    return ""


# --------------------------------------------------------------------------------------------
# The server


class ScriptedServer:
    """An OpenAI-compatible endpoint on 127.0.0.1 that answers from a policy.

    Use as ``async with`` (same event loop as the test) or ``with srv.in_thread()`` (own loop in a
    background thread, for sync code and subprocess tests). ``base_url`` ends in ``/v1``.
    ``requests`` holds every chat request body (unless ``keep_requests=False``), ``records``
    the same with arrival time, status and injected fault (only for requests answered: one the
    client abandoned while the server waited has no record), ``counters`` running totals.
    ``api_key`` set means requests must carry ``Authorization: Bearer <api_key>`` or get 401.
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
    ) -> None:
        self.faults = faults or FaultConfig()
        self.latency_s = latency_s
        self.model = model
        self.host = host
        self.port = port
        self.strict = strict
        self.keep_requests = keep_requests
        self.requests: list[dict[str, Any]] = []
        self.records: list[RequestRecord] = []
        self.counters: collections.Counter[str] = collections.Counter()
        self._policy = policy
        self._script_pos: collections.Counter[str] = collections.Counter()
        self._seen: collections.Counter[str] = collections.Counter()
        self._auth = f"Bearer {api_key}" if api_key is not None else None
        self._wire = _Wire(model, chunk_chars)
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        if self._runner is None:
            raise RuntimeError("ScriptedServer is not running; use 'async with' or 'with srv.in_thread()'")
        return f"http://{self.host}:{self.port}/v1"

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> ScriptedServer:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.add_routes(
            [
                web.post("/v1/chat/completions", self._chat),
                web.get("/v1/models", self._models),
                web.get("/_scripted/stats", self._stats),
            ]
        )
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

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as exc:  # reported to the caller below
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.stop())
            loop.close()

        thread = threading.Thread(target=serve, name="scripted-server", daemon=True)
        thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)

    # -- handlers ----------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.StreamResponse:
        if denied := self._check_auth(request):
            return denied
        data = {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "trajforge"}]}
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    async def _stats(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=orjson.dumps(dict(self.counters)), content_type="application/json")

    def _check_auth(self, request: web.Request) -> web.Response | None:
        if self._auth is None or request.headers.get("Authorization") == self._auth:
            return None
        self.counters["status_401"] += 1
        return _json_error(401, "Incorrect API key provided.", "invalid_api_key")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        self.counters["requests"] += 1
        if denied := self._check_auth(request):
            return denied
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return self._finish(_json_error(400, "request body is not valid JSON"), arrived, {}, "", None)
        if self.strict and (problem := validate_request(body)):
            return self._finish(_json_error(400, problem), arrived, body, "", None)
        key = conversation_key(body)
        n = self._seen[key]
        self._seen[key] += 1
        fault = self.faults.draw(key, n)
        if self.keep_requests:
            self.requests.append(body)
        if fault is not None:
            self.counters[f"fault_{fault}"] += 1
        stream = bool(body.get("stream"))
        return await self._respond(request, body, key, fault, stream, arrived)

    async def _respond(
        self,
        request: web.Request,
        body: dict[str, Any],
        key: str,
        fault: str | None,
        stream: bool,
        arrived: float,
    ) -> web.StreamResponse:
        if fault == "500":
            return self._finish(_json_error(500, "injected server error"), arrived, body, key, fault)
        if fault == "429":
            response = _json_error(429, "injected rate limit", "rate_limit_exceeded")
            response.headers.update(_retry_after_headers(self.faults.retry_after_s))
            return self._finish(response, arrived, body, key, fault)
        if fault == "timeout":
            await asyncio.sleep(self.faults.timeout_hang_s)
        if fault == "malformed":
            reply = Reply(malformed=True)
        else:
            reply = await self._ask_policy(key, body)
        delay = self.latency_s + reply.delay_s
        if delay > 0:
            await asyncio.sleep(delay)
        if reply.malformed:
            if stream:
                return await self._send_cut_stream(request, body, key, arrived, fault)
            response = web.Response(body=b'{"id": "chatcmpl-x", "choices": [{"index": 0, "mess', status=200)
            response.content_type = "application/json"
            return self._finish(response, arrived, body, key, fault)
        if reply.status != 200:
            response = _json_error(
                reply.status, reply.error or f"scripted error {reply.status}", reply.error_code
            )
            response.headers.update(reply.headers)
            return self._finish(response, arrived, body, key, fault)
        if stream:
            return await self._send_stream(request, body, key, reply, arrived, fault)
        response = web.Response(body=self._wire.completion(body, reply), headers=reply.headers)
        response.content_type = "application/json"
        return self._finish(response, arrived, body, key, fault)

    async def _ask_policy(self, key: str, body: dict[str, Any]) -> Reply:
        """The policy's reply; a policy that raises or returns junk becomes a clear 500."""
        try:
            result = self._next_reply(key, body)
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

    def _next_reply(self, key: str, body: dict[str, Any]) -> Reply | Awaitable[Reply]:
        if callable(self._policy):
            return self._policy(body)
        pos = self._script_pos[key]
        if pos >= len(self._policy):
            return Reply.fail(
                400,
                f"scripted server: script exhausted after {len(self._policy)} replies for conversation {key[:60]!r}",
                code="script_exhausted",
            )
        self._script_pos[key] += 1
        return self._policy[pos]

    async def _send_stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        key: str,
        reply: Reply,
        arrived: float,
        fault: str | None,
    ) -> web.StreamResponse:
        response = _sse_response(reply.headers)
        await response.prepare(request)
        payload = b"".join(
            b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in self._wire.chunks(body, reply)
        )
        await response.write(payload + b"data: [DONE]\n\n")
        await response.write_eof()
        return self._finish(response, arrived, body, key, fault)

    async def _send_cut_stream(
        self, request: web.Request, body: dict[str, Any], key: str, arrived: float, fault: str | None
    ) -> web.StreamResponse:
        """A stream that starts well and then breaks: an unterminated, invalid JSON event, no [DONE]."""
        response = _sse_response({})
        await response.prepare(request)
        first = next(self._wire.chunks(body, Reply(content="partial")))
        await response.write(b"data: " + orjson.dumps(first) + b'\n\ndata: {"choices": [{"delta": {"cont')
        await response.write_eof()
        return self._finish(response, arrived, body, key, fault)

    def _finish(
        self, response: web.StreamResponse, arrived: float, body: dict[str, Any], key: str, fault: str | None
    ) -> web.StreamResponse:
        self.counters[f"status_{response.status}"] += 1
        if self.keep_requests:
            stream = bool(body.get("stream"))
            self.records.append(
                RequestRecord(
                    t=arrived, key=key, body=body, stream=stream, status=response.status, fault=fault
                )
            )
        return response


def _json_error(status: int, message: str, code: str | None = None) -> web.Response:
    return web.Response(
        status=status, body=_error_body(message, status, code), content_type="application/json"
    )


def _sse_response(headers: Mapping[str, str]) -> web.StreamResponse:
    response = web.StreamResponse(status=200, headers={"Cache-Control": "no-cache", **headers})
    response.content_type = "text/event-stream"
    return response


# --------------------------------------------------------------------------------------------
# Command line: python -m trajforge.testing.scripted_server


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m trajforge.testing.scripted_server",
        description="Scripted OpenAI-compatible endpoint on loopback, for benchmarks and tests.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on start)")
    p.add_argument("--latency", type=float, default=0.0, help="seconds added to every chat request")
    p.add_argument("--policy", choices=sorted(POLICIES), default="tool_then_answer")
    p.add_argument("--model", default="scripted")
    p.add_argument("--calls-per-sample", type=int, default=2, help="tool_then_answer: tool calls per sample")
    p.add_argument("--tool", default="terminal", help="tool_then_answer: the tool to call")
    p.add_argument("--command", default="echo hi", help="tool_then_answer: the terminal command")
    p.add_argument("--answer", default="done", help="tool_then_answer: the final answer")
    p.add_argument("--reasoning-field", default="reasoning_content", choices=ReasoningField.__args__)
    p.add_argument("--api-key-env", default=None, help="require the key held in this environment variable")
    p.add_argument("--p-500", type=float, default=0.0)
    p.add_argument("--p-429", type=float, default=0.0)
    p.add_argument("--retry-after", type=float, default=1.0)
    p.add_argument("--p-timeout", type=float, default=0.0)
    p.add_argument("--timeout-hang", type=float, default=5.0)
    p.add_argument("--p-malformed", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port-file", default=None, help="also write the port number to this file")
    return p.parse_args(argv)


def _policy_from_args(args: argparse.Namespace) -> PolicyFn:
    if args.policy == "echo":
        return echo_policy
    return tool_then_answer(
        calls_per_sample=args.calls_per_sample,
        tool=args.tool,
        command=args.command,
        answer=args.answer,
        reasoning_field=args.reasoning_field,
    )


async def _serve_forever(args: argparse.Namespace) -> None:
    faults = FaultConfig(
        p_500=args.p_500,
        p_429=args.p_429,
        retry_after_s=args.retry_after,
        p_timeout=args.p_timeout,
        timeout_hang_s=args.timeout_hang,
        p_malformed=args.p_malformed,
        seed=args.seed,
    )
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise SystemExit(f"error: environment variable {args.api_key_env} is empty or unset")
    server = ScriptedServer(
        _policy_from_args(args),
        faults=faults,
        latency_s=args.latency,
        model=args.model,
        host=args.host,
        port=args.port,
        api_key=api_key,
        keep_requests=False,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        if args.port_file:
            await asyncio.to_thread(Path(args.port_file).write_text, f"{server.port}\n")
        print(f"READY {server.base_url}", flush=True)
        await stop.wait()
    print(f"STATS {orjson.dumps(dict(server.counters)).decode()}", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    asyncio.run(_serve_forever(_parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
