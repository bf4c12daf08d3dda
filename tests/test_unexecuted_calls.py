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


async def test_prose_that_only_mentions_tags_is_still_an_answer(
    tmp_path: Path, scripted_batch_config
) -> None:
    text = "Wrap each call in <tool_call> tags, as the docs say."
    async with ScriptedServer([Reply(content=text)], api_key="k") as srv:
        await run_batch(scripted_batch_config([{"prompt": p} for p in ["explain"]], srv.base_url))
    done = _records(tmp_path / "data" / "run", "trajectories.jsonl")
    assert len(done) == 1 and done[0]["completed"]
