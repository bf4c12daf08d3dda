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

Reward (graded by swebench, below): 1.0 when every listed test passes, else 0.0. With
``partial_credit`` the reward is the fraction of ``fail_to_pass`` tests that pass, and 0.0
whenever a ``pass_to_pass`` test fails (breaking what worked earns nothing). ``components``
always hold both fractions.

The tests run with the runner of :mod:`trajforge.envs.library.swe_runner`, which keeps the rule
"the tests and the code that records their result never share an interpreter or a writable
location with the model's code": the hidden tests' assertions run in the runner's interpreter
(non-dumpable, its result signed with a nonce only it held), and the repository's code runs in
a separate interpreter per test, reached over a pipe with data-only values. See there for what
that allows and forbids. (A SWE-bench-style verifier that runs pytest *in process* over the
repository cannot keep that rule: the code under test can rewrite pytest's report of itself.)

**SWE-bench instances** (``instances``: a JSON/JSONL file of rows in the ``swebench`` package's
format) run on prepared local checkouts of their repositories (``repos_dir``; building SWE-bench's
official images needs the internet): see :mod:`trajforge.envs.library.swe_instances`. Their tests
are the instance's own test command, run in the finished rollout's sandbox with the packages of
``test_env_dir`` (pytest and the repository's test requirements) -- that is, pytest *in process*
with the repository's code, as SWE-bench itself runs them: the code under test could rewrite its
own report there, so instances grade an honest agent, and RL against an adversarial policy should
use tasks in the isolated runner's layout (docs/security.md).

**Grading** is swebench's own, for both kinds (:mod:`trajforge.envs.library.swe_grading`): the
test log in SWE-bench's shape, its log parser, its FAIL_TO_PASS / PASS_TO_PASS report and its
resolution status; for the shipped tasks the log is rendered from the runner's signed results.
Reward 1.0 when swebench says RESOLVED_FULL; with ``partial_credit`` the FAIL_TO_PASS fraction
when it says RESOLVED_PARTIAL.

Task directories and an item's ``task_dir`` are data: a task is read beneath ``tasks_dir`` (the
operator's root) without following any link (:class:`~trajforge.sandbox.confined.HostPath`); a
task holding a link is refused when the env loads, and an item (a ``batch --env swe`` row) whose
``task_dir`` lies outside ``tasks_dir`` is refused when its files are asked for.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
import tomllib
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, model_validator

from trajforge.envs.agents import write_files_command
from trajforge.envs.base import BaseEnv, EnvDataError
from trajforge.envs.config import EnvConfig
from trajforge.envs.library import swe_runner
from trajforge.envs.library.swe_grading import grade, markers, require_swebench, runner_log
from trajforge.envs.library.swe_instances import LocalRepos, instance_test_command, load_instances, prompt
from trajforge.envs.library.trusted_run import run_trusted
from trajforge.envs.types import Item, RewardBreakdown
from trajforge.envs.verifier import SYSTEM_PATH
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
    instances: str | None = Field(
        None, description="JSON/JSONL file of SWE-bench instances (the swebench package's fields)"
    )
    repos_dir: str | None = Field(
        None, description="where the instances' repositories are checked out (OWNER__NAME/ or OWNER/NAME/)"
    )
    test_env_dir: str | None = Field(
        None,
        description="host directory of the Python packages an instance's tests import (pytest, the "
        "repository's test requirements); written fresh for each verification, on PYTHONPATH",
    )

    @model_validator(mode="after")
    def _instances(self) -> SweConfig:
        if self.instances and not self.repos_dir:
            raise ValueError("instances need repos_dir: the directory of their prepared local checkouts")
        if self.instances and self.tasks_dir:
            raise ValueError("instances and tasks_dir are exclusive: keep one source of tasks")
        return self


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
    def _instances(self) -> dict[str, dict[str, Any]]:
        """SWE-bench instances by id ({} when the env runs task directories)."""
        if not self.cfg.instances:
            return {}
        return {row["instance_id"]: row for row in load_instances(Path(self.cfg.instances))}

    @cached_property
    def _repos(self) -> LocalRepos:
        return LocalRepos(Path(self.cfg.repos_dir or "."))

    def _instance(self, item: Item) -> dict[str, Any] | None:
        if not item.get("swebench"):
            return None
        found = self._instances.get(str(item.get("id")))
        if found is None:
            raise EnvDataError(f"swe item {item.get('id')!r} names no instance of {self.cfg.instances}")
        return found

    @cached_property
    def _test_env(self) -> dict[str, bytes]:
        if not self.cfg.test_env_dir:
            return {}
        root = HostPath.of(Path(self.cfg.test_env_dir).absolute())
        if not root.is_dir():
            raise EnvDataError(f"swe test_env_dir {self.cfg.test_env_dir} is not a directory")
        return {rel: data for rel, data in _files(root).items() if not rel.startswith("bin/")}

    @cached_property
    def tasks(self) -> list[Item]:
        if self.cfg.instances:
            items = []
            for row in self._instances.values():
                self._repos.checkout(row["repo"])  # a missing checkout says so when the env loads
                items.append(
                    {
                        "id": row["instance_id"],
                        "category": row["repo"],
                        "instruction": prompt(row),
                        "fail_to_pass": row["FAIL_TO_PASS"],
                        "pass_to_pass": row["PASS_TO_PASS"],
                        "swebench": True,
                    }
                )
            return items
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
        require_swebench()
        await asyncio.to_thread(lambda: self.tasks)

    def generate(self, index: int, *, split: str) -> Item:
        return self.tasks[index % len(self.tasks)]

    def eval_items(self, n: int) -> list[Item]:
        return self.tasks[:n]

    def format_prompt(self, item: Item) -> str:
        if item.get("swebench"):
            return str(item["instruction"])
        return PROMPT.format(instruction=item["instruction"])

    def setup_files(self, item: Item) -> dict[str, bytes]:
        inst = self._instance(item)
        if inst is not None:
            return self._repos.tree(inst["repo"], inst["base_commit"])
        return _files(self._task_dir(item) / "repo")

    def verifier_files(self, item: Item) -> dict[str, bytes]:
        if item.get("swebench"):
            return {}  # the test patch's files are written by compute_reward, beside the repo's own
        return {
            f"{HIDDEN_DIR}/{rel}": data for rel, data in _files(self._task_dir(item) / HIDDEN_DIR).items()
        }

    def solution_files(self, item: Item) -> dict[str, bytes]:
        """The reference solution (repo-relative paths -> full new contents)."""
        inst = self._instance(item)
        if inst is not None:
            applied = self._repos.apply(inst["repo"], inst["base_commit"], str(inst.get("patch") or ""))
            return {rel: data for rel, data in applied.items() if data is not None}
        return _files(self._task_dir(item) / "solution")

    def _deleted_by_solution(self, item: Item) -> list[str]:
        inst = self._instance(item)
        if inst is None:
            return []
        applied = self._repos.apply(inst["repo"], inst["base_commit"], str(inst.get("patch") or ""))
        return [rel for rel, data in applied.items() if data is None]

    def oracle_calls(self, item: Item) -> list[tuple[str, dict[str, Any]]]:
        """The oracle as :func:`trajforge.envs.agents.agent_model_for` (``--agent oracle``) runs it."""
        return [("terminal", {"command": self.oracle_command(item)})]

    def oracle_command(self, item: Item) -> str:
        """What the oracle agent runs (see :mod:`trajforge.envs.agents`): write the solution."""
        command = write_files_command(self.solution_files(item))
        gone = self._deleted_by_solution(item)
        if gone:
            command += " && rm -f -- " + " ".join(shlex.quote(p) for p in gone)
        return command

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        inst = self._instance(item)
        if inst is not None:
            return await self._instance_reward(inst, ctx)
        ran = await run_hidden_tests(ctx, sorted(self.verifier_files(item)), self.cfg.test_timeout_s)
        if isinstance(ran, str):
            return RewardBreakdown(
                value=0.0, components={"fail_to_pass": 0.0, "pass_to_pass": 0.0}, reason=ran
            )
        return await score(item, ran, partial_credit=self.cfg.partial_credit)

    async def _instance_reward(self, inst: dict[str, Any], ctx: VerifierContext) -> RewardBreakdown:
        """SWE-bench's evaluation on the finished rollout: the test patch's files put in place
        over the agent's versions, the instance's test command between swebench's markers, the
        log graded by swebench."""
        tests = await asyncio.to_thread(
            self._repos.apply, inst["repo"], inst["base_commit"], inst["test_patch"]
        )
        for rel, data in tests.items():
            if data is None:
                await ctx.exec(["rm", "-f", "--", rel])
            else:
                await ctx.write_file(rel, data)
        env_files = await asyncio.to_thread(lambda: self._test_env)
        box = f".trajforge-swe-env-{secrets.token_hex(8)}"
        where = f"{ctx.sandbox.scratch_dir}/{box}"
        variables = {}
        try:
            if env_files:
                for rel, data in env_files.items():
                    await ctx.sandbox.write_scratch_bytes(f"{box}/{rel}", data)
                await ctx.sandbox.write_scratch_bytes(f"{box}/bin/pytest", PYTEST_LAUNCHER)
                await ctx.exec(["chmod", "+x", f"{where}/bin/pytest"])
                variables = {"PYTHONPATH": where, "PATH": f"{where}/bin:{SYSTEM_PATH}"}
            start, end, exit_marker = await asyncio.to_thread(markers)
            q = shlex.quote
            script = (
                f"exec 2>&1\necho {q(start)}\n{instance_test_command(inst)}\nrc=$?\n"
                f"echo {q(end)}\necho {q(exit_marker)}: $rc"
            )
            run = await ctx.exec(script, timeout=self.cfg.test_timeout_s, env=variables)
        finally:
            await ctx.exec(["rm", "-rf", "--", where])
        log = (run.stdout + run.stderr).decode(errors="replace")
        spec = {
            "instance_id": inst["instance_id"],
            "repo": inst["repo"],
            "version": inst.get("version"),
            "fail_to_pass": inst["FAIL_TO_PASS"],
            "pass_to_pass": inst["PASS_TO_PASS"],
            "log_parser": inst.get("log_parser"),
            "eval_type": inst.get("eval_type"),
        }
        detail = f"the tests timed out after {self.cfg.test_timeout_s:g}s" if run.timed_out else ""
        return await grade(spec, log, partial_credit=self.cfg.partial_credit, detail=detail)


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


async def score(item: Item, ran: dict[str, Any], *, partial_credit: bool) -> RewardBreakdown:
    """The runner's verified results graded by swebench: rendered as SWE-bench's test log (pytest
    ``-rA`` summary lines for the ids the runner judged) and read back by its ``parse_log_pytest``,
    report and resolution rules, as an instance's log is."""
    results: dict[str, str] = ran.get("results", {})
    errors: dict[str, str] = ran.get("errors", {})
    f2p, p2p = item["fail_to_pass"], item["pass_to_pass"]
    failed = [t for t in [*f2p, *p2p] if results.get(t) != "passed"]
    detail = ""
    if failed:
        first = failed[0]
        text = (errors.get(first) or errors.get(first.partition("::")[0]) or "not run").strip()
        detail = text.splitlines()[-1] if text else ""
    spec = {
        "instance_id": str(item.get("id", "task")),
        "repo": "trajforge/swe_tasks",
        "fail_to_pass": f2p,
        "pass_to_pass": p2p,
        "log_parser": "parse_log_pytest",
    }
    return await grade(spec, runner_log(results, errors), partial_credit=partial_credit, detail=detail)


# What ``pytest`` is in a verification's test environment: the sandbox's python3 running the
# pytest of ``test_env_dir`` (a ``pip install --target`` script names the host's interpreter).
PYTEST_LAUNCHER = b'#!/bin/sh\nexec python3 -m pytest "$@"\n'
