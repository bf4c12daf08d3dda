"""``trajforge env`` commands, live concurrency changes, and env eval against model eval."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from trajforge.cli.main import app
from trajforge.envs import RolloutBackends, load_env, run_eval, write_control
from trajforge.envs.catalog import LIBRARY
from trajforge.llm.types import AssistantTurn
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.tools.builtin import default_registry

runner = CliRunner()


def test_env_list_names_every_shipped_env() -> None:
    out = runner.invoke(app, ["env", "list"])
    assert out.exit_code == 0, out.output
    for name in LIBRARY:
        assert name in out.output


def test_env_show_prints_config_and_an_example_item() -> None:
    out = runner.invoke(app, ["env", "show", "terminal_test", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["name"] == "terminal_test"
    assert data["config"]["enabled_toolsets"] == ["terminal", "file"]
    assert data["example_item"]["expected_files"]
    assert data["example_prompt"] == data["example_item"]["prompt"]


def test_env_eval_oracle_then_rescore_from_kept_files(tmp_path: Path) -> None:
    out = runner.invoke(
        app,
        [
            "env",
            "eval",
            "terminal_test",
            "--agent",
            "oracle",
            "--max-samples",
            "5",
            "--group-size",
            "2",
            "--output-dir",
            str(tmp_path),
            "--run-name",
            "r",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output[out.output.index("{") :])
    assert summary["mean_reward"]["value"] == 1.0 and summary["episodes"] == 10
    assert summary["pass_at_k"] == {"1": 1.0, "2": 1.0}
    out = runner.invoke(app, ["env", "rescore", str(tmp_path / "r")])
    assert out.exit_code == 0, out.output
    assert "rescored 10 episodes: 10 same reward, 0 changed" in out.output


def test_env_eval_errors_say_what_to_do(tmp_path: Path) -> None:
    out = runner.invoke(app, ["env", "eval", "terminal_test", "--agent", "genius"])
    assert out.exit_code == 2 and "--agent must be model, oracle or none" in out.output
    out = runner.invoke(app, ["env", "eval", "nope"])
    assert out.exit_code == 2 and "unknown env 'nope'" in out.output
    out = runner.invoke(app, ["env", "eval", "terminal_test", "--tasks", str(tmp_path)])
    assert out.exit_code == 2 and "does not read a task directory" in out.output
    out = runner.invoke(app, ["env", "rescore", str(tmp_path)])
    assert out.exit_code == 2 and "is not a run directory trajforge wrote" in out.output


class _Gauge:
    """A model that answers after a pause and records how many of its calls overlap."""

    def __init__(self) -> None:
        self.active = 0
        self.peak_after_resize = 0
        self.resized = False

    @property
    def name(self) -> str:
        return "gauge"

    async def complete(self, messages: Any, tools: Any = None, sampling: Any = None) -> AssistantTurn:
        self.active += 1
        if self.resized:
            self.peak_after_resize = max(self.peak_after_resize, self.active)
        try:
            await asyncio.sleep(0.4)
        finally:
            self.active -= 1
        return AssistantTurn(content="done", finish_reason="stop")

    async def aclose(self) -> None:
        return None


async def test_concurrency_changes_while_running_and_is_reported(tmp_path: Path) -> None:
    env = load_env("terminal_test", {"max_concurrent_rollouts": 1})
    model = _Gauge()
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap"))
    run_dir = tmp_path / "run"
    try:
        task = asyncio.create_task(
            run_eval(env, RolloutBackends(model, factory, default_registry()), run_dir, n=16, group_size=1)
        )
        await asyncio.sleep(1.5)
        status = orjson.loads((run_dir / "status.json").read_bytes())
        assert status["rollouts"]["size"] == 1 and status["rollouts"]["waiting"] > 0
        write_control(run_dir, max_concurrent_rollouts=6)
        model.resized = True
        await asyncio.wait_for(task, 120)
    finally:
        await close_factory(factory)
    assert model.peak_after_resize > 1
    status = orjson.loads((run_dir / "status.json").read_bytes())
    assert status["rollouts"]["size"] == 6 and status["finished"] == 16


@pytest.mark.slow
def test_env_eval_tiny_tasks_on_the_embedded_policy_agrees_with_model_eval(tmp_path: Path) -> None:
    """The same held-out items, greedy: `env eval` (served by `trajforge serve`) and `model eval`
    (in-process) must agree within the 95% interval (in practice item by item)."""
    from trajforge.models.tiny import weights_path
    from trajforge.models.tiny.evaluate import evaluate

    n = 6
    out = runner.invoke(
        app,
        [
            "env",
            "eval",
            "tiny_tasks",
            "--max-samples",
            str(n),
            "--group-size",
            "1",
            "--temperature",
            "0",
            "--output-dir",
            str(tmp_path),
            "--run-name",
            "e",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    env_summary = json.loads(out.output[out.output.index("{") :])
    report = asyncio.run(evaluate(weights_path(), n))
    low, high = env_summary["pass_at_1"]["low"], env_summary["pass_at_1"]["high"]
    assert low <= report.success_rate <= high
    episodes = [orjson.loads(x) for x in (tmp_path / "e" / "episodes.jsonl").read_bytes().splitlines()]
    by_item = {e["item_id"]: e["reward"]["value"] for e in episodes}
    same = sum(by_item[o.task_id] == o.reward for o in report.outcomes)
    assert same >= n - 1, (by_item, [(o.task_id, o.reward) for o in report.outcomes])


def test_env_eval_config_file_keeps_the_env_defaults(tmp_path: Path) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text("env:\n  max_agent_turns: 3\n")
    out = runner.invoke(
        app,
        [
            "env",
            "eval",
            "terminal_test",
            "--agent",
            "oracle",
            "--max-samples",
            "2",
            "--group-size",
            "1",
            "--config",
            str(conf),
            "--output-dir",
            str(tmp_path),
            "--run-name",
            "c",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    run = orjson.loads((tmp_path / "c" / "run.json").read_bytes())
    assert run["config"]["max_agent_turns"] == 3
    assert run["config"]["enabled_toolsets"] == ["terminal", "file"]  # the env's default, kept
