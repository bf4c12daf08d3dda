"""``tblite``: the light Terminal-Bench sets, bring your own directory. Without ``--tasks`` it says
how to get one (none ship: the published sets cannot be downloaded offline); with one it runs it
as terminal_bench does (bwrap, oracle 1.0 / do-nothing 0.0 through the CLI), its records named
``tblite``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trajforge.cli.main import app
from trajforge.envs import load_env
from trajforge.envs.base import EnvDataError
from trajforge.envs.library.tblite import TbliteEnv
from trajforge.envs.library.terminal_bench import shipped_dir

PICK = ("word-frequency", "orders-totals", "port-check")  # text, data, listeners on loopback


def test_without_a_directory_it_says_how_to_get_one() -> None:
    env = load_env("tblite")
    assert isinstance(env, TbliteEnv)
    with pytest.raises(EnvDataError, match=r"--tasks DIR"):
        env.eval_items(1)
    done = CliRunner().invoke(app, ["env", "eval", "tblite", "--agent", "oracle", "--n", "1"])
    assert done.exit_code != 0 and "tblite needs the task set on disk" in done.output, done.output


@pytest.mark.bwrap
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("none", 0.0)])
def test_a_task_directory_runs_through_the_cli(agent: str, reward: float, tmp_path: Path) -> None:
    tasks = tmp_path / "tblite"
    for name in PICK:
        shutil.copytree(shipped_dir() / name, tasks / name)
    done = CliRunner().invoke(
        app,
        [
            "env", "eval", "tblite", "--agent", agent, "--tasks", str(tasks), "--n", "10",
            "--group-size", "1", "--output-dir", str(tmp_path / "runs"), "--run-name", "r", "--json",
        ],
    )  # fmt: skip
    assert done.exit_code == 0, done.output[-3000:]
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    assert summary["env"] == "tblite" and summary["episodes"] == len(PICK), summary
    assert summary["failed"] == 0 and summary["reward_errors"] == 0, summary
    assert summary["mean_reward"]["value"] == reward, summary
    rows = [
        json.loads(line) for line in (tmp_path / "runs" / "r" / "episodes.jsonl").read_text().splitlines()
    ]
    assert sorted(r["item"]["id"] for r in rows) == sorted(PICK)
