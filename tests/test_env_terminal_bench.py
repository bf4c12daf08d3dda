"""The ``terminal_bench`` env under the real bwrap sandbox: the oracle (solution/solve.sh) scores
1.0 and the do-nothing agent 0.0 on every task of the shipped offline suite (run concurrently);
the Dockerfile subset (COPY, RUN, ENV, ARG, WORKDIR) is replayed in the sandbox; tasks that need
more are skipped with the reason; the agent cannot plant the reward file or the tests. (The
docker backend, image builds included, on a real engine: tests/test_sandbox_docker.py; the
reading of task.toml against the harbor package itself: tests/test_harbor_parity.py.)"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest

from trajforge.envs import BaseEnv, RolloutBackends, Rollouts, load_env
from trajforge.envs.agents import NothingModel, OracleModel, nothing_model_for, oracle_model_for
from trajforge.envs.base import EnvDataError
from trajforge.envs.library.dockerfile import parse_dockerfile, rewrite_paths
from trajforge.envs.library.terminal_bench import TerminalBenchConfig, TerminalBenchEnv, shipped_dir
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools.builtin import default_registry

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

ENV = load_env("terminal_bench")
assert isinstance(ENV, TerminalBenchEnv)
TASKS = ENV.eval_items(1000)
# Terminal-Bench 2's kinds of work, each with several tasks in the suite (docs/envs.md has the table)
CATEGORIES = {
    "file-operations", "text-processing", "data-processing", "version-control",
    "software-engineering", "debugging", "system-administration", "scripting", "networking",
}  # fmt: skip


def _rollouts(env, factory, *, model=None, model_for=None) -> Rollouts:
    backends = RolloutBackends(
        model=model or NothingModel(), factory=factory, registry=default_registry(), model_for=model_for
    )
    return Rollouts(env, backends)


def test_ships_the_offline_suite():
    """At least 30 tasks over TB2's categories, every part of the Harbor layout present; a task is
    skipped only for a program its task.toml requires and this machine's /usr lacks."""
    every = ENV.all_tasks
    assert len(every) >= 36, len(every)
    for name, why in ENV.skipped.items():
        assert "([metadata] requires), absent from the sandbox's /usr" in why, (name, why)
    counts = Counter(t.category for t in every.values())
    assert set(counts) >= CATEGORIES and all(counts[c] >= 3 for c in CATEGORIES), counts
    for name in every:
        task = shipped_dir() / name
        for part in (
            "task.toml",
            "instruction.md",
            "environment/Dockerfile",
            "solution/solve.sh",
            "tests/test.sh",
        ):
            assert (task / part).is_file(), (name, part)
    if all(shutil.which(p) for p in ("gcc", "make", "git", "tar", "gzip")):
        assert ENV.skipped == {} and len(TASKS) == len(every)


async def test_oracle_scores_one_and_nothing_zero_on_every_task(factory):
    """Both agents on every runnable task, all episodes at once (8 in flight): every oracle 1.0,
    every do-nothing 0.0, each with a completed status and no reward error."""
    gate = asyncio.Semaphore(8)

    async def run(task, model_for):
        async with gate:
            return await _rollouts(ENV, factory, model_for=model_for).episode(task)

    start = time.monotonic()
    oracle, nothing = oracle_model_for(ENV), nothing_model_for(ENV)
    eps = await asyncio.gather(*(run(t, m) for t in TASKS for m in (oracle, nothing)))
    took = time.monotonic() - start
    wrong = []
    for i, task in enumerate(TASKS):
        for ep, want in ((eps[2 * i], 1.0), (eps[2 * i + 1], 0.0)):
            if ep.status != "completed" or ep.reward.error is not None or ep.reward.value != want:
                wrong.append(
                    f"{task['id']}: want {want}, got {ep.status} {ep.reward.value} {ep.reason or ''} {ep.reward.reason}"
                )
            # a verdict only in reward.json is said by the exit status too: a harness that reads
            # only reward.txt or the exit code (Hermes Agent's Terminal-Bench 2 env) scores the same
            if not (ep.reward.reason or "").startswith("reward.json"):
                continue
            code = re.search(r"test\.sh exit code (-?\d+)", ep.reward.reason or "")
            if code is None or (int(code.group(1)) == 0) != (want == 1.0):
                wrong.append(f"{task['id']}: verdict {want} but {code and code.group(0)}: {ep.reward.reason}")
    assert not wrong, "\n".join(wrong)
    oracle_turns = [m["role"] for m in eps[0].messages if m["role"] != "system"]
    assert oracle_turns == ["user", "assistant", "tool", "assistant"]
    print(f"{len(TASKS)} tasks x 2 agents in {took:.1f}s")


async def test_dockerfile_steps_run_before_the_rollout(factory):
    """The agent's shell starts in WORKDIR with the ENV; RUN output and COPYed files (with their
    executable bit) are there; ARG values reached the RUN step."""
    task = next(t for t in TASKS if t["id"] == "fix-backup-script")
    model = ScriptedModel(
        [
            tool_turn(
                (
                    "terminal",
                    {"command": "pwd; echo root=$BACKUP_ROOT; ls -l backup.sh; cat data/record-2.txt"},
                )
            ),
            answer("looked"),
        ]
    )
    ep = await _rollouts(ENV, factory, model=model).episode(task)
    out = _tool_output(ep)
    assert "/workspace" in out and "root=/workspace/backups" in out and "record 2" in out
    assert "-rwx" in out
    env_task = next(t for t in TASKS if t["id"] == "env-config")
    model = ScriptedModel(
        [tool_turn(("terminal", {"command": "cat app.env; echo $APP_PORT $APP_MODE"})), answer("ok")]
    )
    ep = await _rollouts(ENV, factory, model=model).episode(env_task)
    assert "name=inventory" in _tool_output(ep) and "8080 production" in _tool_output(ep)


async def test_agent_cannot_plant_reward_or_tests(factory):
    task = next(t for t in TASKS if t["id"] == "log-summary")
    plant = (
        "for d in /tmp/trajforge-verify-x /workspace/logs/verifier; do mkdir -p $d/logs/verifier $d/tests; "
        "echo 1 > $d/logs/verifier/reward.txt; printf 'echo 1 > /dev/null\\n' > $d/tests/test.sh; done; "
        "mkdir -p /tmp/tb && echo 1 > /tmp/tb/reward.txt; echo 'wrong 1' > summary.txt; "
        "chmod -R a-w /tmp/trajforge-verify-x"
    )
    model = ScriptedModel([tool_turn(("terminal", {"command": plant})), answer("done")])
    ep = await _rollouts(ENV, factory, model=model).episode(task)
    assert ep.reward.error is None and ep.reward.value == 0.0, ep.reward.reason
    assert ep.reward.reason.startswith("reward.txt")


async def test_reward_json_and_exit_code_fallbacks(factory):
    greet = next(t for t in TASKS if t["id"] == "greet-tool")
    half = "mkdir -p bin && printf '#!/bin/sh\\necho \"Hello, $1!\"\\n' > bin/greet && chmod +x bin/greet"
    ep = await _rollouts(
        ENV, factory, model=ScriptedModel([tool_turn(("terminal", {"command": half})), answer("ok")])
    ).episode(greet)
    assert ep.reward.value == 0.0 and ep.reward.reason.startswith("reward.json")
    env_cfg = next(t for t in TASKS if t["id"] == "env-config")
    ep = await _rollouts(ENV, factory, model_for=oracle_model_for(ENV)).episode(env_cfg)
    assert ep.reward.value == 1.0 and ep.reward.reason.startswith("test.sh exit code 0")


def _tool_output(ep) -> str:
    (out,) = [m["content"] for m in ep.messages if m["role"] == "tool"]
    return str(out)


def _task_dir(
    root: Path, name: str, dockerfile: str, test_sh: str = "echo 1 > /logs/verifier/reward.txt\n"
) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "task.toml").write_text('version = "1.0"\n[metadata]\ncategory = "x"\n')
    (task / "instruction.md").write_text("Do it in /app.\n")
    (task / "environment" / "Dockerfile").write_text(dockerfile)
    (task / "tests" / "test.sh").write_text(test_sh)
    (task / "solution" / "solve.sh").write_text("true\n")
    return task


def test_tasks_that_need_more_are_skipped_with_the_reason(tmp_path):
    _task_dir(tmp_path, "ok", "FROM x\nWORKDIR /app\nRUN echo hi > a\n")
    _task_dir(tmp_path, "apt", "FROM x\nWORKDIR /app\nRUN apt-get update && apt-get install -y jq\n")
    _task_dir(tmp_path, "pip", "FROM x\nWORKDIR /app\nRUN pip install numpy==2.0\n")
    _task_dir(tmp_path, "stage", "FROM a AS b\nFROM c\nWORKDIR /app\nCOPY --from=b /x /app/x\n")
    _task_dir(tmp_path, "outside", "FROM x\nWORKDIR /app\nCOPY f /etc/f\n")
    _task_dir(tmp_path, "noworkdir", "FROM x\nRUN true\n")
    _task_dir(
        tmp_path, "uvtest", "FROM x\nWORKDIR /app\n", "curl -LsSf https://astral.sh/uv/install.sh | sh\n"
    )
    env = TerminalBenchEnv(TerminalBenchConfig(tasks_dir=str(tmp_path)))
    skipped = env.skipped
    assert [t["id"] for t in env.eval_items(10)] == ["ok"]
    assert "apt-get" in skipped["apt"] and "pip" in skipped["pip"]
    assert "multi-stage" in skipped["stage"] and "--from" in skipped["stage"]
    assert "outside the first WORKDIR" in skipped["outside"]
    assert "no WORKDIR" in skipped["noworkdir"]
    assert skipped["uvtest"] == "tests/test.sh needs a package manager or the network (curl)"
    local = TerminalBenchEnv(TerminalBenchConfig(tasks_dir=str(tmp_path), sandbox="local"))
    assert "use bwrap or docker" in local.skipped["ok"]


async def test_a_failing_run_step_fails_the_episode_not_the_model(tmp_path, factory):
    task = _task_dir(tmp_path, "broken", "FROM x\nWORKDIR /app\nRUN echo nope && exit 3\n")
    env = TerminalBenchEnv(TerminalBenchConfig(tasks_dir=str(task.parent), enabled_toolsets=["terminal"]))
    ep = await _rollouts(env, factory, model_for=oracle_model_for(env)).episode(env.eval_items(1)[0])
    assert ep.status == "failed" and "RUN step failed (exit code 3)" in (ep.reason or "")


def test_dockerfile_parsing_and_path_rewrites():
    plan = parse_dockerfile(
        '# comment\nFROM python:3.11\nARG N=3\nENV A=1 B="two words"\nENV C $A-x\nWORKDIR /app\n'
        "COPY a.txt b.txt ./\nCOPY dir /app/dir\nWORKDIR sub\nRUN echo $N \\\n  && ls\nUSER nobody\n"
    )
    assert plan.problems == []
    assert plan.env == {"A": "1", "B": "two words", "C": "1-x"}
    assert (plan.root, plan.workdir) == ("/app", "/app/sub")
    copies = [s for s in plan.steps if s.kind == "copy"]
    assert [(c.sources, c.dest) for c in copies] == [(["a.txt", "b.txt"], "/app/"), (["dir"], "/app/dir")]
    assert [s.text for s in plan.steps if s.kind == "run"] == ["echo $N && ls"]
    assert any("USER" in n for n in plan.notes)
    mapping = {"/app": "/workspace", "/logs": "/tmp/v/logs"}
    assert rewrite_paths("cd /app; cat /app/x /apple /x/app > /logs/verifier/r", mapping) == (
        "cd /workspace; cat /workspace/x /apple /x/app > /tmp/v/logs/verifier/r"
    )
    assert (
        rewrite_paths("Work in /app. Not /app.py nor /app-x.", mapping)
        == "Work in /workspace. Not /app.py nor /app-x."
    )


class _NoOracleEnv(BaseEnv):
    name = "no_oracle"


async def test_oracle_model_without_terminal_answers():
    model = OracleModel([("terminal", {"command": "true"})])
    turn = await model.complete([{"role": "user", "content": "x"}], tools=[])
    assert not turn.tool_calls and "terminal tool is not offered" in (turn.content or "")
    with pytest.raises(ValueError, match="no reference solutions"):
        oracle_model_for(_NoOracleEnv())


@pytest.mark.parametrize("env_name", ["terminal_bench", "swe"])
async def test_cli_agents_run_the_same_oracle(env_name, factory):
    """``trajforge env eval --agent oracle|none`` goes through envs.agents.agent_model_for."""
    from trajforge.envs.agents import agent_model_for

    env = load_env(env_name)
    item = env.eval_items(1)[0]
    oracle = await _rollouts(env, factory, model_for=agent_model_for(env, "oracle")).episode(item)
    assert oracle.reward.value == 1.0, oracle.reward.reason
    none = await _rollouts(env, factory, model_for=agent_model_for(env, "none")).episode(item)
    assert none.reward.value == 0.0


def test_harbor_fields_trajforge_cannot_honour_skip_the_task(tmp_path):
    """Multi-step, Windows, an env value naming a host variable, a required program this /usr
    lacks: skipped, each with its reason (harbor would run them; trajforge says why it won't)."""
    ok = _task_dir(tmp_path, "ok", "FROM x\nWORKDIR /app\n")
    (ok / "task.toml").write_text('[metadata]\nrequires = ["bash", "sh"]\n')
    for name, toml in {
        "steps": '[[steps]]\nname = "one"\n',
        "windows": '[environment]\nos = "Windows"\n',
        "hostvar": '[verifier.env]\nAPI_KEY = "${OPENAI_API_KEY}"\n',
        "missing": '[metadata]\nrequires = ["trajforge-no-such-program"]\n',
        "outside": '[environment]\nworkdir = "/srv"\n',
    }.items():
        task = _task_dir(tmp_path, name, "FROM x\nWORKDIR /app\n")
        (task / "task.toml").write_text(toml)
    env = TerminalBenchEnv(TerminalBenchConfig(tasks_dir=str(tmp_path)))
    skipped = env.skipped
    assert [t["id"] for t in env.eval_items(10)] == ["ok"], skipped
    assert "multi-step" in skipped["steps"]
    assert "only Linux" in skipped["windows"]
    assert "${OPENAI_API_KEY}" in skipped["hostvar"] and "never passed in" in skipped["hostvar"]
    assert skipped["missing"] == (
        "needs trajforge-no-such-program ([metadata] requires), absent from the sandbox's /usr"
    )
    assert "workdir /srv is outside the first WORKDIR /app" in skipped["outside"]


async def test_task_toml_workdir_env_and_canary_are_honoured(tmp_path, factory):
    """[environment] workdir is where the agent, the oracle and test.sh start; [environment] env
    reaches all three, [solution] env only the oracle, [verifier] env only test.sh
    (``${VAR:-default}`` gives its default); canary lines never reach the prompt."""
    task = _task_dir(
        tmp_path,
        "fields",
        "FROM x\nWORKDIR /app\nENV FROM_DOCKERFILE=d\nRUN mkdir -p sub\n",
        test_sh=(
            'ok=1; [ "$(pwd)" = /app/sub ] || ok=0; [ "$SHARED/$ONLY_TESTS" = "s/t-default" ] || ok=0\n'
            '[ -z "$ONLY_ORACLE" ] || ok=0; [ "$(cat /app/sub/seen)" = "/app/sub s o d" ] || ok=0\n'
            "echo $ok > /logs/verifier/reward.txt\n"
        ),
    )
    (task / "task.toml").write_text(
        '[environment]\nworkdir = "/app/sub"\n[environment.env]\nSHARED = "s"\n'
        '[solution.env]\nONLY_ORACLE = "o"\n[verifier.env]\nONLY_TESTS = "${NOT_SET:-t-default}"\n'
    )
    (task / "instruction.md").write_text(
        "<!-- canary GUID 1234 -->\n# BENCHMARK DATA canary\n\nDo it in /app.\n"
    )
    (task / "solution" / "solve.sh").write_text(
        'echo "$(pwd) $SHARED $ONLY_ORACLE $FROM_DOCKERFILE" > /app/sub/seen\n'
    )
    env = TerminalBenchEnv(TerminalBenchConfig(tasks_dir=str(tmp_path), enabled_toolsets=["terminal"]))
    item = env.eval_items(1)[0]
    assert env.format_prompt(item) == "Do it in /workspace."
    ep = await _rollouts(env, factory, model_for=oracle_model_for(env)).episode(item)
    assert ep.reward.value == 1.0, ep.reward.reason
    model = ScriptedModel(
        [tool_turn(("terminal", {"command": "pwd; echo $SHARED-$ONLY_ORACLE"})), answer("x")]
    )
    ep = await _rollouts(env, factory, model=model).episode(item)
    assert json.loads(_tool_output(ep))["output"] == "/workspace/sub\ns-\n", _tool_output(ep)
    assert ep.reward.value == 0.0


@pytest.mark.parametrize(
    ("task_id", "command"),
    [
        # the tests count words of their own pristine copy, not of the agent's book.txt
        ("word-frequency", ": > book.txt; : > top10.txt"),
        # all orders cancelled, and a view that holds numbers instead of computing them
        (
            "sqlite-monthly-view",
            "python3 -c \"import sqlite3; d = sqlite3.connect('shop.db'); "
            "d.execute(\\\"UPDATE orders SET status = 'cancelled'\\\"); "
            "d.execute('CREATE VIEW monthly_revenue AS SELECT 1 AS month, 2 AS revenue WHERE 0'); d.commit()\"",
        ),
        # history rewritten so that the named commit is whatever the agent wrote down
        (
            "git-bisect-regression",
            "cd repo && git -c user.name=x -c user.email=x@y commit -q --amend -m 'Change 14' "
            "&& git rev-parse HEAD > ../first_bad.txt",
        ),
    ],
)
async def test_editing_the_inputs_wins_nothing(task_id, command, factory):
    """Hidden tests judge against data the agent cannot reach (a copy in tests/, a database
    regenerated from the shipped generator, commit ids known in advance), so changing the inputs
    until a trivial answer matches them scores 0."""
    task = next(t for t in TASKS if t["id"] == task_id)
    model = ScriptedModel([tool_turn(("terminal", {"command": command})), answer("done")])
    ep = await _rollouts(ENV, factory, model=model).episode(task)
    assert ep.status == "completed" and ep.reward.error is None, ep.reason
    assert ep.reward.value == 0.0, ep.reward.reason


# Ways a test.sh writes its verdict, each the task passing: test.sh's own shell writes it
# (directly, from a subshell, through a redirected program, from its EXIT trap after `exit`,
# with its own fds 3 and 10 in use), so each pays 1.0; a program that opens the file itself
# (`tee`, python's open()) is not test.sh's shell: 0, and the reason says how to write it.
VERDICT_WRITERS = {
    "echo": ("echo 1 > /logs/verifier/reward.txt\n", 1.0),
    "a subshell": (
        "x=$(echo 1 > /logs/verifier/reward.txt; echo done)\n( echo 1 > /logs/verifier/reward.txt )\n",
        1.0,
    ),
    "a redirected program": ("python3 -c 'print(1)' > /logs/verifier/reward.txt\n", 1.0),
    "reward.json by printf": ("printf '{\"reward\": 1.0}' > /logs/verifier/reward.json\n", 1.0),
    "an EXIT trap after exit": ("r=1\ntrap 'echo $r > /logs/verifier/reward.txt' EXIT\nexit 0\n", 1.0),
    "an EXIT trap after set -e": (
        "set -e\nr=1\ntrap 'echo $r > /logs/verifier/reward.txt' EXIT\nfalse\n",
        1.0,
    ),
    "its own fds": (
        "exec 3>&1 10>/dev/null\necho noted >&3\necho 1 > /logs/verifier/reward.txt\nexec 3>&- 10>&-\n",
        1.0,
    ),
    "a program test.sh runs and waits for": (
        "sleep 0.2 & wait $!\necho 1 > /logs/verifier/reward.txt\n",
        1.0,
    ),
    "tee": ("echo 1 | tee /logs/verifier/reward.txt\n", 0.0),
    "python's open()": (
        "python3 -c \"open('/logs/verifier/reward.txt', 'w').write('1')\"\n",
        0.0,
    ),
}


@pytest.mark.parametrize("how", list(VERDICT_WRITERS))
async def test_the_ways_test_sh_writes_its_verdict(how, tmp_path, factory):
    test_sh, want = VERDICT_WRITERS[how]
    _task_dir(tmp_path, "verdict", "FROM x\nWORKDIR /app\n", test_sh="#!/bin/bash\n" + test_sh)
    env = TerminalBenchEnv(TerminalBenchConfig(tasks_dir=str(tmp_path)))
    ep = await _rollouts(env, factory).episode(env.eval_items(1)[0])
    assert ep.reward.value == want and ep.reward.error is None, ep.reward.reason
    if want == 0.0:
        assert "wrote no verdict" in ep.reward.reason and "only test.sh's own shell" in ep.reward.reason


def test_the_guard_compiles_without_a_warning_and_ships_with_the_package():
    import tomllib

    from trajforge.envs.library.tb_guard import build_guard

    assert build_guard(("-Werror", "-Wshadow", "-Wformat=2"))[:4] == b"\x7fELF"
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert "envs/library/*.c" in pyproject["tool"]["setuptools"]["package-data"]["trajforge"]


async def test_without_a_compiler_the_env_refuses_and_scores_nothing(monkeypatch, tmp_path, factory):
    """No C compiler, no guard: the env says what to install at setup, and a reward asked for
    anyway is 0 with that reason -- never a verdict the tests' programs could have written."""
    import trajforge.envs.library.terminal_bench as tb
    from trajforge.envs.library import tb_guard

    monkeypatch.setattr(tb_guard, "compiler", lambda: None)
    monkeypatch.setattr(tb, "build_guard", tb_guard.build_guard.__wrapped__)  # not the cached build
    _task_dir(tmp_path, "verdict", "FROM x\nWORKDIR /app\n")
    env = TerminalBenchEnv(TerminalBenchConfig(tasks_dir=str(tmp_path)))
    with pytest.raises(EnvDataError, match="apt-get install gcc"):
        await env.setup()
    ep = await _rollouts(env, factory).episode(env.eval_items(1)[0])
    assert ep.reward.value == 0.0 and "apt-get install gcc" in (ep.reward.reason or ""), ep.reward.reason
