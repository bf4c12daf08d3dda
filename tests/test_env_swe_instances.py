"""The ``swe`` env on SWE-bench instances (the ``swebench`` package's row format) over a prepared
local checkout, graded by swebench's own log parser and resolution rules, under bubblewrap: the
reference patch resolves the instance, doing nothing or breaking a PASS_TO_PASS test does not;
the shipped tasks go through the same swebench grading."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from trajforge.envs import RolloutBackends, Rollouts, load_env
from trajforge.envs.agents import nothing_model_for, oracle_model_for
from trajforge.envs.base import EnvDataError
from trajforge.envs.config import EnvConfigError
from trajforge.envs.library import swe_grading
from trajforge.envs.library.swe import SweEnv
from trajforge.envs.library.swe_instances import instance_test_command, load_instances, patch_files
from trajforge.sandbox import SandboxConfig, close_factory, create_sandbox_factory
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools.builtin import default_registry

pytest.importorskip("swebench", reason="the swe extra (swebench) is not installed")

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
FIXED = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
BASE_TESTS = "from calc import mul\n\n\ndef test_mul():\n    assert mul(3, 4) == 12\n"
NEW_TESTS = BASE_TESTS + "\n\ndef test_add():\n    assert add(2, 3) == 5\n"
NEW_TESTS = NEW_TESTS.replace("from calc import mul", "from calc import add, mul")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _diff(repo: Path, rel: str, new: str) -> str:
    old = (repo / rel).read_text()
    (repo / rel).write_text(new)
    patch = _git(repo, "diff", "--", rel)
    (repo / rel).write_text(old)
    return patch


def _eval_script(base: str) -> str:
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            "cd /testbed",
            f"git checkout {base} tests/test_calc.py",
            "git apply -v - <<'EOF_114329324912'",
            "(the test patch)",
            "EOF_114329324912",
            ": '>>>>> Start Test Output'",
            "pytest -rA -p no:cacheprovider tests/test_calc.py",
            ": '>>>>> End Test Output'",
            f"git checkout {base} tests/test_calc.py",
        ]
    )


@pytest.fixture(scope="module")
def swebench_setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A checkout of acme/calc in repos_dir, its instance file, and a test environment (pytest
    and its dependencies, copied from this interpreter's site-packages: the sandbox's python3
    has no pytest)."""
    root = tmp_path_factory.mktemp("swebench")
    repo = root / "repos" / "acme__calc"
    (repo / "calc").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text(BUGGY)
    (repo / "tests" / "test_calc.py").write_text(BASE_TESTS)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    instance = {
        "repo": "acme/calc",
        "instance_id": "acme__calc-1",
        "base_commit": base,
        "patch": _diff(repo, "calc/__init__.py", FIXED),
        "test_patch": _diff(repo, "tests/test_calc.py", NEW_TESTS),
        "problem_statement": "add() subtracts instead of adding.",
        "hints_text": "",
        "created_at": "2026-01-01T00:00:00Z",
        "version": "0.1",
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
        "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_mul"]),
        "environment_setup_commit": base,
        "image": "swebench/sweb.eval.x86_64.acme_1776_calc-1:latest",
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "eval_script": _eval_script(base),
    }
    (root / "instances.jsonl").write_text(json.dumps(instance) + "\n")
    env_dir = root / "test_env"
    env_dir.mkdir()
    import _pytest
    import iniconfig
    import packaging
    import pluggy

    site = Path(_pytest.__file__).parent.parent
    for mod in (_pytest, pluggy, iniconfig, packaging):
        src = Path(mod.__file__).parent
        shutil.copytree(src, env_dir / src.name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(site / "pytest", env_dir / "pytest", ignore=shutil.ignore_patterns("__pycache__"))
    for dist in ("pytest", "pluggy", "iniconfig", "packaging"):  # pytest checks their versions
        for info in site.glob(f"{dist}-*.dist-info"):
            shutil.copytree(info, env_dir / info.name)
    if (site / "py.py").is_file():
        shutil.copy(site / "py.py", env_dir / "py.py")
    return {"root": root, "repos": root / "repos", "instances": root / "instances.jsonl", "env": env_dir}


@pytest.fixture
async def factory(tmp_path):
    f = create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=str(tmp_path / "sb")))
    yield f
    await close_factory(f)


def _env(setup: dict[str, Path], **extra: Any) -> SweEnv:
    env = load_env(
        "swe",
        {
            "instances": str(setup["instances"]),
            "repos_dir": str(setup["repos"]),
            "test_env_dir": str(setup["env"]),
            **extra,
        },
    )
    assert isinstance(env, SweEnv)
    return env


def _rollouts(env: SweEnv, factory: Any, *, model: Any = None, model_for: Any = None) -> Rollouts:
    backends = RolloutBackends(
        model=model or ScriptedModel(["unused"]),
        factory=factory,
        registry=default_registry(),
        model_for=model_for,
    )
    return Rollouts(env, backends)


def test_instances_load_in_the_swebench_format(swebench_setup):
    env = _env(swebench_setup)
    (item,) = env.eval_items(5)
    assert item["id"] == "acme__calc-1" and item["category"] == "acme/calc"
    assert item["fail_to_pass"] == ["tests/test_calc.py::test_add"]  # the JSON string, decoded
    assert "add() subtracts" in env.format_prompt(item)
    files = env.setup_files(item)
    assert files["calc/__init__.py"].decode() == BUGGY  # the tree at base_commit
    assert files["tests/test_calc.py"].decode() == BASE_TESTS  # the test patch is not there
    assert env.solution_files(item) == {"calc/__init__.py": FIXED.encode()}
    (row,) = load_instances(swebench_setup["instances"])
    assert (
        instance_test_command(row) == "pytest -rA -p no:cacheprovider tests/test_calc.py"
    )  # from eval_script


async def test_the_reference_patch_resolves_and_nothing_does_not(swebench_setup, factory):
    env = _env(swebench_setup)
    (item,) = env.eval_items(1)
    oracle = await _rollouts(env, factory, model_for=oracle_model_for(env)).episode(item)
    assert oracle.reward.value == 1.0, oracle.reward.reason
    assert oracle.reward.components == {"fail_to_pass": 1.0, "pass_to_pass": 1.0}
    assert "RESOLVED_FULL" in (oracle.reward.reason or "")
    nothing = await _rollouts(env, factory, model_for=nothing_model_for(env)).episode(item)
    assert nothing.reward.value == 0.0
    assert nothing.reward.components == {"fail_to_pass": 0.0, "pass_to_pass": 1.0}, nothing.reward.reason
    assert "RESOLVED_NO" in (nothing.reward.reason or "") and "test_add" in (nothing.reward.reason or "")


async def test_breaking_a_pass_to_pass_test_and_rewriting_the_tests_earn_nothing(swebench_setup, factory):
    env = _env(swebench_setup, partial_credit=True)
    (item,) = env.eval_items(1)
    broken = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return 0\n"
    fake_tests = "def test_add():\n    pass\n\n\ndef test_mul():\n    pass\n"
    model = ScriptedModel(
        [
            tool_turn(("write_file", {"path": "calc/__init__.py", "content": broken})),
            tool_turn(("write_file", {"path": "tests/test_calc.py", "content": fake_tests})),
            answer("done"),
        ]
    )
    ep = await _rollouts(env, factory, model=model).episode(item)
    # the test patch's file replaced the agent's; mul is broken: no credit, even partial
    assert ep.reward.value == 0.0, ep.reward.reason
    assert ep.reward.components == {"fail_to_pass": 1.0, "pass_to_pass": 0.0}
    assert "test_mul" in (ep.reward.reason or "")


async def test_shipped_tasks_are_graded_by_swebench(factory):
    env = load_env("swe")
    assert isinstance(env, SweEnv)
    task = env.eval_items(1)[0]
    oracle = await _rollouts(env, factory, model_for=oracle_model_for(env)).episode(task)
    assert oracle.reward.value == 1.0 and "swebench: RESOLVED_FULL" in (oracle.reward.reason or "")
    nothing = await _rollouts(env, factory, model_for=nothing_model_for(env)).episode(task)
    assert nothing.reward.value == 0.0 and "swebench: RESOLVED_NO" in (nothing.reward.reason or "")


async def test_swebench_rules_decide_the_edge_cases():
    spec = {"instance_id": "x", "fail_to_pass": ["t.py::a", "t.py::b"], "pass_to_pass": ["t.py::c"]}
    start, end, code = swe_grading.markers()
    partial = f"{start}\nPASSED t.py::a\nFAILED t.py::b - AssertionError\nPASSED t.py::c\n{end}\n{code}: 1\n"
    got = await swe_grading.grade(spec, partial, partial_credit=True)
    assert got.reward == 0.5 and "RESOLVED_PARTIAL" in (got.reason or "")
    assert (await swe_grading.grade(spec, partial, partial_credit=False)).reward == 0.0
    # a log of passes that contradicts its own exit status is no result (swebench's check)
    forged = f"{start}\nPASSED t.py::a\nPASSED t.py::b\nPASSED t.py::c\n{end}\n{code}: 1\n"
    got = await swe_grading.grade(spec, forged, partial_credit=False)
    assert got.reward == 0.0 and "no test result" in (got.reason or "")
    # a skipped PASS_TO_PASS test is maintained; a skipped FAIL_TO_PASS one is not resolved
    skipped = f"{start}\nPASSED t.py::a\nPASSED t.py::b\nSKIPPED t.py::c\n{end}\n{code}: 0\n"
    assert (await swe_grading.grade(spec, skipped, partial_credit=False)).reward == 1.0
    skipped_f2p = f"{start}\nSKIPPED t.py::a\nPASSED t.py::b\nPASSED t.py::c\n{end}\n{code}: 0\n"
    assert (await swe_grading.grade(spec, skipped_f2p, partial_credit=False)).reward == 0.0
    # a run that never reached the end marker (killed at the deadline) has no result
    cut = f"{start}\nPASSED t.py::a\n"
    assert (await swe_grading.grade(spec, cut, partial_credit=False, detail="timed out")).reward == 0.0


def test_bad_instances_and_missing_checkouts_say_what_to_do(swebench_setup, tmp_path):
    with pytest.raises(EnvConfigError, match="repos_dir"):
        load_env("swe", {"instances": str(swebench_setup["instances"])})
    row = json.loads(swebench_setup["instances"].read_text())
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({k: v for k, v in row.items() if k != "test_patch"}) + "\n")
    with pytest.raises(EnvDataError, match="lacks test_patch"):
        load_instances(bad)
    bad.write_text(json.dumps({**row, "FAIL_TO_PASS": "not json"}) + "\n")
    with pytest.raises(EnvDataError, match="FAIL_TO_PASS is not a JSON list"):
        load_instances(bad)
    elsewhere = tmp_path / "instances.jsonl"
    elsewhere.write_text(json.dumps({**row, "repo": "acme/other"}) + "\n")
    env = load_env("swe", {"instances": str(elsewhere), "repos_dir": str(swebench_setup["repos"])})
    with pytest.raises(EnvDataError, match="no local checkout of acme/other.*needs the internet"):
        env.eval_items(1)


def test_env_eval_runs_instances_from_a_config_file(swebench_setup, tmp_path):
    """What a user types: `trajforge env eval swe --config swe-bench.yaml --agent oracle`."""
    from typer.testing import CliRunner

    from trajforge.cli.main import app

    config = tmp_path / "swe-bench.yaml"
    config.write_text(
        f"instances: {swebench_setup['instances']}\nrepos_dir: {swebench_setup['repos']}\n"
        f"test_env_dir: {swebench_setup['env']}\n"
    )
    for agent, expected in (("oracle", 1.0), ("none", 0.0)):
        out = CliRunner().invoke(
            app,
            [
                "env", "eval", "swe", "--config", str(config), "--agent", agent, "--n", "1",
                "--group-size", "1", "--output-dir", str(tmp_path / "runs"), "--run-name", agent, "--json",
            ],
        )  # fmt: skip
        assert out.exit_code == 0, out.output
        summary = json.loads(out.output[out.output.index("{") :])
        assert summary["mean_reward"]["value"] == expected, summary


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "src/../../x", ".git/config"])
def test_a_patch_naming_a_path_outside_the_repository_is_refused(name):
    """A dataset row's patch names the files the host reads back after ``git apply``: a name that
    leaves the scratch tree (or edits the repository's git config) is bad data, refused first."""
    good = "diff --git a/src/ok.py b/src/ok.py\n--- a/src/ok.py\n+++ b/src/ok.py\n@@ -1 +1 @@\n-a\n+b\n"
    assert patch_files(good) == ["src/ok.py"]
    bad = good + f"diff --git a/{name} b/{name}\n--- a/{name}\n+++ b/{name}\n@@ -1 +1 @@\n-a\n+b\n"
    with pytest.raises(EnvDataError, match="only paths inside the repository"):
        patch_files(bad)
