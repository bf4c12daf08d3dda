"""The fidelity suite (tests/fidelity.py): every workload a real task runs, in the bwrap sandbox and
in the docker backend (the reference for a Linux box), compared; docs/fidelity.md is its table.

Each backend runs all workloads once per module (four at a time: they are independent), the bwrap
ones on one reusing factory, so the sandboxes are reset between workloads as in a batch. Without
a Docker engine (tests/docker_engine.py says why) the comparison is skipped and bwrap's answers
are still held to each workload's expectation."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import fidelity
from trajforge.sandbox import SandboxConfig, close_factory, create_sandbox_factory

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

NAMES = [w.name for w in fidelity.WORKLOADS]


async def _run(config: SandboxConfig) -> dict[str, list[fidelity.Answer]]:
    factory = create_sandbox_factory(config)
    try:
        return await fidelity.run_all(factory)
    finally:
        await close_factory(factory)


@pytest.fixture(scope="module")
def bwrap_answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[fidelity.Answer]]:
    root = tmp_path_factory.mktemp("fidelity-bwrap")
    return asyncio.run(_run(SandboxConfig(kind="bwrap", reuse=True, root_dir=str(root))))


@pytest.fixture(scope="module")
def docker_answers(
    docker_engine_session: Any, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[fidelity.Answer]]:
    root = tmp_path_factory.mktemp("fidelity-docker")
    config = SandboxConfig(kind="docker", root_dir=str(root), docker_image=docker_engine_session.base)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", docker_engine_session.host)
        return asyncio.run(_run(config))


def test_the_doc_is_the_suites_table() -> None:
    """docs/fidelity.md is generated (``python tests/fidelity.py table > docs/fidelity.md``): a row
    is a workload of this suite, and a difference it lists is one this suite checks."""
    assert fidelity.DOC.read_text() == fidelity.table(), (
        "docs/fidelity.md is not tests/fidelity.py's table: python tests/fidelity.py table > docs/fidelity.md"
    )


def test_the_suite_runs_what_the_issue_lists() -> None:
    assert len(fidelity.WORKLOADS) >= 40 and len(set(NAMES)) == len(NAMES)
    commands = "\n".join(c for w in fidelity.WORKLOADS for c in w.calls)
    for needed in (
        "multiprocessing",
        "ProcessPoolExecutor",
        "pytest -q -n 2",
        "make -s -j2",
        "sqlite3",
        "hooks/pre-commit",
        "python3 -m venv",
        "pip install",
        "curl -s http://127.0.0.1",
        "jobs",
        "wait %1",
        "kill %1",
        "timeout ",
        "flock ",
        "mkfifo",
        "script -qec",
        "tmux new-session",
        "ps -o",
        "top -bn1",
        "nproc",
        "/proc/cpuinfo",
        "ulimit -a",
        "locale",
        "date ",
        "日本語",
        "truncate -s 1G",
    ):
        assert needed in commands, needed


def test_every_difference_says_what_each_backend_answers() -> None:
    """The table's bwrap and docker columns of a row that differs are its ``shows``: both written."""
    for w in fidelity.WORKLOADS:
        assert all(w.shows) == bool(w.differs), w.name


@pytest.mark.parametrize("name", NAMES)
def test_each_workload_does_its_job_in_bwrap(
    bwrap_answers: dict[str, list[fidelity.Answer]], name: str
) -> None:
    workload = fidelity.by_name()[name]
    assert not fidelity.problems(workload, bwrap_answers[name]), bwrap_answers[name]


@pytest.mark.docker
@pytest.mark.parametrize("name", NAMES)
def test_each_workload_does_its_job_in_docker(
    docker_answers: dict[str, list[fidelity.Answer]], name: str
) -> None:
    workload = fidelity.by_name()[name]
    assert not fidelity.problems(workload, docker_answers[name]), docker_answers[name]


@pytest.mark.docker
@pytest.mark.parametrize("name", NAMES)
def test_bwrap_answers_as_docker_does_or_the_doc_says_why_not(
    bwrap_answers: dict[str, list[fidelity.Answer]],
    docker_answers: dict[str, list[fidelity.Answer]],
    name: str,
) -> None:
    """Equal exit codes and output, call by call, unless the workload's ``differs`` says why; and a
    reason written down for a difference that no longer exists fails too (the doc stays true)."""
    workload = fidelity.by_name()[name]
    same = bwrap_answers[name] == docker_answers[name]
    if workload.differs:
        assert not same, f"{name} now answers alike in both: drop its `differs` (and regenerate the doc)"
    else:
        assert same, {"bwrap": bwrap_answers[name], "docker": docker_answers[name]}


async def test_multiprocessing_works_in_the_default_sandbox(tmp_path: Path) -> None:
    """The issue's line, in a sandbox of the default config: /dev/shm was
    root's and read-only, and ``SemLock`` failed with ``PermissionError`` at the pool's first
    queue. A pool's semaphores leave nothing behind in /dev/shm."""
    factory = create_sandbox_factory(SandboxConfig(root_dir=str(tmp_path)))
    sandbox = await factory.create("mp")
    try:
        res = await sandbox.exec(
            'python3 -c "import multiprocessing as m; print(m.Pool(2).map(abs, [-1, -2]))"'
        )
        assert (res.exit_code, res.output) == (0, "[1, 2]\n"), res
        assert os.listdir(sandbox.layout.shm) == []
        assert (await sandbox.exec("stat -c %a /dev/shm")).output == "1777\n"
    finally:
        await sandbox.close()
        await close_factory(factory)
