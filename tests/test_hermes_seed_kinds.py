"""The compatibility suite: one env file per kind of env the seed system ships (terminal test,
SWE, on-policy distillation, Terminal-Bench 2, TBLite, YC-Bench), written as a Hermes Agent user
writes them (tests/hermes_seed_envs.py) and laid out as a checkout (``environments/...``), each
run unchanged through ``trajforge env eval`` with a scripted model that solves its tasks (mean
reward 1.0) and one that does nothing (0.0). The model is the scripted OpenAI-compatible server,
the sandboxes are real bubblewrap (the YC-Bench kind's simulation is a host file, as the seed's
is: it runs with ``--sandbox local``)."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import tarfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from hermes_seed_envs import FILES, MINISIM
from trajforge.cli.main import app
from trajforge.testing.policies import count_assistant_turns, last_user_text
from trajforge.testing.scripted_server import Reply, ScriptedServer, ToolCallSpec

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

runner = CliRunner()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """The six env files in a seed checkout's layout."""
    root = tmp_path / "hermes"
    for rel, source in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(source)
    return root


def _eval(
    tmp_path: Path, policy: Any, ref: str, name: str, *extra: str
) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    with ScriptedServer(policy).in_thread() as srv:
        out = runner.invoke(
            app,
            [
                "env", "eval", ref, "--model", "scripted", "--base-url", srv.base_url,
                "--output-dir", str(tmp_path / "runs"), "--run-name", name, "--json", "--progress", "plain", *extra,
            ],
        )  # fmt: skip
    assert out.exit_code == 0, out.output
    summary = json.loads(out.stdout[out.stdout.index("{") :])
    path = tmp_path / "runs" / name / "episodes.jsonl"
    episodes = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return summary, episodes, out.stderr


def _mean(summary: dict[str, Any]) -> float:
    return float(summary["mean_reward"]["value"])


def idle(body: dict[str, Any]) -> Reply:
    return Reply(content="I will not do that.")


def _calls(*calls: tuple[str, dict[str, Any]]) -> Reply:
    return Reply(tool_calls=[ToolCallSpec(name, args) for name, args in calls])


# ------------------------------------------------------------------------------- terminal test


def terminal_solver(body: dict[str, Any]) -> Reply:
    """Writes the asked text at the asked ~/ path, with the terminal."""
    found = re.search(r"Put the text '([^']*)' into (~/\S+)", last_user_text(body) or "")
    if count_assistant_turns(body) == 0 and found:
        text, path = found.groups()
        return _calls(("terminal", {"command": f"mkdir -p $(dirname {path}) && echo '{text}' > {path}"}))
    return Reply(content="done")


def test_terminal_test_kind(tmp_path: Path, checkout: Path) -> None:
    ref = f"{checkout}/environments/terminal_test_env/terminal_test_env.py:FileTasksEnv"
    solved, episodes, notes = _eval(tmp_path, terminal_solver, ref, "solved")
    assert _mean(solved) == 1.0 and solved["episodes"] == 4, solved  # 2 items x the env's group_size 2
    assert all(e["status"] == "completed" for e in episodes)
    assert "terminal_backend 'modal' runs in trajforge's bwrap sandbox" in notes
    assert "vendor/model at https://openrouter.ai/api/v1" in notes and "not used" in notes
    wandb = orjson.loads((tmp_path / "runs" / "solved" / "wandb_metrics.json").read_bytes())
    assert wandb == [{"train/avg_reward": 1.0}]  # the env's wandb_log, called once at the end
    unsolved, _, _ = _eval(tmp_path, idle, ref, "idle")
    assert _mean(unsolved) == 0.0 and unsolved["episodes"] == 4


# ----------------------------------------------------------------------------------------- SWE

SWE_ROWS = [
    {
        "prompt": "Write add(a, b) returning a + b in solution.py.",
        "test": "from solution import add; assert add(2, 3) == 5",
    },
    {
        "prompt": "Write neg(x) returning -x in solution.py.",
        "test": "from solution import neg; assert neg(4) == -4",
    },
]
SWE_CODE = {"add": "def add(a, b):\n    return a + b\n", "neg": "def neg(x):\n    return -x\n"}


def swe_solver(body: dict[str, Any]) -> Reply:
    name = re.search(r"Write (\w+)\(", last_user_text(body) or "")
    if count_assistant_turns(body) == 0 and name:
        return _calls(("write_file", {"path": "solution.py", "content": SWE_CODE[name.group(1)]}))
    return Reply(content="done")


def test_swe_kind_from_a_local_dataset(tmp_path: Path, checkout: Path) -> None:
    data = tmp_path / "code-tasks"
    data.mkdir()
    (data / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in SWE_ROWS))
    config = tmp_path / "swe.yaml"
    config.write_text(f"env:\n  dataset_name: {data}\nopenai:\n  model_name: vendor/coder\n")
    ref = f"{checkout}/environments/hermes_swe_env/hermes_swe_env.py:CodeTasksEnv"
    solved, _, notes = _eval(tmp_path, swe_solver, ref, "solved", "--config", str(config))
    assert _mean(solved) == 1.0 and solved["items"] == 2, solved
    assert "section(s) openai not used" in notes
    unsolved, _, _ = _eval(tmp_path, idle, ref, "idle", "--config", str(config))
    assert _mean(unsolved) == 0.0


# ----------------------------------------------------------------------- on-policy distillation

OPD_CODE = {
    "double": "def double(x):\n    return 2 * x\n",
    "shout": "def shout(s):\n    return s.upper() + '!'\n",
    "count_vowels": "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)\n",
}


def opd_solver(body: dict[str, Any]) -> Reply:
    prompt = last_user_text(body) or ""
    turns = count_assistant_turns(body)
    name = re.search(r"`(\w+)\(", prompt)
    tests = re.search(r"```python\n(.*?)```", prompt, re.S)
    if turns == 0 and name and tests:
        return _calls(
            ("write_file", {"path": "solution.py", "content": OPD_CODE[name.group(1)]}),
            ("write_file", {"path": "test_solution.py", "content": tests.group(1)}),
        )
    if turns == 1:
        return _calls(("terminal", {"command": "python test_solution.py"}))
    return Reply(content="tests pass")


def test_opd_kind_rollouts_and_its_own_evaluate(tmp_path: Path, checkout: Path) -> None:
    """Its rollouts (compute_reward runs ``python``: the seed's images have one) and, with
    ``evaluation: evaluate``, its evaluate(): HermesAgentLoop, ToolContext(task_id) and the
    blocking compute_reward awaited on the event loop."""
    ref = f"{checkout}/environments/agentic_opd_env.py:CodeOPDEnv"
    solved, _, notes = _eval(tmp_path, opd_solver, ref, "solved", "--group-size", "1")
    assert _mean(solved) == 1.0 and solved["items"] == 3, solved
    assert "CodeOPDEnv.evaluate() is not run" in notes
    unsolved, _, _ = _eval(tmp_path, idle, ref, "idle", "--group-size", "1")
    assert _mean(unsolved) == 0.0
    config = tmp_path / "evaluate.yaml"
    config.write_text("env:\n  evaluation: evaluate\n")
    own, episodes, notes = _eval(tmp_path, opd_solver, ref, "own", "--config", str(config))
    assert _mean(own) == 1.0 and own["episodes"] == 2, own  # its eval_size: 2 held-out tasks
    assert all(e["reward"]["reason"].startswith("the env's evaluate(): reward") for e in episodes)
    assert "evaluate() is the evaluation" in notes
    logged = orjson.loads((tmp_path / "runs" / "own" / "evaluate_log.json").read_bytes())
    assert logged[0]["metrics"] == {"eval/mean_reward": 1.0}
    own_idle, _, _ = _eval(tmp_path, idle, ref, "own-idle", "--config", str(config))
    assert _mean(own_idle) == 0.0


# ------------------------------------------------------------------------- Terminal-Bench 2 / TBLite

TB_TASKS = [("status-word", "Write the word ready into status.txt.", "status.txt", "ready"),
            ("count-file", "Write the number 3 into count.txt.", "count.txt", "3"),
            ("mode-file", "Write the word quiet into mode.txt.", "mode.txt", "quiet")]  # fmt: skip


def _tb_dataset(where: Path) -> Path:
    rows = []
    for name, instruction, path, want in TB_TASKS:
        check = f"import pathlib, sys\nsys.exit(0 if pathlib.Path('{path}').read_text().strip() == '{want}' else 1)\n"
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            info = tarfile.TarInfo("check.py")
            info.size = len(check)
            tar.addfile(info, io.BytesIO(check.encode()))
        test_sh = "python3 tests/check.py && echo 1 > logs/verifier/reward.txt || echo 0 > logs/verifier/reward.txt\n"
        rows.append(
            {"task_name": name, "category": "files", "instruction": instruction, "docker_image": "",
             "tests_tar": base64.b64encode(buf.getvalue()).decode(), "test_sh": test_sh}
        )  # fmt: skip
    where.mkdir(parents=True)
    (where / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return where


def tb_solver(body: dict[str, Any]) -> Reply:
    found = re.search(r"Write the (?:word|number) (\w+) into (\S+)\.", last_user_text(body) or "")
    if count_assistant_turns(body) == 0 and found:
        word, path = found.groups()
        return _calls(("terminal", {"command": f"echo {word} > {path}"}))
    return Reply(content="done")


@pytest.mark.parametrize(
    ("rel", "cls"),
    [
        ("environments/benchmarks/terminalbench_2/terminalbench2_env.py", "TerminalTasksEnv"),
        ("environments/benchmarks/tblite/tblite_env.py", "LiteTasksEnv"),  # imports its sibling above
    ],
)
def test_terminal_bench_kinds_run_their_own_evaluate(
    tmp_path: Path, checkout: Path, rel: str, cls: str
) -> None:
    config = tmp_path / "tb.yaml"
    config.write_text(f"env:\n  dataset_name: {_tb_dataset(tmp_path / 'tasks')}\n")
    ref = f"{checkout}/{rel}:{cls}"
    # one loop at a time: the others wait for a slot, so their loops start interleaved
    solved, episodes, notes = _eval(
        tmp_path, tb_solver, ref, "solved", "--config", str(config), "--concurrency", "1"
    )
    assert _mean(solved) == 1.0 and solved["episodes"] == 3, solved
    assert {e["item_id"] for e in episodes} == {"status-word", "count-file", "mode-file"}
    assert len({e["key"] for e in episodes}) == 3  # each loop run its own episode
    assert all(e["category"] == "files" and e["status"] == "completed" for e in episodes)
    assert f"{cls}.evaluate() is the evaluation (its compute_reward returns a constant)" in notes
    assert "per-task images ('python:3.11', ...) are used by the docker sandbox only" in notes
    run = tmp_path / "runs" / "solved"
    assert orjson.loads((run / "evaluate_log.json").read_bytes())[0]["metrics"]["eval/pass_rate"] == 1.0
    unsolved, episodes, _ = _eval(tmp_path, idle, ref, "idle", "--config", str(config))
    assert _mean(unsolved) == 0.0 and len(episodes) == 3


# ------------------------------------------------------------------------------------ YC-Bench


def sim_player(body: dict[str, Any]) -> Reply:
    turns = count_assistant_turns(body)
    steps = ["minisim status", "minisim work", "minisim end"]
    if turns < len(steps):
        return _calls(("terminal", {"command": steps[turns]}))
    return Reply(content="the simulation ended")


def test_yc_bench_kind_drives_a_host_simulation(
    tmp_path: Path, checkout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its simulation is a host file it initialises itself (os.environ names it) and its CLI is on
    sandbox_path, as the seed's local backend saw its host: run with --sandbox local."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "minisim").write_text(MINISIM)
    (bin_dir / "minisim").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    config = tmp_path / "yc.yaml"
    config.write_text(f"env:\n  state_dir: {tmp_path / 'state'}\n  sandbox_path: [{bin_dir}]\n")
    ref = f"{checkout}/environments/benchmarks/yc_bench/yc_bench_env.py:SimEnv"
    solved, episodes, notes = _eval(
        tmp_path, sim_player, ref, "solved", "--config", str(config), "--sandbox", "local"
    )
    assert _mean(solved) == 1.0 and solved["episodes"] == 2, (solved, [e["reason"] for e in episodes])
    assert {e["item_id"] for e in episodes} == {"easy-seed1", "easy-seed2"}
    assert "the env set MINISIM_STATE in its environment" in notes
    unsolved, _, _ = _eval(tmp_path, idle, ref, "idle", "--config", str(config), "--sandbox", "local")
    assert _mean(unsolved) == 0.0


@pytest.mark.docker
def test_terminal_bench_kind_runs_each_task_in_the_image_it_registers(
    tmp_path: Path, checkout: Path, docker_engine: Any
) -> None:
    """``register_task_env_overrides(task_id, {"modal_image": IMAGE})`` picks the image of that
    task's docker sandbox (here the engine's local base image: no registry is reachable)."""
    data = _tb_dataset(tmp_path / "tasks")
    rows = [json.loads(line) for line in (data / "train.jsonl").read_text().splitlines()]
    (data / "train.jsonl").write_text(
        "".join(json.dumps({**r, "docker_image": docker_engine.base}) + "\n" for r in rows)
    )
    config = tmp_path / "tb.yaml"
    config.write_text(f"env:\n  dataset_name: {data}\n")
    ref = f"{checkout}/environments/benchmarks/terminalbench_2/terminalbench2_env.py:TerminalTasksEnv"
    solved, episodes, notes = _eval(
        tmp_path, tb_solver, ref, "docker", "--config", str(config), "--sandbox", "docker"
    )
    assert _mean(solved) == 1.0 and solved["episodes"] == 3, (solved, [e["reason"] for e in episodes])
    assert "per-task images" not in notes  # used, not ignored
    assert {e["item_id"] for e in episodes} == {"status-word", "count-file", "mode-file"}
