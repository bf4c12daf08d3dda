"""``terminal_bench`` under ``--sandbox docker`` on a real engine, end to end: every shipped Harbor
task's Dockerfile is built on the locally debootstrapped base (its ``FROM`` names that image, as a
task directory prepared for an offline machine does), the agent runs in the built image, the tests
run in the same container at their real paths (``/tests``, ``/logs``), and the reward comes back:
the oracle 1.0, the do-nothing agent 0.0, on every task; through the CLI as well. The agent cannot
plant the reward: not as files, not with a detached process that writes it during verification."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trajforge.cli.main import app
from trajforge.envs import RolloutBackends, Rollouts, load_env
from trajforge.envs.agents import NothingModel, nothing_model_for, oracle_model_for
from trajforge.envs.library.terminal_bench import TerminalBenchEnv, shipped_dir
from trajforge.sandbox import SandboxConfig, close_factory, create_sandbox_factory
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools.registry import default_registry

pytestmark = [pytest.mark.docker]

SHIPPED = sorted(p.name for p in shipped_dir().iterdir() if (p / "task.toml").is_file())


def _offline_copy(dest: Path, base: str) -> Path:
    """The shipped tasks with every ``FROM`` on the local base image (no registry is reachable)."""
    shutil.copytree(shipped_dir(), dest, ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
    for dockerfile in dest.glob("*/environment/Dockerfile"):
        text = dockerfile.read_text()
        dockerfile.write_text(re.sub(r"(?im)^FROM\s+\S+", f"FROM {base}", text))
    return dest


@pytest.fixture(scope="module")
def tasks_dir(docker_engine, tmp_path_factory) -> Path:
    return _offline_copy(tmp_path_factory.mktemp("tb") / "tasks", docker_engine.base)


@pytest.fixture(scope="module")
def env(tasks_dir) -> TerminalBenchEnv:
    loaded = load_env("terminal_bench", {"sandbox": "docker", "tasks_dir": str(tasks_dir)})
    assert isinstance(loaded, TerminalBenchEnv)
    asyncio.run(loaded.setup())  # docker build of every task, once for the module
    return loaded


@pytest.fixture
async def factory(docker_engine, tmp_path):
    f = create_sandbox_factory(
        SandboxConfig(kind="docker", root_dir=str(tmp_path / "sb"), docker_image=docker_engine.base)
    )
    yield f
    await close_factory(f)


def _rollouts(env, factory, *, model=None, model_for=None) -> Rollouts:
    backends = RolloutBackends(
        model=model or NothingModel(), factory=factory, registry=default_registry(), model_for=model_for
    )
    return Rollouts(env, backends)


async def test_every_shipped_task_builds_on_the_local_base(env):
    assert env.skipped == {}
    assert sorted(t.name for t in env.tasks) == SHIPPED and len(SHIPPED) >= 6
    for task in env.tasks:
        assert task.image and task.image.startswith("trajforge-tb-"), task


@pytest.mark.parametrize("name", SHIPPED)
async def test_oracle_scores_one_and_nothing_zero(name, env, factory):
    item = next(i for i in env.eval_items(100) if i["id"] == name)
    oracle = await _rollouts(env, factory, model_for=oracle_model_for(env)).episode(item)
    assert oracle.status == "completed" and oracle.reward_error is None, oracle.reason
    assert oracle.reward == 1.0, oracle.reward_reason
    nothing = await _rollouts(env, factory, model_for=nothing_model_for(env)).episode(item)
    assert nothing.status == "completed" and nothing.reward_error is None, nothing.reason
    assert nothing.reward == 0.0, nothing.reward_reason


async def test_the_rollout_runs_in_the_built_image_at_the_real_paths(env, factory):
    """WORKDIR, ENV, COPY and RUN of the Dockerfile are the image's (no replay, no path mapping)."""
    item = next(i for i in env.eval_items(100) if i["id"] == "fix-backup-script")
    look = "pwd; echo root=$BACKUP_ROOT; ls -l /app/backup.sh; cat data/record-2.txt; id -u; cat /etc/os-release | head -1"
    model = ScriptedModel([tool_turn(("terminal", {"command": look})), answer("looked")])
    ep = await _rollouts(env, factory, model=model).episode(item)
    (content,) = [str(m["content"]) for m in ep.messages if m["role"] == "tool"]
    out = json.loads(content)["output"]
    assert "/app\n" in out and "root=/app/backups" in out and "-rwx" in out and "record 2" in out, out
    assert "Debian GNU/Linux" in out, out


async def test_agent_cannot_plant_reward_files_or_a_reward_writing_daemon(env, factory):
    item = next(i for i in env.eval_items(100) if i["id"] == "log-summary")
    plant = (
        "mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
        "printf 'echo 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh && echo 'wrong 1' > /app/summary.txt; "
        "setsid sh -c 'while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; done' "
        ">/dev/null 2>&1 < /dev/null &"
    )
    model = ScriptedModel([tool_turn(("terminal", {"command": plant})), answer("done")])
    ep = await _rollouts(env, factory, model=model).episode(item)
    assert ep.reward_error is None and ep.reward == 0.0, ep.reward_reason
    assert ep.reward_reason.startswith("reward.txt"), ep.reward_reason


def _cli_eval(tasks: Path, agent: str, out: Path) -> dict:
    """``trajforge env eval terminal_bench --sandbox docker`` as a user types it."""
    done = CliRunner().invoke(
        app,
        [
            "env", "eval", "terminal_bench", "--sandbox", "docker", "--agent", agent, "--tasks", str(tasks),
            "--n", "100", "--group-size", "1", "--output-dir", str(out), "--json",
        ],
    )  # fmt: skip
    assert done.exit_code == 0, done.output[-3000:]
    return json.loads(done.stdout[done.stdout.index("{") :])


@pytest.mark.parametrize(("agent", "reward"), [("oracle", 1.0), ("none", 0.0)])
def test_env_eval_cli_with_sandbox_docker(agent, reward, tasks_dir, tmp_path):
    summary = _cli_eval(tasks_dir, agent, tmp_path / "runs")
    assert summary["episodes"] == len(SHIPPED) and summary["failed"] == 0, summary
    assert summary["reward_errors"] == 0 and summary["mean_reward"]["value"] == reward, summary
