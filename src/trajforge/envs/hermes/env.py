"""``HermesAgentBaseEnv``: the seed's env base class on trajforge's :class:`BaseEnv`.

A seed env subclasses it and writes the seed's hooks; ``trajforge env eval`` then runs it one of
two ways (the config's ``evaluation``; docs/hermes.md):

- **rollouts**: the items ``get_next_item()`` gives after ``setup()`` (drawn until the cycle
  closes), each rolled out by trajforge and scored by the env's ``compute_reward(item, result,
  ctx)`` -- called in a thread of its own with the seed's blocking ``ToolContext``, its float the
  reward. What the seed's trainer loop does, without the trainer.
- **evaluate**: the env's own ``evaluate()``, which runs its tasks with ``HermesAgentLoop`` and
  reports through ``evaluate_log(metrics, samples)``; each loop run is an episode, scored by its
  sample. Chosen by ``auto`` when ``compute_reward`` only returns a constant (the seed's
  benchmark envs are eval-only and stub it).

Either way ``self.server`` answers with the run's model while the run lasts, ``wandb_log()`` is
called once at the end with nothing sent to Weights & Biases (the metrics go to
``wandb_metrics.json``), and ``evaluate_log`` calls go to ``evaluate_log.json``.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import functools
import inspect
import itertools
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
from pydantic import ValidationError

from trajforge.envs.base import BaseEnv, EnvDataError
from trajforge.envs.config import EnvConfig, EnvConfigError
from trajforge.envs.hermes import runtime as _runtime
from trajforge.envs.hermes.config import HermesAgentEnvConfig
from trajforge.envs.hermes.context import ToolContext
from trajforge.envs.hermes.loop import AgentResult
from trajforge.envs.hermes.server import SeedServer
from trajforge.envs.types import Item, RewardBreakdown

if TYPE_CHECKING:
    from trajforge.engine.books import EvalRun
    from trajforge.envs.running.episode import RolloutBackends
    from trajforge.sandbox.types import SandboxConfig

EVALUATE_LOG_FILE = "evaluate_log.json"
WANDB_FILE = "wandb_metrics.json"


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in exc.errors()
        )
        return f"invalid config: {problems}"
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    first = first if len(first) <= 300 else first[:300] + "..."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _hub_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed Hugging Face hub download (no network, not cached)."""
    for e in (exc, exc.__cause__, exc.__context__):
        if e is None:
            continue
        module = type(e).__module__.split(".")[0]
        if module in ("datasets", "huggingface_hub", "requests", "urllib3", "httpx") or isinstance(
            e, ConnectionError
        ):
            return True
    return "huggingface" in str(exc).lower()


def _is_constant_reward(fn: Callable[..., Any]) -> bool:
    """Whether a ``compute_reward`` does nothing but return a number (an eval-only env's stub)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    func = tree.body[0] if tree.body else None
    if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    body = list(func.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return (
        len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, int | float)
    )


def _python_shim() -> str | None:
    """A directory holding ``python`` -> this system's ``python3``, when the system has no
    ``python`` (Debian's has none); None when it has one, or no python3 either."""
    import os
    import shutil

    from trajforge.envs.verifier import SYSTEM_PATH

    if shutil.which("python", path=SYSTEM_PATH) is not None:
        return None
    python3 = shutil.which("python3", path=SYSTEM_PATH)
    if python3 is None:
        return None
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    shim = cache / "trajforge" / "seed-python"
    link = shim / "python"
    try:
        shim.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink() or os.readlink(link) != python3:
            tmp = shim / f".python.{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(python3)
            tmp.replace(link)
    except OSError:
        return None
    return str(shim)


def _adapt_reward(fn: Callable[..., Any]) -> Callable[..., Awaitable[float | RewardBreakdown]]:
    """A seed ``compute_reward`` as trajforge's: seed types in, the call in a thread of its own
    (its ToolContext verbs block and must not run on the event loop)."""

    @functools.wraps(fn)
    async def compute_reward(self: Any, item: Item, result: Any, ctx: Any) -> float | RewardBreakdown:
        # the env's own ToolContext(task_id) or a subclass's super() call, else the judge's context
        tool_ctx = ctx if isinstance(ctx, ToolContext) else ToolContext(ctx, asyncio.get_running_loop())
        seed_result = AgentResult.of(result)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - always awaited on a loop
            running = None
        if running is not tool_ctx._loop:  # already off the verbs' loop (a super() call in a thread)
            value = fn(self, item, seed_result, tool_ctx)
            value = await value if inspect.isawaitable(value) else value
        elif inspect.iscoroutinefunction(fn):
            value = await asyncio.to_thread(asyncio.run, fn(self, item, seed_result, tool_ctx))
        else:
            value = await asyncio.to_thread(fn, self, item, seed_result, tool_ctx)
        if isinstance(value, RewardBreakdown):
            return value
        if value is None:
            raise TypeError("compute_reward returned None; the seed's contract is a float reward")
        return float(value)

    compute_reward.__trajforge_seed_reward__ = fn  # type: ignore[attr-defined]
    return compute_reward


def _adapt_setup(fn: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """A subclass's ``setup``; for the outermost one (a subclass's ``super().setup()`` comes
    back through here), its failure as one line naming what to do, then the eval items drawn
    from its finished state."""

    @functools.wraps(fn)
    async def setup(self: HermesAgentBaseEnv) -> None:
        if type(self).setup is not setup:
            await fn(self)
            return
        try:
            await fn(self)
        except Exception as exc:
            raise EnvDataError(self._setup_failed(exc)) from exc
        try:
            await self._ensure_eval_items()
        except EnvDataError:
            raise
        except Exception as exc:
            raise EnvDataError(
                f"{type(self).__name__}.get_next_item() failed after setup: {_one_line(exc)}"
            ) from exc

    setup.__trajforge_seed_setup__ = True  # type: ignore[attr-defined]
    return setup


class HermesAgentBaseEnv(BaseEnv):
    """The seed's base env (see the module's docstring for how ``env eval`` runs one)."""

    name: ClassVar[str] = "hermes-agent"
    config_class: ClassVar[type[EnvConfig]] = HermesAgentEnvConfig
    env_config_cls: ClassVar[type[EnvConfig]] = HermesAgentEnvConfig
    eval_pool: ClassVar[int] = 1024
    _tf_server_configs: ClassVar[Any] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        if "env_config_cls" in own and "config_class" not in own:
            cls.config_class = own["env_config_cls"]
        reward = own.get("compute_reward")
        if reward is not None and not getattr(reward, "__trajforge_seed_reward__", None):
            cls.compute_reward = _adapt_reward(reward)  # type: ignore[method-assign,assignment]
        setup = own.get("setup")
        if setup is not None and not getattr(setup, "__trajforge_seed_setup__", False):
            cls.setup = _adapt_setup(setup)  # type: ignore[method-assign,assignment]
        if "name" in own and own["name"] is None:
            cls.name = cls.__name__  # the seed allows name = None

    def __init__(
        self,
        config: EnvConfig | None = None,
        server_configs: Any = None,
        slurm: bool = False,
        testing: bool = False,
    ) -> None:
        super().__init__(config)
        self.server_configs = server_configs  # kept for the subclass; the endpoint is the run's
        self.server = SeedServer()
        self.tokenizer: Any = None  # no client-side tokenizer: exact tokens come from --tokenizer
        self.testing = testing
        self.curr_step = 0
        self.rollouts_for_wandb: list[Any] = []
        self._tf_eval: list[Item] | None = None
        self._tf_logs: list[dict[str, Any]] = []
        self._tf_wandb: list[dict[str, Any]] = []
        self._tf_draws = itertools.count()

    # ------------------------------------------------------------------ config

    @classmethod
    def default_config(cls) -> EnvConfig:
        init = getattr(cls, "config_init", None)
        if init is None:
            return cls.config_class()
        try:
            made = init()
        except Exception as exc:
            raise EnvConfigError(f"{cls.__name__}.config_init() failed: {_one_line(exc)}") from exc
        cfg, servers = (
            (made[0], made[1] if len(made) > 1 else None) if isinstance(made, tuple) else (made, None)
        )
        cls._tf_server_configs = servers
        if isinstance(cfg, EnvConfig):
            return cfg
        if hasattr(cfg, "model_dump"):
            cfg = cfg.model_dump()
        if not isinstance(cfg, dict):
            raise EnvConfigError(f"{cls.__name__}.config_init() must return (HermesAgentEnvConfig, servers)")
        base = (
            cls.config_class if issubclass(cls.config_class, HermesAgentEnvConfig) else HermesAgentEnvConfig
        )
        try:
            return base.model_validate(cfg)
        except ValidationError as exc:
            raise EnvConfigError(f"{cls.__name__}.config_init(): {_one_line(exc)}") from None

    @property
    def seed_config(self) -> HermesAgentEnvConfig:
        cfg = self.config
        if not isinstance(cfg, HermesAgentEnvConfig):
            cfg = HermesAgentEnvConfig.model_validate(cfg.model_dump(exclude_unset=True))
        return cfg

    def notes(self) -> list[str]:
        """One line per thing a seed user should know about this run (printed by ``env eval``)."""
        cfg = self.seed_config
        notes = list(cfg.seed_notes())
        servers = type(self)._tf_server_configs
        if servers:
            shown = ", ".join(
                f"{getattr(s, 'model_name', '?')} at {getattr(s, 'base_url', '?')}"
                for s in (servers if isinstance(servers, list | tuple) else [servers])
            )
            notes.append(
                f"config_init's server configs ({shown}) are not used: the model is --model/--base-url "
                "(or the embedded policy)"
            )
        if cfg.use_wandb:
            notes.append(
                f"use_wandb: nothing is sent to Weights & Biases; wandb_log()'s metrics go to {WANDB_FILE}"
            )
        if self.evaluates_itself():
            why = (
                "evaluation: evaluate"
                if cfg.evaluation == "evaluate"
                else "its compute_reward returns a constant"
            )
            notes.append(
                f"{type(self).__name__}.evaluate() is the evaluation ({why}): its HermesAgentLoop runs "
                f"are the episodes, scored by its evaluate_log samples; --max-samples and --group-size "
                "do not apply (its own config picks the tasks)"
            )
        elif type(self).evaluate is not HermesAgentBaseEnv.evaluate:
            notes.append(
                f"{type(self).__name__}.evaluate() is not run: env eval rolls out get_next_item()'s items "
                "and scores each with compute_reward (evaluation: evaluate in the config runs it instead)"
            )
        return notes

    def evaluates_itself(self) -> bool:
        """Whether ``env eval`` runs this env's ``evaluate()`` (see the module's docstring)."""
        mode = self.seed_config.evaluation
        if mode != "auto":
            return mode == "evaluate"
        if type(self).evaluate is HermesAgentBaseEnv.evaluate:
            return False
        reward = getattr(type(self).compute_reward, "__trajforge_seed_reward__", None)
        return reward is not None and _is_constant_reward(reward)

    def sandbox_config(self, base: SandboxConfig) -> SandboxConfig:
        """The sandbox as the seed's tasks expect it: ``sandbox_path`` first on ``PATH`` (bound
        read-only; the local backend sees the host's anyway), and a ``python`` command where the
        system has only ``python3`` (the seed's images have both; its envs run ``python x.py``)."""
        from trajforge.envs.verifier import SYSTEM_PATH

        dirs = list(self.seed_config.sandbox_path)
        if base.kind != "docker" and (shim := _python_shim()) is not None:
            dirs.append(shim)
        if not dirs:
            return base
        path = ":".join([*dirs, base.env.get("PATH", SYSTEM_PATH)])
        binds = base.ro_binds if base.kind == "local" else [*base.ro_binds, *dirs]
        return base.model_copy(update={"env": {**base.env, "PATH": path}, "ro_binds": binds})

    # ------------------------------------------------------------------ items

    async def setup(self) -> None:
        await super().setup()
        if type(self).setup is HermesAgentBaseEnv.setup:  # no subclass setup to wait for
            await self._ensure_eval_items()

    def _setup_failed(self, exc: BaseException) -> str:
        text = f"{type(self).__name__}.setup() failed: {_one_line(exc)}"
        dataset = getattr(self.config, "dataset_name", None)
        if dataset and _hub_error(exc):
            text += (
                f"; its dataset {dataset!r} is a Hugging Face hub download and is not in this machine's "
                "cache: fetch it where there is network (it is kept in ~/.cache/huggingface), or set "
                "dataset_name (--config) to a local copy"
            )
        return text

    async def _ensure_eval_items(self) -> None:
        if self._tf_eval is not None or type(self).get_next_item is BaseEnv.get_next_item:
            return  # drawn already, or items from dataset_file / generate: BaseEnv's eval_items
        items: list[Item] = []
        for _ in range(self.eval_pool):
            item = await self.get_next_item()
            if items and item == items[0]:
                break
            items.append(item)
        self._tf_eval = items

    def eval_items(self, n: int) -> list[Item]:
        pool: list[Item] | None = getattr(self, "_tf_eval", None)
        if pool is None:
            return super().eval_items(n)
        if not pool:
            raise EnvDataError(f"env {self.name!r}: get_next_item gave no items after setup")
        return pool[:n]  # at most n: the env's own items, each once

    def example_item(self) -> Item:
        return self.eval_items(1)[0]

    # ------------------------------------------------------------------ the seed's hooks

    def _resolve_tools_for_group(self) -> tuple[list[dict[str, Any]], set[str]]:
        """The tools of one group (the seed's ``(tool_schemas, valid_tool_names)``): the config's
        ``enabled_toolsets``, or a seeded draw from its ``distribution``, less ``disabled_toolsets``."""
        from trajforge.distributions import derive_seed
        from trajforge.rollout import draw_toolsets
        from trajforge.tools.builtin import default_registry

        cfg = self.config
        runtime = _runtime.CURRENT.get()
        registry = runtime.backends.registry if runtime is not None else default_registry()
        enabled = cfg.enabled_toolsets if cfg.enabled_toolsets is not None else ["terminal", "file"]
        toolsets = draw_toolsets(
            derive_seed(cfg.seed, f"group#{next(self._tf_draws)}"),
            distribution=cfg.distribution,
            enabled=enabled,
            disabled=cfg.disabled_toolsets,
        )
        tools = registry.for_toolsets(toolsets)
        return registry.schemas(tools), {t.name for t in tools}

    def _use_managed_server(self) -> bool:
        """The seed's Phase 2 switch: False (exact tokens come from ``--tokenizer`` instead)."""
        return False

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """The seed's evaluation hook (see :meth:`evaluates_itself` for when env eval runs it)."""
        return None

    async def evaluate_log(
        self,
        metrics: dict[str, Any],
        task_name: str | None = None,
        model_name: str | None = None,
        start_time: float | None = None,
        end_time: float | None = None,
        generation_parameters: dict[str, Any] | None = None,
        samples: list[dict[str, Any]] | None = None,
        verbose: bool = True,
    ) -> None:
        """Kept for the run's ``evaluate_log.json`` (and, with samples, each loop run's score)."""
        self._tf_logs.append(
            {
                "metrics": dict(metrics or {}),
                "task_name": task_name,
                "model_name": model_name,
                "start_time": start_time,
                "end_time": end_time,
                "generation_parameters": dict(generation_parameters or {}),
                "samples": list(samples or []),
            }
        )

    def logged_samples(self) -> list[dict[str, Any]]:
        """Every sample the env's ``evaluate_log`` calls reported, in order."""
        return [s for log in self._tf_logs for s in log["samples"] if isinstance(s, dict)]

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        """What the seed would send to Weights & Biases, kept for ``wandb_metrics.json``."""
        self._tf_wandb.append(dict(wandb_metrics or {}))

    async def add_rollouts_for_wandb(self, scored_data: Any, item: Any = None) -> None:
        """The seed's wandb rollout table: not kept (the episodes are the record)."""

    async def collect_trajectory(self, item: Item) -> Any:
        raise NotImplementedError(
            "collect_trajectory is Atropos's trainer path: `trajforge env eval` runs trajforge's own "
            "rollouts of get_next_item's items (and `trajforge env serve` serves them to Atropos)"
        )

    async def collect_trajectories(self, item: Item) -> Any:
        raise NotImplementedError(
            "collect_trajectories is Atropos's trainer path: `trajforge env eval` runs trajforge's own "
            "rollouts of get_next_item's items (and `trajforge env serve` serves them to Atropos)"
        )

    @classmethod
    def cli(cls) -> None:
        """The seed's ``python env.py serve|process|evaluate``: say what runs it here."""
        raise SystemExit(
            f"run this env with trajforge: `trajforge env eval {sys.argv[0]}:{cls.__name__}` "
            f"(or `trajforge env serve|process|evaluate {sys.argv[0]}:{cls.__name__}` under Atropos)"
        )

    # ------------------------------------------------------------------ env eval

    async def run_evaluation(
        self,
        backends: RolloutBackends,
        run_dir: Path,
        *,
        n: int,
        group_size: int,
        agent: str = "model",
        on_episode: Callable[..., None] | None = None,
        fit: Callable[[int | None], int | None] = lambda x: x,
        announce: Callable[[str], None] = lambda _m: None,
    ) -> EvalRun:
        """``env eval`` of this env: its rollouts or its own ``evaluate()`` (module docstring),
        with ``self.server`` answering and the seed's task tools reaching this run."""
        from dataclasses import replace

        from trajforge.envs.hermes.evaluation import run_own_evaluation
        from trajforge.envs.running.evaluate import evaluate_rollouts

        async with self._running(backends, fit, announce) as runtime:
            seeded = replace(backends, factory=_runtime.SeedFactory(backends.factory, runtime.exported))
            if self.evaluates_itself():
                run = await run_own_evaluation(self, runtime, run_dir, agent=agent, on_episode=on_episode)
            else:
                run = await evaluate_rollouts(
                    self, seeded, run_dir, n=n, group_size=group_size, agent=agent, on_episode=on_episode
                )
        await self.write_logs(run_dir)
        return run

    @contextlib.asynccontextmanager
    async def _running(
        self,
        backends: RolloutBackends,
        fit: Callable[[int | None], int | None],
        announce: Callable[[str], None],
    ) -> AsyncIterator[_runtime.SeedRuntime]:
        runtime = _runtime.SeedRuntime(self, backends, fit=fit, announce=announce)
        token = _runtime.CURRENT.set(runtime)
        self.server.bind(backends.model, fit)
        with _runtime.blocking_room(self.seed_config.tool_pool_size):
            try:
                yield runtime
            finally:
                await runtime.close()
                self.server.unbind()
                _runtime.CURRENT.reset(token)

    async def write_logs(self, run_dir: Path) -> None:
        """``wandb_log()`` once (what the seed would have sent), then the run's log files."""
        try:
            await self.wandb_log()
        except Exception as exc:  # the env's own metrics code: its failure is noted, not fatal
            self._tf_wandb.append({"error": f"wandb_log() failed: {_one_line(exc)}"})
        files = {EVALUATE_LOG_FILE: self._tf_logs, WANDB_FILE: self._tf_wandb}
        for name, data in files.items():
            if data:
                plain = [
                    {**d, "samples": [{k: v for k, v in s.items() if k != "messages"} for s in d["samples"]]}
                    if "samples" in d
                    else d
                    for d in data
                ]
                payload = orjson.dumps(
                    plain, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY, default=str
                )
                await asyncio.to_thread((run_dir / name).write_bytes, payload)


__all__ = ["EVALUATE_LOG_FILE", "WANDB_FILE", "HermesAgentBaseEnv"]
