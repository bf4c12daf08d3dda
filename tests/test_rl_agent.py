"""The RL agent driven by a scripted OpenAI-compatible endpoint through the whole workflow:
discover (library + an env file it writes in its sandbox), select, inspect, edit (a rejected
value, accepted ones, a locked field after start), test inference, start a real tiny GRPO run of
``trajforge rl train`` through the run manager, follow its status, read its results and compare
the trained checkpoint with the start. The tools are the real rl tools; nothing is stubbed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from trajforge.endpoint import EndpointConfig, build_chat_model
from trajforge.rl.agent import RLAgent, RLAgentConfig
from trajforge.rl.runs.manager import Manager
from trajforge.rl.runs.schema import read_metrics
from trajforge.rl.runs.tools import RLSession, RLToolSettings
from trajforge.testing.scripted_server import Reply, ScriptedServer, ToolCallSpec

KEY_ENV = "TF_RL_AGENT_TEST_KEY"

USER_ENV = textwrap.dedent(
    '''
    """tiny_tasks arithmetic only: written by the agent in its sandbox."""
    from trajforge.envs.library.tiny_tasks import TinyTasksConfig, TinyTasksEnv


    class ArithmeticEnv(TinyTasksEnv):
        name = "arithmetic_only"
        description = "tiny_tasks, arithmetic family only (written by the agent)"

        @classmethod
        def default_config(cls):
            return TinyTasksConfig(enabled_toolsets=["terminal", "file"], max_agent_turns=2, families=["arithmetic"])
    '''
)

# The workflow before training: (tool, arguments). DISCOVER -> CREATE -> DISCOVER -> INSPECT ->
# CONFIGURE -> TEST -> TRAIN.
BEFORE_TRAINING: list[tuple[str, dict[str, Any]]] = [
    ("rl_list_environments", {}),
    ("write_file", {"path": "envs/arithmetic_env.py", "content": USER_ENV}),
    ("rl_list_environments", {}),
    ("rl_select_environment", {"name": "agent/arithmetic_env"}),
    ("terminal", {"command": "python3 -c 'print(6*7)'"}),  # INSPECT DATA: the agent can compute
    ("rl_get_current_config", {}),
    ("rl_edit_config", {"field": "group_size", "value": "1"}),  # rejected: GRPO needs >= 2
    ("rl_edit_config", {"field": "max_agent_turns", "value": 0}),  # rejected by the env's config
    ("rl_edit_config", {"field": "steps", "value": 2}),
    ("rl_edit_config", {"field": "group_size", "value": "2"}),
    ("rl_edit_config", {"field": "groups_per_step", "value": 1}),
    ("rl_edit_config", {"field": "max_tokens", "value": 48}),
    ("rl_edit_config", {"field": "max_agent_turns", "value": 2}),
    ("rl_test_inference", {"models": ["embedded"], "n": 2}),
    ("rl_start_training", {}),
    ("rl_edit_config", {"field": "model", "value": "/elsewhere"}),  # locked now
    ("rl_check_status", {}),
]


def _calls(body: dict[str, Any]) -> list[str]:
    return [
        tc["function"]["name"]
        for m in body["messages"]
        if m["role"] == "assistant"
        for tc in m.get("tool_calls") or []
    ]


def _results(body: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in body["messages"] if m["role"] == "tool"]


def _call(name: str, args: dict[str, Any]) -> Reply:
    return Reply(tool_calls=[ToolCallSpec(name=name, arguments=args)])


def workflow_policy(body: dict[str, Any]) -> Reply:
    """A model that walks the workflow, deciding each step from what the tools returned."""
    calls, results = _calls(body), _results(body)
    if len(calls) < len(BEFORE_TRAINING):
        return _call(*BEFORE_TRAINING[len(calls)])
    last, output = calls[-1], results[-1]
    run_id = json.loads(results[BEFORE_TRAINING.index(("rl_start_training", {}))])["run_id"]
    if last == "rl_check_status":
        status = json.loads(output)["status"]
        if status in {"starting", "running"}:
            return _call("terminal", {"command": "sleep 2"})
        return _call("rl_get_results", {"run_id": run_id})
    if last == "terminal":
        return _call("rl_check_status", {"run_id": run_id})
    if last == "rl_get_results":
        return _call("rl_test_inference", {"models": ["embedded", run_id], "n": 2})
    if last == "rl_test_inference":
        return _call("rl_list_runs", {})
    return Reply(content=f"EVALUATE: run {run_id} trained 2 steps; see the accuracy table above.")


def _tool_outputs(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(tool name, output) in call order."""
    names = {
        tc["id"]: tc["function"]["name"]
        for m in messages
        if m["role"] == "assistant"
        for tc in m.get("tool_calls") or []
    }
    return [(names[m["tool_call_id"]], str(m["content"])) for m in messages if m["role"] == "tool"]


@pytest.mark.timeout(1200)
@pytest.mark.slow
async def test_rl_agent_walks_the_workflow_on_a_real_tiny_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "k")
    manager = Manager(tmp_path / "runs")
    settings = RLToolSettings(
        envs_dir=tmp_path / "envs",
        agent_envs_dir=tmp_path / "agent_envs",
        trust_agent_envs=True,  # the operator's flag: the env the agent writes may run, sandboxed
        inference_dir=tmp_path / "inference",
        # the trainer's batch shape for a 2-core machine; the agent edits the rest
        train_defaults={"concurrency": 2, "max_batch": 4, "micro_batch": 4, "max_turns": 2},
        ready_timeout_s=600,
    )
    async with ScriptedServer(workflow_policy) as srv:
        model = build_chat_model(EndpointConfig(model="scripted", base_url=srv.base_url, api_key_env=KEY_ENV))
        try:
            async with RLAgent(model, manager, settings, RLAgentConfig()) as agent:
                result = await agent.ask("Train a model on arithmetic tasks and tell me if it improved.")
                session = agent.ctx.state["rl"] if agent.ctx else None
        finally:
            await model.aclose()

    assert result.finished_naturally, result.error
    assert result.final_answer and result.final_answer.startswith("EVALUATE: run ")
    # What the model was offered: the real rl tools next to terminal, file and web, and the workflow.
    offered = {t["function"]["name"] for t in srv.requests[0]["tools"]}
    assert {"terminal", "write_file", "web_extract", "rl_start_training", "rl_test_inference"} <= offered
    system = srv.requests[0]["messages"][0]["content"]
    for step in ("DISCOVER", "INSPECT DATA", "CREATE", "CONFIGURE", "TEST", "TRAIN", "EVALUATE"):
        assert step in system

    outputs = _tool_outputs(result.messages)
    by_name: dict[str, list[str]] = {}
    for name, out in outputs:
        by_name.setdefault(name, []).append(out)

    # DISCOVER: the library first, then also the env file the agent wrote in its sandbox, read
    # statically and kept in the agent env store, never in the operator's envs dir.
    first, second = (json.loads(o) for o in by_name["rl_list_environments"])
    assert "tiny_tasks" in {e["name"] for e in first["environments"]}
    agent_rows = [e for e in second["environments"] if e["source"] == "agent"]
    assert [(e["name"], e["approved"]) for e in agent_rows] == [("agent/arithmetic_env", False)]
    assert agent_rows[0]["description"] == "tiny_tasks, arithmetic family only (written by the agent)"
    assert not (tmp_path / "envs").exists()
    stored = list((tmp_path / "agent_envs").glob("arithmetic_env.*.py"))
    assert [p.read_text() for p in stored] == [USER_ENV]
    # INSPECT / INSPECT DATA: it ran in its env host (approved by the operator's flag)
    selected = json.loads(by_name["rl_select_environment"][0])
    assert selected["selected"] == "agent/arithmetic_env:ArithmeticEnv" and selected["source"] == "agent"
    assert selected["example_item"]["family"] == "arithmetic" and selected["example_prompt"]
    assert "42" in by_name["terminal"][0]
    # CONFIGURE: typed validation, then a lock once a run started
    edits = by_name["rl_edit_config"]
    assert edits[0].startswith("Error: group_size=1 rejected") and "greater than or equal to 2" in edits[0]
    assert edits[1].startswith("Error: max_agent_turns=0 rejected")
    assert all('"changed"' in e for e in edits[2:7])
    assert edits[7].startswith("Error: model is locked: run ") and "tokenizer" in edits[7]
    config = json.loads(by_name["rl_get_current_config"][0])
    assert config["locked"]["env"] and config["train"]["model"]
    # TEST: an accuracy table for the starting model
    assert "| embedded | 2 |" in by_name["rl_test_inference"][0]

    # TRAIN: a real run of `trajforge rl train`, ready at its first metrics line, followed to its end
    start = json.loads(by_name["rl_start_training"][0])
    run_id = start["run_id"]
    assert start["status"] == "running" and start["processes"][0]["name"] == "trainer"
    statuses = [json.loads(o)["status"] for o in by_name["rl_check_status"]]
    assert statuses[-1] == "finished" and set(statuses) <= {"running", "finished"}
    state = await manager.status(run_id)
    assert state.status == "finished" and state.process("trainer").exit_code == 0
    run_dir = Path(state.dir)
    train_file = (run_dir / "train.yaml").read_text()
    assert "steps: 2" in train_file and "max_agent_turns: 2" in train_file
    assert "env: agent-env:" in train_file  # the trainer ran the agent's env through its env host
    assert len(read_metrics(run_dir / "trainer" / "metrics.jsonl")) == 2
    # EVALUATE: results with checkpoints on disk, then the checkpoint against the start
    results = json.loads(by_name["rl_get_results"][0])
    assert results["metric_lines"] == 2 and "reward_mean" in results["metrics"]
    assert results["checkpoints"] and all((Path(c) / "config.json").is_file() for c in results["checkpoints"])
    table = by_name["rl_test_inference"][1]
    assert "| embedded | 2 |" in table and f"| {run_id} | 2 |" in table
    compared = json.loads(table.split("\n\n")[0])["results"]
    assert compared[1]["weights"] == results["checkpoints"][-1]
    assert 0.0 <= compared[1]["accuracy"] <= 1.0
    runs = json.loads(by_name["rl_list_runs"][0])["runs"]
    assert [r["run_id"] for r in runs if not r["run_id"].startswith("_")] == [run_id]
    # per-session state lives in the tool context
    assert isinstance(session, RLSession) and session.runs == [run_id]


def test_rl_agent_cli_task_and_repl_status_shortcut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``trajforge rl agent "TASK" --interactive``: the task runs, then the REPL's ``status``
    lists runs without a model call, and ``exit`` ends it."""
    monkeypatch.setenv(KEY_ENV, "k")
    runs = tmp_path / "runs"
    (runs / "demo-run").mkdir(parents=True)
    (runs / "demo-run" / "state.json").write_text(
        json.dumps({"id": "demo-run", "kind": "train", "dir": str(runs / "demo-run"), "status": "finished"})
    )

    def policy(body: dict[str, Any]) -> Reply:
        if not _calls(body):
            return _call("rl_list_runs", {})
        return Reply(content="DISCOVER done: one run, demo-run, finished.")

    with ScriptedServer(policy).in_thread() as srv:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                "from trajforge.cli.main import main; main()",
                "rl",
                "agent",
                "What runs are there?",
                "--interactive",
                "--model",
                "scripted",
                "--base-url",
                srv.base_url,
                "--api-key-env",
                KEY_ENV,
                "--output-dir",
                str(runs),
                "--envs-dir",
                str(tmp_path / "envs"),
                "--sandbox",
                "local",
            ],
            input="status\nexit\n",
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        requests = len(srv.requests)
    assert proc.returncode == 0, proc.stderr
    assert "DISCOVER done: one run, demo-run, finished." in proc.stdout
    assert "demo-run" in proc.stdout.split("DISCOVER done")[1]  # the status table after the answer
    assert requests == 2  # the task's two model calls; `status` asked no model
