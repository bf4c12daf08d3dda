"""Exports never invent a tool call: malformed calls are the assistant's text, or left out and counted.

The run is real (scripted endpoint on loopback, the agent loop, local sandboxes): the endpoint
returns calls as text (broken JSON, or valid JSON it did not parse), call markup beside a real
call, and arguments that are not a JSON object, as models and endpoints do. The export used to
re-parse every ``<tool_call>`` block of the ShareGPT text, so these became calls nobody made.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from export_runs import MALFORMED, MALFORMED_KIND, SCRIPTS, SYSTEM, mixed_run, read_jsonl
from trajforge.agent.config import AgentConfig
from trajforge.agent.loop import AgentLoop
from trajforge.cli.main import app
from trajforge.export.formats import ExportOptions, export, markup_check
from trajforge.testing.scripted_model import ScriptedModel
from trajforge.tools.base import ToolContext
from trajforge.tools.builtin import default_registry
from trajforge.trajectory.calls import PARSE_ERROR_PREFIX, to_messages


def _lines(run_dir: Path) -> dict[str, dict[str, Any]]:
    lines = [*read_jsonl(run_dir / "trajectories.jsonl"), *read_jsonl(run_dir / "failed.jsonl")]
    return {line["conversations"][1]["value"]: line for line in lines}


def _calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for m in messages for c in m.get("tool_calls") or ()]


def _executed(line: dict[str, Any]) -> int:
    """Calls the agent loop ran (its own count, independent of the ShareGPT text)."""
    return sum(stat["count"] for stat in line["tool_stats"].values())


@pytest.fixture
async def run_dir(tmp_path: Path, scripted_batch_config: Any) -> Path:
    return await mixed_run(tmp_path, scripted_batch_config)


async def test_the_agent_loop_replies_to_an_unparsed_call_with_the_prefix_exports_look_for() -> None:
    model = ScriptedModel(["<tool_call>\n{broken\n</tool_call>", "ok"])
    tools = default_registry().for_toolsets(["terminal"])
    loop = AgentLoop(model, tools, ToolContext(task_id="t"), AgentConfig(max_turns=3))
    result = await loop.run([{"role": "user", "content": "go"}])
    told = [m for m in result.messages if m["role"] == "user"][1]
    assert told["content"].startswith(PARSE_ERROR_PREFIX)


async def test_malformed_calls_are_text_never_calls(run_dir: Path) -> None:
    lines = _lines(run_dir)
    assert set(lines) == set(SCRIPTS) | set(MALFORMED)
    for prompt, line in lines.items():
        ended = line["termination"] == "final_answer"
        chat = to_messages(line["conversations"], ended_on_answer=ended, markup=markup_check(None))
        calls = _calls(chat.messages)
        kinds = {m.kind for m in chat.malformed}
        assert kinds == ({MALFORMED_KIND[prompt]} if prompt in MALFORMED else set()), prompt
        # every call in the messages ran, with object arguments and a result after it
        assert len(calls) == _executed(line) - (1 if prompt.endswith("arguments") else 0), prompt
        ids = [m["tool_call_id"] for m in chat.messages if m["role"] == "tool"]
        assert ids == [c["id"] for c in calls], prompt
        assert all(c["function"]["name"] and isinstance(c["function"]["arguments"], dict) for c in calls)
    broken = to_messages(lines["broken markup"]["conversations"]).messages
    assert broken[1] == {
        "role": "assistant",
        "content": MALFORMED["broken markup"][0].content,
        "reasoning_content": "call ls",
    }
    assert broken[2]["role"] == "user" and broken[2]["content"].startswith(PARSE_ERROR_PREFIX)
    assert _calls(broken)[0]["function"] == {"name": "terminal", "arguments": {"command": "echo fixed"}}
    # valid JSON the endpoint did not parse is text too: the old export made a call of it
    unparsed = to_messages(lines["markup as text"]["conversations"]).messages
    assert _calls(unparsed) == [] and '"command": "ls"' in unparsed[1]["content"]
    # arguments that are not an object: the turn and its results read as the text they were
    bad = to_messages(lines["string arguments"]["conversations"]).messages
    assert [m["role"] for m in bad] == ["user", "assistant", "user", "assistant"]
    assert (
        '"arguments": "{\\"command\\": \\"ls\\""' in bad[1]["content"]
        and "not valid JSON" in bad[2]["content"]
    )


async def test_exports_leave_malformed_samples_out_by_default_and_count_them(run_dir: Path) -> None:
    for fmt in ("messages", "llamafactory", "axolotl", "sharegpt", "hermes", "parquet"):
        report = export(run_dir, fmt, run_dir / "out" / f"{fmt}.data")
        assert report.rows == len(SCRIPTS) and report.read == len(SCRIPTS) + len(MALFORMED) - 0, fmt
        assert sum(report.left_out.values()) == len(MALFORMED), (fmt, report.left_out)
        assert set(report.left_out) == {
            "malformed tool call (unparsed_call)",
            "malformed tool call (call_markup_in_text)",
            "malformed tool call (non_object_arguments)",
        }
    rows = read_jsonl(export(run_dir, "messages").path)
    lines = {line["key"]: line for line in _lines(run_dir).values()}
    for row in rows:  # the rows carry what to filter on afterwards
        line = lines[row["key"]]
        assert row["status"] == line["status"] and row["prompt_index"] == line["prompt_index"]
        assert "reward" in row and row["reward"] is None  # not graded
        assert len(_calls(row["messages"])) == _executed(line)


async def test_text_mode_keeps_them_with_the_call_as_the_assistants_text(run_dir: Path) -> None:
    opts = ExportOptions(malformed_calls="text")
    rows = read_jsonl(export(run_dir, "messages", options=opts).path)
    assert len(rows) == len(SCRIPTS) + len(MALFORMED)
    lines = {line["key"]: line for line in _lines(run_dir).values()}
    for row in rows:
        calls = _calls(row["messages"])
        assert all(c["function"]["name"] and isinstance(c["function"]["arguments"], dict) for c in calls)
        prompt = lines[row["key"]]["conversations"][1]["value"]
        executed = _executed(lines[row["key"]])
        assert len(calls) == (0 if prompt.endswith("arguments") else executed), prompt
        assert row["messages"][0] == {"role": "system", "content": SYSTEM}
    axolotl = read_jsonl(export(run_dir, "axolotl", options=opts).path)
    for row in axolotl:  # Axolotl json.loads every argument string: each one must be an object
        for call in _calls(row["messages"]):
            assert isinstance(json.loads(call["function"]["arguments"]), dict)


async def test_the_cli_says_what_it_left_out_and_how_to_keep_it(run_dir: Path) -> None:
    result = CliRunner().invoke(app, ["export", str(run_dir), "-f", "axolotl"])
    assert result.exit_code == 0, result.output
    assert f"wrote {len(SCRIPTS)} rows" in result.output
    assert "left out 2: malformed tool call (unparsed_call)" in result.output
    assert "--malformed-calls text" in result.output
    bad = CliRunner().invoke(app, ["export", str(run_dir), "--malformed-calls", "maybe"])
    assert bad.exit_code == 2 and "skip or text" in bad.output


async def test_a_completed_line_with_a_dangling_closing_tag_is_left_out_of_every_sft_format(
    run_dir: Path,
) -> None:
    """Lines written before the loop checked closing tags (issue 43: 6 of 46 rows of a T=1.5 run)
    end "completed" on an answer with a dangling ``</tool_call>``: no SFT format holds them, unless
    asked for with --malformed-calls text."""
    path = run_dir / "trajectories.jsonl"
    lines = read_jsonl(path)
    done = next(line for line in lines if line["conversations"][1]["value"] == "list files")
    done["conversations"][-1]["value"] += "\n</tool_call>"
    path.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    for fmt in ("messages", "llamafactory", "axolotl", "sharegpt", "hermes", "parquet"):
        report = export(run_dir, fmt, run_dir / "out" / f"{fmt}.data")
        assert report.rows == len(SCRIPTS) - 1, (fmt, report.left_out)
        markup = sum(kind == "call_markup_in_text" for kind in MALFORMED_KIND.values())
        assert report.left_out["malformed tool call (call_markup_in_text)"] == markup + 1, report.left_out
    kept = export(
        run_dir, "messages", run_dir / "out" / "text.jsonl", options=ExportOptions(malformed_calls="text")
    )
    assert kept.rows == len(SCRIPTS) + len(MALFORMED)
