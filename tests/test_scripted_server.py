"""The scripted server's wire protocol (read with a raw HTTP client), its policies, faults,
thread and subprocess modes; and the in-process ScriptedModel."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import pytest

from trajforge.llm.types import AssistantTurn, ModelError, ModelErrorKind
from trajforge.protocols import ChatModel
from trajforge.testing import (
    FaultConfig,
    Reply,
    ScriptedModel,
    ScriptedServer,
    ToolCallSpec,
    answer,
    echo_policy,
    tool_then_answer,
    tool_turn,
)

USER = [{"role": "user", "content": "task one"}]


async def post(srv: ScriptedServer, body: dict[str, Any], headers: dict[str, str] | None = None):
    """(status, headers, raw bytes) of one chat request."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{srv.base_url}/chat/completions", json=body, headers=headers) as resp,
    ):
        return resp.status, resp.headers, await resp.read()


def sse_events(raw: bytes) -> list[str]:
    """The ``data:`` payloads of an SSE body, checking every event is properly terminated."""
    text = raw.decode()
    assert text.endswith("\n\n")
    events = [block for block in text.split("\n\n") if block]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


# --------------------------------------------------------------------------------------------
# Wire protocol


async def test_json_completion_shape(scripted_server) -> None:
    reply = Reply(content="hi", reasoning="because", tool_calls=[ToolCallSpec("terminal", {"command": "ls"})])
    srv = await scripted_server([reply], model="m1")
    status, headers, raw = await post(srv, {"model": "m1", "messages": USER})
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    data = json.loads(raw)
    assert data["object"] == "chat.completion" and data["model"] == "m1"
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "hi" and message["reasoning_content"] == "because"
    call = message["tool_calls"][0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "terminal", "arguments": '{"command":"ls"}'}
    assert (
        data["usage"]["total_tokens"] == data["usage"]["prompt_tokens"] + data["usage"]["completion_tokens"]
    )


async def test_sse_stream_shape(scripted_server) -> None:
    calls = [
        ToolCallSpec("terminal", {"command": "echo " + "x" * 40}),
        ToolCallSpec("read_file", {"path": "a"}),
    ]
    srv = await scripted_server(lambda body: Reply(content="c" * 40, reasoning="r" * 40, tool_calls=calls))
    body = {"model": "m", "messages": USER, "stream": True, "stream_options": {"include_usage": True}}
    status, headers, raw = await post(srv, body)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] > 0
    deltas = [c["choices"][0]["delta"] for c in chunks[:-1]]
    assert deltas[0]["role"] == "assistant"
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "r" * 40
    assert "".join(d.get("content") or "" for d in deltas) == "c" * 40
    fragments = [tc for d in deltas for tc in d.get("tool_calls", [])]
    heads = [f for f in fragments if "id" in f]
    assert [(h["index"], h["function"]["name"]) for h in heads] == [(0, "terminal"), (1, "read_file")]
    args0 = "".join(f["function"]["arguments"] for f in fragments if f["index"] == 0)
    assert json.loads(args0) == {"command": "echo " + "x" * 40}
    assert sum(1 for f in fragments if f["index"] == 0) > 2  # arguments really arrive in pieces
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"

    status, _, raw = await post(srv, {**body, "stream_options": None})
    assert "usage" not in json.loads(sse_events(raw)[-2])  # no usage chunk unless asked for


@pytest.mark.parametrize(
    ("style", "where"),
    [
        ("reasoning_content", lambda m: m["reasoning_content"]),
        ("reasoning", lambda m: m["reasoning"]),
        ("reasoning_details", lambda m: m["reasoning_details"][0]["text"]),
        ("think", lambda m: m["content"].split("</think>")[0].removeprefix("<think>")),
    ],
)
async def test_reasoning_styles_on_the_wire(scripted_server, style: str, where) -> None:
    srv = await scripted_server([Reply(content="ans", reasoning="deep thought", reasoning_field=style)])
    _, _, raw = await post(srv, {"model": "m", "messages": USER})
    message = json.loads(raw)["choices"][0]["message"]
    assert where(message) == "deep thought"
    other = {"reasoning_content", "reasoning", "reasoning_details"} - {style}
    assert not other & message.keys()


async def test_models_route_and_errors(scripted_server) -> None:
    srv = await scripted_server([Reply.fail(429, "slow down", retry_after_s=2.5)], api_key="k")
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{srv.base_url}/models", headers={"Authorization": "Bearer k"}) as resp:
            assert (await resp.json())["data"][0]["id"] == "scripted"
        async with session.get(f"{srv.base_url}/models") as resp:
            assert resp.status == 401
            assert (await resp.json())["error"]["code"] == "invalid_api_key"
    status, headers, raw = await post(srv, {"model": "m", "messages": USER}, {"Authorization": "Bearer k"})
    assert status == 429 and headers["Retry-After"] == "2" and headers["retry-after-ms"] == "2500"
    error = json.loads(raw)["error"]
    assert error["message"] == "slow down" and error["type"] == "rate_limit_exceeded"


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ([{"model": "m", "messages": USER}], "JSON object"),
        ({"messages": USER}, "model"),
        ({"model": "m", "messages": []}, "messages"),
        (
            {"model": "m", "messages": [*USER, {"role": "tool", "tool_call_id": "nope", "content": "x"}]},
            "nope",
        ),
        (
            {
                "model": "m",
                "messages": [
                    *USER,
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {}}}],
                    },
                ],
            },
            "arguments",
        ),
    ],
)
async def test_strict_validation_rejects_what_real_endpoints_reject(scripted_server, body, complaint) -> None:
    srv = await scripted_server(echo_policy)
    status, _, raw = await post(srv, body)
    assert status == 400 and complaint in json.loads(raw)["error"]["message"]


# --------------------------------------------------------------------------------------------
# Policies and scripts


async def test_script_is_per_conversation_and_reports_exhaustion(scripted_server) -> None:
    srv = await scripted_server([Reply(content="first"), Reply(content="second")])

    async def ask(user: str) -> str:
        _, _, raw = await post(srv, {"model": "m", "messages": [{"role": "user", "content": user}]})
        return json.loads(raw)["choices"][0]["message"]["content"]

    assert await asyncio.gather(ask("a"), ask("b")) == ["first", "first"]
    assert await asyncio.gather(ask("a"), ask("b")) == ["second", "second"]
    status, _, raw = await post(srv, {"model": "m", "messages": [{"role": "user", "content": "a"}]})
    assert status == 400 and json.loads(raw)["error"]["code"] == "script_exhausted"


async def test_tool_then_answer_counts_assistant_turns(scripted_server) -> None:
    srv = await scripted_server(tool_then_answer(calls_per_sample=2, command="pwd", answer="all done"))
    messages: list[dict[str, Any]] = list(USER)
    for _ in range(2):
        _, _, raw = await post(srv, {"model": "m", "messages": messages})
        message = json.loads(raw)["choices"][0]["message"]
        call = message["tool_calls"][0]
        assert call["function"] == {"name": "terminal", "arguments": '{"command":"pwd"}'}
        assert message["reasoning_content"]
        messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": "/"}]
    _, _, raw = await post(srv, {"model": "m", "messages": messages})
    final = json.loads(raw)["choices"][0]
    assert final["message"]["content"] == "all done" and final["finish_reason"] == "stop"


async def test_faults_are_seeded_and_do_not_consume_the_script(scripted_server) -> None:
    faults = FaultConfig(p_500=0.3, p_429=0.2, p_malformed=0.2, retry_after_s=0, seed=3)
    draws = [faults.draw("k", n) for n in range(40)]
    assert draws == [
        FaultConfig(p_500=0.3, p_429=0.2, p_malformed=0.2, seed=3).draw("k", n) for n in range(40)
    ]
    assert {"500", "429", "malformed", None} <= set(draws)
    assert draws != [
        FaultConfig(p_500=0.3, p_429=0.2, p_malformed=0.2, seed=4).draw("k", n) for n in range(40)
    ]

    srv = await scripted_server([Reply(content="one"), Reply(content="two")], faults=faults)
    answers = []
    while len(answers) < 2:
        status, _, raw = await post(srv, {"model": "m", "messages": USER})
        try:
            answers.append(json.loads(raw)["choices"][0]["message"]["content"])
        except (ValueError, KeyError):
            assert status in (500, 429) or srv.counters["fault_malformed"]
    assert answers == ["one", "two"]
    assert srv.counters["requests"] > 2


async def test_broken_policy_is_a_clear_500(scripted_server) -> None:
    srv = await scripted_server(lambda body: body["no such key"])
    status, _, raw = await post(srv, {"model": "m", "messages": USER})
    assert status == 500 and "policy raised KeyError" in json.loads(raw)["error"]["message"]
    srv2 = await scripted_server(lambda body: "not a reply")
    status, _, raw = await post(srv2, {"model": "m", "messages": USER})
    assert status == 500 and "expected Reply" in json.loads(raw)["error"]["message"]


def test_fault_config_rejects_impossible_probabilities() -> None:
    with pytest.raises(ValueError, match="sum to at most 1"):
        FaultConfig(p_500=0.7, p_429=0.5)


async def test_timeout_fault_hangs_then_answers(scripted_server) -> None:
    srv = await scripted_server(echo_policy, faults=FaultConfig(p_timeout=1.0, timeout_hang_s=0.2))
    status, _, raw = await post(srv, {"model": "m", "messages": USER})
    assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"] == "task one"
    assert srv.records[0].fault == "timeout"


async def test_malformed_replies_are_broken(scripted_server) -> None:
    srv = await scripted_server(lambda body: Reply(malformed=True))
    _, _, raw = await post(srv, {"model": "m", "messages": USER})
    with pytest.raises(ValueError):
        json.loads(raw)
    _, _, raw = await post(srv, {"model": "m", "messages": USER, "stream": True})
    assert b"[DONE]" not in raw and not raw.endswith(b"\n\n")


# --------------------------------------------------------------------------------------------
# Thread and subprocess modes


def test_in_thread_for_sync_code() -> None:
    server = ScriptedServer([Reply(content="from a thread")])
    with server.in_thread() as srv:
        request = urllib.request.Request(
            f"{srv.base_url}/chat/completions",
            data=json.dumps({"model": "m", "messages": USER}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert json.load(resp)["choices"][0]["message"]["content"] == "from a thread"
        assert len(srv.requests) == 1
    with pytest.raises(urllib.error.URLError):  # stopped on exit
        urllib.request.urlopen(request, timeout=5)


def test_command_line_entry_point() -> None:
    cmd = [sys.executable, "-m", "trajforge.testing.server_cli", "--policy", "echo", "--latency", "0.01"]
    env = {**os.environ, "PYTHONWARNINGS": "error::RuntimeWarning"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().strip()
        assert ready.startswith("READY http://127.0.0.1:"), proc.stderr.read() if proc.stderr else ""
        base_url = ready.split()[1]
        request = urllib.request.Request(
            f"{base_url}/chat/completions",
            data=json.dumps({"model": "m", "messages": USER}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert json.load(resp)["choices"][0]["message"]["content"] == "task one"
        with urllib.request.urlopen(f"{base_url.removesuffix('/v1')}/_scripted/stats", timeout=10) as resp:
            assert json.load(resp)["status_200"] == 1
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert out.startswith("STATS ") and json.loads(out.split(" ", 1)[1])["requests"] == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------------------------
# ScriptedModel (in-process)


async def test_scripted_model_plays_the_script_per_conversation() -> None:
    boom = ModelError("scripted failure", kind=ModelErrorKind.TRANSIENT)
    model = ScriptedModel([tool_turn(("terminal", {"command": "ls"}), reasoning="look"), boom, "final words"])
    first = await model.complete(USER, tools=[{"type": "function"}])
    assert first.tool_calls[0].name == "terminal" and first.tool_calls[0].arguments == '{"command":"ls"}'
    assert first.reasoning == "look" and first.model == "scripted"
    with pytest.raises(ModelError, match="scripted failure"):
        await model.complete(USER)
    assert (await model.complete(USER)).content == "final words"
    other = [{"role": "user", "content": "another task"}]
    assert (await model.complete(other)).tool_calls  # a new conversation starts at the top
    with pytest.raises(ModelError, match="exhausted") as info:
        await model.complete(USER)
    assert info.value.kind is ModelErrorKind.PERMANENT
    assert len(model.calls) == 5 and model.calls[0].tools == [{"type": "function"}]


async def test_scripted_model_records_copies_and_accepts_policies() -> None:
    async def policy(messages, tools, sampling) -> AssistantTurn:
        return answer(f"{len(messages)} messages")

    model = ScriptedModel(policy, name="p")
    messages = list(USER)
    turn = await model.complete(messages)
    messages.append({"role": "assistant", "content": "changed later"})
    assert turn.content == "1 messages" and turn.model == "p"
    assert model.calls[0].messages == USER  # not affected by the caller mutating its list


def test_scripted_model_satisfies_protocol() -> None:
    assert isinstance(ScriptedModel([]), ChatModel)
