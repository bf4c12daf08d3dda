"""yc_bench on the real ``yc-bench`` package (the benchmark virtualenv, ``make bench-venv``) under
real bubblewrap: the agent plays through the published CLI, the verifier replays the command log
through the real simulator.

- ``env eval yc_bench`` end to end, the model a scripted OpenAI-compatible server
  (``trajforge.testing``): the oracle's greedy CEO played as tool calls scores clearly above a
  model that does nothing (0), the verifier's replay ends where the agent's own game ended
  (funds, date), and ``env rescore`` replays the kept log to the same reward.
- what the agent may run (the published agent commands only), and a log over ``max_read_bytes``.
The database-editing attack is in ``tests/security/test_reward_hacks.py``.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from trajforge.benchpython import BenchPythonError, probe
from trajforge.cli.main import app
from trajforge.envs import RolloutBackends, Rollouts, env_sandbox_config, load_env, read_episodes
from trajforge.envs.library import yc_bench_driver as driver
from trajforge.envs.library.yc_bench import PACKAGES, YcBenchEnv
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.testing.policies import Script
from trajforge.testing.replies import Reply, ToolCallSpec
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.testing.scripted_server import ScriptedServer
from trajforge.tools.builtin import default_registry

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
]
runner = CliRunner()
SMALL = {"presets": ["tutorial"], "horizon_months": 1}  # one simulated month: ~80 CLI commands


def _env(**overrides: Any) -> YcBenchEnv:
    env = load_env("yc_bench", {**SMALL, **overrides})
    assert isinstance(env, YcBenchEnv)
    return env


@pytest.fixture
async def factory() -> AsyncIterator[Any]:
    f = create_sandbox_factory(env_sandbox_config(_env(), SandboxConfig(kind="bwrap")))
    try:
        yield f
    finally:
        await close_factory(f)


def test_only_the_published_agent_commands_are_run() -> None:
    ok = (["company", "status"], ["task", "accept", "--task-id", "x"], ["sim", "resume"], ["task", "--help"])
    for argv in ok:
        assert driver.policy_problem(list(argv)) is None, argv
    refused = (
        [],
        ["run", "--model", "x", "--seed", "1"],  # the package's own LLM loop
        ["start"],
        ["sim", "init", "--seed", "2", "--start-date", "01/01/2025", "--company-name", "x"],
        ["company", "set-funds"],
        ["scratchpad", "write", "--content", "x" * (70 << 10)],
    )
    for argv in refused:
        assert driver.policy_problem(list(argv)), argv


def _documents(text: str) -> list[Any]:
    """The JSON documents one terminal call printed (one per yc-bench command)."""
    decoder, docs, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) >= 0:
        doc, at = decoder.raw_decode(text, at)
        docs.append(doc)
    return docs


def _eval(tmp_path: Path, name: str, srv: ScriptedServer) -> dict[str, Any]:
    config = tmp_path / "yc.yaml"
    config.write_text(json.dumps({**SMALL, "group_size": 1, "max_agent_turns": 200}))
    out = runner.invoke(
        app,
        [
            "env",
            "eval",
            "yc_bench",
            "--base-url",
            srv.base_url,
            "--model",
            "scripted",
            "--config",
            str(config),
        ]
        + ["--n", "1", "--output-dir", str(tmp_path), "--run-name", name, "--json"],
    )
    assert out.exit_code == 0, out.output
    summary: dict[str, Any] = json.loads(out.output[out.output.index("{") :])
    return summary


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~80 `yc-bench` processes in the sandbox: 3.6 min at load 10 on 2 cores
def test_env_eval_oracle_scores_clearly_above_doing_nothing_and_the_replay_agrees(tmp_path: Path) -> None:
    env = _env()
    item = env.eval_items(1)[0]
    calls = env.oracle_calls(item)
    assert len(calls) >= 5  # several decision rounds, each ending in `sim resume`
    script = Script(
        [Reply(tool_calls=[ToolCallSpec(name, args)]) for name, args in calls]
        + [Reply(content="Played the year.")]
    )
    with ScriptedServer(script).in_thread() as srv:
        played = _eval(tmp_path, "oracle", srv)
    with ScriptedServer(Script([Reply(content="I will not play.")])).in_thread() as srv:
        idle = _eval(tmp_path, "none", srv)
    assert idle["mean_reward"]["value"] == 0.0
    assert played["mean_reward"]["value"] >= 0.25, played

    (ep,) = read_episodes(tmp_path / "oracle" / "episodes.jsonl")
    comps = ep.reward.components
    assert ep.reward.error is None and ep.status == "completed", (ep.reward.error, ep.error)
    assert comps["survived"] == 1.0 and comps["progress"] == 1.0, ep.reward.reason
    assert comps["refused"] == 0 and comps["failed_commands"] == 0 and comps["tasks_succeeded"] >= 2
    assert comps["commands"] == sum(1 for _ in env.plan(item))
    # the agent's own last `company status` (its database) shows what the replay computed
    last = _documents(json.loads([m["content"] for m in ep.messages if m["role"] == "tool"][-1])["output"])[
        -1
    ]
    assert last["funds_cents"] / 100 == comps["funds"] and last["sim_time"].startswith("2025-02-01")

    (none,) = read_episodes(tmp_path / "none" / "episodes.jsonl")
    assert none.reward.value == 0.0 and none.reward.components["commands"] == 0 and none.reward.error is None

    # `env rescore` replays the kept log on this host: the same outcome
    out = runner.invoke(app, ["env", "rescore", str(tmp_path / "oracle")])
    assert out.exit_code == 0, out.output
    assert "rescored 1 episodes: 1 same reward, 0 changed" in out.output, out.output


async def test_a_log_over_max_read_bytes_scores_zero_with_the_limit_named(factory: Any) -> None:
    env = _env(max_read_bytes=4096)
    item = env.eval_items(1)[0]
    steps = [
        "yc-bench company status > /dev/null",
        'yes \'{"argv": ["company", "status"]}\' | head -c 200000 >> .yc_bench/commands.jsonl',
    ]

    def policy(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
        turn = sum(m["role"] == "assistant" for m in messages)
        return tool_turn(("terminal", {"command": steps[turn]})) if turn < len(steps) else answer("done")

    ep = await Rollouts(env, RolloutBackends(ScriptedModel(policy), factory, default_registry())).episode(
        item
    )
    assert ep.reward.value == 0.0 and ep.reward.error and "max_read_bytes" in ep.reward.error, ep.reward.error


async def test_the_sandbox_runs_the_cli_and_refuses_the_rest(factory: Any) -> None:
    env = _env()
    item = env.eval_items(1)[0]
    box = await factory.create("yc-cli")
    try:
        for path, text in env.setup_files(item).items():
            await box.write_bytes(path, text.encode())
        status = await box.exec("yc-bench company status")
        assert status.exit_code == 0, status.output
        assert json.loads(status.output)["funds_cents"] == 25_000_000
        refused = await box.exec("yc-bench run --model openai/x --seed 1; yc-bench sim init --seed 9")
        assert "not an agent command" in refused.output
        log = (await box.read_bytes(".yc_bench/commands.jsonl")).decode()
        assert [orjson.loads(line)["argv"] for line in log.splitlines()] == [["company", "status"]]
        for path in (*env.bench().ro_paths, str(env.cli_dir())):  # mounted read-only, at their own path
            opts = await box.exec(f"awk -v p={path} '$5 == p {{print $6}}' /proc/self/mountinfo")
            assert opts.output.strip().split(",")[0] == "ro", (path, opts.output)
    finally:
        await box.close()


def test_without_a_benchmark_interpreter_env_eval_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(BenchPythonError, match="Python 3.11, the benchmarks need >= 3.12"):
        probe(Path(sys.prefix), PACKAGES)  # trajforge's own interpreter is too old
    config = tmp_path / "yc.yaml"
    config.write_text(json.dumps({**SMALL, "bench_venv": str(tmp_path / "nowhere")}))
    out = runner.invoke(
        app,
        [
            "env",
            "eval",
            "yc_bench",
            "--agent",
            "none",
            "--config",
            str(config),
            "--output-dir",
            str(tmp_path),
        ],
    )
    assert out.exit_code == 2 and "make bench-venv" in out.output and "nowhere" in out.output, out.output


def test_read_only_binds_are_plain_absolute_paths_outside_the_sandboxs_own() -> None:
    assert SandboxConfig(ro_binds=["/opt/venv", "/root/.pyenv/versions/3.12.1"]).ro_binds[0] == "/opt/venv"
    for bad in ("opt/venv", "/opt/../etc", "/opt/venv/", "/tmp/x", "/workspace", "/run", "/usr/lib", "/"):
        with pytest.raises(ValidationError, match="ro_binds"):
            SandboxConfig(ro_binds=[bad])
