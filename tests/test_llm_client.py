"""OpenAIChatModel against the scripted server on 127.0.0.1, plus the pure helpers it uses."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from openai.types.chat import ChatCompletionChunk
from pydantic import ValidationError

from trajforge.llm.keys import MissingApiKeyError, redact, resolve_api_key
from trajforge.llm.openai_client import (
    OpenAIChatModel,
    OpenAIModelConfig,
    StreamAssembler,
    build_request_body,
    parse_retry_after,
)
from trajforge.llm.types import ModelError, ModelErrorKind, SamplingParams
from trajforge.messages import combine_reasoning, extract_reasoning, reasoning_from_fields, split_think
from trajforge.protocols import ChatModel
from trajforge.testing.scripted_server import FaultConfig, Reply, ScriptedServer, ToolCallSpec

SECRET = "sk-test-0123456789abcdefSECRET"
USER = [{"role": "user", "content": "hello there"}]


def make_model(srv: ScriptedServer, **overrides: Any) -> OpenAIChatModel:
    settings: dict[str, Any] = {
        "base_url": srv.base_url,
        "model": "scripted",
        "backoff_base_s": 0.001,
        "backoff_max_s": 0.01,
        "max_retries": 3,
        "request_timeout_s": 5.0,
    }
    settings.update(overrides)
    return OpenAIChatModel(OpenAIModelConfig(**settings))


@pytest.fixture
async def models() -> Any:
    """Collects models made in a test and closes them at teardown."""
    made: list[OpenAIChatModel] = []

    def keep(model: OpenAIChatModel) -> OpenAIChatModel:
        made.append(model)
        return model

    yield keep
    for model in made:
        await model.aclose()


# --------------------------------------------------------------------------------------------
# Happy paths, both transports


@pytest.mark.parametrize("stream", [False, True])
async def test_plain_answer_with_usage(scripted_server, models, stream: bool) -> None:
    srv = await scripted_server(
        [Reply(content="Hi! " * 20, usage={"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16})]
    )
    model = models(make_model(srv, stream=stream))
    turn = await model.complete(USER, sampling=SamplingParams(temperature=0.3, max_tokens=50, seed=4))
    assert turn.content == "Hi! " * 20
    assert turn.reasoning is None and turn.tool_calls == []
    assert turn.finish_reason == "stop"
    assert (turn.usage.prompt_tokens, turn.usage.completion_tokens, turn.usage.total_tokens) == (7, 9, 16)
    assert turn.model == "scripted" and turn.latency_s > 0
    sent = srv.requests[0]
    assert (sent["temperature"], sent["max_tokens"], sent["seed"]) == (0.3, 50, 4)
    assert sent.get("stream", False) is stream
    if stream:
        assert sent["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("style", ["reasoning_content", "reasoning", "reasoning_details", "think"])
async def test_reasoning_in_each_style(scripted_server, models, style: str, stream: bool) -> None:
    thought = "First I consider the question carefully, then I answer."
    srv = await scripted_server([Reply(content="42", reasoning=thought, reasoning_field=style)])
    turn = await models(make_model(srv, stream=stream)).complete(USER)
    assert turn.reasoning == thought
    assert turn.content == "42"
    assert turn.to_message()["reasoning"] == thought


@pytest.mark.parametrize("stream", [False, True])
async def test_several_tool_calls_in_one_turn(scripted_server, models, stream: bool) -> None:
    calls = [
        ToolCallSpec("terminal", {"command": "ls -la /tmp && echo 'a long enough command'"}),
        ToolCallSpec("read_file", {"path": "notes.txt", "offset": 10}),
        ToolCallSpec("write_file", '{"path": "x", "content": "unterminated'),  # invalid JSON kept raw
    ]
    srv = await scripted_server([Reply(reasoning="plan", tool_calls=calls)])
    turn = await models(make_model(srv, stream=stream)).complete(USER, tools=[_tool_schema("terminal")])
    assert [tc.name for tc in turn.tool_calls] == ["terminal", "read_file", "write_file"]
    assert turn.tool_calls[0].arguments == '{"command":"ls -la /tmp && echo \'a long enough command\'"}'
    assert turn.tool_calls[1].arguments == '{"path":"notes.txt","offset":10}'
    assert turn.tool_calls[2].arguments == '{"path": "x", "content": "unterminated'
    assert len({tc.id for tc in turn.tool_calls}) == 3
    assert turn.finish_reason == "tool_calls" and turn.content is None
    assert srv.requests[0]["tools"] == [_tool_schema("terminal")]


@pytest.mark.parametrize(
    "reply",
    [
        Reply(content="text", reasoning="why", tool_calls=[ToolCallSpec("t", {"a": 1}, id="call_x")]),
        Reply(content="", tool_calls=[ToolCallSpec("t", "", id="call_y")]),  # empty content/arguments
        Reply(content="<think>inline</think>\n\nanswer", finish_reason="length"),
    ],
)
async def test_streamed_and_plain_turns_are_identical(scripted_server, models, reply: Reply) -> None:
    srv = await scripted_server(lambda body: reply)
    plain = await models(make_model(srv)).complete(USER)
    streamed = await models(make_model(srv, stream=True)).complete(USER)
    ignore = {"latency_s"}
    assert plain.model_dump(exclude=ignore) == streamed.model_dump(exclude=ignore)
    assert plain.content != ""  # empty content is normalised to None in both modes


async def test_async_policy_and_concurrency_limit(scripted_server, models) -> None:
    in_flight = 0
    peak = 0

    async def policy(body: dict[str, Any]) -> Reply:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return Reply(content="ok")

    srv = await scripted_server(policy)
    model = models(make_model(srv, max_concurrency=2))
    turns = await asyncio.gather(*(model.complete([{"role": "user", "content": f"q{i}"}]) for i in range(6)))
    assert [t.content for t in turns] == ["ok"] * 6
    assert peak == 2


async def test_requests_per_second_spaces_request_starts(scripted_server, models) -> None:
    srv = await scripted_server(lambda body: Reply(content="ok"))
    model = models(make_model(srv, requests_per_second=10))
    before = time.monotonic()  # the server stamps arrivals with the same clock
    await asyncio.gather(*(model.complete([{"role": "user", "content": f"q{i}"}]) for i in range(3)))
    # Lower bound only: the third request may not start before two intervals have passed.
    assert max(r.t for r in srv.records) - before >= 2 * 0.1


# --------------------------------------------------------------------------------------------
# Transient failures are retried


async def test_429_honours_retry_after(scripted_server, models) -> None:
    srv = await scripted_server([Reply.fail(429, "slow down", retry_after_s=0.3), Reply(content="ok")])
    turn = await models(make_model(srv)).complete(USER)
    assert turn.content == "ok"
    first, second = srv.records
    assert (first.status, second.status) == (429, 200)
    # Backoff alone would be ~1 ms (backoff_base_s=0.001): the gap shows Retry-After was obeyed.
    assert second.t - first.t >= 0.3


@pytest.mark.parametrize("stream", [False, True])
async def test_500_then_success(scripted_server, models, stream: bool) -> None:
    srv = await scripted_server([Reply.fail(500), Reply.fail(503), Reply(content="recovered")])
    turn = await models(make_model(srv, stream=stream)).complete(USER)
    assert turn.content == "recovered"
    assert [r.status for r in srv.records] == [500, 503, 200]


@pytest.mark.parametrize("stream", [False, True])
async def test_timeout_then_success(scripted_server, models, stream: bool) -> None:
    srv = await scripted_server([Reply(content="too late", delay_s=3.0), Reply(content="in time")])
    turn = await models(make_model(srv, stream=stream, request_timeout_s=0.3)).complete(USER)
    assert turn.content == "in time"
    assert len(srv.requests) == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_malformed_body_then_success(scripted_server, models, stream: bool) -> None:
    srv = await scripted_server([Reply(malformed=True), Reply(content="fine")])
    turn = await models(make_model(srv, stream=stream)).complete(USER)
    assert turn.content == "fine"
    assert len(srv.requests) == 2


async def test_injected_faults_all_recovered(scripted_server, models) -> None:
    faults = FaultConfig(p_500=0.2, p_429=0.1, retry_after_s=0.01, p_malformed=0.1, seed=7)
    srv = await scripted_server(lambda body: Reply(content="ok"), faults=faults)
    model = models(make_model(srv, stream=True, max_retries=8))
    turns = await asyncio.gather(*(model.complete([{"role": "user", "content": f"q{i}"}]) for i in range(20)))
    assert all(t.content == "ok" for t in turns)
    clean = [r for r in srv.records if r.fault is None]
    assert len(clean) == 20 and all(r.status == 200 for r in clean)  # exactly one good answer each
    assert {r.fault for r in srv.records} >= {"500", "429", "malformed"}


async def test_retries_exhausted_is_transient_model_error(scripted_server, models) -> None:
    srv = await scripted_server(lambda body: Reply.fail(502, "bad gateway"))
    model = models(make_model(srv, max_retries=2))
    with pytest.raises(ModelError) as info:
        await model.complete(USER)
    err = info.value
    assert err.kind is ModelErrorKind.TRANSIENT and err.transient
    assert err.attempts == 3 and err.status == 502
    assert srv.base_url in str(err) and "502" in str(err) and "bad gateway" in str(err)
    assert len(srv.requests) == 3


# --------------------------------------------------------------------------------------------
# Permanent failures raise at once, naming endpoint and status, never the key


@pytest.mark.parametrize("stream", [False, True])
async def test_401_raises_immediately_without_the_key(scripted_server, models, monkeypatch, stream) -> None:
    monkeypatch.setenv("MY_KEY", SECRET)
    srv = await scripted_server([Reply(content="never")], api_key="the-right-key")
    model = models(make_model(srv, api_key_env="MY_KEY", stream=stream))
    with pytest.raises(ModelError) as info:
        await model.complete(USER)
    err = info.value
    assert err.kind is ModelErrorKind.AUTH and err.status == 401 and err.attempts == 1
    assert srv.base_url in str(err) and "401" in str(err)
    assert "$MY_KEY" in str(err)  # says where the key came from ...
    assert SECRET not in str(err) and SECRET not in repr(err)  # ... never what it is
    assert srv.counters["requests"] == 1  # one chat request, not retried (the dialect probe GETs /models)


async def test_right_key_is_accepted(scripted_server, models, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    srv = await scripted_server([Reply(content="welcome")], api_key=SECRET)
    assert (await models(make_model(srv)).complete(USER)).content == "welcome"


async def test_404_wrong_path_raises_immediately(scripted_server, models) -> None:
    srv = await scripted_server([Reply(content="never")])
    model = models(make_model(srv, base_url=srv.base_url.replace("/v1", "/v2")))
    with pytest.raises(ModelError) as info:
        await model.complete(USER)
    err = info.value
    assert err.kind is ModelErrorKind.PERMANENT and err.status == 404 and err.attempts == 1
    assert "/v2" in str(err) and "404" in str(err)


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (
            Reply.fail(404, "The model `nope` does not exist", code="model_not_found"),
            ModelErrorKind.PERMANENT,
        ),
        (Reply.fail(403, "forbidden region"), ModelErrorKind.AUTH),
        (Reply.fail(400, "unknown parameter 'foo'"), ModelErrorKind.PERMANENT),
        (
            Reply.fail(
                400, "This model's maximum context length is 8192 tokens.", code="context_length_exceeded"
            ),
            ModelErrorKind.CONTEXT_LENGTH,
        ),
        (
            Reply.fail(400, "prompt is too long: 210000 tokens > 200000 maximum"),
            ModelErrorKind.CONTEXT_LENGTH,
        ),
    ],
)
async def test_permanent_errors_are_not_retried(scripted_server, models, reply: Reply, kind) -> None:
    srv = await scripted_server([reply, Reply(content="never reached")])
    with pytest.raises(ModelError) as info:
        await models(make_model(srv)).complete(USER)
    assert info.value.kind is kind and info.value.status == reply.status
    assert reply.error is not None and reply.error in str(info.value)
    assert len(srv.requests) == 1


async def test_key_never_in_repr_or_logs(scripted_server, models, monkeypatch, caplog) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    srv = await scripted_server(
        [Reply.fail(500), Reply(content="ok"), Reply.fail(401, "bad key")], api_key=SECRET
    )
    model = models(make_model(srv))
    assert SECRET not in repr(model) and "OPENAI_API_KEY" in repr(model)
    assert SECRET not in repr(model.config) and SECRET not in model.config.model_dump_json()
    await model.complete(USER)
    with pytest.raises(ModelError):
        await model.complete(USER)
    assert "retry 1/3" in caplog.text  # the retry was logged ...
    assert SECRET not in caplog.text  # ... without the key, at every level


# --------------------------------------------------------------------------------------------
# check() preflight


async def test_check_lists_models(scripted_server, models) -> None:
    srv = await scripted_server([Reply(content="pong")])
    model = models(make_model(srv))
    assert await model.check() == ["scripted"]
    assert srv.requests == []  # /models was enough
    assert await model.check(chat_probe=True) == ["scripted"]
    assert srv.requests[0]["max_tokens"] == 1 and srv.requests[0].get("stream") is not True


async def test_check_unreachable_port_fails_fast(models) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    model = models(OpenAIChatModel(OpenAIModelConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m")))
    with pytest.raises(ModelError) as info:
        await model.check()
    assert "cannot reach" in str(info.value) and str(port) in str(info.value)


async def test_check_bad_key(scripted_server, models, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    srv = await scripted_server([], api_key="other")
    with pytest.raises(ModelError) as info:
        await models(make_model(srv)).check()
    assert info.value.kind is ModelErrorKind.AUTH and SECRET not in str(info.value)


async def test_check_falls_back_to_chat_without_models_route(models) -> None:
    seen: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.json_response(_completion("p"))

    async with _raw_app({"/v1/chat/completions": chat}) as base_url:
        model = models(OpenAIChatModel(OpenAIModelConfig(base_url=base_url, model="m")))
        assert await model.check() == []
        assert seen and seen[0]["max_tokens"] == 1


async def test_connection_dropped_mid_stream_is_retried(models, caplog) -> None:
    caplog.set_level(logging.INFO, logger="trajforge")
    attempts = 0

    async def chat(request: web.Request) -> web.StreamResponse:
        nonlocal attempts
        attempts += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        if attempts == 1:  # half an answer, then the connection dies without a chunked terminator
            delta = {"choices": [{"index": 0, "delta": {"content": "par"}, "finish_reason": None}]}
            await response.write(b"data: " + json.dumps({**chunk, **delta}).encode() + b"\n\n")
            assert request.transport is not None
            request.transport.abort()
            return response
        done = {"choices": [{"index": 0, "delta": {"content": "whole"}, "finish_reason": "stop"}]}
        await response.write(b"data: " + json.dumps({**chunk, **done}).encode() + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    async with _raw_app({"/v1/chat/completions": chat}) as base_url:
        config = OpenAIModelConfig(base_url=base_url, model="m", stream=True, backoff_base_s=0.001)
        turn = await models(OpenAIChatModel(config)).complete(USER)
    assert turn.content == "whole" and attempts == 2
    assert "connection error" in caplog.text, caplog.text  # not mistaken for a finished answer


@pytest.mark.parametrize("suffix", ["", "/"])
async def test_chat_url_under_a_path_prefix(models, suffix: str) -> None:
    """The chat URL is joined to the base URL once (llm/openai_client.py, _chat_url), as the SDK
    joins a relative path: under a gateway's prefix, with or without a trailing slash."""
    seen: list[str] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response(_completion("p"))

    async with _raw_app({"/gw/openai/v1/chat/completions": chat}) as base_url:
        prefixed = base_url.replace("/v1", "/gw/openai/v1") + suffix
        model = models(OpenAIChatModel(OpenAIModelConfig(base_url=prefixed, model="m")))
        assert (await model.complete(USER)).content == "p"
    assert seen == ["/gw/openai/v1/chat/completions"]


async def test_cookie_set_by_the_endpoint_comes_back(models) -> None:
    """A sticky load balancer's cookie is kept and sent again (the jar reads a response only
    when it sets a cookie: llm/openai_client.py, _SetCookieOnly)."""
    seen: list[str | None] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        response = web.json_response(_completion("p"))
        if len(seen) == 2:  # not on the first answer: one without a cookie changes nothing
            response.set_cookie("lb", "node-7")
        return response

    async with _raw_app({"/v1/chat/completions": chat}) as base_url:
        model = models(OpenAIChatModel(OpenAIModelConfig(base_url=base_url, model="m")))
        for _ in range(4):
            await model.complete(USER)
        assert type(model._sdk()._client.cookies).__name__ == "_SetCookieOnly"  # the lean jar is in place
    assert seen == [None, None, "lb=node-7", "lb=node-7"]


@contextlib.asynccontextmanager
async def _raw_app(routes: dict[str, Any]) -> AsyncIterator[str]:
    """A bare aiohttp app on loopback for behaviours the scripted server deliberately lacks."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


def _completion(content: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": content}
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
    }


# --------------------------------------------------------------------------------------------
# Config, request body and keys


def test_model_satisfies_chat_model_protocol() -> None:
    model = OpenAIChatModel(OpenAIModelConfig(base_url="http://127.0.0.1:1/v1", model="m"))
    assert isinstance(model, ChatModel) and model.name == "m"


def test_config_rejects_bad_input() -> None:
    with pytest.raises(ValidationError, match="http"):
        OpenAIModelConfig(base_url="127.0.0.1:8000", model="m")
    with pytest.raises(ValidationError):
        OpenAIModelConfig(base_url="http://x/v1", model="m", api_key="sk-no")  # keys are not config


def test_request_body_reasoning_styles_and_extra_body() -> None:
    msgs = [{"role": "user", "content": "q"}]
    routed = SamplingParams(
        reasoning_effort="high", extra_body={"provider": {"order": ["a"]}, "reasoning": {"max_tokens": 9}}
    )
    body = build_request_body(
        OpenAIModelConfig(base_url="https://openrouter.ai/api/v1", model="m"), msgs, None, routed
    )
    assert body["reasoning"] == {"effort": "high", "max_tokens": 9} and body["provider"] == {"order": ["a"]}
    assert "tools" not in body and "reasoning_effort" not in body

    off = SamplingParams(reasoning_disabled=True, max_tokens=5)
    openrouter = OpenAIModelConfig(base_url="https://openrouter.ai/api/v1", model="m")
    assert build_request_body(openrouter, msgs, [], off)["reasoning"] == {"enabled": False}
    openai_cfg = OpenAIModelConfig(
        base_url="http://h/v1", model="m", max_tokens_field="max_completion_tokens"
    )
    assert build_request_body(openai_cfg, msgs, None, routed)["reasoning_effort"] == "high"
    assert build_request_body(openai_cfg, msgs, None, off)["max_completion_tokens"] == 5
    vllm = OpenAIModelConfig(base_url="http://h/v1", model="m", reasoning_style="chat_template")
    assert build_request_body(vllm, msgs, None, off)["chat_template_kwargs"] == {"enable_thinking": False}
    silent = OpenAIModelConfig(base_url="http://h/v1", model="m", reasoning_style="none")
    assert "reasoning_effort" not in build_request_body(silent, msgs, None, routed)


async def test_extra_body_reaches_the_wire(scripted_server, models) -> None:
    srv = await scripted_server([Reply(content="ok")])
    sampling = SamplingParams(reasoning_effort="low", extra_body={"provider": {"sort": "price"}, "top_k": 5})
    await models(make_model(srv, reasoning_style="openrouter")).complete(USER, sampling=sampling)
    sent = srv.requests[0]
    assert (
        sent["reasoning"] == {"effort": "low"}
        and sent["provider"] == {"sort": "price"}
        and sent["top_k"] == 5
    )


def test_key_resolution(monkeypatch) -> None:
    env = {"OPENAI_API_KEY": "oa", "OPENROUTER_API_KEY": "or"}
    assert resolve_api_key(None, "http://h/v1", env).source == "OPENAI_API_KEY"
    assert resolve_api_key(None, "https://openrouter.ai/api/v1", env).source == "OPENROUTER_API_KEY"
    assert resolve_api_key(None, "http://h/v1", {"OPENROUTER_API_KEY": "or"}).source == "OPENROUTER_API_KEY"
    none = resolve_api_key(None, "http://h/v1", {})
    assert none.secret is None and "OPENAI_API_KEY" in none.describe()
    found = resolve_api_key("CUSTOM", "http://h/v1", {"CUSTOM": SECRET})
    assert found.secret is not None and SECRET not in repr(found) and SECRET not in found.describe()
    with pytest.raises(MissingApiKeyError, match="CUSTOM"):
        resolve_api_key("CUSTOM", "http://h/v1", {"CUSTOM": "  "})
    with pytest.raises(MissingApiKeyError):
        OpenAIChatModel(OpenAIModelConfig(base_url="http://h/v1", model="m", api_key_env="NOT_SET_ANYWHERE"))
    assert redact(f"bad key {SECRET}!", found.secret) == "bad key ***!"


def test_parse_retry_after() -> None:
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:10 GMT"}, now=1445412480.0) == 10.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


# --------------------------------------------------------------------------------------------
# Stream assembly edge cases (chunks as real SDK objects)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> ChatCompletionChunk:
    return ChatCompletionChunk.model_validate(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def test_stream_assembler_handles_reused_index_and_missing_finish() -> None:
    asm = StreamAssembler("m")
    asm.add(
        _chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x":'}}]})
    )
    asm.add(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}))
    asm.add(_chunk({"tool_calls": [{"index": 0, "id": "b", "function": {"name": "g", "arguments": "{}"}}]}))
    with pytest.raises(Exception, match="truncated"):
        asm.turn()
    asm.add(_chunk({}, finish="tool_calls"))
    turn = asm.turn()
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [("a", "f", '{"x":1}'), ("b", "g", "{}")]


# --------------------------------------------------------------------------------------------
# Reasoning extraction (pure functions)


def test_reasoning_from_fields() -> None:
    assert reasoning_from_fields({"reasoning_content": "a", "reasoning": "b"}) == "a"
    assert reasoning_from_fields({"reasoning": "b", "reasoning_details": [{"text": "c"}]}) == "b"
    details = [
        {"type": "reasoning.text", "text": "x"},
        {"type": "reasoning.encrypted", "data": "zzz"},
        {"summary": "y"},
    ]
    assert reasoning_from_fields({"reasoning_details": details}) == "xy"
    assert reasoning_from_fields({"reasoning": "", "reasoning_details": []}) is None
    assert reasoning_from_fields(None) is None


def test_split_think() -> None:
    assert split_think("<think>\nhmm\n</think>\nAnswer") == ("Answer", "hmm")
    assert split_think("  <think>hmm</think>") == (None, "hmm")
    assert split_think("<think>cut off while thinking") == (None, "cut off while thinking")
    assert split_think("hmm, template opened the block</think>\n\nAnswer") == (
        "Answer",
        "hmm, template opened the block",
    )
    assert split_think("no tags here") == ("no tags here", None)
    assert split_think("text mentioning <think> later") == ("text mentioning <think> later", None)
    assert split_think(None) == (None, None)


def test_extract_and_combine_reasoning() -> None:
    assert extract_reasoning({"reasoning": "field"}, "<think>inline</think>ans") == ("ans", "field\n\ninline")
    assert extract_reasoning({"reasoning": "same"}, "<think>same</think>ans") == ("ans", "same")
    assert combine_reasoning(None, "", "  ") is None


def _tool_schema(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": {}}},
    }


def test_turn_from_payload_normalises_odd_but_usable_bodies():
    from trajforge.llm.openai_client import MalformedResponseError, turn_from_payload

    payload = {
        "model": "m",
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "content": "",
                    "reasoning": "think first",
                    "tool_calls": [
                        {"id": "c1", "function": {"name": "terminal", "arguments": {"command": "ls"}}}
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }
    turn = turn_from_payload(payload, "default")
    assert turn.content is None and turn.reasoning == "think first"
    assert turn.tool_calls[0].arguments == '{"command":"ls"}'
    assert turn.usage.total_tokens == 5 and turn.model == "m"
    for bad in ([], {"choices": []}, {"error": {"message": "overloaded"}}, {"choices": [{"message": None}]}):
        with pytest.raises(MalformedResponseError):
            turn_from_payload(bad, "default")
