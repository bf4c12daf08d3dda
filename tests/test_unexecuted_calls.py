"""A chat endpoint that returns the model's tool call as text must not make a "completed" line.

Over the real wire protocol (a scripted OpenAI-compatible server): the endpoint puts the call
markup in ``content`` with no ``tool_calls``. The loop tells the model it was not run; a model that
then calls properly goes on, one that keeps doing it ends as ``tool_parse_error`` -- never as a
completed trajectory whose last turn is a call that never ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from trajforge.batch.runner import run_batch
from trajforge.testing.scripted_server import Reply, ScriptedServer, ToolCallSpec

MARKUP = 'Let me check.\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>'


def _records(run_dir: Path, name: str) -> list[dict[str, Any]]:
    path = run_dir / name
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


async def test_markup_in_content_is_a_parse_error_and_the_model_retries(
    tmp_path: Path, scripted_batch_config
) -> None:
    script = [
        Reply(content=MARKUP),  # the endpoint did not parse the call
        Reply(tool_calls=[ToolCallSpec("terminal", {"command": "echo ran"})]),
        Reply(content="It printed ran."),
    ]
    async with ScriptedServer(script, api_key="k") as srv:
        await run_batch(scripted_batch_config([{"prompt": p} for p in ["go"]], srv.base_url))
        told = srv.requests[1]["messages"][-1]
    assert told["role"] == "user" and "was not run" in told["content"] and "'terminal'" in told["content"]
    done = _records(tmp_path / "data" / "run", "trajectories.jsonl")
    assert len(done) == 1 and done[0]["completed"] and done[0]["tool_error_counts"].get("<parse>", 0) == 0
    assert done[0]["tool_stats"]["terminal"]["success"] == 1  # the retried call ran


async def test_a_model_that_keeps_emitting_markup_never_completes(
    tmp_path: Path, scripted_batch_config
) -> None:
    async with ScriptedServer(lambda body: Reply(content=MARKUP), api_key="k") as srv:
        await run_batch(scripted_batch_config([{"prompt": p} for p in ["a", "b"]], srv.base_url))
    run_dir = tmp_path / "data" / "run"
    assert _records(run_dir, "trajectories.jsonl") == []
    failed = _records(run_dir, "failed.jsonl")
    assert len(failed) == 2 and {r["termination"] for r in failed} == {"tool_parse_error"}, failed
    for r in failed:
        assert not r["completed"]


async def test_a_call_tag_anywhere_in_an_answer_is_told_and_an_answer_without_one_completes(
    tmp_path: Path, scripted_batch_config
) -> None:
    """Any opening or closing tag of a call family counts (issue 43): prose that names the tag
    would train a model to write it where no call runs. Told, the model answers without it."""
    script = [
        Reply(content="Wrap each call in <tool_call> tags, as the docs say."),
        Reply(content="Wrap each call in the tool-call tags, as the docs say."),
    ]
    async with ScriptedServer(script, api_key="k") as srv:
        await run_batch(scripted_batch_config([{"prompt": p} for p in ["explain"]], srv.base_url))
        told = srv.requests[1]["messages"][-1]
    assert told["role"] == "user" and "<tool_call>" in told["content"] and "was not run" in told["content"]
    done = _records(tmp_path / "data" / "run", "trajectories.jsonl")
    assert len(done) == 1 and done[0]["completed"] and "<tool_call>" not in str(done[0]["conversations"][-1])


async def test_a_dangling_closing_tag_or_a_call_in_the_reasoning_never_completes(
    tmp_path: Path, scripted_batch_config
) -> None:
    """What a T=1.5 run of the embedded model wrote (issue 43): a final answer ending in a
    dangling ``</tool_call>``, reasoning holding an unclosed ``<tool_call>{...``. Neither ends as
    completed; each is told to the model, as a call that did not parse."""
    replies = {
        "dangling": Reply(content="The answer is 4\n</tool_call>"),
        "thought": Reply(
            content="The answer is 4", reasoning='I will run <tool_call>{"name": "terminal", "argu'
        ),
    }
    async with ScriptedServer(lambda body: replies[body["messages"][0]["content"]], api_key="k") as srv:
        await run_batch(scripted_batch_config([{"prompt": p} for p in replies], srv.base_url))
        told = [
            r["messages"][-1]["content"]
            for r in srv.requests
            if r["messages"][-1]["role"] == "user" and "was not run" in r["messages"][-1]["content"]
        ]
    run_dir = tmp_path / "data" / "run"
    assert _records(run_dir, "trajectories.jsonl") == []
    failed = _records(run_dir, "failed.jsonl")
    assert {r["termination"] for r in failed} == {"tool_parse_error"} and len(failed) == 2
    assert any("your reply contains the call tag </tool_call>" in t for t in told)
    assert any("your reasoning contains the call tag <tool_call>" in t for t in told)
