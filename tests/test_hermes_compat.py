"""An env written against the seed system's API (Hermes Agent's ``environments/``: a
``HermesAgentBaseEnv`` subclass with ``config_init`` and a ``compute_reward`` calling the blocking
``ctx.terminal``) runs unchanged with ``trajforge env eval path/file.py:Class``, end to end: the
scripted OpenAI-compatible server plays the model, the rollouts run in bubblewrap, the seed's
reward code judges them."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from trajforge.cli.main import app
from trajforge.envs.config import EnvConfigError
from trajforge.envs.hermes_compat import HermesAgentEnvConfig
from trajforge.testing.policies import count_assistant_turns, last_user_text
from trajforge.testing.scripted_server import Reply, ScriptedServer, ToolCallSpec

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

runner = CliRunner()

# Written as a Hermes Agent user writes one: the seed's imports, config_init, blocking ctx verbs.
SEED_ENV = textwrap.dedent(
    '''
    """Write a word into answer.txt; the seed's reward code checks it with ctx.terminal."""
    from typing import Any, Dict, List, Tuple

    from atroposlib.envs.server_handling.server_manager import APIServerConfig
    from environments.agent_loop import AgentResult
    from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig
    from environments.tool_context import ToolContext


    class WordFileEnv(HermesAgentBaseEnv):
        name = "word-file"
        env_config_cls = HermesAgentEnvConfig

        @classmethod
        def config_init(cls) -> Tuple[HermesAgentEnvConfig, List[APIServerConfig]]:
            env_config = HermesAgentEnvConfig(
                enabled_toolsets=["terminal", "file"],
                max_agent_turns=4,
                group_size=1,
                terminal_backend="local",
                terminal_timeout=60,
                tokenizer_name="NousResearch/Hermes-3-Llama-3.1-8B",
                use_wandb=False,
                total_steps=10,
                max_token_length=2048,
            )
            server_configs = [
                APIServerConfig(
                    base_url="http://localhost:8000/v1", model_name="NousResearch/Hermes-4-14B",
                    server_type="openai", api_key="x", health_check=False,
                )
            ]
            return env_config, server_configs

        async def setup(self):
            self.train = [{"word": w} for w in ("alpha", "bravo", "charlie")]
            self.iter = 0

        async def get_next_item(self) -> Dict[str, Any]:
            item = self.train[self.iter % len(self.train)]
            self.iter += 1
            return item

        def format_prompt(self, item: Dict[str, Any]) -> str:
            return f"Write the word {item['word']} into answer.txt"

        async def compute_reward(self, item, result: AgentResult, ctx: ToolContext) -> float:
            test = ctx.terminal("cat answer.txt")
            if test["exit_code"] != 0:
                return 0.0
            read = ctx.read_file("answer.txt")
            assert read["content"] == test["output"], (read, test)
            if result.managed_state is not None or result.turns_used < 1:
                return 0.0
            return 1.0 if test["output"].strip() == item["word"] else 0.0

        async def evaluate(self, *args, **kwargs):
            pass


    class ExportedWordEnv(WordFileEnv):
        """The seed's same-session check: a variable the agent exported, seen by reward code."""

        name = "exported-word"

        async def compute_reward(self, item, result, ctx: ToolContext) -> float:
            got = ctx.terminal("echo word=$WORD")
            return 1.0 if got["output"].strip() == f"word={item['word']}" else 0.0
    '''
)


def _policy(body: dict[str, Any]) -> Reply:
    """Writes the asked word (but 'charlie' misspelt), exporting it too; then answers."""
    word = re.search(r"word (\w+)", last_user_text(body) or "")
    text = word.group(1) if word else "none"
    if count_assistant_turns(body) == 0:
        written = "charly" if text == "charlie" else text
        command = f"echo {written} > answer.txt && export WORD={written}"
        return Reply(tool_calls=[ToolCallSpec("terminal", {"command": command})])
    return Reply(content="done")


def _eval(
    tmp_path: Path, srv: Any, ref: str, name: str, *extra: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    out = runner.invoke(
        app,
        [
            "env", "eval", ref, "--model", "scripted", "--base-url", srv.base_url,
            "--api-key-env", "TF_SEED_KEY", "--n", "3", "--group-size", "1",
            "--output-dir", str(tmp_path / "runs"), "--run-name", name, "--json", *extra,
        ],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output[out.output.index("{") :])
    episodes = [
        orjson.loads(line) for line in (tmp_path / "runs" / name / "episodes.jsonl").read_bytes().splitlines()
    ]
    return summary, episodes


def _by_word(episodes: list[dict[str, Any]]) -> dict[str, float]:
    return {e["item"]["word"]: e["reward"]["value"] for e in episodes}


def test_a_seed_env_runs_unchanged_under_env_eval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_SEED_KEY", "k")
    env_file = tmp_path / "word_env.py"
    env_file.write_text(SEED_ENV)
    with ScriptedServer(_policy).in_thread() as srv:
        summary, episodes = _eval(tmp_path, srv, f"{env_file}:WordFileEnv", "seed")
    assert summary["episodes"] == 3
    assert _by_word(episodes) == {"alpha": 1.0, "bravo": 1.0, "charlie": 0.0}, episodes
    assert all(e["status"] == "completed" and e["reward"]["error"] is None for e in episodes)
    cfg = orjson.loads((tmp_path / "runs" / "seed" / "run.json").read_bytes())["config"]
    # the seed's config names arrived as trajforge's; atroposlib's are kept, named
    assert cfg["command_timeout_s"] == 60.0 and cfg["sandbox"] == "bwrap" and cfg["max_tokens"] == 2048
    assert (
        cfg["tokenizer_name"] == "NousResearch/Hermes-3-Llama-3.1-8B" and cfg["terminal_backend"] == "local"
    )


def test_same_session_reward_needs_reward_shell_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed ran reward commands in the rollout's own shell; here that is an explicit choice."""
    monkeypatch.setenv("TF_SEED_KEY", "k")
    env_file = tmp_path / "word_env.py"
    env_file.write_text(SEED_ENV)
    config = tmp_path / "session.yaml"
    config.write_text("reward_shell: session\n")
    with ScriptedServer(_policy).in_thread() as srv:
        _, session = _eval(tmp_path, srv, f"{env_file}:ExportedWordEnv", "session", "--config", str(config))
        _, fresh = _eval(tmp_path, srv, f"{env_file}:ExportedWordEnv", "fresh")
    assert _by_word(session) == {"alpha": 1.0, "bravo": 1.0, "charlie": 0.0}, session
    assert _by_word(fresh) == {"alpha": 0.0, "bravo": 0.0, "charlie": 0.0}, fresh


def test_seed_config_fields_map_or_say_what_to_do() -> None:
    cfg = HermesAgentEnvConfig(
        terminal_backend="docker", terminal_timeout=30, terminal_lifetime=900, use_wandb=True,
        max_token_length=512, disabled_toolsets=None, extra_body=None,
    )  # fmt: skip
    assert cfg.sandbox == "docker" and cfg.command_timeout_s == 30.0 and cfg.sandbox_lifetime_s == 900.0
    assert cfg.max_tokens == 512 and cfg.max_token_length == 512 and cfg.use_wandb is True
    assert cfg.max_agent_turns == 30 and cfg.disabled_toolsets == []
    again = cfg.with_overrides({"sandbox": "bwrap"})  # a dump re-validates, a flag still wins
    assert again.sandbox == "bwrap" and again.terminal_backend == "docker"
    # every backend name of the seed's maps to a sandbox, with a note that says which
    for backend, sandbox in (("modal", "bwrap"), ("daytona", "bwrap"), ("ssh", "bwrap"),
                             ("singularity", "bwrap"), ("local", "bwrap"), ("docker", "docker")):  # fmt: skip
        mapped = HermesAgentEnvConfig(terminal_backend=backend)
        assert mapped.sandbox == sandbox, backend
        assert any(backend in n and sandbox in n for n in mapped.seed_notes()), mapped.seed_notes()
    # --sandbox wins over the file's backend; a --config that changes the backend derives it again
    modal = HermesAgentEnvConfig(terminal_backend="modal")
    assert modal.with_overrides({"sandbox": "local"}).sandbox == "local"
    assert modal.with_overrides({"terminal_backend": "docker"}).sandbox == "docker"
    assert modal.with_overrides({"terminal_timeout": 7}).command_timeout_s == 7.0
    with pytest.raises(ValueError, match="not one of the seed's backends"):
        HermesAgentEnvConfig(terminal_backend="k8s")
    with pytest.raises(EnvConfigError, match="not_a_field"):
        cfg.with_overrides({"not_a_field": 1})


def test_the_seeds_parser_names_resolve() -> None:
    """A seed config's ``tool_call_parser: qwen`` (Qwen 2.5: Hermes's ``<tool_call>`` JSON) and
    ``deepseek_v3_1`` work; they are aliases, not families of their own."""
    from trajforge.llm.parsers import ParsedCall, get_parser, list_parsers

    qwen = get_parser("qwen")
    assert qwen.name == "hermes" and "qwen" not in list_parsers()
    text = qwen.format_calls([ParsedCall("terminal", {"command": "ls"})])
    assert text.lstrip().startswith("<tool_call>") and '"terminal"' in text
    assert get_parser("deepseek_v3_1").name == "deepseek_v31"


# ----------------------------------------------------------------- fresh and session alike


def _leave_notes(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
    from trajforge.testing.scripted_model import answer, tool_turn

    if sum(m.get("role") == "assistant" for m in messages) == 0:
        command = "mkdir -p ~/notes && echo hello > ~/notes/a.txt && echo 'a needle here' > ~/notes/b.txt"
        return tool_turn(("terminal", {"command": command}))
    return answer("done")


async def test_every_tool_context_verb_answers_alike_in_fresh_and_session(tmp_path: Path, bwrap: Any) -> None:
    """A rollout that left no process running: each verb of the seed's ToolContext gives the same
    answer whether reward commands run in a fresh shell (the default) or in the rollout's session;
    and ``~``, ``$HOME``, the working directory and relative paths are the rollout's."""
    from hermes_seed_envs import VERBS
    from trajforge.envs import RolloutBackends, Rollouts
    from trajforge.envs.catalog import load_env
    from trajforge.testing.scripted_model import ScriptedModel
    from trajforge.tools.builtin import default_registry

    env_file = tmp_path / "environments" / "verbs_env.py"
    env_file.parent.mkdir()
    env_file.write_text(VERBS)
    host = tmp_path / "host"
    answers: dict[str, dict[str, Any]] = {}
    for shell in ("fresh", "session"):
        shutil.rmtree(host, ignore_errors=True)
        env: Any = load_env(f"{env_file}:VerbsEnv", {"reward_shell": shell})
        type(env).host_dir = str(host)
        await env.setup()
        backends = RolloutBackends(ScriptedModel(_leave_notes), bwrap, default_registry())
        ep = await Rollouts(env, backends).episode(env.eval_items(1)[0])
        assert ep.reward.value == 1.0 and ep.reward.error is None, (shell, ep.reward.reason)
        answers[shell] = env.answers
    fresh, session = answers["fresh"], answers["session"]
    assert fresh.keys() == session.keys()
    differ = [(k, fresh[k], session[k]) for k in fresh if fresh[k] != session[k]]
    assert differ == []
    # ... and what they agree on is what the rollout saw
    workdir = fresh["pwd"]["output"].strip()
    assert fresh["home"]["output"].split() == [workdir, workdir]  # bwrap: HOME is the workdir
    assert fresh["tilde"]["output"] == "hello\n" and fresh["relative"]["output"].startswith("hello\n")
    assert fresh["streams"] == {"exit_code": 3, "output": "out\nerr\nout2\n"}
    assert fresh["timeout"] == -1
    assert fresh["read_tilde"]["content"] == "hello\n" == fresh["read_relative"]["content"]
    assert "error" in fresh["read_missing"] and fresh["written"]["output"] == "written"
    assert fresh["downloaded"] == "hello\n" and fresh["downloaded_dir"] == ["a.txt", "b.txt"]
    assert fresh["search"]["matches"] == [{"path": "notes/b.txt", "line": 1, "content": "a needle here"}]
    assert "uploaded\n" in fresh["uploaded"]["output"] and "uptree/sub/t.bin" in fresh["uploaded"]["output"]
    assert "e2c865db4162bed963bfaa9ef6ac18f0" in fresh["uploaded"]["output"]  # md5 of bytes 0..255
    assert "web_search" in fresh["web_search"]["error"] and "hello" in fresh["call_tool"]


# ------------------------------------------------------------------------------- load errors

BROKEN = textwrap.dedent(
    """
    from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig


    class BadConfigEnv(HermesAgentBaseEnv):
        @classmethod
        def config_init(cls):
            return HermesAgentEnvConfig(max_agent_turns=0, terminal_backend="modal"), []


    class BadInitEnv(HermesAgentBaseEnv):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            raise RuntimeError("the env's own __init__ broke")
    """
)


def _errors(out: Any) -> list[str]:
    return [line for line in out.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("source", "cls", "said"),
    [
        (BROKEN, "BadConfigEnv", "BadConfigEnv.config_init() failed: invalid config: max_agent_turns:"),
        (BROKEN, "BadInitEnv", "RuntimeError: the env's own __init__ broke"),
        (
            "import environments.hermes_base_env\nimport not_a_module_anywhere\n",
            "X",
            "No module named 'not_a_module_anywhere'",
        ),
    ],
)
def test_a_user_envs_load_error_is_one_line_and_its_traceback_is_behind_v(
    tmp_path: Path, source: str, cls: str, said: str
) -> None:
    env_file = tmp_path / "broken_env.py"
    env_file.write_text(source)
    argv = ["env", "eval", f"{env_file}:{cls}", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"]
    out = runner.invoke(app, argv)
    assert out.exit_code == 2, out.output
    lines = _errors(out)
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], lines
    verbose = runner.invoke(app, [*argv, "-v"])
    assert verbose.exit_code == 2 and "Traceback (most recent call last)" in verbose.stderr
    assert _errors(verbose)[-1].startswith("error: ") and said in _errors(verbose)[-1]


async def test_a_hub_dataset_that_is_not_here_is_one_line_saying_so(
    tmp_path: Path, scripted_server: Any
) -> None:
    """The seed's SWE env loads its dataset from the hub in setup(); offline, that is one line (the
    endpoint is a real one: an unreachable one is refused first, at preflight)."""
    import asyncio
    import os
    import sys

    from hermes_seed_envs import SWE
    from trajforge.testing.scripted_server import echo_policy

    srv = await scripted_server(echo_policy)
    env_file = tmp_path / "environments" / "hermes_swe_env" / "hermes_swe_env.py"
    env_file.parent.mkdir(parents=True)
    env_file.write_text(SWE)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "trajforge.cli.main", "env", "eval", f"{env_file}:CodeTasksEnv", "--model", "m",
        "--base-url", srv.base_url, "--output-dir", str(tmp_path / "runs"), "--progress", "none",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    _, raw = await asyncio.wait_for(proc.communicate(), timeout=300)
    stderr = raw.decode()
    assert proc.returncode == 2, stderr
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert (
        last.startswith("error: CodeTasksEnv.setup() failed: ")
        and "'example-org/code-tasks' is a Hugging Face hub download" in last
    ), last


def test_an_eval_only_seed_env_is_refused_on_ray_with_the_reason(tmp_path: Path) -> None:
    """Its evaluate() runs in the driver; rollout actors would silently run something else."""
    pytest.importorskip("ray")
    from hermes_seed_envs import TERMINAL_BENCH

    env_file = tmp_path / "environments" / "benchmarks" / "terminalbench_2" / "terminalbench2_env.py"
    env_file.parent.mkdir(parents=True)
    env_file.write_text(TERMINAL_BENCH)
    out = runner.invoke(
        app,
        ["env", "eval", f"{env_file}:TerminalTasksEnv", "--model", "m", "--base-url", "http://127.0.0.1:9/v1",
         "--backend", "ray"],
    )  # fmt: skip
    assert out.exit_code == 2
    assert _errors(out) == [
        "error: TerminalTasksEnv's evaluation is its own evaluate(), which runs in this process: run it "
        "without --backend ray (--backend ray runs an env's rollouts on rollout actors)"
    ]


SLOW = textwrap.dedent(
    """
    import asyncio
    import uuid

    from environments.agent_loop import HermesAgentLoop
    from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig


    class TimedEnv(HermesAgentBaseEnv):
        name = "timed"

        @classmethod
        def config_init(cls):
            return HermesAgentEnvConfig(enabled_toolsets=["terminal"], max_agent_turns=3), []

        async def setup(self):
            pass

        async def get_next_item(self):
            return {"prompt": "unused"}

        def format_prompt(self, item):
            return item["prompt"]

        async def compute_reward(self, item, result, ctx) -> float:
            return 0.0

        async def evaluate(self, *args, **kwargs):
            tools, names = self._resolve_tools_for_group()
            samples = []
            for name in ("quick", "slow"):
                agent = HermesAgentLoop(server=self.server, tool_schemas=tools, valid_tool_names=names,
                                        max_turns=3, task_id=str(uuid.uuid4()))
                try:
                    limit = 120 if name == "quick" else 1  # the slow one's model answers after 30 s
                    result = await asyncio.wait_for(agent.run([{"role": "user", "content": name}]), timeout=limit)
                    samples.append({"task_name": name, "reward": 1.0, "messages": result.messages})
                except asyncio.TimeoutError:
                    samples.append({"task_name": name, "reward": 0.0, "error": f"timeout ({limit}s)"})
            await self.evaluate_log(metrics={"eval/done": len(samples)}, samples=samples)
    """
)


def test_a_loop_the_env_times_out_is_cancelled_and_recorded_as_such(tmp_path: Path) -> None:
    """The seed's benchmarks wrap each task in asyncio.wait_for; the rollout of a loop they give up
    on stops too (it is not left running to its end), and its record says it was cancelled."""
    env_file = tmp_path / "timed_env.py"
    env_file.write_text(SLOW)

    def policy(body: dict[str, Any]) -> Reply:
        return Reply(content="done", delay_s=30 if last_user_text(body) == "slow" else 0)

    with ScriptedServer(policy).in_thread() as srv:
        out = runner.invoke(
            app,
            ["env", "eval", f"{env_file}:TimedEnv", "--model", "scripted", "--base-url", srv.base_url,
             "--output-dir", str(tmp_path / "runs"), "--run-name", "timed", "--json", "--progress", "none"],
        )  # fmt: skip
        assert out.exit_code == 0, out.output
        assert srv.counters["requests"] == 2  # one each: the slow one was not asked again
    episodes = {
        e["item_id"]: e
        for e in (
            orjson.loads(x)
            for x in (tmp_path / "runs" / "timed" / "episodes.jsonl").read_bytes().splitlines()
        )
    }
    assert episodes["quick"]["status"] == "completed" and episodes["quick"]["reward"]["value"] == 1.0, (
        episodes["quick"]["reason"]
    )
    slow = episodes["slow"]
    assert (
        slow["status"] == "failed"
        and slow["reason"].startswith("cancelled:")
        and slow["reward"]["value"] is None
    )


BUSY = textwrap.dedent(
    """
    import asyncio
    import tempfile
    import uuid
    from pathlib import Path

    from environments.agent_loop import HermesAgentLoop
    from environments.hermes_base_env import HermesAgentBaseEnv, HermesAgentEnvConfig
    from environments.tool_context import ToolContext


    class BusyEnv(HermesAgentBaseEnv):
        name = "busy"

        @classmethod
        def config_init(cls):
            return HermesAgentEnvConfig(enabled_toolsets=["terminal"], max_agent_turns=2), []

        async def setup(self):
            pass

        async def get_next_item(self):
            return {"prompt": "unused"}

        def format_prompt(self, item):
            return item["prompt"]

        async def compute_reward(self, item, result, ctx) -> float:
            return 0.0

        async def evaluate(self, *args, **kwargs):
            tools, names = self._resolve_tools_for_group()
            task_id = str(uuid.uuid4())
            agent = HermesAgentLoop(server=self.server, tool_schemas=tools, valid_tool_names=names,
                                    max_turns=2, task_id=task_id)
            result = await agent.run([{"role": "user", "content": "go"}])
            ctx = ToolContext(task_id)
            local = Path(tempfile.mkdtemp())
            (local / "f.txt").write_text("x")
            loop = asyncio.get_event_loop()
            jobs = [loop.run_in_executor(None, ctx.upload_dir, str(local), f"up{i}") for i in range(48)]
            uploaded = await asyncio.gather(*jobs)
            ok = all(r and r[0]["exit_code"] == 0 for r in uploaded)
            ctx.cleanup()
            await self.evaluate_log(metrics={}, samples=[{"task_name": "busy", "reward": 1.0 if ok else 0.0,
                                                         "messages": result.messages}])
    """
)


def test_the_seeds_blocking_verbs_in_executor_threads_do_not_starve_the_loop(tmp_path: Path) -> None:
    """The seed's benchmarks run their blocking test code with run_in_executor(None, ...); each
    ToolContext verb there waits for a coroutine that itself needs a thread of that executor.
    With the default pool (cpu_count + 4 threads) 48 such calls at once deadlocked the run."""
    import os
    import subprocess
    import sys

    env_file = tmp_path / "busy_env.py"
    env_file.write_text(BUSY)
    with ScriptedServer([Reply(content="done")]).in_thread() as srv:
        proc = subprocess.run(
            [sys.executable, "-m", "trajforge.cli.main", "env", "eval", f"{env_file}:BusyEnv", "--model", "scripted",
             "--base-url", srv.base_url, "--output-dir", str(tmp_path / "runs"), "--run-name", "busy", "--json",
             "--progress", "none"],
            capture_output=True, text=True, timeout=300, env={**os.environ},
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert summary["mean_reward"]["value"] == 1.0 and summary["episodes"] == 1, summary


def test_an_error_samples_reason_is_the_line_that_says_what_was_raised() -> None:
    """yc-bench's `sim init` failure (a rich traceback box, then SQL, then a link) as one line."""
    from trajforge.envs.hermes.runtime import _brief

    text = (
        "yc-bench sim init failed: ╭──── Traceback (most recent call last) ───╮\n│ /x/sqlalchemy/engine.py │\n"
        "OperationalError: (sqlite3.OperationalError) no such table: sim_state\n[SQL: SELECT sim_state.id]\n"
        "(Background on this error at: https://sqlalche.me/e/21/e3q8)"
    )
    assert _brief(text) == "OperationalError: (sqlite3.OperationalError) no such table: sim_state"
    assert _brief("timeout (1800s)") == "timeout (1800s)" and len(_brief("E: " + "x" * 900)) == 300
