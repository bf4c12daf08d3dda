"""A token budget the endpoint cannot give, and episodes whose model was never reached.

Before: a seed config's ``max_token_length: 16000`` against the embedded model's 1,024-token
context ran "successfully": every request was refused ("maximum context length is 1024 tokens,
but 16250 were requested"), every episode ended with 0 turns, and each was counted as a finished
episode with reward 0. Now the budget is clamped to the endpoint's stated context with a note,
and an episode whose model never answered fails with the reason, outside the rates. The endpoint
is the scripted server modelling a context as vLLM does (``/v1/models`` ``max_model_len``, a 400
for a request that does not fit)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from hermes_seed_envs import TERMINAL_TEST
from trajforge.cli.main import app
from trajforge.envs.running.budget import endpoint_context, fitter
from trajforge.llm.openai_client import OpenAIChatModel, OpenAIModelConfig
from trajforge.testing.policies import count_assistant_turns, last_user_text
from trajforge.testing.scripted_server import Reply, ScriptedServer, ToolCallSpec

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

runner = CliRunner()


def _solver(body: dict[str, Any]) -> Reply:
    import re

    found = re.search(r"Put the text '([^']*)' into (~/\S+)", last_user_text(body) or "")
    if count_assistant_turns(body) == 0 and found:
        text, path = found.groups()
        return Reply(
            tool_calls=[
                ToolCallSpec("terminal", {"command": f"mkdir -p $(dirname {path}) && echo '{text}' > {path}"})
            ]
        )
    return Reply(content="done")


def _run(
    srv: ScriptedServer, tmp_path: Path, ref: str, name: str, *extra: str
) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    out = runner.invoke(
        app,
        [
            "env", "eval", ref, "--model", "scripted", "--base-url", srv.base_url, "--output-dir",
            str(tmp_path / "runs"), "--run-name", name, "--json", "--progress", "plain", *extra,
        ],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    summary = json.loads(out.stdout[out.stdout.index("{") :])
    episodes = [
        orjson.loads(x) for x in (tmp_path / "runs" / name / "episodes.jsonl").read_bytes().splitlines()
    ]
    return summary, episodes, out.stderr


async def test_the_endpoint_context_is_read_from_its_models_route() -> None:
    async with ScriptedServer([Reply(content="x")], context_length=1024) as srv:
        model = OpenAIChatModel(OpenAIModelConfig(base_url=srv.base_url, model="scripted"))
        assert await endpoint_context(model) == 1024
        await model.aclose()
    async with ScriptedServer([Reply(content="x")]) as srv:  # an endpoint that does not say
        model = OpenAIChatModel(OpenAIModelConfig(base_url=srv.base_url, model="scripted"))
        assert await endpoint_context(model) is None
        await model.aclose()
    fit = fitter(1024)
    assert fit(16000) is None and fit(1024) is None and fit(512) == 512 and fit(None) is None


def test_a_budget_over_the_context_is_clamped_with_a_note(tmp_path: Path) -> None:
    """The seed-style env asks max_token_length 4096 of a 1024-token model: clamped, it scores."""
    env_file = tmp_path / "environments" / "file_tasks.py"
    env_file.parent.mkdir()
    env_file.write_text(TERMINAL_TEST)
    with ScriptedServer(_solver, context_length=1024).in_thread() as srv:
        summary, episodes, notes = _run(srv, tmp_path, f"{env_file}:FileTasksEnv", "clamped")
        sent = [r.get("max_tokens") for r in srv.requests]
    assert (
        "max_tokens 4096 is not below the endpoint's context of 1024 tokens" in notes and "clamped" in notes
    )
    assert sent and all(m is None for m in sent), sent  # each call asked for what its context had left
    assert summary["mean_reward"]["value"] == 1.0 and summary["failed"] == 0
    assert all(e["status"] == "completed" and e["turns"] >= 1 for e in episodes)


def test_an_episode_that_never_reached_the_model_failed(tmp_path: Path) -> None:
    """max_tokens under the context, but no request fits beside its prompt: every call refused.
    Each episode fails with the reason and no reward, and the rates leave it out."""
    config = tmp_path / "env.yaml"
    config.write_text("max_tokens: 1000\n")
    with ScriptedServer(_solver, context_length=1024).in_thread() as srv:
        summary, episodes, _ = _run(
            srv,
            tmp_path,
            "terminal_test",
            "refused",
            "--config",
            str(config),
            "--max-samples",
            "3",
            "--group-size",
            "1",
        )
        assert srv.counters["context_refusals"] == len(episodes) == 3
    for ep in episodes:
        assert ep["status"] == "failed" and ep["turns"] == 0, ep["status"]
        assert ep["reason"].startswith("the model was never reached: context_length"), ep["reason"]
        assert ep["reason_kind"] == "model_not_reached" and ep["reward"]["value"] is None
        assert "maximum context length is 1024 tokens" in ep["reason"]
    assert summary["failed"] == 3 and summary["items"] == 0, summary  # none counted as a 0
