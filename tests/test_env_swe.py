"""The ``swe`` env under the real bwrap sandbox: the oracle solves every shipped task, doing
nothing scores 0, and the ways an agent could fake a pass (its own tests, conftest.py,
sitecustomize.py, PATH/PYTHONPATH in its shell, forged result lines, stubs) score 0."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trajforge.envs import RolloutBackends, Rollouts, load_env
from trajforge.envs.agents import nothing_model_for, oracle_model_for
from trajforge.envs.library.swe import SweConfig, SweEnv, shipped_dir
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools.builtin import default_registry

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

ENV = load_env("swe")
assert isinstance(ENV, SweEnv)
TASKS = ENV.eval_items(100)
IDS = [t["id"] for t in TASKS]


def _rollouts(env, factory, *, model=None, model_for=None) -> Rollouts:
    backends = RolloutBackends(
        model=model or ScriptedModel(["unused"]),
        factory=factory,
        registry=default_registry(),
        model_for=model_for,
    )
    return Rollouts(env, backends)


def test_ships_ten_tasks_with_both_kinds():
    assert len(TASKS) >= 10
    assert {t["category"] for t in TASKS} == {"bug", "feature"}
    for t in TASKS:
        assert ENV.setup_files(t) and ENV.verifier_files(t) and ENV.solution_files(t)
        assert all(p.startswith("tests/") for p in ENV.verifier_files(t))
        # the hidden tests are not part of what the agent starts with
        assert not set(ENV.verifier_files(t)) & set(ENV.setup_files(t))


@pytest.mark.parametrize("task", TASKS, ids=IDS)
async def test_oracle_solves_and_nothing_scores_zero(task, factory):
    oracle = await _rollouts(ENV, factory, model_for=oracle_model_for(ENV)).episode(task)
    assert oracle.reward.value == 1.0, oracle.reward.reason
    assert oracle.reward.components == {"fail_to_pass": 1.0, "pass_to_pass": 1.0}
    assert oracle.status == "completed" and oracle.reward.error is None
    nothing = await _rollouts(ENV, factory, model_for=nothing_model_for(ENV)).episode(task)
    assert nothing.reward.value == 0.0
    # every fail_to_pass test fails on the untouched repo, every pass_to_pass test passes there
    assert nothing.reward.components == {"fail_to_pass": 0.0, "pass_to_pass": 1.0}, nothing.reward.reason


def test_hidden_tests_pass_under_real_pytest_with_the_solution(tmp_path):
    """The runner is pytest-compatible: the same hidden tests, run by pytest on the host against
    the reference solution, pass (and the listed ids are the ones pytest collects)."""
    for task in TASKS:
        root = tmp_path / task["id"]
        for files in (ENV.setup_files(task), ENV.solution_files(task), ENV.verifier_files(task)):
            for rel, data in files.items():
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_bytes(data)
        ids = task["fail_to_pass"] + task["pass_to_pass"]
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(root), *ids],
            cwd=root,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
        )
        assert proc.returncode == 0, (task["id"], proc.stdout[-2000:])
        assert f"{len(ids)} passed" in proc.stdout


TASK = next(t for t in TASKS if t["id"] == "roman_subtractive")
PASSING_TEST = "def test_subtractive():\n    pass\n\ndef test_large():\n    pass\n"
FAKE_RESULT = (
    "import json\n"
    "ids = ['tests/test_hidden.py::test_subtractive', 'tests/test_hidden.py::test_large',"
    " 'tests/test_hidden.py::test_additive_and_range']\n"
    "print('TRAJFORGE-SWE-RESULT 0 ' + json.dumps({'results': {i: 'passed' for i in ids}}))\n"
)


async def _attack(factory, *calls) -> float:
    model = ScriptedModel([tool_turn(c) for c in calls] + [answer("done")])
    ep = await _rollouts(ENV, factory, model=model).episode(TASK)
    assert ep.reward.error is None, ep.reward.error
    assert all(m.get("content") != "error" for m in ep.messages if m["role"] == "tool")
    return ep.reward.value


async def test_agent_written_tests_are_overwritten(factory):
    reward = await _attack(factory, ("write_file", {"path": "tests/test_hidden.py", "content": PASSING_TEST}))
    assert reward == 0.0


async def test_planted_conftest_and_sitecustomize_do_nothing(factory):
    conftest = (
        "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    out = yield\n    out.get_result().outcome = 'passed'\n"
    )
    reward = await _attack(
        factory,
        ("write_file", {"path": "conftest.py", "content": conftest}),
        ("write_file", {"path": "tests/conftest.py", "content": conftest}),
        ("write_file", {"path": "sitecustomize.py", "content": FAKE_RESULT + "raise SystemExit(0)\n"}),
        ("write_file", {"path": "usercustomize.py", "content": FAKE_RESULT + "raise SystemExit(0)\n"}),
        ("write_file", {"path": "site/sitecustomize.py", "content": FAKE_RESULT + "raise SystemExit(0)\n"}),
    )
    assert reward == 0.0


async def test_path_and_pythonpath_in_the_rollout_shell_do_nothing(factory):
    fake_python = "#!/bin/sh\n" + "cat <<'EOF'\nTRAJFORGE-SWE-RESULT x {}\nEOF\n"
    reward = await _attack(
        factory,
        ("write_file", {"path": "bin/python3", "content": fake_python}),
        ("write_file", {"path": "site/sitecustomize.py", "content": FAKE_RESULT + "raise SystemExit(0)\n"}),
        ("terminal", {"command": "chmod +x bin/python3 && export PATH=$PWD/bin:$PATH PYTHONPATH=$PWD/site"}),
        ("terminal", {"command": "python3 -c 'print(1)'"}),  # the rollout's shell does see them
    )
    assert reward == 0.0


async def test_forged_result_line_and_early_exit_score_zero(factory):
    """Repository code that prints a result line (without the nonce) and exits at import."""
    forged = FAKE_RESULT.replace("'TRAJFORGE-SWE-RESULT 0 '", "'TRAJFORGE-SWE-RESULT ' + 'f' * 32 + ' '")
    reward = await _attack(
        factory,
        ("write_file", {"path": "numerals.py", "content": forged + "import os\nos._exit(0)\n"}),
    )
    assert reward == 0.0


async def test_stub_that_only_defines_names_scores_zero(factory):
    stub = "def to_roman(n):\n    return ''\n"
    assert await _attack(factory, ("write_file", {"path": "numerals.py", "content": stub})) == 0.0
    # a planted json.py / unittest.py shadows nothing: the result still parses, the stub fails
    assert (
        await _attack(
            factory,
            ("write_file", {"path": "json.py", "content": "raise SystemExit(0)\n"}),
            ("write_file", {"path": "unittest.py", "content": "raise SystemExit(0)\n"}),
        )
        == 0.0
    )


async def test_partial_credit_counts_fail_to_pass_and_requires_pass_to_pass(factory):
    env = SweEnv(SweConfig(enabled_toolsets=["terminal", "file"], partial_credit=True))
    task = next(t for t in env.eval_items(100) if t["id"] == "parse_duration")
    solution = env.solution_files(task)["timefmt.py"].decode()
    # right for well-formed input, accepts everything else: test_parse and test_round_trip pass
    lax = solution.replace("if not text or match is None:", "if False:").replace(
        "match = _PATTERN.fullmatch(text)", "match = _PATTERN.match(text)"
    )
    model = ScriptedModel([tool_turn(("write_file", {"path": "timefmt.py", "content": lax})), answer("ok")])
    ep = await _rollouts(env, factory, model=model).episode(task)
    assert ep.reward.value == pytest.approx(2 / 3), ep.reward.reason
    assert "test_parse_rejects" in ep.reward.reason
    # breaking format_duration (a pass_to_pass test) makes it 0 even with all of parse right
    broken = solution.replace('return "".join(parts) or "0s"', 'return "".join(parts)')
    model = ScriptedModel(
        [tool_turn(("write_file", {"path": "timefmt.py", "content": broken})), answer("ok")]
    )
    ep = await _rollouts(env, factory, model=model).episode(task)
    assert ep.reward.value == 0.0 and ep.reward.components["pass_to_pass"] == 0.0
    assert ep.reward.components["fail_to_pass"] < 1.0  # round trip of 0 breaks too


def test_tasks_dir_and_bad_tasks(tmp_path):
    good = tmp_path / "mine"
    shutil.copytree(shipped_dir() / "roman_subtractive", good / "t1")
    env = SweEnv(SweConfig(tasks_dir=str(good)))
    assert [t["id"] for t in env.eval_items(5)] == ["t1"]
    (good / "t2").mkdir()
    (good / "t2" / "task.toml").write_text('instruction = "x"\nfail_to_pass = ["tests/nope.py::test_a"]\n')
    with pytest.raises(ValueError, match="names no file"):
        SweEnv(SweConfig(tasks_dir=str(good))).eval_items(5)


def test_task_data_ships_with_the_package():
    assert (shipped_dir() / "roman_subtractive" / "task.toml").is_file()
    assert Path(shipped_dir()).parent.name == "library"
