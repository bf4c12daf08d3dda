"""The ``rl`` toolset: ten tools that take a model from "which environments exist" to "the
trained checkpoint scores this much", all backed by the run manager.

Why the tools are built here and not in ``tools/``: they start processes through
:class:`~trajforge.rl.runs.manager.Manager`, load envs and run evaluations (``envs/``), which sit
above ``tools/``'s floor. ``tools/pending.py`` keeps declaring the rl schemas (so batch
distributions and filters know the names); the RL agent offers these real ones instead
(:func:`rl_tools`), built for its manager and settings -- no registry is mutated.

Per-session state (selected env, the config being edited, runs started, locked fields) lives in
``ToolContext.state["rl"]``, so two sessions never share it.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trajforge.envs.hooks import aclose_hook, env_description
from trajforge.envs.sandboxed.static import StaticReadError, read_env_classes
from trajforge.envs.sandboxed.store import (
    LIST_PREFIX,
    MAX_FILE_BYTES,
    MAX_NAMES,
    AgentEnvError,
    AgentEnvStore,
    StoredVersion,
    is_agent_ref,
    not_approved_message,
    parse_ref,
)
from trajforge.rl.config import TrainConfig, TrainConfigError
from trajforge.rl.runs.manager import Manager
from trajforge.rl.runs.run_config import train_run_spec, validate_train
from trajforge.rl.runs.schema import RunError, RunState
from trajforge.tools.base import FunctionTool, ToolContext, ToolOutput

_STATE_KEY = "rl"
# Fields of the editable config that rl_edit_config does not change, and why.
_ALWAYS_LOCKED = {
    "env": "the environment is chosen with rl_select_environment (which starts a fresh config)",
    "output_dir": "each run writes into its own run directory (the run manager chooses it)",
    "env_overrides": "edit the env's fields by name (they are collected here)",
}
# Env fields the agent does not set: they name host paths, or the isolation its rollouts get.
_ENV_LOCKED = {
    "sandbox": "rollouts run isolated (bwrap, docker); the operator chooses the backend",
    "dataset_file": "it names a host file: the operator sets data paths",
    "dataset_name": "it names a host dataset: the operator sets data sources",
    "tasks_dir": "it names a host directory: the operator sets task directories",
    "instances": "it names a host file: the operator sets SWE-bench instance files",
    "repos_dir": "it names a host directory: the operator sets the repositories' checkouts",
    "test_env_dir": "it names a host directory: the operator sets the tests' packages",
    "reward_shell": "where reward commands run is the operator's choice (a session-mode reward "
    "trusts the rollout's live processes)",
}
_TRAIN_FIELDS = [n for n in TrainConfig.model_fields if n not in {"output_dir", "env_overrides"}]
_FILE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_LOCKED_AFTER_START = ("model", "tool_call_parser")


class RLToolSettings(BaseModel):
    """Where the rl tools look and write, and whether envs the agent writes may run."""

    model_config = ConfigDict(arbitrary_types_allowed=True, allow_inf_nan=False)

    envs_dir: Path = Field(
        Path("envs"), description="the operator's env files (*.py), listed next to the library"
    )
    agent_envs_dir: Path = Field(
        Path("runs/agent_envs"),
        description="where env files the agent writes in its sandbox are kept on the host (an agent env "
        "store: never imported, never mixed with envs_dir)",
    )
    trust_agent_envs: bool = Field(
        False,
        description="approve every env the agent writes when it is selected (--trust-agent-envs); off: "
        "the operator approves each content, or nothing of it runs",
    )
    inference_dir: Path = Field(Path("runs/_inference"), description="rl_test_inference's eval runs")
    default_model: str | None = Field(None, description="model dir a new config starts from (embedded)")
    trainer_command: list[str] | None = Field(
        None, description="the trainer command before ENV (default: trajforge rl train)"
    )
    train_defaults: dict[str, Any] = Field(
        default_factory=dict, description="TrainConfig fields a new config starts with (after env and model)"
    )
    ready_timeout_s: float = Field(900.0, gt=0, description="a run's first metrics line must appear by then")
    sandbox_envs_dir: str = Field(
        "envs", description="env files the agent writes in its sandbox are picked up from here"
    )

    @model_validator(mode="after")
    def _apart(self) -> RLToolSettings:
        if self.envs_dir.resolve() == self.agent_envs_dir.resolve():
            raise ValueError(
                "agent_envs_dir must not be envs_dir: the agent's env files are kept apart from the "
                "operator's (choose another --agent-envs-dir)"
            )
        return self


@dataclass
class RLSession:
    """One agent session's rl state."""

    env: str | None = None
    label: str = ""
    description: str = ""
    train: dict[str, Any] = field(default_factory=dict)
    env_config: dict[str, Any] = field(default_factory=dict)
    env_edits: dict[str, Any] = field(default_factory=dict)
    env_config_class: Any = None
    runs: list[str] = field(default_factory=list)
    locked: dict[str, str] = field(default_factory=dict)


def _session(ctx: ToolContext) -> RLSession:
    session = ctx.state.get(_STATE_KEY)
    if not isinstance(session, RLSession):
        session = RLSession()
        ctx.state[_STATE_KEY] = session
    return session


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)


def _schema(required: list[str], **props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required}


_RUN_ID = {"type": "string", "description": "Run id (default: the last run this session started)."}


@dataclass(frozen=True)
class AgentEnvReview:
    """What the operator is shown before approving an env the agent wrote."""

    label: str
    path: Path
    sha256: str
    size: int
    classes: list[dict[str, Any]]


Approver = Callable[[AgentEnvReview], Awaitable[bool]]
"""Asks the operator whether an agent-written env may run (the interactive REPL's question)."""


@dataclass(frozen=True)
class _Chosen:
    ref: str  # what load_env takes
    label: str  # what the agent sees
    source: str
    agent: StoredVersion | None = None
    class_name: str = ""


class RLTools:
    """The handlers, sharing one manager, one settings object and the operator's approver."""

    def __init__(self, manager: Manager, settings: RLToolSettings, approver: Approver | None = None) -> None:
        self.manager = manager
        self.settings = settings
        self.approver = approver
        self.store = AgentEnvStore(settings.agent_envs_dir)

    # -------------------------------------------------------------- discover
    async def list_environments(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        from trajforge.envs.catalog import LIBRARY, available, describe

        here = available()
        rows = [
            {"name": name, "source": "library", "description": describe(name)[1]}
            for name in LIBRARY
            if name in here
        ]
        copied, problems = await self._copy_sandbox_envs(ctx)
        user, unreadable = await asyncio.to_thread(_user_envs, self.settings.envs_dir)
        agent = await asyncio.to_thread(_agent_envs, self.store)
        rows += user + agent
        out: dict[str, Any] = {"environments": rows}
        if copied:
            out["copied_from_sandbox"] = copied
        if problems or unreadable:
            out["not_loadable"] = problems + unreadable
        out["hint"] = "rl_select_environment(name) shows an env's config and an example item"
        if agent:
            out["agent_envs"] = (
                "envs you wrote (source: agent) were read without running them; one runs -- in its own "
                "sandbox -- only once the operator approved that content"
            )
        return ToolOutput(content=_json(out))

    async def _copy_sandbox_envs(self, ctx: ToolContext) -> tuple[list[str], list[dict[str, str]]]:
        """Env files the agent wrote in its sandbox (``envs/*.py``) are copied into the agent env
        store (never the operator's envs_dir): content-addressed, nothing of them run."""
        sandbox = await ctx.ensure_sandbox()
        if sandbox is None:
            return [], []
        where = shlex.quote(self.settings.sandbox_envs_dir)
        listing = await sandbox.exec(f"ls -1 {where}/ 2>/dev/null || true")
        copied: list[str] = []
        problems: list[dict[str, str]] = []
        names = [n.strip() for n in listing.output.splitlines() if n.strip().endswith(".py")]
        for file_name in names[:MAX_NAMES]:
            stem = file_name[: -len(".py")]
            if not _FILE_NAME.fullmatch(stem):
                problems.append(
                    {"file": file_name[:100], "error": "env file names are NAME.py (letters, digits, _)"}
                )
                continue
            try:
                data = await sandbox.read_bytes(
                    f"{self.settings.sandbox_envs_dir}/{file_name}", MAX_FILE_BYTES + 1
                )
                version = await asyncio.to_thread(
                    self.store.ingest,
                    stem,
                    data,
                    source=f"sandbox:{self.settings.sandbox_envs_dir}/{file_name}",
                )
            except (OSError, AgentEnvError) as exc:
                problems.append({"file": file_name, "error": str(exc)[:300]})
                continue
            copied.append(f"{LIST_PREFIX}{version.name}")
        return copied, problems

    async def select_environment(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        from trajforge.envs import EnvConfig, UnknownEnvError, load_env

        name = str(args.get("name") or "").strip()
        if not name:
            return ToolOutput.failure("give the env name (rl_list_environments lists them)")
        try:
            chosen = await asyncio.to_thread(self._resolve, name)
        except (AgentEnvError, StaticReadError, OSError) as exc:
            return ToolOutput.failure(str(exc))
        if chosen.agent is not None:
            refused = await self._approve(chosen.agent, chosen.class_name)
            if refused:
                return ToolOutput.failure(refused)
        env: Any = None
        try:
            env = await asyncio.to_thread(load_env, chosen.ref)
            await env.setup()
            example = (await asyncio.to_thread(env.eval_items, 1))[0]
            prompt = await asyncio.to_thread(env.format_prompt, example)
        except (UnknownEnvError, ValueError, OSError, RuntimeError) as exc:
            return ToolOutput.failure(f"cannot load {chosen.label}: {exc}")
        finally:
            await _close_env(env)
        default_model = self.settings.default_model
        if default_model is None:
            from trajforge.endpoint import embedded_weights

            try:
                default_model = str(embedded_weights())
            except FileNotFoundError:
                default_model = ""
        session = _session(ctx)
        session.env = chosen.ref
        session.label = chosen.label
        session.description = env_description(env)
        session.env_config_class = type(env.config) if isinstance(env.config, EnvConfig) else EnvConfig
        session.env_config = env.config.model_dump(mode="json")
        session.train = {**self.settings.train_defaults, "env": chosen.ref, "model": default_model}
        session.env_edits = {}
        session.locked = {}
        return ToolOutput(
            content=_json(
                {
                    "selected": chosen.label,
                    "source": chosen.source,
                    "description": session.description,
                    "config": self._view(session),
                    "example_item": example,
                    "example_prompt": prompt,
                    "next": "rl_edit_config to change fields, rl_test_inference to try it, rl_start_training to train",
                }
            )
        )

    def _resolve(self, name: str) -> _Chosen:
        """The env ``name`` means, among what rl_list_environments lists: a library name, an
        operator's env file of envs_dir (``NAME`` / ``NAME:Class``), or an env the agent wrote
        (``agent/NAME`` / ``agent/NAME:Class``). No other path or module is imported for the agent."""
        from trajforge.envs.catalog import LIBRARY, available

        if name in LIBRARY and name in available():
            return _Chosen(ref=name, label=name, source="library")
        if name.startswith(LIST_PREFIX):
            stem, _, cls = name[len(LIST_PREFIX) :].partition(":")
            versions = {v.name: v for v in self.store.latest()}
            version = versions.get(stem)
            if version is None:
                known = ", ".join(LIST_PREFIX + n for n in versions) or "none"
                raise AgentEnvError(
                    f"no env {name!r} of yours; write envs/{stem}.py in your workspace and call "
                    f"rl_list_environments first (yours: {known})"
                )
            cls = cls or _single_class([c["class"] for c in version.classes], name)
            if cls not in {c["class"] for c in version.classes}:
                raise AgentEnvError(f"{version.name}.py has no env class {cls!r}")
            ref = version.ref(cls)
            return _Chosen(ref=str(ref), label=ref.label, source="agent", agent=version, class_name=cls)
        where, _, cls = name.partition(":")
        path = Path(where)
        if path.is_absolute() and path.parent.resolve() == self.settings.envs_dir.resolve():
            where = path.name
        stem = where.removesuffix(".py")
        path = self.settings.envs_dir / f"{stem}.py"
        if not _FILE_NAME.fullmatch(stem) or not path.is_file():
            raise AgentEnvError(
                f"unknown env {name!r}: choose one rl_list_environments lists (a library name, an env "
                f"file of the operator's, or {LIST_PREFIX}NAME for an env you wrote)"
            )
        classes = [c.class_name for c in read_env_classes(path.read_bytes(), path.name)]
        cls = cls or _single_class(classes, name)
        return _Chosen(ref=f"{path.resolve()}:{cls}", label=f"{stem}:{cls}", source="user")

    async def _approve(self, version: StoredVersion, class_name: str) -> str | None:
        """None when ``version`` may run (approved before, or now by the operator); else why not."""
        if version.approved:
            return None
        label = version.ref(class_name).label
        if self.settings.trust_agent_envs:
            by = "--trust-agent-envs"
        elif self.approver is not None and await self.approver(
            AgentEnvReview(
                label, version.path, version.sha256, int(version.record.get("size", 0)), version.classes
            )
        ):
            by = "the operator, interactively"
        else:
            return not_approved_message(label, version.sha256)
        await asyncio.to_thread(self.store.approve, version.name, version.sha256, by=by)
        return None

    # -------------------------------------------------------------- configure
    def _view(self, session: RLSession) -> dict[str, Any]:
        env_locked = {k: v for k, v in _ENV_LOCKED.items() if k in session.env_config}
        locked = {**_ALWAYS_LOCKED, **env_locked, **session.locked}
        train_fields = {
            name: session.train.get(name, TrainConfig.model_fields[name].default) for name in _TRAIN_FIELDS
        }
        return {"train": train_fields, "env": session.env_config, "locked": locked}

    async def get_current_config(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        session = _session(ctx)
        if session.env is None:
            return ToolOutput.failure("no environment selected: call rl_select_environment first")
        return ToolOutput(content=_json({"environment": session.label or session.env, **self._view(session)}))

    async def edit_config(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        from trajforge.envs import EnvConfigError, parse_env_config

        session = _session(ctx)
        if session.env is None:
            return ToolOutput.failure("no environment selected: call rl_select_environment first")
        name = str(args.get("field") or "")
        value = _parse_value(args.get("value"))
        locked = {**_ALWAYS_LOCKED, **_ENV_LOCKED, **session.locked}
        if name in locked:
            return ToolOutput.failure(f"{name} is locked: {locked[name]}")
        if name in _TRAIN_FIELDS:
            candidate = {**session.train, name: value}
            try:
                validate_train({**candidate, "env_overrides": session.env_edits})
            except TrainConfigError as exc:
                return ToolOutput.failure(f"{name}={value!r} rejected: {exc}")
            session.train = candidate
        elif name in session.env_config:
            data = {**session.env_config, name: value}
            try:
                conf = parse_env_config(data, session.env_config_class)
                if is_agent_ref(session.env):
                    conf = await self._validate_in_env_host(session.env, conf)
            except (EnvConfigError, AgentEnvError, RuntimeError) as exc:
                return ToolOutput.failure(f"{name}={value!r} rejected: {exc}")
            session.env_config = conf.model_dump(mode="json")
            session.env_edits[name] = session.env_config[name]
        else:
            known = _TRAIN_FIELDS + list(session.env_config)
            return ToolOutput.failure(f"unknown field {name!r}; fields: {', '.join(known)}")
        return ToolOutput(content=_json({"changed": {name: value}, "config": self._view(session)}))

    async def _validate_in_env_host(self, ref: str, conf: Any) -> Any:
        """An agent env's own fields are its config class's to check: in its env host."""
        from trajforge.envs import load_env

        env: Any = None
        try:
            env = await asyncio.to_thread(load_env, ref, config=conf)
            return env.config
        finally:
            await _close_env(env)

    async def _runnable_env(self, ref: str | None) -> str | None:
        """Why the session's env cannot be trained or evaluated now (none selected, or an agent
        env whose approval is gone), or None."""
        if ref is None:
            return "no environment selected: call rl_select_environment first"
        return await self._still_approved(ref) if is_agent_ref(ref) else None

    async def _still_approved(self, ref: str) -> str | None:
        try:
            parsed = parse_ref(ref)
            await asyncio.to_thread(AgentEnvStore(parsed.store).read_approved, parsed)
        except AgentEnvError as exc:
            return str(exc)
        return None

    # -------------------------------------------------------------- train
    async def start_training(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        session = _session(ctx)
        refused = await self._runnable_env(session.env)
        if refused:
            return ToolOutput.failure(refused)
        try:
            spec = train_run_spec(
                {**session.train, "env_overrides": session.env_edits},
                command=self.settings.trainer_command,
                ready_timeout_s=self.settings.ready_timeout_s,
            )
        except TrainConfigError as exc:
            return ToolOutput.failure(f"the config cannot start a run: {exc}")
        try:
            state = await self.manager.start(spec)
        except RunError as exc:
            return ToolOutput.failure(str(exc))
        session.runs.append(state.id)
        for name in _LOCKED_AFTER_START:
            session.locked[name] = (
                f"run {state.id} started with {name}={session.train.get(name, session.env_config.get(name))!r}; "
                "its checkpoints and tokenizer belong to it. Select the environment again for a fresh "
                "config to train from another model"
            )
        if state.status == "failed":
            return ToolOutput.failure(
                f"run {state.id} failed to start: {state.reason}", content=_json(_brief(state))
            )
        return ToolOutput(
            content=_json(
                {**_brief(state), "next": "rl_check_status to follow it, rl_get_results for metrics"}
            )
        )

    def _run_id(self, args: dict[str, Any], ctx: ToolContext) -> str | None:
        given = args.get("run_id")
        if given:
            return str(given)
        runs = _session(ctx).runs
        return runs[-1] if runs else None

    async def check_status(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        run_id = self._run_id(args, ctx)
        if run_id is None:
            return ToolOutput.failure(
                "no run given and none started in this session (rl_list_runs lists them)"
            )
        try:
            state = await self.manager.status(run_id)
            results = await asyncio.to_thread(self.manager.results, run_id)
        except RunError as exc:
            return ToolOutput.failure(str(exc))
        return ToolOutput(
            content=_json(
                {**_brief(state), "metric_lines": results.metric_lines, "last_metrics": results.last}
            )
        )

    async def stop_training(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        run_id = self._run_id(args, ctx)
        if run_id is None:
            return ToolOutput.failure("no run given and none started in this session")
        try:
            state = await self.manager.stop(run_id)
        except RunError as exc:
            return ToolOutput.failure(str(exc))
        return ToolOutput(content=_json(_brief(state)))

    async def get_results(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        run_id = self._run_id(args, ctx)
        if run_id is None:
            return ToolOutput.failure("no run given and none started in this session")
        try:
            await self.manager.status(run_id)
            results = await asyncio.to_thread(self.manager.results, run_id)
        except RunError as exc:
            return ToolOutput.failure(str(exc))
        data = results.model_dump(mode="json")
        data["metrics"] = {k: {kk: round(vv, 6) for kk, vv in v.items()} for k, v in data["metrics"].items()}
        return ToolOutput(content=_json(data))

    async def list_runs(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        states = await self.manager.list_runs()
        rows = [
            {
                "run_id": s.id,
                "kind": s.kind,
                "status": s.status,
                "reason": (s.reason or "")[:300],
                "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.created_at)),
            }
            for s in states
        ]
        return ToolOutput(content=_json({"runs": rows}))

    # -------------------------------------------------------------- test / evaluate
    async def test_inference(self, args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        session = _session(ctx)
        refused = await self._runnable_env(session.env)
        if refused:
            return ToolOutput.failure(refused)
        n = int(args.get("n") or 3)
        if not 1 <= n <= 50:
            return ToolOutput.failure("n must be between 1 and 50 items")
        models = args.get("models") or [session.train.get("model") or "embedded"]
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            return ToolOutput.failure("models must be a list of strings (model dirs, run ids, or 'embedded')")
        rows = []
        for label in models:
            try:
                path = self._model_path(label)
                summary, run_dir = await self._eval(session, path, label, n)
            except (RunError, ValueError, OSError, RuntimeError) as exc:
                rows.append({"model": label, "error": str(exc)[:1000]})
                continue
            rows.append(
                {
                    "model": label,
                    "weights": path,
                    "items": summary.items,
                    "episodes": summary.episodes,
                    "failed_to_run": summary.failed,
                    "accuracy": round(summary.pass_at_1.value, 4),
                    "accuracy_95ci": [round(summary.pass_at_1.low, 4), round(summary.pass_at_1.high, 4)],
                    "mean_reward": round(summary.mean_reward.value, 4),
                    "by_category": {k: round(v.pass_at_1.value, 4) for k, v in summary.by_category.items()},
                    "episodes_file": str(run_dir / "episodes.jsonl"),
                }
            )
        table = _table(rows)
        ok = any("error" not in r for r in rows)
        out = _json({"environment": session.label or session.env, "items_per_model": n, "results": rows})
        out += "\n\n" + table
        return (
            ToolOutput(content=out) if ok else ToolOutput.failure("no model could be evaluated", content=out)
        )

    def _model_path(self, label: str) -> str | None:
        """'embedded' -> None (the embedded policy); a run id -> its latest checkpoint; else a dir."""
        if label == "embedded":
            return None
        if (self.manager.runs_dir / label / "state.json").is_file():
            checkpoints = self.manager.results(label).checkpoints
            if not checkpoints:
                raise RunError(f"run {label} has no checkpoint yet")
            return checkpoints[-1]
        if not (Path(label) / "config.json").is_file():
            raise ValueError(f"{label!r} is neither 'embedded', a run id nor a model directory")
        return str(Path(label).resolve())

    async def _eval(self, session: RLSession, path: str | None, label: str, n: int) -> tuple[Any, Path]:
        from trajforge.endpoint import EndpointConfig, open_chat_model
        from trajforge.envs import RolloutBackends, load_env, parse_env_config, run_eval
        from trajforge.sandbox import close_factory, create_sandbox_factory
        from trajforge.sandbox.types import SandboxConfig
        from trajforge.tools.builtin import default_registry

        assert session.env is not None
        conf = parse_env_config(session.env_config, session.env_config_class)
        env: Any = None
        safe = "".join(c if c.isalnum() else "-" for c in label)[-40:]
        run_dir = (
            self.settings.inference_dir
            / f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}-n{n}-{time.time_ns() % 10**6}"
        )
        factory = create_sandbox_factory(
            SandboxConfig(kind=conf.sandbox, command_timeout_s=conf.command_timeout_s)
        )
        registry = default_registry()
        try:
            env = await asyncio.to_thread(load_env, session.env, config=conf)
            if path is None:
                async with open_chat_model(EndpointConfig()) as model:
                    result = await run_eval(
                        env, RolloutBackends(model, factory, registry), run_dir, n=n, group_size=1
                    )
            else:
                from trajforge.serve.launcher import LocalServer

                async with LocalServer(path, log_path=run_dir / "serve.log") as server:
                    endpoint = EndpointConfig(model=server.model_name, base_url=server.openai_base_url)
                    async with open_chat_model(endpoint) as model:
                        result = await run_eval(
                            env, RolloutBackends(model, factory, registry), run_dir, n=n, group_size=1
                        )
        finally:
            await close_factory(factory)
            await registry.aclose()
            await _close_env(env)
        return result.summary, run_dir


def _brief(state: RunState) -> dict[str, Any]:
    return {
        "run_id": state.id,
        "status": state.status,
        "reason": state.reason,
        "run_dir": state.dir,
        "processes": [
            {"name": p.name, "status": p.status, "pid": p.pid, "exit_code": p.exit_code, "signal": p.signal}
            for p in state.processes
        ],
    }


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | items | accuracy [95% CI] | mean reward |", "|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | - | error: {r['error'][:120]} | - |")
        else:
            lo, hi = r["accuracy_95ci"]
            lines.append(
                f"| {r['model']} | {r['items']} | {r['accuracy']:.2f} [{lo:.2f}, {hi:.2f}] | {r['mean_reward']:.2f} |"
            )
    return "\n".join(lines)


def _parse_value(value: Any) -> Any:
    """Values arrive as JSON or as text; '4' means 4, 'null' means None, plain words stay text."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _single_class(classes: list[str], name: str) -> str:
    if len(classes) == 1:
        return classes[0]
    if not classes:
        raise AgentEnvError(f"{name}: no env class found (a subclass of trajforge.envs.BaseEnv)")
    raise AgentEnvError(
        f"{name} has several env classes; name one: {', '.join(f'{name}:{c}' for c in classes)}"
    )


async def _close_env(env: Any) -> None:
    """Envs that hold a process (an agent env's env host) are closed as soon as they are done with."""
    close = aclose_hook(env)
    if close is not None:
        await close()


def _user_envs(envs_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The operator's env files, read statically (listing imports nothing)."""
    rows: list[dict[str, Any]] = []
    problems: list[dict[str, str]] = []
    if not envs_dir.is_dir():
        return rows, problems
    for path in sorted(envs_dir.glob("*.py")):
        try:
            classes = read_env_classes(path.read_bytes(), path.name)
        except (OSError, StaticReadError) as exc:
            problems.append({"file": str(path), "error": str(exc)[:500]})
            continue
        for c in classes:
            name = path.stem if len(classes) == 1 else f"{path.stem}:{c.class_name}"
            rows.append(
                {
                    "name": name,
                    "source": "user",
                    "description": c.description or c.doc or "",
                    "file": str(path),
                }
            )
    return rows, problems


def _agent_envs(store: AgentEnvStore) -> list[dict[str, Any]]:
    """The latest version of each env the agent wrote, as its source reads (never run)."""
    rows: list[dict[str, Any]] = []
    for version in store.latest():
        classes = version.classes
        if not classes:
            problem = (
                version.record.get("problem") or "no env class found (a subclass of trajforge.envs.BaseEnv)"
            )
            rows.append({"name": f"{LIST_PREFIX}{version.name}", "source": "agent", "error": problem})
        for c in classes:
            rows.append(
                {
                    "name": f"{LIST_PREFIX}{version.name}" + ("" if len(classes) == 1 else f":{c['class']}"),
                    "source": "agent",
                    "approved": version.approved,
                    "sha256": version.sha256[:16],
                    "class": c["class"],
                    **({"env_name": c["name"]} if "name" in c else {}),
                    **{k: v for k, v in c.items() if k in ("description", "doc", "config")},
                }
            )
    return rows


Handler = Callable[[dict[str, Any], ToolContext], Awaitable[ToolOutput]]


def rl_tools(
    manager: Manager, settings: RLToolSettings | None = None, approver: Approver | None = None
) -> list[FunctionTool]:
    """The ten rl tools over ``manager`` (toolset ``rl``), for an agent's own tool list.
    ``approver`` asks the operator before an env the agent wrote runs (None: only
    ``settings.trust_agent_envs`` or an earlier approval lets one run)."""
    h = RLTools(manager, settings or RLToolSettings(), approver)
    specs: list[tuple[str, str, dict[str, Any], Handler, bool]] = [
        (
            "rl_list_environments",
            "List RL environments: the shipped library, the operator's env files, and env files you "
            "wrote in your workspace under envs/NAME.py (listed as agent/NAME; read, not run: one runs "
            "in its own sandbox once the operator approved it).",
            _schema([]),
            h.list_environments,
            False,
        ),
        (
            "rl_select_environment",
            "Select an environment: starts a fresh training config from its defaults and shows its "
            "config, an example item and the prompt the model sees.",
            _schema(
                ["name"],
                name={
                    "type": "string",
                    "description": "An env name rl_list_environments lists (agent/NAME for yours).",
                },
            ),
            h.select_environment,
            False,
        ),
        (
            "rl_get_current_config",
            "Show the training config being edited (train fields, env fields, locked fields with why).",
            _schema([]),
            h.get_current_config,
            True,
        ),
        (
            "rl_edit_config",
            "Change one config field (train: model, trainer, steps, group_size, groups_per_step, lr, "
            "temperature, ...; or any env field). Values are validated; locked fields say why.",
            _schema(
                ["field", "value"],
                field={"type": "string", "description": "Field name."},
                value={"description": 'New value (JSON: 4, 0.5, true, null, ["terminal"], or text).'},
            ),
            h.edit_config,
            False,
        ),
        (
            "rl_start_training",
            "Start a training run with the current config; returns once the trainer wrote its first "
            "metrics (or with the reason it failed).",
            _schema([]),
            h.start_training,
            False,
        ),
        (
            "rl_check_status",
            "Status of a run: processes, exit codes and reasons, metric lines, the last metrics.",
            _schema([], run_id=_RUN_ID),
            h.check_status,
            True,
        ),
        (
            "rl_stop_training",
            "Stop a run: SIGTERM (the trainer may save a checkpoint), then SIGKILL after a grace period.",
            _schema([], run_id=_RUN_ID),
            h.stop_training,
            False,
        ),
        (
            "rl_get_results",
            "Results of a run: metrics summary (first/last/min/max/mean), last metrics, checkpoint paths, logs.",
            _schema([], run_id=_RUN_ID),
            h.get_results,
            True,
        ),
        ("rl_list_runs", "List every run with its status.", _schema([]), h.list_runs, True),
        (
            "rl_test_inference",
            "Run a few held-out items of the selected env per model and show an accuracy table. "
            "Models: 'embedded', a run id (its latest checkpoint) or a model directory.",
            _schema(
                [],
                models={"type": "array", "items": {"type": "string"}, "description": "Models to compare."},
                n={"type": "integer", "description": "Items per model (1-50, default 3)."},
            ),
            h.test_inference,
            False,
        ),
    ]
    return [
        FunctionTool(
            name=name, toolset="rl", description=desc, parameters=params, handler=handler, parallel_safe=safe
        )
        for name, desc, params, handler, safe in specs
    ]
