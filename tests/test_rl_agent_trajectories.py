"""The RL agent saves its sessions as trajectory lines (``--save-trajectories``), as the seed's RL
CLI does: the project's line format (ShareGPT ``conversations`` + exact ``messages``), one line
per task, a session's lines sharing ``session_id``; a directory splits them by outcome."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from trajforge.cli.main import app
from trajforge.rl.agent import RLAgent, RLAgentConfig
from trajforge.rl.runs.manager import Manager
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.testing.scripted_server import ScriptedServer, tool_then_answer
from trajforge.trajectory.save import COMPLETED_FILE, FAILED_FILE

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]


def _lines(path: Path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()]


async def test_each_task_of_a_session_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "sessions.jsonl"
    model = ScriptedModel(
        [tool_turn(("terminal", {"command": "echo from-the-sandbox"})), answer("done"), answer("again")]
    )
    config = RLAgentConfig(toolsets=["terminal"], max_iterations=4, save_trajectories=out)
    async with RLAgent(model, Manager(tmp_path / "runs"), config=config) as agent:
        await agent.ask("List the environments.")
        await agent.ask("And now?")
    first, second = _lines(out)
    assert first["session_id"] == second["session_id"] == agent.session_id
    assert (first["task_index"], second["task_index"]) == (0, 1)
    assert first["completed"] is True and first["model"] == "scripted" and first["source"] == "rl_agent"
    roles = [t["from"] for t in first["conversations"]]
    # the ShareGPT format of the project: the tools in a system turn, then the human prompt
    assert roles[:2] == ["system", "human"] and "tool" in roles and roles[-1] == "gpt"
    assert '"terminal"' in first["conversations"][0]["value"]
    assert first["conversations"][1]["value"] == "List the environments."
    assert any("from-the-sandbox" in t["value"] for t in first["conversations"] if t["from"] == "tool")
    assert first["tool_stats"]["terminal"]["success"] == 1
    # the exact messages ride on the same line; the second line extends the first
    assert first["messages"][0]["role"] == "system"
    assert second["messages"][: len(first["messages"])][1:] == first["messages"][1:]
    last = second["conversations"][-1]
    assert last["from"] == "gpt" and last["value"].endswith(
        "again"
    )  # <think></think> first, as every gpt turn
    assert [t["value"] for t in second["conversations"] if t["from"] == "human"] == [
        "List the environments.",
        "And now?",
    ]


async def test_a_directory_splits_by_outcome(tmp_path: Path) -> None:
    where = tmp_path / "trajs"
    # one call allowed: the first task ends on its budget (failed), the second answers (completed)
    model = ScriptedModel([tool_turn(("terminal", {"command": "true"})), answer("ok")])
    config = RLAgentConfig(toolsets=["terminal"], max_iterations=1, save_trajectories=where)
    async with RLAgent(model, Manager(tmp_path / "runs"), config=config) as agent:
        failed = await agent.ask("one")
        done = await agent.ask("two")
    assert not failed.finished_naturally and done.finished_naturally
    assert [x["completed"] for x in _lines(where / FAILED_FILE)] == [False]
    assert [x["completed"] for x in _lines(where / COMPLETED_FILE)] == [True]


def test_the_cli_flag_saves_the_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_RL_TRAJ_KEY", "k")
    out = tmp_path / "agent.jsonl"
    with ScriptedServer(tool_then_answer(calls_per_sample=1, command="echo cli")).in_thread() as srv:
        result = CliRunner().invoke(
            app,
            [
                "rl", "agent", "Say hi.", "--model", "scripted", "--base-url", srv.base_url,
                "--api-key-env", "TF_RL_TRAJ_KEY", "--toolsets", "terminal",
                "--runs-dir", str(tmp_path / "runs"), "--save-trajectories", str(out),
            ],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    (line,) = _lines(out)
    assert line["completed"] is True and line["conversations"][1] == {"from": "human", "value": "Say hi."}
    assert any(t["from"] == "tool" and "cli" in t["value"] for t in line["conversations"])


def test_a_path_that_cannot_hold_lines_is_refused_before_the_session(tmp_path: Path) -> None:
    (tmp_path / "taken.jsonl").mkdir()
    result = CliRunner().invoke(
        app,
        ["rl", "agent", "x", "--save-trajectories", str(tmp_path / "taken.jsonl"), "--toolsets", "terminal"],
    )
    assert result.exit_code == 2 and "is a directory" in result.output
