"""``terminal_bench``: tasks in the Harbor / Terminal-Bench 2 layout, from any directory.

A task is a directory::

    task.toml                [metadata] category/difficulty, [verifier] timeout_sec + env,
                             [environment] workdir/env/docker_image/build_timeout_sec, [solution] env
    instruction.md           the prompt (leading canary comment lines stripped, as harbor does)
    environment/Dockerfile   (+ the files it COPYs)
    solution/solve.sh        the reference solution (the ``oracle`` agent runs it)
    tests/test.sh            the verifier: writes /logs/verifier/reward.txt (or reward.json with a
                             "reward" key); without either, exit code 0 scores 1.0, else 0.0

``tasks_dir`` points at a directory of such tasks (default: the shipped suite in ``tb_tasks/``).
task.toml is read as the ``harbor`` package reads it (:mod:`harbor_task`; equal parsing is tested
against harbor itself). A task harbor would run but trajforge cannot is skipped with the reason:
multi-step (``[[steps]]``), Windows, an env value naming a host variable, a program in
``[metadata] requires`` that the bwrap sandbox's /usr lacks.

Backends. With ``sandbox: docker`` each task's image is built (``docker build``, once per env,
tagged by the hash of its environment directory) and the rollout runs in it; ``/tests``,
``/logs`` and ``/solution`` are the real paths. Under ``bwrap`` (the default) there is no image:
the Dockerfile subset of :mod:`trajforge.envs.library.dockerfile` is honoured -- FROM is ignored
with a note, WORKDIR/ENV/ARG apply, COPY/ADD of local files are written into the sandbox, and RUN
steps run inside the sandbox before the rollout (``prepare_sandbox``); a task that needs more (a
package manager, the network, a path outside its WORKDIR) is skipped, with the reason in
``env.skipped``. The bwrap sandbox's root is read-only, so paths are mapped by a documented
convention: the first WORKDIR (``/app``) *is* the sandbox workdir ``/workspace``, and
``/tests``/``/logs`` become a fresh, unguessable ``/tmp/trajforge-verify-<random>/{tests,logs}``
made after the rollout (``/solution``: ``/tmp/trajforge-solution``); these prefixes are rewritten
in the instruction, RUN steps, ENV values, solve.sh and every text file of tests/.

Verification runs after the rollout, in a fresh environment (not the agent's shell) with the
Dockerfile's ENV, from the task's WORKDIR: the tests are copied in only then, so nothing the agent
wrote to ``/tests`` or ``/logs`` counts.

Task directories are data, and the process reading them is often root: every file of a task
(task.toml, instruction.md, the Dockerfile and what it COPYs, glob matches, tests/, solution/) is
read through :class:`~trajforge.sandbox.confined.HostPath`, walked from the tasks directory's fd
without following any link. A task that holds a link (or a FIFO, a device) is skipped with the
reason: links are refused rather than resolved inside the task because a Harbor task has no view
of its own in which a link could mean something safe (an absolute target names a host path, a
Docker build context never follows one out), and every shipped or published task is plain files.
A link that appears after loading makes the read that meets it fail (the episode fails, the
reward scores 0), never follow.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import secrets
import shlex
import shutil
import tomllib
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from trajforge.envs.agents import write_files_command
from trajforge.envs.base import BaseEnv, EnvDataError
from trajforge.envs.config import EnvConfig
from trajforge.envs.library import tb_verify
from trajforge.envs.library.dockerfile import NEEDS_MORE, DockerPlan, parse_dockerfile, rewrite_paths
from trajforge.envs.library.harbor_task import HarborTaskConfig, literal_env, strip_canary
from trajforge.envs.library.tb_guard import GuardUnavailableError, build_guard
from trajforge.envs.library.trusted_run import run_trusted
from trajforge.envs.types import Item, RewardBreakdown
from trajforge.sandbox.confined import DataPathError, HostPath
from trajforge.spawn import spawn

if TYPE_CHECKING:
    from trajforge.agent.result import AgentResult
    from trajforge.envs.verifier import VerifierContext
    from trajforge.protocols import Sandbox

log = logging.getLogger(__name__)

SHIPPED = "tb_tasks"
BWRAP_WORKDIR = "/workspace"
BWRAP_SOLUTION = "/tmp/trajforge-solution"
VERIFY_PREFIX = "/tmp/trajforge-verify-"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # bwrap's, over the host's /usr


class TerminalBenchConfig(EnvConfig):
    tasks_dir: str | None = Field(None, description="directory of Harbor-layout tasks (default: the shipped)")
    verifier_timeout_s: float = Field(600.0, gt=0, description="test.sh deadline when task.toml has none")
    build_timeout_s: float = Field(900.0, gt=0, description="deadline of one image build / RUN step")


def shipped_dir() -> Path:
    return Path(str(resources.files("trajforge.envs.library").joinpath(SHIPPED)))


@dataclass
class TbTask:
    name: str  # the directory's name: the item id
    path: HostPath  # beneath the tasks directory: read without following links
    config: HarborTaskConfig
    plan: DockerPlan
    skip: str | None = None
    image: str | None = None
    env: dict[str, str] | None = None  # [environment] env, templates resolved
    verifier_env: dict[str, str] | None = None
    solution_env: dict[str, str] | None = None

    @property
    def verifier_timeout(self) -> float | None:
        """[verifier] timeout_sec when the task sets it (else the env's default applies)."""
        verifier = self.config.verifier
        return verifier.timeout_sec if "timeout_sec" in verifier.model_fields_set else None

    @property
    def category(self) -> str:
        return self.config.category


def _text_files(root: HostPath) -> dict[str, bytes]:
    """Every file of a task's tree (``{}`` when it has none); a link in it raises DataPathError."""
    if root.kind() in (None, "file"):
        return {}
    return {rel: data for rel, data, _ in root.files(skip=("__pycache__",))}


def _rewrite_bytes(data: bytes, mapping: dict[str, str]) -> bytes:
    try:
        return rewrite_paths(data.decode(), mapping).encode()
    except UnicodeDecodeError:  # binary: left as it is
        return data


def load_task(path: HostPath, backend: str) -> TbTask:
    """One task directory; skipped (with the reason) when it holds a link or special file, or
    needs more than the backend gives."""
    problem = path.first_problem()
    if problem:
        return TbTask(path.name, path, HarborTaskConfig(), DockerPlan(), skip=problem)
    try:
        config = HarborTaskConfig.from_toml((path / "task.toml").read_text())
    except (OSError, DataPathError, tomllib.TOMLDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise EnvDataError(f"terminal_bench task {path}: cannot read task.toml ({exc})") from None
    dockerfile = path / "environment" / "Dockerfile"
    plan = parse_dockerfile(dockerfile.read_text()) if dockerfile.is_file() else DockerPlan()
    task = TbTask(path.name, path, config, plan)
    task.skip = _harbor_problem(task) or _backend_problem(task, backend)
    return task


def _harbor_problem(task: TbTask) -> str | None:
    """What of the Harbor layout trajforge does not run, on any backend."""
    config, path = task.config, task.path
    if config.steps:
        return "a multi-step task ([[steps]]) is not supported"
    if config.environment.os != "linux":
        return f"[environment] os = {config.environment.os!r}: only Linux tasks run"
    for needed in ("instruction.md", "tests/test.sh"):
        if not (path / needed).is_file():
            return f"no {needed}"
    task.env, why_env = literal_env(config.environment.env, "environment")
    task.verifier_env, why_verifier = literal_env(config.verifier.env, "verifier")
    task.solution_env, why_solution = literal_env(config.solution.env, "solution")
    problems = [p for p in (why_env, why_verifier, why_solution) if p]
    return problems[0] if problems else None


def _backend_problem(task: TbTask, backend: str) -> str | None:
    path, plan, config = task.path, task.plan, task.config
    dockerfile = (path / "environment" / "Dockerfile").is_file()
    if backend == "docker":
        if not dockerfile and not config.environment.docker_image:
            return "no environment/Dockerfile to build and no [environment] docker_image"
        return None
    if backend != "bwrap":
        return f"the {backend} backend cannot run Harbor tasks (no fixed workdir, no isolation): use bwrap or docker"
    if not dockerfile:
        return "no environment/Dockerfile"
    if plan.problems:
        return "; ".join(plan.problems)
    workdir = config.environment.workdir
    if workdir and not (
        plan.root and (workdir == plan.root or workdir.startswith(plan.root.rstrip("/") + "/"))
    ):
        return f"[environment] workdir {workdir} is outside the first WORKDIR {plan.root} (under bwrap only it is writable)"
    missing = [p for p in config.requires if shutil.which(p, path=SANDBOX_PATH) is None]
    if missing:
        return f"needs {', '.join(missing)} ([metadata] requires), absent from the sandbox's /usr"
    for script in ("tests/test.sh", "solution/solve.sh"):
        file = path / script
        found = NEEDS_MORE.search(file.read_text(errors="replace")) if file.is_file() else None
        if found:
            return f"{script} needs a package manager or the network ({found.group(1)})"
    return None


class TerminalBenchEnv(BaseEnv[TerminalBenchConfig]):
    name: ClassVar[str] = "terminal_bench"
    description: ClassVar[str] = "Harbor / Terminal-Bench 2 task directories (tests/test.sh judges)"
    config_class: ClassVar[type[EnvConfig]] = TerminalBenchConfig

    @classmethod
    def default_config(cls) -> EnvConfig:
        return TerminalBenchConfig(enabled_toolsets=["terminal", "file"], max_agent_turns=50)

    @property
    def cfg(self) -> TerminalBenchConfig:
        return self.config

    # ---------------------------------------------------------------- tasks

    def tasks_root(self) -> Path:
        """The directory of tasks: ``tasks_dir``, else the shipped suite."""
        return Path(self.cfg.tasks_dir) if self.cfg.tasks_dir else shipped_dir()

    @cached_property
    def all_tasks(self) -> dict[str, TbTask]:
        given = self.tasks_root()
        if not given.is_dir():
            raise EnvDataError(f"terminal_bench tasks_dir {given} is not a directory")
        root = HostPath.of(given)  # the operator's: from here on no link is followed
        tasks: dict[str, TbTask] = {}
        for p in root.iterdir():
            kind = p.kind()
            if kind == "link":  # maybe a task, maybe not: said either way, never followed
                tasks[p.name] = TbTask(p.name, p, HarborTaskConfig(), DockerPlan(), skip=p.first_problem())
            elif kind == "dir" and (p / "task.toml").kind() is not None:
                tasks[p.name] = load_task(p, self.cfg.sandbox)
        if not tasks:
            raise EnvDataError(f"no Harbor tasks (directories with task.toml) in {root}")
        for task in tasks.values():
            if task.skip:
                log.warning("terminal_bench: skipping %s: %s", task.name, task.skip)
        return tasks

    @property
    def skipped(self) -> dict[str, str]:
        """Task name -> why it cannot run on this backend."""
        return {t.name: t.skip for t in self.all_tasks.values() if t.skip}

    @property
    def tasks(self) -> list[TbTask]:
        runnable = [t for t in self.all_tasks.values() if not t.skip]
        if not runnable:
            raise EnvDataError(f"no runnable terminal_bench task on {self.cfg.sandbox}: {self.skipped}")
        return runnable

    async def setup(self) -> None:
        await asyncio.to_thread(lambda: self.all_tasks)
        try:  # the verifier judges nothing without its guard: say so before any rollout runs
            await asyncio.to_thread(build_guard)
        except GuardUnavailableError as exc:
            raise EnvDataError(str(exc)) from None
        if self.cfg.sandbox == "docker":
            for task in self.tasks:
                await self._build(task)

    async def _build(self, task: TbTask) -> None:
        """``docker build`` the task's environment (once; tagged by its content hash); a task
        with no Dockerfile runs in its ``[environment] docker_image`` as it is."""
        context = task.path / "environment"
        if not (context / "Dockerfile").is_file():
            task.image = task.config.environment.docker_image
            return
        build_timeout = (
            task.config.environment.build_timeout_sec
            if "build_timeout_sec" in task.config.environment.model_fields_set
            else self.cfg.build_timeout_s
        )
        digest = hashlib.sha256()
        for rel, data in _text_files(context).items():
            digest.update(rel.encode() + b"\0" + data + b"\0")
        tag = f"trajforge-tb-{task.name.lower()}:{digest.hexdigest()[:12]}"
        proc = await spawn(
            "docker", "build", "-t", tag, str(context),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), build_timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            task.skip = f"docker build timed out after {build_timeout}s"
            return
        if proc.returncode != 0:
            task.skip = f"docker build failed: {out.decode(errors='replace').strip()[-500:]}"
            return
        task.image = tag

    def _task(self, item: Item) -> TbTask:
        try:
            return self.all_tasks[item["id"]]
        except KeyError:
            raise EnvDataError(f"terminal_bench has no task {item.get('id')!r}") from None

    def _item(self, task: TbTask) -> Item:
        return {
            "id": task.name,
            "category": task.category,
            "difficulty": task.config.metadata.get("difficulty"),
            "task_dir": str(task.path),
        }

    def generate(self, index: int, *, split: str) -> Item:
        tasks = self.tasks
        return self._item(tasks[index % len(tasks)])

    def eval_items(self, n: int) -> list[Item]:
        return [self._item(t) for t in self.tasks[:n]]

    # ---------------------------------------------------------------- paths

    @property
    def _bwrap(self) -> bool:
        return self.cfg.sandbox != "docker"

    def _mapping(self, task: TbTask, verify_dir: str | None = None) -> dict[str, str]:
        if not self._bwrap:
            return {}
        mapping = {"/solution": BWRAP_SOLUTION}
        if task.plan.root:
            mapping[task.plan.root] = BWRAP_WORKDIR
        if verify_dir:
            mapping |= {"/tests": f"{verify_dir}/tests", "/logs": f"{verify_dir}/logs"}
        return mapping

    def _workdir(self, task: TbTask) -> str:
        """Where commands start: ``[environment] workdir``, else the Dockerfile's last WORKDIR."""
        return rewrite_paths(task.config.environment.workdir or task.plan.workdir, self._mapping(task))

    def _env(self, task: TbTask, *extra: dict[str, str] | None) -> dict[str, str]:
        """The Dockerfile's ENV, then ``[environment] env`` (and ``extra`` tables), paths mapped."""
        mapping = self._mapping(task)
        merged = {**task.plan.env, **(task.env or {})}
        for table in extra:
            merged |= table or {}
        return {k: rewrite_paths(v, mapping) for k, v in merged.items() if k.isidentifier()}

    # ---------------------------------------------------------------- rollout

    def format_prompt(self, item: Item) -> str:
        task = self._task(item)
        text = strip_canary((task.path / "instruction.md").read_text())
        return rewrite_paths(text.strip(), self._mapping(task))

    def sandbox_image(self, item: Item) -> str | None:
        """The built image of the task (docker backend); None under bwrap."""
        return self._task(item).image if not self._bwrap else None

    async def prepare_sandbox(self, item: Item, sandbox: Sandbox) -> None:
        """Before the rollout: under bwrap the Dockerfile's COPY and RUN steps, in order; on both
        backends the agent's shell then starts in WORKDIR with the Dockerfile's ENV."""
        task = self._task(item)
        if self._bwrap:
            await self._replay(task, sandbox)
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in self._env(task).items())
        script = (f"export {exports}; " if exports else "") + f"mkdir -p {shlex.quote(self._workdir(task))}"
        res = await sandbox.exec(f"{script} && cd {shlex.quote(self._workdir(task))}", timeout=60)
        if not res.ok:
            raise RuntimeError(f"cannot enter WORKDIR {self._workdir(task)}: {res.shown.strip()[-300:]}")

    async def _replay(self, task: TbTask, sandbox: Sandbox) -> None:
        fresh = getattr(sandbox, "exec_fresh", None)
        if fresh is None:
            raise RuntimeError(f"{type(sandbox).__name__} cannot run Dockerfile RUN steps (no exec_fresh)")
        mapping = self._mapping(task)
        context = task.path / "environment"
        env: dict[str, str] = {}
        cwd = BWRAP_WORKDIR
        for step in task.plan.steps:
            if step.kind == "workdir":
                cwd = rewrite_paths(step.text, mapping)
                await _checked(fresh, f"mkdir -p {shlex.quote(cwd)}", 60, None, "WORKDIR")
            elif step.kind in ("env", "arg"):
                env.update({k: rewrite_paths(v, mapping) for k, v in step.env.items() if k.isidentifier()})
            elif step.kind == "copy":
                executables = await asyncio.to_thread(_copy_files, context, step.sources, step.dest, mapping)
                for rel, data, executable in executables:
                    await sandbox.write_bytes(rel, data)
                    if executable:
                        await _checked(fresh, f"chmod +x -- {shlex.quote(rel)}", 60, BWRAP_WORKDIR, "COPY")
            else:
                command = rewrite_paths(step.text, mapping)
                exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
                await _checked(
                    fresh, f"{exports}/bin/sh -c {shlex.quote(command)}", self.cfg.build_timeout_s, cwd, "RUN"
                )

    def oracle_calls(self, item: Item) -> list[tuple[str, dict[str, Any]]]:
        """The oracle as :func:`trajforge.envs.agents.agent_model_for` (``--agent oracle``) runs it."""
        return [("terminal", {"command": self.oracle_command(item)})]

    def oracle_command(self, item: Item) -> str:
        """Harbor's oracle: put solution/ at /solution and run ``bash /solution/solve.sh``."""
        task = self._task(item)
        mapping = self._mapping(task)
        where = BWRAP_SOLUTION if self._bwrap else "/solution"
        files = {
            rel: _rewrite_bytes(data, mapping) for rel, data in _text_files(task.path / "solution").items()
        }
        workdir = shlex.quote(self._workdir(task))
        exports = "".join(
            f"export {k}={shlex.quote(rewrite_paths(v, mapping))}; "
            for k, v in (task.solution_env or {}).items()
            if k.isidentifier()
        )
        return (
            f"{write_files_command(files, where)} && cd {workdir} && {exports}"
            f"bash {shlex.quote(where + '/solve.sh')}"
        )

    # ---------------------------------------------------------------- verification

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        """test.sh under :mod:`tb_verify` (the trusted wrapper); the reward from the verdict
        files it held, which only test.sh's own shell could write, once test.sh finished normally
        and every process it started was gone, or from test.sh's exit code when the tests name
        no reward file."""
        task = self._task(item)
        guard = await asyncio.to_thread(build_guard)  # GuardUnavailableError: 0, with the reason
        verify_dir = f"{VERIFY_PREFIX}{secrets.token_hex(12)}" if self._bwrap else ""
        tests, logs = f"{verify_dir}/tests", f"{verify_dir}/logs"
        mapping = self._mapping(task, verify_dir)
        if not self._bwrap:  # the real paths: whatever the agent left there goes first
            await ctx.exec(["rm", "-rf", "--", tests, f"{logs}/verifier"])
        files = {rel: _rewrite_bytes(data, mapping) for rel, data in _text_files(task.path / "tests").items()}
        for rel, data in files.items():
            await ctx.write_file(f"{tests}/{rel}", data)
        timeout = task.verifier_timeout or self.cfg.verifier_timeout_s
        try:
            ran = await run_trusted(
                ctx,
                verify_dir or "/tmp",
                "tb_verify.py",
                [f"{logs}/verifier", str(timeout), f"{tests}/test.sh"],
                marker=tb_verify.MARKER,
                timeout=timeout + 60,
                cwd=self._workdir(task),
                env=self._env(task, task.verifier_env),
                extra_data={tb_verify.GUARD_NAME: guard},
            )
        finally:
            if verify_dir:
                await ctx.exec(["rm", "-rf", "--", verify_dir])
        output = (ran.run.stdout + ran.run.stderr).decode(errors="replace")
        output = output.split(f"\n{tb_verify.MARKER} ")[0].strip()[-600:]
        if ran.data is None:
            return RewardBreakdown(value=0.0, components={"tests": 0.0}, reason=f"no verdict: {ran.why}")
        return _verdict(ran.data, _named_reward_files(files), output)


def _named_reward_files(tests: dict[str, bytes]) -> tuple[str, ...]:
    """The reward files the task's tests name (reward.txt, reward.json): only those count. A
    program the tests run could write the other one, which test.sh would never overwrite."""
    blob = b"\n".join(tests.values())
    return tuple(n for n in tb_verify.REWARD_FILES if n.encode() in blob)


def _unfinished(data: dict[str, Any]) -> str | None:
    """Why test.sh's run cannot give a verdict (None: it finished normally, alone)."""
    if data.get("guard") != "ok":
        return f"{data.get('guard') or 'the verdict guard did not take'}; nothing of this run is trusted"
    if data.get("timed_out"):
        return "test.sh timed out"
    if data.get("stopped"):
        return (
            f"test.sh was stopped (signal {data['stopped']}) before it finished: killed, and no verdict "
            "trusted (nothing the tests do stops it; a process that did could race its verdict)"
        )
    if data.get("signal"):
        return (
            f"test.sh was killed by signal {data['signal']} before it finished: no verdict is trusted, "
            "whatever it wrote"
        )
    if data.get("survivors"):
        return (
            f"{data['survivors']} process(es) started by the tests were still running when test.sh "
            "exited: killed, and the reward not trusted (they could have rewritten it)"
        )
    return None


def _verdict(data: dict[str, Any], named: tuple[str, ...], output: str) -> RewardBreakdown:
    comps = {"survivors": float(data.get("survivors") or 0), "others": float(data.get("others") or 0)}
    why = _unfinished(data)
    if why:
        return RewardBreakdown(value=0.0, components={"tests": 0.0, **comps}, reason=f"{why}; {output}")
    files = data.get("files")
    texts: dict[str, Any] = files if isinstance(files, dict) else {}
    reward, source = _read_reward({n: t if isinstance(t := texts.get(n), str) else None for n in named})
    if reward is None and named:
        given = data.get("links")
        links: dict[str, Any] = given if isinstance(given, dict) else {}
        moved = [n for n in named if links.get(n) is False]
        how = (
            f" ({', '.join(moved)} in the verifier directory was replaced or removed by a process the "
            "tests ran)"
            if moved
            else " (only test.sh's own shell can write it: a redirection in test.sh, such as "
            "`echo 1 > /logs/verifier/reward.txt`; a program that opens the file itself cannot)"
        )
        reward, source = 0.0, f"test.sh wrote no verdict into {' or '.join(named)}{how}"
    elif reward is None:
        code = data.get("exit_code")
        reward, source = (1.0 if code == 0 else 0.0), f"test.sh exit code {code}"
    else:  # said too: a harness that reads only the exit code would score what it says
        source = f"{source} (test.sh exit code {data.get('exit_code')})"
    return RewardBreakdown(value=reward, components={"tests": reward, **comps}, reason=f"{source}; {output}")


async def _checked(fresh: Any, command: str, timeout: float, cwd: str | None, what: str) -> None:
    res = await fresh(command, timeout=timeout, cwd=cwd)
    if not res.ok:
        why = "timed out" if res.timed_out else f"exit code {res.exit_code}"
        raise RuntimeError(
            f"Dockerfile {what} step failed ({why}): {command[-200:]}: {res.shown.strip()[-500:]}"
        )


def _copy_files(
    context: HostPath, sources: list[str], dest: str, mapping: dict[str, str]
) -> list[tuple[str, bytes, bool]]:
    """(workdir-relative path, bytes, executable) of one COPY, Docker's rules: a directory's
    contents go into ``dest``; a file goes to ``dest`` or, when ``dest`` ends in ``/``, into it.
    Sources and glob matches are read beneath the build context without following links."""
    target = rewrite_paths(dest.rstrip("/") or "/", mapping)
    rel_target = target.removeprefix(BWRAP_WORKDIR).lstrip("/")
    out: list[tuple[str, bytes, bool]] = []
    for pattern in sources:
        matches = context.glob(pattern.lstrip("/")) if pattern not in (".", "./") else [context]
        if not matches:
            raise RuntimeError(f"COPY {pattern}: no such file in the build context")
        for src in matches:
            if src.is_dir():
                for rel, data, mode in src.files(skip=("__pycache__",)):
                    out.append((f"{rel_target}/{rel}".lstrip("/"), data, bool(mode & 0o111)))
            else:
                into = dest.endswith("/")  # parse_dockerfile marks every directory target so
                name = f"{rel_target}/{src.name}" if into else rel_target
                data = src.read_bytes()  # a link: DataPathError, never followed
                out.append((name.lstrip("/"), data, bool(src.mode() & 0o111)))
    return out


def _read_reward(texts: dict[str, str | None]) -> tuple[float | None, str]:
    """Harbor's rule on the files the wrapper read: reward.txt (a number), else reward.json's
    ``"reward"``; (None, "") when neither was written. A reward must be a finite number."""
    text = texts.get("reward.txt")
    if text is not None:
        try:
            value = float(text.split()[0])
        except (ValueError, IndexError):
            return 0.0, f"reward.txt holds no number ({text[:80]!r})"
        return (value, "reward.txt") if math.isfinite(value) else (0.0, f"reward.txt holds {value}")
    raw = texts.get("reward.json")
    if raw is None:
        return None, ""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return 0.0, "reward.json is not JSON"
    given = data.get("reward") if isinstance(data, dict) else None
    if isinstance(given, int | float) and not isinstance(given, bool) and math.isfinite(float(given)):
        return float(given), "reward.json"
    return 0.0, "reward.json has no finite numeric 'reward'"
