"""``swe``: fix a bug or add a feature in a small Python repository; hidden tests judge.

Each task is a directory (the shipped ones are in ``swe_tasks/``; ``tasks_dir`` points at others)::

    task.toml       instruction, category ("bug"/"feature"), fail_to_pass, pass_to_pass
    repo/           the repository, copied into the sandbox's workdir before the rollout
    tests/          hidden tests: written into the workdir's ``tests/`` only after the rollout
                    (overwriting whatever the agent put at those paths)
    solution/       reference files (repo-relative) that solve the task: the oracle writes them

``fail_to_pass`` / ``pass_to_pass`` (SWE-bench's terms) are test ids ``tests/FILE.py::name``: the
first fail on the untouched repository (so an agent that does nothing, or only adds the names the
tests import, scores 0), the second pass there and must keep passing.

Reward: 1.0 when every listed test passes, else 0.0. With ``partial_credit`` the reward is the
fraction of ``fail_to_pass`` tests that pass, and 0.0 whenever a ``pass_to_pass`` test fails
(breaking what worked earns nothing). ``components`` always hold both fractions.

The tests run with the runner of :mod:`trajforge.envs.library.swe_runner`, which keeps the rule
"the tests and the code that records their result never share an interpreter or a writable
location with the model's code": the hidden tests' assertions run in the runner's interpreter
(non-dumpable, its result signed with a nonce only it held), and the repository's code runs in
a separate interpreter per test, reached over a pipe with data-only values. See there for what
that allows and forbids. (A SWE-bench-style verifier that runs pytest *in process* over the
repository cannot keep that rule: the code under test can rewrite pytest's report of itself.)

Task directories and an item's ``task_dir`` are data: a task is read beneath ``tasks_dir`` (the
operator's root) without following any link (:class:`~trajforge.sandbox.confined.HostPath`); a
task holding a link is refused when the env loads, and an item (a ``batch --env swe`` row) whose
``task_dir`` lies outside ``tasks_dir`` is refused when its files are asked for.
"""

from __future__ import annotations

import asyncio
import tomllib
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from trajforge.envs.agents import write_files_command
from trajforge.envs.base import BaseEnv, EnvDataError
from trajforge.envs.config import EnvConfig
from trajforge.envs.library import swe_runner
from trajforge.envs.library.trusted_run import run_trusted
from trajforge.envs.types import Item, RewardBreakdown
from trajforge.sandbox.confined import DataPathError, HostPath, beneath

if TYPE_CHECKING:
    from trajforge.agent.result import AgentResult
    from trajforge.envs.verifier import VerifierContext

SHIPPED = "swe_tasks"
HIDDEN_DIR = "tests"
PROMPT = """You are working in a Python repository (your current directory). {instruction}

Change the repository's code. Hidden tests will be run against your changes after you finish."""


class SweConfig(EnvConfig):
    tasks_dir: str | None = Field(None, description="directory of task directories (default: the shipped)")
    partial_credit: bool = Field(
        False, description="reward the fraction of fail_to_pass tests passed (0 if a pass_to_pass fails)"
    )
    test_timeout_s: float = Field(120.0, gt=0, description="deadline of the hidden test run")


def shipped_dir() -> Path:
    return Path(str(resources.files("trajforge.envs.library").joinpath(SHIPPED)))


def _files(root: HostPath) -> dict[str, bytes]:
    """A task tree's files (``{}`` when it has none), read without following links: a link in it
    raises DataPathError."""
    if root.kind() in (None, "file"):
        return {}
    return {rel: data for rel, data, _ in root.files(skip=("__pycache__",))}


def load_task(path: HostPath) -> Item:
    """One task directory as an item (plain JSON: it goes into every episode record)."""
    problem = path.first_problem()
    if problem:
        raise EnvDataError(f"swe task {path}: {problem}")
    try:
        meta = tomllib.loads((path / "task.toml").read_text())
    except (OSError, DataPathError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise EnvDataError(f"swe task {path}: cannot read task.toml ({exc})") from None
    missing = [k for k in ("instruction", "fail_to_pass") if not meta.get(k)]
    if missing:
        raise EnvDataError(f"swe task {path}: task.toml lacks {', '.join(missing)}")
    for test_id in [*meta["fail_to_pass"], *meta.get("pass_to_pass", [])]:
        file = test_id.partition("::")[0]
        if not file.startswith(f"{HIDDEN_DIR}/") or ".." in file.split("/") or not (path / file).is_file():
            raise EnvDataError(f"swe task {path}: test id {test_id!r} names no file under {HIDDEN_DIR}/")
    return {
        "id": path.name,
        "category": str(meta.get("category", "task")),
        "instruction": str(meta["instruction"]).strip(),
        "fail_to_pass": list(meta["fail_to_pass"]),
        "pass_to_pass": list(meta.get("pass_to_pass", [])),
        "task_dir": str(path),
    }


class SweEnv(BaseEnv[SweConfig]):
    name: ClassVar[str] = "swe"
    description: ClassVar[str] = "fix a bug / add a feature in a small Python repo; hidden tests judge"
    config_class: ClassVar[type[EnvConfig]] = SweConfig

    @classmethod
    def default_config(cls) -> EnvConfig:
        return SweConfig(enabled_toolsets=["terminal", "file"], max_agent_turns=30)

    @property
    def cfg(self) -> SweConfig:
        return self.config

    @cached_property
    def _root(self) -> Path:
        return Path(self.cfg.tasks_dir) if self.cfg.tasks_dir else shipped_dir()

    def _task_dir(self, item: Item) -> HostPath:
        """The item's task directory, beneath ``tasks_dir`` (an item is data: a row may name any
        path in ``task_dir``)."""
        return beneath(self._root, str(item.get("task_dir", item.get("id", ""))), "swe task_dir")

    @cached_property
    def tasks(self) -> list[Item]:
        if not self._root.is_dir():
            raise EnvDataError(f"swe tasks_dir {self._root} is not a directory")
        tasks = []
        for p in HostPath.of(self._root).iterdir():
            kind = p.kind()
            if kind == "link":
                raise EnvDataError(f"swe tasks_dir entry {p}: {p.first_problem()}")
            if kind == "dir" and (p / "task.toml").kind() is not None:
                tasks.append(load_task(p))
        if not tasks:
            raise EnvDataError(f"no swe tasks (directories with task.toml) in {self._root}")
        return tasks

    async def setup(self) -> None:
        await asyncio.to_thread(lambda: self.tasks)

    def generate(self, index: int, *, split: str) -> Item:
        return self.tasks[index % len(self.tasks)]

    def eval_items(self, n: int) -> list[Item]:
        return self.tasks[:n]

    def format_prompt(self, item: Item) -> str:
        return PROMPT.format(instruction=item["instruction"])

    def setup_files(self, item: Item) -> dict[str, bytes]:
        return _files(self._task_dir(item) / "repo")

    def verifier_files(self, item: Item) -> dict[str, bytes]:
        return {
            f"{HIDDEN_DIR}/{rel}": data for rel, data in _files(self._task_dir(item) / HIDDEN_DIR).items()
        }

    def solution_files(self, item: Item) -> dict[str, bytes]:
        """The reference solution (repo-relative paths -> full new contents)."""
        return _files(self._task_dir(item) / "solution")

    def oracle_calls(self, item: Item) -> list[tuple[str, dict[str, Any]]]:
        """The oracle as :func:`trajforge.envs.agents.agent_model_for` (``--agent oracle``) runs it."""
        return [("terminal", {"command": self.oracle_command(item)})]

    def oracle_command(self, item: Item) -> str:
        """What the oracle agent runs (see :mod:`trajforge.envs.agents`): write the solution."""
        return write_files_command(self.solution_files(item))

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        ran = await run_hidden_tests(ctx, sorted(self.verifier_files(item)), self.cfg.test_timeout_s)
        if isinstance(ran, str):
            return RewardBreakdown(
                reward=0.0, components={"fail_to_pass": 0.0, "pass_to_pass": 0.0}, reason=ran
            )
        return score(item, ran, partial_credit=self.cfg.partial_credit)


async def run_hidden_tests(
    ctx: VerifierContext, test_files: list[str], timeout: float
) -> dict[str, Any] | str:
    """Run ``test_files`` (workdir-relative) with the shipped runner; its verified result, or why
    there is none."""
    root = ctx.workdir
    ran = await run_trusted(
        ctx,
        root,
        "swe_runner.py",
        [root, *(f"{root}/{f}" for f in test_files)],
        marker=swe_runner.MARKER,
        timeout=timeout,
        extra_files=("swe_repo.py",),
    )
    if ran.data is None:
        return f"the hidden tests produced no result: {ran.why}"
    return ran.data


def score(item: Item, ran: dict[str, Any], *, partial_credit: bool) -> RewardBreakdown:
    results: dict[str, str] = ran.get("results", {})
    errors: dict[str, str] = ran.get("errors", {})
    f2p, p2p = item["fail_to_pass"], item["pass_to_pass"]
    failed = [t for t in [*f2p, *p2p] if results.get(t) != "passed"]
    f2p_frac = sum(results.get(t) == "passed" for t in f2p) / len(f2p)
    p2p_frac = sum(results.get(t) == "passed" for t in p2p) / len(p2p) if p2p else 1.0
    if not failed:
        reward, reason = 1.0, f"all {len(f2p) + len(p2p)} hidden tests pass"
    else:
        reward = f2p_frac if partial_credit and p2p_frac == 1.0 else 0.0
        first = failed[0]
        detail = (errors.get(first) or errors.get(first.partition("::")[0]) or "not run").strip()
        reason = (
            f"{len(failed)} hidden test(s) fail: {', '.join(failed)}; "
            f"first: {detail.splitlines()[-1] if detail else ''}"
        )
    return RewardBreakdown(
        reward=reward, components={"fail_to_pass": f2p_frac, "pass_to_pass": p2p_frac}, reason=reason
    )
