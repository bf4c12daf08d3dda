"""Running an environment written for the seed system (Hermes Agent's ``environments/``) unchanged.

A seed env subclasses ``HermesAgentBaseEnv`` and writes ``async def compute_reward(self, item,
result, ctx)`` against the seed's ``ToolContext``, whose verbs are *blocking* calls
(``ctx.terminal("pytest -q")`` returns ``{"exit_code", "output"}``), and its config is a
``HermesAgentEnvConfig`` returned by ``config_init()`` with the server configs. This module gives
those names their trajforge meaning (docs/hermes.md maps every one):

- :class:`HermesAgentEnvConfig` is an :class:`~trajforge.envs.config.EnvConfig` that also takes the
  seed's own fields (``terminal_backend``, ``terminal_timeout``, ``terminal_lifetime``,
  ``tool_pool_size``) and atroposlib's ``BaseEnvConfig`` fields, mapping what has a meaning here and
  keeping the rest, named, under ``atropos``;
- :class:`HermesAgentBaseEnv` is a :class:`~trajforge.envs.base.BaseEnv`: a subclass's
  ``compute_reward`` is wrapped when the class is made, so the judge calls it with the seed's
  ``AgentResult`` and a :class:`ToolContext`, in a worker thread of its own (the seed's verbs block;
  each is run on the judge's event loop and waited for), and its float becomes the reward;
- :class:`ToolContext` is the seed's verb set over a :class:`~trajforge.envs.verifier.VerifierContext`;
  ``terminal`` runs where the env's ``reward_shell`` says: a fresh shell by default (the seed ran
  it in the rollout's session: set ``reward_shell: session`` for that, docs/security.md);
- :func:`install_seed_modules` makes ``from environments.hermes_base_env import ...`` (and
  ``environments.tool_context`` / ``environments.agent_loop``) resolve to this module when no real
  ``environments`` package is importable, so a seed env file loads without an edit
  (:func:`trajforge.envs.catalog.env_class` calls it for a file that imports them).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import json
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import Field, model_validator

from trajforge.agent.result import AgentResult as _TrajforgeResult
from trajforge.agent.result import ToolErrorRecord
from trajforge.envs.base import BaseEnv, EnvDataError
from trajforge.envs.config import EnvConfig, EnvConfigError
from trajforge.envs.types import Item, RewardBreakdown

if TYPE_CHECKING:
    from trajforge.envs.verifier import VerifierContext

_T = TypeVar("_T")

# atroposlib 0.4 BaseEnvConfig's fields: accepted (a seed config sets them), kept under
# ``atropos``; only max_token_length and group_size mean something to trajforge's env runner.
ATROPOS_FIELDS = frozenset(
    {
        "batch_size",
        "custom_thinking_prompt",
        "data_dir_to_save_evals",
        "data_path_to_save_groups",
        "ensure_scores_are_not_same",
        "eval_handling",
        "eval_limit_ratio",
        "include_messages",
        "inference_weight",
        "max_batches_offpolicy",
        "max_eval_workers",
        "max_num_workers",
        "max_num_workers_per_node",
        "max_reasoning_tokens",
        "min_batch_allocation",
        "min_items_sent_before_logging",
        "num_rollouts_per_group_for_logging",
        "num_rollouts_to_keep",
        "reasoning_effort",
        "rollout_server_url",
        "steps_per_eval",
        "thinking_mode",
        "tokenizer_name",
        "total_steps",
        "use_wandb",
        "wandb_name",
        "worker_timeout",
    }
)
# The seed's terminal backends and trajforge's sandbox for each; the cloud ones have none here.
_BACKENDS = {"local": None, "docker": "docker", "bwrap": "bwrap"}


class HermesAgentEnvConfig(EnvConfig):
    """The seed's env config as a trajforge :class:`EnvConfig` (its defaults: 30 agent turns)."""

    max_agent_turns: int = Field(30, ge=1, description="model calls per rollout (the seed's default 30)")
    tool_pool_size: int = Field(
        128, ge=1, description="the seed's tool thread pool; unused: trajforge's tools are async"
    )
    atropos: dict[str, Any] = Field(
        default_factory=dict, description="atroposlib BaseEnvConfig fields a seed config set (kept, unused)"
    )

    @model_validator(mode="before")
    @classmethod
    def _seed_fields(cls, data: Any) -> Any:
        """The seed's names -> trajforge's, before validation (so a dump re-validates as is)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        backend = data.pop("terminal_backend", None)
        if backend is not None:
            if backend not in _BACKENDS:
                raise ValueError(
                    f"terminal_backend {backend!r} has no trajforge sandbox (modal, ssh, singularity "
                    "and daytona are cloud or remote backends): use terminal_backend local (runs in "
                    "bubblewrap here) or docker, or set sandbox: bwrap|docker|local"
                )
            if _BACKENDS[backend] is not None:
                data.setdefault("sandbox", _BACKENDS[backend])
        if (timeout := data.pop("terminal_timeout", None)) is not None:
            data.setdefault("command_timeout_s", float(timeout))
        if (lifetime := data.pop("terminal_lifetime", None)) is not None:
            data.setdefault("sandbox_lifetime_s", float(lifetime))
        if (tokens := data.pop("max_token_length", None)) is not None:
            data.setdefault("max_tokens", int(tokens))
            data.setdefault("atropos", {})["max_token_length"] = tokens
        if data.get("disabled_toolsets") is None:
            data.pop("disabled_toolsets", None)
        if data.get("extra_body") is None:
            data.pop("extra_body", None)
        kept = {k: data.pop(k) for k in list(data) if k in ATROPOS_FIELDS}
        if kept:
            data["atropos"] = {**data.get("atropos", {}), **kept}
        return data


class AgentResult(_TrajforgeResult):
    """The seed's ``AgentResult``: trajforge's (``messages``, ``turns_used``,
    ``finished_naturally``, ``reasoning_per_turn``, ``tool_errors`` are the same fields) plus
    ``managed_state``, which is None here: an exact-token run keeps its tokens in
    ``token_traces`` instead."""

    managed_state: dict[str, Any] | None = None

    @classmethod
    def of(cls, result: _TrajforgeResult) -> AgentResult:
        if isinstance(result, AgentResult):
            return result
        return cls.model_construct(**dict(result), managed_state=None)


ToolError = ToolErrorRecord  # the seed's name for a tool error record (same fields)


def _json_or_error(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (ValueError, TypeError):
        return {"error": text} if text else {}
    return value if isinstance(value, dict) else {"result": value}


class ToolContext:
    """The seed's ``ToolContext``: blocking verbs for reward code, each run on the judge's event
    loop against the rollout's :class:`VerifierContext` (confinement, bounded reads and the
    reward deadline are that context's). Made by :class:`HermesAgentBaseEnv`; only usable from the
    thread its ``compute_reward`` runs in."""

    def __init__(self, ctx: VerifierContext, loop: asyncio.AbstractEventLoop) -> None:
        self._ctx = ctx
        self._loop = loop
        self.task_id = ctx.sandbox.task_id

    @property
    def verifier(self) -> VerifierContext:
        """The trajforge context underneath (its async verbs: ``exec``, ``search``, ...)."""
        return self._ctx

    def _run(self, make: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            raise RuntimeError(
                "the seed's ToolContext verbs block: call them from compute_reward (which runs in a "
                "thread of its own), or await the trajforge context's verbs via ctx.verifier"
            )
        return asyncio.run_coroutine_threadsafe(make(), self._loop).result()

    # -- terminal

    def terminal(self, command: str, timeout: int = 180) -> dict[str, Any]:
        """``{"exit_code": int, "output": str}`` (-1 when killed at ``timeout``)."""
        got = self._run(lambda: self._ctx.terminal(command, timeout=timeout))
        return {"exit_code": got["exit_code"], "output": got["output"]}

    # -- files

    def read_file(self, path: str) -> dict[str, Any]:
        try:
            data = self._run(lambda: self._ctx.read_file(path))
        except (OSError, ValueError) as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        return {"content": data.decode(errors="replace"), "path": path, "bytes": len(data)}

    def write_file(self, path: str, content: str) -> dict[str, Any]:
        try:
            self._run(lambda: self._ctx.write_file(path, content))
        except (OSError, ValueError) as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        return {"success": True, "path": path, "bytes": len(content.encode())}

    def upload_file(self, local_path: str, remote_path: str) -> dict[str, Any]:
        if not Path(local_path).is_file():
            return {"exit_code": -1, "output": f"Local file not found: {local_path}"}
        try:
            self._run(lambda: self._ctx.upload_file(local_path, remote_path))
        except (OSError, ValueError) as exc:
            return {"exit_code": -1, "output": f"{type(exc).__name__}: {exc}"}
        return {"exit_code": 0, "output": ""}

    def upload_dir(self, local_dir: str, remote_dir: str) -> list[dict[str, Any]]:
        if not Path(local_dir).is_dir():
            return [{"exit_code": -1, "output": f"Local directory not found: {local_dir}"}]
        written = self._run(lambda: self._ctx.upload_dir(local_dir, remote_dir))
        return [{"exit_code": 0, "output": path} for path in written]

    def download_file(self, remote_path: str, local_path: str) -> dict[str, Any]:
        try:
            out = self._run(lambda: self._ctx.download_file(remote_path, local_path))
        except (OSError, ValueError) as exc:
            return {"success": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"success": True, "bytes": out.stat().st_size}

    def download_dir(self, remote_dir: str, local_dir: str) -> list[dict[str, Any]]:
        try:
            paths = self._run(lambda: self._ctx.download_dir(remote_dir, local_dir))
        except (OSError, ValueError) as exc:
            return [{"success": False, "error": f"{type(exc).__name__}: {exc}"}]
        return [{"success": True, "bytes": p.stat().st_size} for p in paths]

    def search(self, query: str, path: str = ".") -> dict[str, Any]:
        hits = self._run(lambda: self._ctx.search(query, path))
        return {"matches": [{"path": h.path, "line": h.line, "content": h.text} for h in hits]}

    # -- web, browser, any tool

    def web_search(self, query: str) -> dict[str, Any]:
        return self._tool_json("web_search", {"query": query})

    def web_extract(self, urls: list[str]) -> dict[str, Any]:
        return self._tool_json("web_extract", {"urls": list(urls)})

    def browser_navigate(self, url: str) -> dict[str, Any]:
        return self._tool_json("browser_navigate", {"url": url})

    def browser_snapshot(self) -> dict[str, Any]:
        return self._tool_json("browser_snapshot", {})

    def call_tool(self, tool_name: str, arguments: dict[str, Any]) -> str:
        """The tool's raw result text (an unknown or unconfigured tool: a JSON error)."""
        try:
            out = self._run(lambda: self._ctx.call_tool(tool_name, arguments))
        except KeyError as exc:
            return json.dumps({"error": str(exc.args[0]) if exc.args else str(exc)})
        return str(out.content)

    def _tool_json(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return _json_or_error(self.call_tool(name, args))

    def cleanup(self) -> None:
        """Stop what the rollout left running (the seed calls this after compute_reward; the
        trajforge judge also closes the sandbox afterwards)."""
        self._run(self._ctx.stop_processes)


def _adapt_reward(fn: Callable[..., Any]) -> Callable[..., Awaitable[float | RewardBreakdown]]:
    """A seed ``compute_reward`` as trajforge's: seed types in, the call in a thread of its own."""

    @functools.wraps(fn)
    async def compute_reward(self: Any, item: Item, result: Any, ctx: Any) -> float | RewardBreakdown:
        if isinstance(ctx, ToolContext):  # super().compute_reward from a seed subclass
            value = fn(self, item, result, ctx)
            return await value if inspect.isawaitable(value) else value  # type: ignore[no-any-return]
        tool_ctx = ToolContext(ctx, asyncio.get_running_loop())
        seed_result = AgentResult.of(result)
        if inspect.iscoroutinefunction(fn):
            value = await asyncio.to_thread(asyncio.run, fn(self, item, seed_result, tool_ctx))
        else:
            value = await asyncio.to_thread(fn, self, item, seed_result, tool_ctx)
        if isinstance(value, RewardBreakdown):
            return value
        if value is None:
            raise TypeError("compute_reward returned None; the seed's contract is a float reward")
        return float(value)

    compute_reward.__trajforge_seed_reward__ = True  # type: ignore[attr-defined]
    return compute_reward


def _adapt_setup(fn: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """A subclass's ``setup``, then (only for the outermost one: a subclass's ``super().setup()``
    comes back through here) the eval items drawn from its finished state."""

    @functools.wraps(fn)
    async def setup(self: HermesAgentBaseEnv) -> None:
        await fn(self)
        if type(self).setup is setup:
            await self._ensure_eval_items()

    setup.__trajforge_seed_setup__ = True  # type: ignore[attr-defined]
    return setup


class HermesAgentBaseEnv(BaseEnv):
    """The seed's base env on trajforge's rollouts. Subclasses write the seed's methods:
    ``setup`` (async), ``get_next_item`` (async), ``format_prompt``, ``compute_reward(item,
    result, ctx) -> float`` with the seed's :class:`ToolContext`, and ``evaluate`` (not called:
    ``trajforge env eval`` is the evaluation). ``config_init()`` gives the default config; its
    server configs are not used (the endpoint is the command line's ``--model``/``--base-url``).

    ``eval_items(n)``: the first ``n`` items ``get_next_item`` gives after ``setup``, drawn once
    until the cycle closes (an item equal to the first) or ``eval_pool`` items."""

    name: ClassVar[str] = "hermes-agent"
    config_class: ClassVar[type[EnvConfig]] = HermesAgentEnvConfig
    env_config_cls: ClassVar[type[EnvConfig]] = HermesAgentEnvConfig
    eval_pool: ClassVar[int] = 1024

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        if "env_config_cls" in own and "config_class" not in own:
            cls.config_class = own["env_config_cls"]
        reward = own.get("compute_reward")
        if reward is not None and not getattr(reward, "__trajforge_seed_reward__", False):
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
        self.server_configs = server_configs  # kept for the subclass; trajforge's endpoint is the CLI's
        self._seed_eval: list[Item] | None = None

    @classmethod
    def default_config(cls) -> EnvConfig:
        init = getattr(cls, "config_init", None)
        if init is None:
            return cls.config_class()
        made = init()
        cfg = made[0] if isinstance(made, tuple) else made
        if isinstance(cfg, EnvConfig):
            return cfg
        if hasattr(cfg, "model_dump"):
            cfg = cfg.model_dump()
        if not isinstance(cfg, dict):
            raise EnvConfigError(f"{cls.__name__}.config_init() must return (HermesAgentEnvConfig, servers)")
        base = (
            cls.config_class if issubclass(cls.config_class, HermesAgentEnvConfig) else HermesAgentEnvConfig
        )
        return base.model_validate(cfg)

    async def setup(self) -> None:
        await super().setup()
        if type(self).setup is HermesAgentBaseEnv.setup:  # no subclass setup to wait for
            await self._ensure_eval_items()

    async def _ensure_eval_items(self) -> None:
        if self._seed_eval is not None or type(self).get_next_item is BaseEnv.get_next_item:
            return  # drawn already, or items from dataset_file / generate: BaseEnv's eval_items
        items: list[Item] = []
        for _ in range(self.eval_pool):
            item = await self.get_next_item()
            if items and item == items[0]:
                break
            items.append(item)
        self._seed_eval = items

    def eval_items(self, n: int) -> list[Item]:
        pool = getattr(self, "_seed_eval", None)
        if pool is None:
            return super().eval_items(n)
        if not pool:
            raise EnvDataError(f"env {self.name!r}: get_next_item gave no items after setup")
        return [pool[i % len(pool)] for i in range(n)] if n > len(pool) else pool[:n]

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """The seed's periodic evaluation hook; trajforge evaluates with ``trajforge env eval``."""
        return None


# --------------------------------------------------------------------------- module names

SEED_MODULES = (
    "environments",
    "environments.hermes_base_env",
    "environments.tool_context",
    "environments.agent_loop",
)


def seed_imports(source: str) -> bool:
    """Whether a file's source imports the seed's ``environments`` modules."""
    return "from environments" in source or "import environments" in source


def install_seed_modules() -> bool:
    """Make the seed's module names importable as this module's names, unless a real
    ``environments`` package is importable (then that one is used). Returns whether the names
    are ours. Idempotent; the modules stay in ``sys.modules`` for the process (a seed env file's
    functions import them lazily too)."""
    current = sys.modules.get("environments")
    if current is not None:
        return bool(getattr(current, "__trajforge_compat__", False))
    if importlib.util.find_spec("environments") is not None:
        return False
    names: dict[str, dict[str, Any]] = {
        "environments": {},
        "environments.hermes_base_env": {
            "HermesAgentBaseEnv": HermesAgentBaseEnv,
            "HermesAgentEnvConfig": HermesAgentEnvConfig,
            "AgentResult": AgentResult,
            "ToolContext": ToolContext,
        },
        "environments.tool_context": {"ToolContext": ToolContext},
        "environments.agent_loop": {"AgentResult": AgentResult, "ToolError": ToolError},
    }
    for name, attrs in names.items():
        module = ModuleType(
            name, f"trajforge's stand-in for the seed's {name} (trajforge.envs.hermes_compat)"
        )
        module.__dict__.update(attrs)
        module.__trajforge_compat__ = True  # type: ignore[attr-defined]
        if name == "environments":
            module.__path__ = []  # a package, so its submodules import
        sys.modules[name] = module
    for name in SEED_MODULES[1:]:
        setattr(sys.modules["environments"], name.rpartition(".")[2], sys.modules[name])
    return True


__all__ = [
    "AgentResult",
    "HermesAgentBaseEnv",
    "HermesAgentEnvConfig",
    "ToolContext",
    "ToolError",
    "install_seed_modules",
    "seed_imports",
]
