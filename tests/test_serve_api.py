"""``trajforge serve`` over real HTTP on 127.0.0.1, with a tiny random transformers model.

Outputs that must be known in advance (tool calls, reasoning) are scripted with a logits hook on
the real model (:class:`ScriptedLogits`); everything else -- template, forward pass, batching,
logprobs, SSE -- runs for real, and one chat test uses the untouched model end to end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import torch
from openai import AsyncOpenAI
from transformers import AutoModelForCausalLM, AutoTokenizer

from trajforge.serve.app import RunningServer, run_server
from trajforge.serve.config import ServeConfig
from trajforge.serve.scripted import ScriptedLogits
from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
TOOL_TEXT = (
    "<think>\nI should list the files.\n</think>\n\nLet me look.\n<tool_call>\n"
    '{"name": "terminal", "arguments": {"command": "ls -la"}}\n</tool_call>'
)
MESSAGES = [{"role": "user", "content": "What files are here?"}]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two checkpoints of the same architecture and tokenizer, with different random weights."""
    first, second = tmp_path_factory.mktemp("tiny-a"), tmp_path_factory.mktemp("tiny-b")
    tok = build_tiny_tokenizer(first)
    build_tiny_model(first, tok, seed=0)
    build_tiny_model(second, tok, seed=1)
    return first, second


@pytest.fixture
async def server(model_dirs: tuple[Path, Path]) -> AsyncIterator[RunningServer]:
    config = ServeConfig(model_path=model_dirs[0], port=0, max_batch=8, batch_wait_ms=20)
    async with run_server(config) as srv:
        yield srv


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def script(server: RunningServer, text: str) -> list[int]:
    """Make the served model say ``text`` then EOS; returns the scripted ids."""
    tok = server.ctx.tokenizer
    ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
    server.engine.logits_hook = ScriptedLogits(ids)
    return ids


async def post(
    http: aiohttp.ClientSession,
    server: RunningServer,
    path: str,
    body: Any,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    async with http.post(server.base_url + path, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def sse(http: aiohttp.ClientSession, server: RunningServer, path: str, body: Any) -> list[Any]:
    """Every ``data:`` payload of a stream, decoded (``"[DONE]"`` kept as the string)."""
    events = []
    async with http.post(server.base_url + path, json=body) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def forward_logprobs(model_dir: Path, prompt: list[int], out: list[int]) -> list[float]:
    """The model's own log-softmax at each sampled token, from one plain forward pass."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + out])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [float(lp[len(prompt) - 1 + j, t]) for j, t in enumerate(out)]


async def test_health_and_models(server: RunningServer, http: aiohttp.ClientSession) -> None:
    async with http.get(server.base_url + "/health") as resp:
        health = await resp.json()
    assert resp.status == 200 and health["status"] == "ok" and health["model_version"] == 0
    async with http.get(server.base_url + "/v1/models") as resp:
        models = await resp.json()
    assert [m["id"] for m in models["data"]] == [health["model"]]


async def test_chat_with_tools_returns_parsed_tool_calls(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    ids = script(server, TOOL_TEXT)
    body = {"messages": MESSAGES, "tools": TOOLS, "temperature": 0, "return_token_ids": True}
    status, data = await post(http, server, "/v1/chat/completions", body)
    assert status == 200, data
    choice = data["choices"][0]
    msg = choice["message"]
    assert msg["reasoning_content"] == "I should list the files."
    assert msg["content"] == "Let me look."
    [call] = msg["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "terminal"
    assert json.loads(call["function"]["arguments"]) == {"command": "ls -la"}
    assert choice["finish_reason"] == "tool_calls" and "parse_errors" not in msg
    assert choice["token_ids"] == ids
    assert data["usage"]["completion_tokens"] == len(ids)
    assert data["usage"]["prompt_tokens"] == len(data["prompt_token_ids"])
    prompt = server.ctx.decode(data["prompt_token_ids"], skip_special_tokens=False)
    assert "<tools>" in prompt and '"name": "terminal"' in prompt  # tools went through the template
    assert prompt.endswith("<|im_start|>assistant\n")


async def test_openai_sdk_round_trip_with_tool_history(server: RunningServer) -> None:
    """The official client parses our responses, and a tool-call history renders back."""
    script(server, TOOL_TEXT)
    client = AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused")
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        await client.chat.completions.create(model="gpt-4o", messages=MESSAGES, tools=TOOLS)
    models = await client.models.list()
    name = models.data[0].id
    first = await client.chat.completions.create(model=name, messages=MESSAGES, tools=TOOLS, temperature=0)
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "terminal"
    script(server, "There are two files.")
    history = [
        *MESSAGES,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt\nb.txt"},
    ]
    second = await client.chat.completions.create(model=name, messages=history, tools=TOOLS, temperature=0)
    assert second.choices[0].message.content == "There are two files."
    assert second.choices[0].finish_reason == "stop"
    await client.close()


async def test_malformed_tool_call_is_returned_as_text_with_errors(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    bad = '<tool_call>\n{"name": "terminal", "arguments": {command: ls}}\n</tool_call>'
    script(server, bad)
    status, data = await post(http, server, "/v1/chat/completions", {"messages": MESSAGES, "tools": TOOLS})
    assert status == 200
    msg = data["choices"][0]["message"]
    assert msg["content"] == bad and "tool_calls" not in msg
    assert msg["parse_errors"] and "command: ls" in msg["parse_errors"][0]
    assert data["choices"][0]["finish_reason"] == "stop"


async def test_streaming_reassembles_to_the_json_response(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    ids = script(server, TOOL_TEXT)
    body = {"messages": MESSAGES, "tools": TOOLS, "temperature": 0, "logprobs": True}
    _, whole = await post(http, server, "/v1/chat/completions", body)
    events = await sse(
        http,
        server,
        "/v1/chat/completions",
        {**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    reasoning = content = ""
    calls: dict[int, dict[str, str]] = {}
    logprobs: list[float] = []
    finish = None
    for chunk in chunks[:-1]:
        [choice] = chunk["choices"]
        delta = choice["delta"]
        reasoning += delta.get("reasoning_content") or ""
        content += delta.get("content") or ""
        for tc in delta.get("tool_calls") or []:
            slot = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
            slot["id"] += tc.get("id") or ""
            slot["name"] += (tc.get("function") or {}).get("name") or ""
            slot["arguments"] += (tc.get("function") or {}).get("arguments") or ""
        logprobs += [e["logprob"] for e in (choice.get("logprobs") or {}).get("content") or []]
        finish = choice["finish_reason"] or finish
    msg = whole["choices"][0]["message"]
    assert reasoning == msg["reasoning_content"] and content == msg["content"]
    [call] = calls.values()
    assert (call["name"], call["arguments"]) == (
        msg["tool_calls"][0]["function"]["name"],
        msg["tool_calls"][0]["function"]["arguments"],
    )
    assert finish == "tool_calls"
    expected = [e["logprob"] for e in whole["choices"][0]["logprobs"]["content"]]
    assert logprobs == pytest.approx(expected, abs=1e-5) and len(logprobs) == len(ids)
    # reasoning was streamed in pieces as tokens came, not in one lump at the end
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("reasoning_content")) > 1


async def test_real_model_chat_end_to_end(
    server: RunningServer, http: aiohttp.ClientSession, model_dirs: tuple[Path, Path]
) -> None:
    """No hook: the random model's own greedy output, with logprobs equal to a plain forward pass."""
    body = {
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": 8,
        "logprobs": True,
        "return_token_ids": True,
    }
    status, data = await post(http, server, "/v1/chat/completions", body)
    assert status == 200
    choice = data["choices"][0]
    out = choice["token_ids"]
    assert len(out) == data["usage"]["completion_tokens"] <= 8
    tok = AutoTokenizer.from_pretrained(str(model_dirs[0]))
    rendered = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert data["prompt_token_ids"] == tok(rendered, add_special_tokens=False)["input_ids"]
    got = [e["logprob"] for e in choice["logprobs"]["content"]]
    assert got == pytest.approx(forward_logprobs(model_dirs[0], data["prompt_token_ids"], out), abs=1e-4)
    streamed = await sse(http, server, "/v1/chat/completions", {**body, "stream": True})
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in streamed[:-1] if c["choices"])
    assert text == (choice["message"]["content"] or "")


async def test_vllm_generate_token_ids_and_logprobs_match_forward(
    server: RunningServer, http: aiohttp.ClientSession, model_dirs: tuple[Path, Path]
) -> None:
    prompt = [5, 17, 42, 99, 7]
    body = {"prompt": {"prompt_token_ids": prompt}, "logprobs": 0, "max_tokens": 10, "temperature": 1.0}
    status, data = await post(http, server, "/generate", {**body, "seed": 11, "ignore_eos": True, "n": 2})
    assert status == 200, data
    assert data["prompt_token_ids"] == prompt and len(data["finish_reasons"]) == 2
    for seq_ids, seq_lps in zip(data["token_ids"], data["logprobs"], strict=True):
        ids = [int(next(iter(item[0]))) for item in seq_lps]  # Atropos' way of reading them
        lps = [next(iter(item[0].values())) for item in seq_lps]
        assert ids == seq_ids and len(ids) == 10
        assert lps == pytest.approx(forward_logprobs(model_dirs[0], prompt, ids), abs=1e-4)
    assert data["token_ids"][0] != data["token_ids"][1]  # n=2 draws differ (seed, seed+1)
    _, again = await post(http, server, "/generate", {**body, "seed": 11, "ignore_eos": True, "n": 2})
    assert again["token_ids"] == data["token_ids"]


async def test_sglang_generate_token_ids_and_logprobs_match_forward(
    server: RunningServer, http: aiohttp.ClientSession, model_dirs: tuple[Path, Path]
) -> None:
    prompt = [3, 4, 5, 6]
    body = {
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": 6, "temperature": 0.7, "sampling_seed": 3, "ignore_eos": True},
        "return_logprob": True,
    }
    status, data = await post(http, server, "/generate", body)
    assert status == 200, data
    meta = data["meta_info"]
    lps = [item[0] for item in meta["output_token_logprobs"]]
    ids = [item[1] for item in meta["output_token_logprobs"]]
    assert ids == data["output_ids"] and meta["completion_tokens"] == 6 and meta["prompt_tokens"] == 4
    assert meta["finish_reason"]["type"] == "length" and meta["weight_version"] == "0"
    assert lps == pytest.approx(forward_logprobs(model_dirs[0], prompt, ids), abs=1e-4)
    batch = {
        **body,
        "input_ids": [prompt, [8, 9]],
        "sampling_params": {"max_new_tokens": 2, "temperature": 0},
    }
    status, items = await post(http, server, "/generate", batch)
    assert status == 200 and [i["meta_info"]["prompt_tokens"] for i in items] == [4, 2]


async def test_completions_with_token_id_prompt(server: RunningServer, http: aiohttp.ClientSession) -> None:
    prompt = [9, 8, 7, 6]
    body = {
        "prompt": prompt,
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": 2,
        "return_tokens_as_token_ids": True,
    }
    status, data = await post(http, server, "/v1/completions", {**body, "ignore_eos": True})
    assert status == 200, data
    [choice] = data["choices"]
    assert choice["prompt_token_ids"] == prompt and len(choice["token_ids"]) == 5
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert choice["text"] == server.ctx.decode(choice["token_ids"])
    for tok, lp, top in zip(
        choice["logprobs"]["tokens"],
        choice["logprobs"]["token_logprobs"],
        choice["logprobs"]["top_logprobs"],
        strict=True,
    ):
        assert top[tok] == lp and max(top.values()) == lp  # greedy: the sampled token is the top one
    assert data["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
    # the same prompt as text gives the same tokens as its ids
    text = server.ctx.decode(prompt, skip_special_tokens=False)
    _, by_text = await post(
        http,
        server,
        "/v1/completions",
        {"prompt": text, "max_tokens": 5, "temperature": 0, "ignore_eos": True},
    )
    assert by_text["choices"][0]["prompt_token_ids"] == prompt
    assert by_text["choices"][0]["token_ids"] == choice["token_ids"]


async def test_concurrent_requests_match_sequential_greedy(
    server: RunningServer, http: aiohttp.ClientSession
) -> None:
    prompts = [[1, 2, 3], [40, 41, 42, 43, 44, 45, 46], [7], [100, 200, 300, 400]]

    async def one(p: list[int]) -> list[int]:
        body = {"prompt": {"prompt_token_ids": p}, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        status, data = await post(http, server, "/generate", body)
        assert status == 200
        return data["token_ids"][0]

    sequential = [await one(p) for p in prompts]
    concurrent = await asyncio.gather(*(one(p) for p in prompts))
    assert list(concurrent) == sequential


async def test_weight_reload_changes_outputs_and_version(
    server: RunningServer, http: aiohttp.ClientSession, model_dirs: tuple[Path, Path]
) -> None:
    body = {
        "prompt": {"prompt_token_ids": [1, 2, 3, 4]},
        "logprobs": 0,
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": True,
    }
    _, before = await post(http, server, "/generate", body)
    status, loaded = await post(
        http, server, "/v1/load_weights", {"path": str(model_dirs[1])}, server.auth_headers()
    )
    assert status == 200 and loaded["version"] == 1 and loaded["path"] == str(model_dirs[1].resolve())
    async with http.get(server.base_url + "/health") as resp:
        assert (await resp.json())["model_version"] == 1
    _, after = await post(http, server, "/generate", body)
    assert before["model_version"] == 0 and after["model_version"] == 1
    assert after["logprobs"] != before["logprobs"]
    lps = [next(iter(item[0].values())) for item in after["logprobs"][0]]
    assert lps == pytest.approx(
        forward_logprobs(model_dirs[1], [1, 2, 3, 4], after["token_ids"][0]), abs=1e-4
    )
    status, back = await post(http, server, "/reload", {"path": str(model_dirs[0])}, server.auth_headers())
    assert status == 200 and back["version"] == 2
    _, restored = await post(http, server, "/generate", body)
    assert restored["token_ids"] == before["token_ids"]


async def test_reload_during_generation_swaps_between_batches(
    server: RunningServer, http: aiohttp.ClientSession, model_dirs: tuple[Path, Path]
) -> None:
    """A request in flight finishes on the weights it started with; the next one sees the new ones."""
    body = {
        "prompt": {"prompt_token_ids": [1, 2]},
        "logprobs": 0,
        "max_tokens": 200,
        "temperature": 0,
        "ignore_eos": True,
    }
    generating = asyncio.Event()
    loop = asyncio.get_running_loop()

    def observe(generated: Any, logits: torch.Tensor) -> torch.Tensor:  # leaves the logits alone
        loop.call_soon_threadsafe(generating.set)
        return logits

    server.engine.logits_hook = observe
    long_request = asyncio.create_task(post(http, server, "/generate", body))
    await generating.wait()
    status, loaded = await post(
        http, server, "/v1/load_weights", {"path": str(model_dirs[1])}, server.auth_headers()
    )
    _, first = await long_request
    assert status == 200 and first["model_version"] == 0 and loaded["version"] == 1
    lps = [next(iter(item[0].values())) for item in first["logprobs"][0]]
    assert lps == pytest.approx(forward_logprobs(model_dirs[0], [1, 2], first["token_ids"][0]), abs=1e-4)


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/chat/completions", {"model": "x"}, 400, "messages"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, 400, "role"),
        ("/v1/chat/completions", {"messages": MESSAGES, "model": "gpt-4o"}, 404, "does not exist"),
        ("/v1/chat/completions", {"messages": MESSAGES, "presence_penalty": 0.5}, 400, "presence_penalty"),
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 10_000}, 400, "context length"),
        ("/v1/completions", {"prompt": [], "max_tokens": 2}, 400, "prompt"),
        ("/v1/completions", {"prompt": [10**9], "max_tokens": 2}, 400, "token ids"),
        ("/generate", {"prompt": {"prompt_token_ids": [1]}, "bogus": 1}, 400, "bogus"),
        ("/v1/nothing", {}, 404, "routes"),
    ],
)
async def test_bad_requests_get_openai_shaped_errors(
    server: RunningServer, http: aiohttp.ClientSession, path: str, body: Any, status: int, needle: str
) -> None:
    got, data = await post(http, server, path, body)
    assert got == status
    err = data["error"]
    assert set(err) == {"message", "type", "param", "code"} and needle in err["message"]
    assert err["type"] == ("invalid_request_error" if status == 400 else "not_found_error")


async def test_invalid_json_body(server: RunningServer, http: aiohttp.ClientSession) -> None:
    async with http.post(server.base_url + "/v1/chat/completions", data=b"{not json") as resp:
        data = await resp.json()
    assert resp.status == 400 and "not valid JSON" in data["error"]["message"]


async def test_chat_stream_with_n_choices(server: RunningServer, http: aiohttp.ClientSession) -> None:
    script(server, TOOL_TEXT)
    body = {"messages": MESSAGES, "tools": TOOLS, "temperature": 0, "n": 2, "stream": True}
    events = await sse(http, server, "/v1/chat/completions", body)
    assert events[-1] == "[DONE]"
    per_choice: dict[int, dict[str, str]] = {0: {}, 1: {}}
    finishes = {}
    for chunk in events[:-1]:
        [choice] = chunk["choices"]
        got = per_choice[choice["index"]]
        for key in ("reasoning_content", "content"):
            got[key] = got.get(key, "") + (choice["delta"].get(key) or "")
        for tc in choice["delta"].get("tool_calls") or []:
            got["arguments"] = got.get("arguments", "") + tc["function"]["arguments"]
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert finishes == {0: "tool_calls", 1: "tool_calls"}
    for got in per_choice.values():
        assert got["reasoning_content"] == "I should list the files." and got["content"] == "Let me look."
        assert json.loads(got["arguments"]) == {"command": "ls -la"}


async def test_completion_stream_matches_json(server: RunningServer, http: aiohttp.ClientSession) -> None:
    body = {"prompt": [11, 12, 13], "max_tokens": 6, "temperature": 0, "ignore_eos": True, "logprobs": 0}
    _, whole = await post(http, server, "/v1/completions", body)
    events = await sse(
        http, server, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    chunks = [e for e in events[:-1] if e["choices"]]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    lps = [
        lp
        for c in chunks
        if c["choices"][0]["logprobs"]
        for lp in c["choices"][0]["logprobs"]["token_logprobs"]
    ]
    [choice] = whole["choices"]
    assert (text, ids) == (choice["text"], choice["token_ids"])
    assert lps == pytest.approx(choice["logprobs"]["token_logprobs"], abs=1e-6)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["usage"] == whole["usage"]


async def test_health_reports_a_stopped_engine(server: RunningServer, http: aiohttp.ClientSession) -> None:
    await server.engine.close()
    async with http.get(server.base_url + "/health") as resp:
        assert resp.status == 503 and (await resp.json())["status"] == "error"
    status, data = await post(http, server, "/v1/completions", {"prompt": [1], "max_tokens": 1})
    assert status == 500 and "not running" in data["error"]["message"]


class _FailingLogits:
    """A logits hook that breaks generation (as a CUDA error would) after the first token."""

    def __call__(self, generated: list[list[int]], logits: torch.Tensor) -> torch.Tensor:
        if any(generated):
            raise RuntimeError("device fell over")
        return logits


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": MESSAGES, "stream": True, "max_tokens": 8, "ignore_eos": True}),
        ("/v1/completions", {"prompt": [11, 12, 13], "stream": True, "max_tokens": 8, "ignore_eos": True}),
    ],
)
async def test_engine_failure_mid_stream_ends_with_an_error_event(
    server: RunningServer, http: aiohttp.ClientSession, path: str, body: dict[str, Any]
) -> None:
    server.engine.logits_hook = _FailingLogits()
    events = await sse(http, server, path, body)
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["type"] == "server_error" and error["code"] == 500 and "device fell over" in error["message"]
