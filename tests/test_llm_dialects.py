"""Endpoint dialects (issue 37): which server is behind a URL, and how each one is spoken to.

Against the scripted server standing in for each kind (``testing.identities``): the probe names
every dialect from what its server says about itself; past reasoning goes back under the field the
server reads; calls a server returned as text are recovered and run (and recorded as such); usage a
server did not report stays unknown; a request-validation error is not retried. The real llama.cpp
servers are in tests/test_llamacpp_servers.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from trajforge.agent import AgentConfig, AgentLoop
from trajforge.llm.dialects import DIALECTS, get_dialect
from trajforge.llm.openai_client import OpenAIChatModel, OpenAIModelConfig
from trajforge.llm.server_probe import by_host, probe_server
from trajforge.llm.types import ModelError, ModelErrorKind, SamplingParams, Usage
from trajforge.record import Record
from trajforge.record.upgrade import load
from trajforge.sandbox import create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.testing.identities import IDENTITIES, Identity
from trajforge.testing.scripted_server import Reply, ToolCallSpec
from trajforge.tools import ToolContext, default_registry
from trajforge.tools.base import openai_schema
from trajforge.trajectory import to_sharegpt

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
HERMES_CALL = '<tool_call>\n{"name": "terminal", "arguments": {"command": "echo hi"}}\n</tool_call>'
USER = [{"role": "user", "content": "say hi"}]


def model_for(srv: Any, **overrides: Any) -> OpenAIChatModel:
    settings: dict[str, Any] = {
        "base_url": srv.base_url,
        "model": "scripted",
        "max_retries": 3,
        "backoff_base_s": 0.001,
        "backoff_max_s": 0.01,
    }
    return OpenAIChatModel(OpenAIModelConfig(**{**settings, **overrides}))


@pytest.fixture
async def models() -> Any:
    made: list[OpenAIChatModel] = []

    def keep(model: OpenAIChatModel) -> OpenAIChatModel:
        made.append(model)
        return model

    yield keep
    for model in made:
        await model.aclose()


# --------------------------------------------------------------------------------------------
# Which server: the probe


def test_every_dialect_has_a_server_that_names_it() -> None:
    """A dialect no server can be identified as would only ever be chosen by hand."""
    assert set(DIALECTS) - {"openrouter"} == set(IDENTITIES)  # openrouter: by its host


@pytest.mark.parametrize("name", sorted(IDENTITIES))
async def test_probe_names_each_server(scripted_server, name: str) -> None:
    srv = await scripted_server([Reply(content="x")], identity=IDENTITIES[name])
    info = await probe_server(srv.base_url)
    assert info.dialect is DIALECTS[name]
    assert info.identified is (name != "openai")  # "openai": nothing named it, the fallback
    expected_context = {"trajforge": 1024, "vllm": 4096, "llamacpp": 1024}.get(name)
    assert info.context_length == expected_context
    assert srv.counters["requests"] == 0  # the probe sends no chat request


@pytest.mark.parametrize(
    ("identity", "dialect", "evidence"),
    [
        (Identity(owned_by="x", headers={"Server": "llama.cpp"}), "llamacpp", "Server header"),
        (Identity(models_route=False, routes={"/props": {"n_ctx": 512}}), "llamacpp", "/props"),
        (Identity(models_route=False, routes={"/version": {"version": "1"}}), "vllm", "/version"),
        (Identity(models_route=False, routes={"/get_server_info": {}}), "sglang", "/get_server_info"),
        (Identity(models_route=False, routes={"/api/version": {"version": "1"}}), "ollama", "/api/version"),
        (Identity(models_route=False), "openai", "plain OpenAI assumed"),
    ],
)
async def test_probe_without_an_owner_asks_the_routes_only_one_server_has(
    scripted_server, identity: Identity, dialect: str, evidence: str
) -> None:
    srv = await scripted_server([Reply(content="x")], identity=identity)
    info = await probe_server(srv.base_url)
    assert info.dialect.name == dialect and evidence in info.evidence
    if identity.routes.get("/props"):
        assert info.context_length == 512  # llama-server's real slot context, from /props


@pytest.mark.parametrize("key", ["max_model_len", "context_length", "context_window"])
async def test_a_context_a_server_states_is_kept_though_nothing_names_the_server(
    scripted_server, key: str
) -> None:
    """The one place an endpoint's context is read (env eval's token-budget clamp asks it too):
    a card of a server the probe cannot name still states its context."""
    srv = await scripted_server([Reply(content="x")], identity=Identity(owned_by="someone", card={key: 2048}))
    info = await probe_server(srv.base_url)
    assert info.dialect.name == "openai" and not info.identified
    assert info.context_length == 2048


def test_hosted_apis_are_known_by_host_without_a_request() -> None:
    assert by_host("https://openrouter.ai/api/v1").dialect.name == "openrouter"  # type: ignore[union-attr]
    assert by_host("https://api.openai.com/v1").dialect.name == "openai"  # type: ignore[union-attr]
    assert by_host("http://127.0.0.1:8000/v1") is None
    assert by_host("https://notopenrouter.ai/v1") is None


async def test_an_unreachable_server_is_plain_openai_not_an_error() -> None:
    info = await probe_server("http://127.0.0.1:9/v1", timeout_s=1.0)
    assert info.dialect.name == "openai" and not info.identified


async def test_explicit_dialect_skips_the_probe(scripted_server, models) -> None:
    srv = await scripted_server([Reply(content="hi")], identity=IDENTITIES["vllm"])
    model = models(model_for(srv, endpoint_dialect="llamacpp"))
    await model.complete(USER)
    assert srv.counters["identity_requests"] == 0
    assert model.server is not None and model.server.dialect.name == "llamacpp"


async def test_check_says_which_server_and_dialect(scripted_server, models) -> None:
    srv = await scripted_server([Reply(content="hi")], identity=IDENTITIES["llamacpp"])
    model = models(model_for(srv))
    assert model.endpoint_summary is None  # not probed yet
    await model.check()
    line = model.endpoint_summary
    assert line is not None and "llama.cpp (llama-server)" in line and "dialect llamacpp" in line
    assert "owned_by 'llamacpp'" in line and "context 1024 tokens" in line
    assert "parsed with 'auto'" in line  # llama-server may not parse calls: text calls are recovered


def test_unknown_dialect_and_parser_names_are_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="choose one of: auto, openai"):
        OpenAIModelConfig(base_url="http://x/v1", model="m", endpoint_dialect="vlm")
    with pytest.raises(ValueError, match="unknown tool-call parser 'hermez'"):
        OpenAIModelConfig(base_url="http://x/v1", model="m", tool_call_parser="hermez")
    with pytest.raises(ValueError, match="unknown endpoint dialect"):
        get_dialect("nope")


# --------------------------------------------------------------------------------------------
# Reasoning on the way out


def _two_turns(reasoning: str = "6*7 is 42") -> list[dict[str, Any]]:
    return [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "reasoning": reasoning,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]


@pytest.mark.parametrize(
    ("name", "field"),
    [("llamacpp", "reasoning_content"), ("vllm", "reasoning_content"), ("trajforge", "reasoning")],
)
async def test_past_reasoning_goes_back_under_the_field_the_server_reads(
    scripted_server, models, name: str, field: str
) -> None:
    srv = await scripted_server([Reply(content="done")], identity=IDENTITIES[name])
    history = _two_turns()
    await models(model_for(srv)).complete(history, TOOLS)
    sent = srv.requests[0]["messages"][1]
    other = "reasoning" if field == "reasoning_content" else "reasoning_content"
    assert sent[field] == "6*7 is 42" and other not in sent
    assert history[1]["reasoning"] == "6*7 is 42" and "reasoning_content" not in history[1]  # ours unchanged


async def test_a_server_that_drops_unknown_fields_gets_reasoning_inline(scripted_server, models) -> None:
    """llama-cpp-python keeps only content and tool_calls of an assistant message, and wants content a
    string: the reasoning goes inline, as the template itself writes it, and null becomes ""."""
    srv = await scripted_server([Reply(content="done")], identity=IDENTITIES["llamacpp_python"])
    history = _two_turns()
    history.append({"role": "assistant", "content": None, "tool_calls": history[1]["tool_calls"]})
    history.append({"role": "tool", "tool_call_id": "c1", "content": "ok"})
    await models(model_for(srv)).complete(history, TOOLS)
    first, second = srv.requests[0]["messages"][1], srv.requests[0]["messages"][3]
    assert first["content"] == "<think>\n6*7 is 42\n</think>\n"
    assert "reasoning" not in first and "reasoning_content" not in first
    assert second["content"] == ""


async def test_llama_cpp_samplers_are_turned_off_unless_the_request_sets_them(
    scripted_server, models
) -> None:
    """llama.cpp truncates the distribution by default (top_k 40, top_p 0.95, min_p 0.05): trajforge
    asks for the model's own, as the other servers sample; a value the request sets is kept."""
    srv = await scripted_server([Reply(content="a"), Reply(content="b")], identity=IDENTITIES["llamacpp"])
    model = models(model_for(srv))
    await model.complete(USER, sampling=SamplingParams(temperature=1.0))
    await model.complete([{"role": "user", "content": "again"}], sampling=SamplingParams(top_p=0.5))
    first, second = srv.requests
    assert (first["top_k"], first["top_p"], first["min_p"]) == (0, 1.0, 0.0)
    assert second["top_p"] == 0.5 and second["top_k"] == 0
    vllm = await scripted_server([Reply(content="a")], identity=IDENTITIES["vllm"])
    await models(model_for(vllm)).complete(USER)
    assert not {"top_k", "min_p"} & set(vllm.requests[0])  # nothing sent a server did not need


# --------------------------------------------------------------------------------------------
# Calls returned as text


@pytest.mark.parametrize("stream", [False, True])
async def test_calls_a_server_returned_as_text_are_recovered(scripted_server, models, stream: bool) -> None:
    srv = await scripted_server(
        [Reply(content=f"Let me look.\n{HERMES_CALL}", finish_reason="stop")],
        identity=IDENTITIES["llamacpp_python"],
    )
    turn = await models(model_for(srv, stream=stream)).complete(USER, TOOLS)
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("terminal", '{"command": "echo hi"}')]
    assert turn.content == "Let me look." and turn.finish_reason == "tool_calls"
    assert turn.calls_from_text == "hermes" and turn.parse_errors == []
    assert turn.tool_calls[0].id.startswith("call_")


@pytest.mark.parametrize(
    ("identity", "parser", "recovered"),
    [
        ("trajforge", "auto", False),  # the server parses calls itself: left to the loop's check
        ("trajforge", "hermes", True),  # named: parsed whatever the dialect
        ("llamacpp_python", "none", False),
        ("llamacpp_python", "auto", True),
    ],
)
async def test_when_text_calls_are_parsed(scripted_server, models, identity, parser, recovered) -> None:
    srv = await scripted_server([Reply(content=HERMES_CALL)], identity=IDENTITIES[identity])
    turn = await models(model_for(srv, tool_call_parser=parser)).complete(USER, TOOLS)
    assert bool(turn.tool_calls) is recovered
    assert (turn.calls_from_text is not None) is recovered


async def test_text_that_calls_no_offered_tool_stays_an_answer(scripted_server, models) -> None:
    """An answer holding JSON with a "name" key is not taken for a call of a tool never offered."""
    srv = await scripted_server(
        [Reply(content='{"name": "Ada", "arguments": {"born": 1815}}')],
        identity=IDENTITIES["llamacpp_python"],
    )
    turn = await models(model_for(srv)).complete(USER, TOOLS)
    assert turn.tool_calls == [] and turn.content == '{"name": "Ada", "arguments": {"born": 1815}}'
    assert turn.calls_from_text is None and turn.parse_errors == []


async def test_broken_call_markup_becomes_a_parse_error(scripted_server, models) -> None:
    srv = await scripted_server(
        [Reply(content='<tool_call>\n{"name": "terminal", "arguments": {"command": \n</tool_call>')],
        identity=IDENTITIES["llamacpp_python"],
    )
    turn = await models(model_for(srv)).complete(USER, TOOLS)
    assert turn.tool_calls == [] and len(turn.parse_errors) == 1


@pytest.fixture
async def sandbox() -> Any:
    sb = await create_sandbox_factory(SandboxConfig(kind="local")).create("dialect-test")
    try:
        yield sb
    finally:
        await sb.close()


async def test_a_recovered_call_runs_is_recorded_and_exports_as_a_parsed_one(
    scripted_server, models, sandbox
) -> None:
    """The same conversation from a server that parsed the call and one that returned it as text:
    the tool runs in both, only the second is recorded as recovered, and the exports are equal."""
    as_text = await scripted_server(
        [Reply(content=HERMES_CALL), Reply(content="hi")], identity=IDENTITIES["llamacpp_python"]
    )
    parsed = await scripted_server(
        [Reply(tool_calls=[ToolCallSpec("terminal", {"command": "echo hi"})]), Reply(content="hi")]
    )
    tools = default_registry().for_toolsets(["terminal"])
    results = []
    for srv in (as_text, parsed):
        loop = AgentLoop(
            models(model_for(srv)), tools, ToolContext(task_id="t", sandbox=sandbox), AgentConfig()
        )
        results.append(await loop.run(list(USER)))
    text_run, parsed_run = results
    for result in results:
        assert result.final_answer == "hi" and result.tool_stats["terminal"].success == 1
    call_id = text_run.messages[1]["tool_calls"][0]["id"]
    assert text_run.recovered_calls == [call_id] and parsed_run.recovered_calls == []
    schemas = [openai_schema(t) for t in tools]

    def exported(messages: list[dict[str, Any]]) -> list[dict[str, str]]:  # call ids are each server's own
        ids = [c["id"] for m in messages for c in m.get("tool_calls") or ()]
        turns = to_sharegpt(messages, schemas)
        return [{**t, "value": t["value"].replace(ids[0], "CALL")} for t in turns]

    assert exported(text_run.messages) == exported(parsed_run.messages)
    assert "CALL" in str(exported(text_run.messages))


def test_records_carry_recovered_calls_and_older_lines_read_without() -> None:
    record = Record(key="k", status="completed", recovered_calls=["call_1"])
    assert load(record.model_dump(mode="json")).recovered_calls == ["call_1"]
    old = record.model_dump(mode="json")
    del old["recovered_calls"]
    assert load(old).recovered_calls == []


# --------------------------------------------------------------------------------------------
# Usage unknown is unknown


async def test_a_stream_without_a_usage_chunk_is_unknown_usage(scripted_server, models) -> None:
    srv = await scripted_server([Reply(content="hi")], identity=IDENTITIES["llamacpp_python"])
    turn = await models(model_for(srv, stream=True)).complete(USER)
    assert "stream_options" not in srv.requests[0]  # not asked of a server that ignores it
    assert turn.usage == Usage()  # every count None: unknown, not zero
    assert turn.usage.total_tokens is None


async def test_reported_usage_is_kept_and_missing_details_are_unknown(scripted_server, models) -> None:
    srv = await scripted_server([Reply(content="hi", usage={"prompt_tokens": 7, "completion_tokens": 2})])
    turn = await models(model_for(srv)).complete(USER)
    assert (turn.usage.prompt_tokens, turn.usage.completion_tokens, turn.usage.total_tokens) == (7, 2, 9)
    assert turn.usage.reasoning_tokens is None and turn.usage.cached_tokens is None


def test_a_sum_with_an_unknown_part_is_unknown() -> None:
    known = Usage(prompt_tokens=5, completion_tokens=1, total_tokens=6)
    assert (Usage.zero() + known).total_tokens == 6
    assert (Usage.zero() + known + Usage()).total_tokens is None
    assert Usage.zero().total_tokens == 0


# --------------------------------------------------------------------------------------------
# Request-validation errors are permanent


VALIDATION_500 = [
    # llama-cpp-python 0.3.36's answer to a token-id prompt (FastAPI's RequestValidationError as text)
    "4 validation errors:\n  {'type': 'string_type', 'loc': ('body', 'prompt', 'str'), 'msg': "
    "'Input should be a valid string', 'input': [1, 2, 3]}",
    # pydantic's own message
    "1 validation error for CreateCompletionRequest\nprompt\n  Input should be a valid string "
    "[type=string_type, input_value=[1, 2, 3], input_type=list]",
]


@pytest.mark.parametrize("text", VALIDATION_500)
async def test_a_500_whose_body_is_a_validation_error_is_not_retried(scripted_server, models, text) -> None:
    srv = await scripted_server([Reply.fail(500, text)] * 5)
    with pytest.raises(ModelError) as info:
        await models(model_for(srv)).complete(USER, sampling=SamplingParams(max_tokens=3))
    assert info.value.kind is ModelErrorKind.PERMANENT and info.value.status == 500
    assert srv.counters["requests"] == 1 and "validation" in str(info.value)


async def test_a_plain_500_is_still_retried(scripted_server, models) -> None:
    srv = await scripted_server([Reply.fail(500, "CUDA error: out of memory"), Reply(content="ok")])
    turn = await models(model_for(srv)).complete(USER)
    assert turn.content == "ok" and srv.counters["requests"] == 2


# --------------------------------------------------------------------------------------------
# Token level (tests/test_llamacpp_servers.py runs it against the real servers)


def test_llama_servers_completion_logprobs_parse_into_the_trace() -> None:
    from trajforge.llm.completion_wire import parse_response

    body = {
        "choices": [
            {
                "text": "hi",
                "finish_reason": "stop",
                "logprobs": {
                    "content": [
                        {"id": 17, "token": "hi", "bytes": [104, 105], "logprob": -0.25, "top_logprobs": []},
                        {"id": 2, "token": "<|im_end|>", "bytes": [], "logprob": -0.01, "top_logprobs": []},
                    ]
                },
            }
        ]
    }
    sampled = parse_response("openai_completions", body)
    assert (sampled.ids, sampled.logprobs, sampled.finish_reason) == ([17, 2], [-0.25, -0.01], "stop")


async def _token_server(identity_owner: str, answer: tuple[int, Any]) -> Any:
    """A server that names itself ``identity_owner`` and answers every completion with ``answer``."""
    from aiohttp import web

    app = web.Application()
    seen: list[Any] = []

    async def models_route(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tiny", "owned_by": identity_owner}]})

    async def completions(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.json_response(answer[1], status=answer[0])

    app.add_routes([web.get("/v1/models", models_route), web.post("/v1/completions", completions)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}", seen


async def test_token_exact_preflight_refuses_a_server_without_token_id_prompts() -> None:
    from trajforge.endpoint import EndpointConfig, build_token_model, embedded_weights, preflight_model

    refusal = {"error": {"message": VALIDATION_500[0], "type": "internal_server_error"}}
    runner, url, seen = await _token_server("me", (500, refusal))
    model = build_token_model(EndpointConfig(model="tiny", base_url=url, tokenizer=str(embedded_weights())))
    try:
        with pytest.raises(ModelError) as info:
            await preflight_model(model)
    finally:
        await model.aclose()
        await runner.cleanup()
    assert len(seen) == 1 and isinstance(seen[0]["prompt"], list)  # one short token-id request, no retry
    assert seen[0]["max_tokens"] == 1
    assert info.value.kind is ModelErrorKind.PERMANENT
    assert "cannot sample from token ids" in str(info.value) and "takes no token-id prompts" in str(
        info.value
    )


async def test_token_exact_preflight_passes_on_llama_server_and_says_so() -> None:
    from trajforge.endpoint import EndpointConfig, build_token_model, embedded_weights, preflight_model

    ok = {
        "choices": [
            {"text": "x", "finish_reason": "length", "logprobs": {"content": [{"id": 5, "logprob": -1.0}]}}
        ]
    }
    runner, url, seen = await _token_server("llamacpp", (200, ok))
    model = build_token_model(EndpointConfig(model="tiny", base_url=url, tokenizer=str(embedded_weights())))
    lines: list[str] = []
    try:
        await preflight_model(model, lines.append)
    finally:
        await model.aclose()
        await runner.cleanup()
    assert (
        len(lines) == 1
        and "dialect llamacpp" in lines[0]
        and "token-exact via openai_completions" in lines[0]
    )
    assert seen[0]["top_k"] == 0 and seen[0]["min_p"] == 0.0  # llama.cpp's samplers off here too
