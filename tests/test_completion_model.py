"""CompletionChatModel against the scripted token server on 127.0.0.1: wire formats, parsing, errors."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from transformers import AutoTokenizer

from trajforge.llm.chat_template import ChatTemplate, TemplateError
from trajforge.llm.completion_model import CompletionChatModel, CompletionModelConfig
from trajforge.llm.types import ModelError, ModelErrorKind, SamplingParams
from trajforge.protocols import ChatModel
from trajforge.testing.tiny import build_tiny_tokenizer
from trajforge.testing.token_server import HTTPFailure, ScriptedReply, TokenServer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
USER = [{"role": "user", "content": "List the files."}]
CALL = '<think>\nLook first.\n</think>\n\nSure.\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tok") / "chatml"
    build_tiny_tokenizer(path, "chatml")
    return str(path)


@pytest.fixture(scope="module")
def tok(tok_dir: str) -> Any:
    return AutoTokenizer.from_pretrained(tok_dir)


def model_for(
    tok_dir: str, server: TokenServer, endpoint: str = "vllm_generate", **kw: Any
) -> CompletionChatModel:
    cfg = CompletionModelConfig(
        tokenizer_path=tok_dir, base_url=server.base_url, endpoint=endpoint, backoff_base_s=0, **kw
    )
    return CompletionChatModel(cfg)


@pytest.mark.parametrize("endpoint", ["vllm_generate", "sglang_generate", "openai_completions"])
async def test_one_turn_on_each_endpoint(tok_dir: str, tok: Any, endpoint: str) -> None:
    async with TokenServer(tok, [CALL]) as server:
        model = model_for(tok_dir, server, endpoint, model="tiny")
        assert isinstance(model, ChatModel)
        turn = await model.complete(
            USER, TOOLS, SamplingParams(temperature=0.7, max_tokens=300, seed=5, stop=["</x>"])
        )
        await model.aclose()
    served = server.served[0]
    prompt = ChatTemplate(tok).prompt_ids(USER, TOOLS)
    body = server.requests[0]
    if endpoint == "vllm_generate":
        assert body["route"] == "/generate" and body["prompt"] == {"prompt_token_ids": prompt}
        assert body["logprobs"] == 0 and body["max_tokens"] == 300 and body["seed"] == 5
        assert body["temperature"] == 0.7 and body["stop"] == ["</x>"]
    elif endpoint == "sglang_generate":
        assert body["route"] == "/generate" and body["input_ids"] == prompt and body["return_logprob"] is True
        assert body["sampling_params"] == {
            "max_new_tokens": 300,
            "temperature": 0.7,
            "stop": ["</x>"],
            "sampling_seed": 5,
        }
    else:
        assert body["route"] == "/v1/completions" and body["prompt"] == prompt and body["model"] == "tiny"
        assert body["logprobs"] == 1 and body["return_tokens_as_token_ids"] is True
    assert turn.content == "Sure." and turn.reasoning == "Look first."
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("terminal", '{"command": "ls"}')]
    assert turn.finish_reason == "tool_calls" and turn.parse_errors == []
    trace = turn.token_trace
    assert trace is not None
    assert trace.prompt_ids == prompt and trace.completion_ids == served.ids
    assert trace.completion_logprobs == served.logprobs and trace.finish_reason == "stop"
    assert turn.usage.prompt_tokens == len(prompt) and turn.usage.completion_tokens == len(served.ids)
    assert trace.completion_ids[-1] == tok.eos_token_id


async def test_malformed_tool_call_is_a_parse_error_not_a_final_answer(tok_dir: str, tok: Any) -> None:
    bad = 'Trying.\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"\n</tool_call>'
    half = bad + '\n<tool_call>\n{"name": "terminal", "arguments": {"command": "pwd"}}\n</tool_call>'
    async with TokenServer(tok, [bad, half, '<tool_call>\n{"name": "terminal"']) as server:
        model = model_for(tok_dir, server)
        only_bad = await model.complete(USER, TOOLS)
        mixed = await model.complete(USER, TOOLS)
        unclosed = await model.complete(USER, TOOLS)
        await model.aclose()
    assert only_bad.tool_calls == [] and len(only_bad.parse_errors) == 1
    assert "invalid JSON" in only_bad.parse_errors[0] and "terminal" in only_bad.parse_errors[0]
    assert only_bad.content == "Trying."
    assert [c.arguments for c in mixed.tool_calls] == ['{"command": "pwd"}'] and len(mixed.parse_errors) == 1
    assert unclosed.tool_calls == [] and unclosed.parse_errors


async def test_tool_call_ids_stay_unique_across_turns(tok_dir: str, tok: Any) -> None:
    async with TokenServer(tok, [CALL, CALL]) as server:
        model = model_for(tok_dir, server)
        first = await model.complete(USER, TOOLS)
        messages = [
            *USER,
            first.to_message(),
            {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "a"},
        ]
        second = await model.complete(messages, TOOLS)
        await model.aclose()
    assert first.tool_calls[0].id != second.tool_calls[0].id


async def test_http_500_then_success_is_retried(tok_dir: str, tok: Any) -> None:
    async with TokenServer(tok, [HTTPFailure(500), HTTPFailure(503), "Hello there."]) as server:
        model = model_for(tok_dir, server, max_retries=3)
        turn = await model.complete(USER, TOOLS)
        await model.aclose()
    assert turn.content == "Hello there." and turn.finish_reason == "stop"
    assert len(server.requests) == 3 and len(server.served) == 1
    assert server.requests[0]["prompt"] == server.requests[2]["prompt"]


async def test_errors_are_classified(tok_dir: str, tok: Any) -> None:
    script = [HTTPFailure(500, "boom")] * 3 + [HTTPFailure(400, "bad request"), HTTPFailure(401, "no key")]
    script.append(HTTPFailure(400, "This model's maximum context length is 10 tokens"))
    async with TokenServer(tok, script) as server:
        model = model_for(tok_dir, server, max_retries=2)
        with pytest.raises(ModelError) as transient:
            await model.complete(USER)
        assert transient.value.kind is ModelErrorKind.TRANSIENT and transient.value.attempts == 3
        assert transient.value.status == 500 and "boom" in str(transient.value)
        for kind in (ModelErrorKind.PERMANENT, ModelErrorKind.AUTH, ModelErrorKind.CONTEXT_LENGTH):
            with pytest.raises(ModelError) as err:
                await model.complete(USER)
            assert err.value.kind is kind and err.value.attempts == 1
        await model.aclose()
    assert len(server.requests) == 6  # 3 attempts, then one each: permanent errors are not retried


async def test_unreachable_server_is_a_transient_model_error(tok_dir: str) -> None:
    cfg = CompletionModelConfig(
        tokenizer_path=tok_dir, base_url="http://127.0.0.1:9", max_retries=1, backoff_base_s=0
    )
    model = CompletionChatModel(cfg)
    with pytest.raises(ModelError, match="connection error") as err:
        await model.complete(USER)
    await model.aclose()
    assert err.value.kind is ModelErrorKind.TRANSIENT and err.value.attempts == 2


async def test_prompt_over_the_context_limit_is_refused_before_sending(tok_dir: str, tok: Any) -> None:
    async with TokenServer(tok, ["x"]) as server:
        model = model_for(tok_dir, server, max_context_tokens=8)
        with pytest.raises(ModelError, match="does not fit") as err:
            await model.complete(USER, TOOLS)
        await model.aclose()
    assert err.value.kind is ModelErrorKind.CONTEXT_LENGTH and server.requests == []


async def test_completions_server_without_token_ids_is_a_clear_permanent_error(
    tok_dir: str, tok: Any
) -> None:
    async with TokenServer(tok, ["hi"]) as server:
        model = model_for(tok_dir, server, "openai_completions")
        sampling = SamplingParams(extra_body={"return_tokens_as_token_ids": False})
        with pytest.raises(ModelError, match="return_tokens_as_token_ids") as err:
            await model.complete(USER, None, sampling)
        await model.aclose()
    assert err.value.kind is ModelErrorKind.PERMANENT


async def test_history_from_elsewhere_is_rendered_afresh_with_a_warning(
    tok_dir: str, tok: Any, caplog: pytest.LogCaptureFixture
) -> None:
    foreign = [*USER, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Again."}]
    async with TokenServer(tok, [ScriptedReply("ok")]) as server:
        model = model_for(tok_dir, server)
        with caplog.at_level(logging.WARNING):
            turn = await model.complete(foreign)
        await model.aclose()
    assert turn.token_trace is not None
    assert turn.token_trace.prompt_ids == ChatTemplate(tok).prompt_ids(foreign)
    assert "no token history" in caplog.text


def test_config_and_tokenizer_errors_say_what_to_do(tmp_path: Any, tok_dir: str) -> None:
    with pytest.raises(TemplateError, match="not a local directory"):
        CompletionChatModel(CompletionModelConfig(tokenizer_path=str(tmp_path / "nope"), base_url="http://x"))
    with pytest.raises(ValueError, match="base_url must be"):
        CompletionModelConfig(tokenizer_path=tok_dir, base_url="127.0.0.1:8000")
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        CompletionChatModel(CompletionModelConfig(tokenizer_path=tok_dir, base_url="http://x", parser="nope"))
    with pytest.raises(TemplateError, match="not a single token"):
        CompletionChatModel(
            CompletionModelConfig(tokenizer_path=tok_dir, base_url="http://x", end_of_turn="</end>")
        )
    cfg = CompletionModelConfig(
        tokenizer_path=tok_dir, base_url="http://h:1/v1/", endpoint="openai_completions"
    )
    assert cfg.url() == "http://h:1/v1/completions"
    assert cfg.model_copy(update={"endpoint": "sglang_generate"}).url() == "http://h:1/generate"
