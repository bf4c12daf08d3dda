"""Finding environments: the shipped library by name, user envs by ``path/to/file.py:ClassName``,
and envs the RL agent wrote by ``agent-env:STORE/NAME.SHA16.py:ClassName``.

A fixed table of names to import paths (lazy: listing envs imports only what it shows), never a
registry that modules add themselves to.

A user env file is the operator's code and is imported. An agent-written env never is: its
reference loads a :class:`~trajforge.envs.sandboxed.proxy.SandboxedEnv`, whose code runs in the
env host's sandbox once the operator approved it, and a ``.py`` in an agent env store (a
directory with the store's manifest) is refused as a user env, however it is named.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from trajforge.envs.base import BaseEnv
from trajforge.envs.config import EnvConfig, parse_env_config
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.types import Item, RewardBreakdown

LIBRARY: Mapping[str, str] = MappingProxyType(
    {
        "terminal_test": "trajforge.envs.library.terminal_test:TerminalTestEnv",
        "tiny_tasks": "trajforge.envs.library.tiny_tasks:TinyTasksEnv",
        "swe": "trajforge.envs.library.swe:SweEnv",
        "terminal_bench": "trajforge.envs.library.terminal_bench:TerminalBenchEnv",
        "tblite": "trajforge.envs.library.tblite:TbliteEnv",
        "yc_bench": "trajforge.envs.library.yc_bench:YcBenchEnv",
        "web_research": "trajforge.envs.library.web_research:WebResearchEnv",
        "opd": "trajforge.envs.library.opd:OnPolicyDistillationEnv",
    }
)


class UnknownEnvError(ValueError):
    """An env reference that names nothing loadable; the message lists what is."""


def _import(ref: str) -> Any:
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def available() -> dict[str, str]:
    """Shipped env name -> import path, for the envs whose module exists in this install."""
    return {
        name: ref
        for name, ref in LIBRARY.items()
        if importlib.util.find_spec(ref.partition(":")[0]) is not None
    }


def env_class(ref: str) -> type[AgentEnv]:
    """The class a reference names: a library name or ``path/to/file.py:ClassName``. For an
    ``agent-env:`` reference it is the sandboxed proxy's class: nothing of the file is imported."""
    from trajforge.envs.sandboxed.store import is_agent_ref, parse_ref

    if is_agent_ref(ref):
        from trajforge.envs.sandboxed.proxy import SandboxedEnv

        parse_ref(ref)
        return SandboxedEnv
    if ref in LIBRARY:
        if ref not in available():
            raise UnknownEnvError(f"env {ref!r} is not part of this install")
        cls = _import(LIBRARY[ref])
    elif ":" in ref:
        cls = _load_attr(ref)
    else:
        known = ", ".join(available())
        raise UnknownEnvError(
            f"unknown env {ref!r}; shipped envs: {known}; or give path/to/file.py:ClassName"
        )
    if not isinstance(cls, type) or not _looks_like_env(cls):
        raise UnknownEnvError(f"{ref} is not an environment class (subclass trajforge.envs.BaseEnv)")
    return cls


def _looks_like_env(cls: type) -> bool:
    return all(hasattr(cls, attr) for attr in ("name", "compute_reward", "format_prompt", "get_next_item"))


def load_env(ref: str, overrides: dict[str, Any] | None = None, config: EnvConfig | None = None) -> AgentEnv:
    """An env instance: its default config, then ``config`` (a whole one) or field ``overrides``.
    An ``agent-env:`` reference starts its env host (blocking) and only when it is approved."""
    from trajforge.envs.sandboxed.store import is_agent_ref

    if is_agent_ref(ref):
        from trajforge.envs.sandboxed.proxy import load_agent_env

        return load_agent_env(ref, overrides, config)
    cls = env_class(ref)
    if config is None:
        base = cls.default_config() if issubclass(cls, BaseEnv) else EnvConfig()
        config = base.with_overrides(overrides) if overrides else base
    elif overrides:
        config = config.with_overrides(overrides)
    env = cls(config) if issubclass(cls, BaseEnv) else cls()
    if not issubclass(cls, BaseEnv):
        env.config = config
    return env


class RewardFunctionEnv(BaseEnv):
    """A reward function as an env: ``batch --env path.py:func`` grades lines with it. The
    function is ``[async] def reward(item, result, ctx) -> float | RewardBreakdown``; ``item`` is
    the dataset row (prompt and every other field)."""

    name: ClassVar[str] = "reward_function"
    description: ClassVar[str] = "a user reward function"

    def __init__(self, fn: Callable[..., Any], ref: str, config: EnvConfig | None = None) -> None:
        super().__init__(config)
        self._fn = fn
        self.name = ref  # type: ignore[misc]  # the record names the function, not the wrapper

    async def compute_reward(self, item: Item, result: Any, ctx: Any) -> float | RewardBreakdown:
        value = self._fn(item, result, ctx)
        if inspect.isawaitable(value):
            value = await value
        return value  # type: ignore[no-any-return]


def _load_attr(ref: str) -> Any:
    """``path/to/file.py:name`` or ``package.module:name``."""
    where, _, name = ref.rpartition(":")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise UnknownEnvError(f"{path} does not exist (expected path/to/file.py:name)")
        _refuse_agent_file(path)
        _seed_names(path)
        mod_name = f"trajforge_user_env_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise UnknownEnvError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise UnknownEnvError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise UnknownEnvError(f"cannot import {where!r}: {exc}") from None
    try:
        return getattr(module, name)
    except AttributeError:
        raise UnknownEnvError(f"{where} has no {name!r}") from None


def _seed_names(path: Path) -> None:
    """A file written for the seed system (``from environments.hermes_base_env import ...``)
    gets trajforge's stand-ins for those modules (docs/hermes.md)."""
    try:
        source = path.read_text(errors="replace")
    except OSError as exc:
        raise UnknownEnvError(f"cannot read {path}: {exc}") from None
    from trajforge.envs.hermes.modules import install_seed_modules, seed_imports, seed_root

    if seed_imports(source):
        install_seed_modules(seed_root(path))


def _refuse_agent_file(path: Path) -> None:
    """A file in an agent env store (the model's writing) is never imported here."""
    from trajforge.envs.sandboxed.store import REF_PREFIX, is_store

    if is_store(path.resolve().parent) or is_store(path.absolute().parent):
        raise UnknownEnvError(
            f"{path} was written by an RL agent (it is in an agent env store): it is never imported "
            f"on the host. It runs only in the env sandbox, once approved, as {REF_PREFIX}PATH:Class "
            "(`trajforge rl agent-envs` lists them)"
        )


def load_grader(ref: str, overrides: dict[str, Any] | None = None) -> AgentEnv:
    """What grades batch lines: an env (name or file.py:Class) or a reward function
    (file.py:func or module:func)."""
    if ref in LIBRARY or ":" not in ref or ref.startswith("agent-env:"):
        return load_env(ref, overrides)
    obj = _load_attr(ref)
    if isinstance(obj, type):
        return load_env(ref, overrides)
    if not callable(obj):
        raise UnknownEnvError(f"{ref} is neither an env class nor a reward function")
    base = EnvConfig()
    return RewardFunctionEnv(obj, ref, base.with_overrides(overrides) if overrides else base)


def describe(ref: str) -> tuple[str, str]:
    cls = env_class(ref)
    return str(getattr(cls, "name", ref)), str(getattr(cls, "description", ""))


__all__ = [
    "LIBRARY",
    "RewardFunctionEnv",
    "UnknownEnvError",
    "available",
    "describe",
    "env_class",
    "load_env",
    "load_grader",
    "parse_env_config",
]
