"""terminal_bench reads Harbor task directories as the ``harbor`` package does: harbor 0.26's own
``Task`` (run by ``.venv-bench/bin/python``, a Python 3.12 environment with harbor installed, as
``make bench-venv`` makes it) and trajforge's reader parse every shipped task and a set of edge
cases, and agree field by field: name, instruction (canary lines stripped), schema version,
metadata, timeouts, env tables, workdir, image, resources, network mode, OS, steps, the test and
solve scripts, and which directories are valid tasks at all."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from trajforge.envs.base import EnvDataError
from trajforge.envs.library.harbor_task import strip_canary
from trajforge.envs.library.terminal_bench import TbTask, load_task, shipped_dir
from trajforge.sandbox.confined import HostPath

REPO = Path(__file__).resolve().parent.parent
BENCH_PYTHON = REPO / ".venv-bench" / "bin" / "python"

pytestmark = pytest.mark.skipif(
    not BENCH_PYTHON.exists(),
    reason=f"{BENCH_PYTHON} is absent: `make bench-venv` makes it (Python 3.12 + harbor==0.26.0)",
)

HARBOR_DUMP = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from harbor.models.task.task import Task

out = {}
for d in json.load(sys.stdin):
    valid = Task.is_valid_dir(d)
    try:
        t = Task(d)
    except Exception as exc:
        out[d] = {"error": type(exc).__name__, "valid": valid}
        continue
    c, e = t.config, t.config.environment
    test, solve = t.paths.discovered_test_path_for(e.os), t.paths.discovered_solve_path_for(e.os)
    out[d] = {
        "valid": valid, "name": t.name, "instruction": t.instruction,
        "schema_version": c.schema_version, "metadata": c.metadata,
        "verifier_timeout_sec": c.verifier.timeout_sec, "verifier_env": c.verifier.env,
        "agent_timeout_sec": c.agent.timeout_sec, "solution_env": c.solution.env,
        "build_timeout_sec": e.build_timeout_sec, "docker_image": e.docker_image, "os": e.os.value,
        "cpus": e.cpus, "memory_mb": e.memory_mb, "storage_mb": e.storage_mb, "gpus": e.gpus,
        "env": e.env, "workdir": e.workdir, "network_mode": e.network_mode.value,
        "steps": bool(c.steps),
        "test_script": test.relative_to(t.task_dir).as_posix() if test else None,
        "solve_script": solve.relative_to(t.task_dir).as_posix() if solve else None,
    }
print(json.dumps(out))
"""


def harbor(dirs: list[Path]) -> dict[str, dict[str, Any]]:
    done = subprocess.run(
        [str(BENCH_PYTHON), "-c", HARBOR_DUMP],
        input=json.dumps([str(d) for d in dirs]),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def ours(d: Path) -> dict[str, Any]:
    try:
        task = load_task(HostPath.of(d.parent) / d.name, "docker")
    except EnvDataError as exc:
        return {"error": str(exc), "valid": False}
    c, e = task.config, task.config.environment
    fields: dict[str, Any] = {
        "valid": not (task.skip or "").startswith("no "),
        "name": c.name_for(d.name),
        "instruction": _instruction(task),
        "schema_version": c.schema_version,
        "metadata": c.metadata,
        "verifier_timeout_sec": c.verifier.timeout_sec,
        "verifier_env": c.verifier.env,
        "agent_timeout_sec": c.agent.timeout_sec,
        "solution_env": c.solution.env,
        "build_timeout_sec": e.build_timeout_sec,
        "docker_image": e.docker_image,
        "os": e.os,
        "cpus": e.cpus,
        "memory_mb": e.memory_mb,
        "storage_mb": e.storage_mb,
        "gpus": e.gpus,
        "env": e.env,
        "workdir": e.workdir,
        "network_mode": e.network_mode,
        "steps": bool(c.steps),
        "test_script": "tests/test.sh" if (task.path / "tests" / "test.sh").is_file() else None,
        "solve_script": "solution/solve.sh" if (task.path / "solution" / "solve.sh").is_file() else None,
    }
    if task.skip and task.skip.startswith("no "):  # what harbor's Task() refuses to load
        return {"error": task.skip, "valid": False}
    return fields


def _instruction(task: TbTask) -> str:
    return strip_canary((task.path / "instruction.md").read_text())


def _task(root: Path, name: str, toml: str, *, instruction: str = "Do it.\n", tests: bool = True) -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\nWORKDIR /app\n")
    (d / "solution").mkdir()
    (d / "solution" / "solve.sh").write_text("true\n")
    if tests:
        (d / "tests").mkdir()
        (d / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (d / "task.toml").write_text(toml)
    (d / "instruction.md").write_text(instruction)
    return d


EDGE_FULL = """
version = "1.1"
source = "made for the parity test"

[task]
name = "acme/edge-full"
description = "every field trajforge reads"
keywords = ["a", "b"]

[metadata]
category = "debugging"
difficulty = "hard"
tags = ["x"]
requires = ["bash"]
nested = { deep = [1, 2.5, "three"] }

[verifier]
timeout_sec = 12.5
env = { A = "1" }

[agent]
timeout_sec = 30

[environment]
build_timeout_sec = 99
docker_image = "debian:bookworm-slim"
memory = "2G"
storage = "512M"
cpus = 2
gpus = 0
allow_internet = false
workdir = "/app/x"
env = { B = "${B:-fallback}" }

[solution]
env = { C = "3" }

[unknown_section]
kept = "ignored by both"
"""


def _edge_cases(root: Path) -> list[Path]:
    return [
        _task(
            root,
            "edge-full",
            EDGE_FULL,
            instruction="<!-- harbor-canary GUID 6f1c -->\n# BENCHMARK DATA canary line\n\n\nFix it.\n# canary not at the top stays\n",
        ),
        _task(root, "edge-minimal", ""),
        _task(
            root,
            "edge-legacy",
            'version = "1.0"\n[environment]\nmemory_mb = 512\nallow_internet = true\nos = "LINUX"\n',
        ),
        _task(root, "edge-no-tests", 'version = "1.0"\n', tests=False),
        _task(root, "edge-bad-name", '[task]\nname = "no-slash"\n'),
        _task(root, "edge-bad-toml", "[metadata\n"),
    ]


def test_harbor_and_trajforge_read_every_task_alike(tmp_path: Path) -> None:
    shipped = sorted(p for p in shipped_dir().iterdir() if (p / "task.toml").is_file())
    assert len(shipped) >= 36
    dirs = shipped + _edge_cases(tmp_path)
    theirs = harbor(dirs)
    differ = []
    for d in dirs:
        want, got = theirs[str(d)], ours(d)
        if "error" in want or "error" in got:  # both refuse it, and neither calls it a task
            if not ("error" in want and "error" in got and want["valid"] == got["valid"] is False):
                differ.append(f"{d.name}: harbor {want} / trajforge {got}")
            continue
        for key in want:
            if want[key] != got[key]:
                differ.append(f"{d.name}.{key}: harbor {want[key]!r} / trajforge {got[key]!r}")
    assert not differ, "\n".join(differ)
    full = theirs[str(tmp_path / "edge-full")]
    assert full["name"] == "acme/edge-full" and full["instruction"].startswith("Fix it.")
    assert (full["memory_mb"], full["storage_mb"], full["network_mode"]) == (2048, 512, "no-network")
    assert theirs[str(tmp_path / "edge-minimal")]["verifier_timeout_sec"] == 600.0
