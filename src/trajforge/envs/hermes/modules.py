"""The seed's module names, made importable for an env file written for it.

A seed env file imports ``environments.hermes_base_env``, ``environments.agent_loop``,
``environments.tool_context`` (and the benchmark ones ``tools.terminal_tool``);
:func:`install_seed_modules` puts stand-ins for those modules into ``sys.modules`` whose names
are trajforge's (:mod:`trajforge.envs.hermes`), unless a real package of that name is importable
(then that one is used). :func:`trajforge.envs.catalog.env_class` calls it for a file that
imports them. docs/hermes.md lists every name and what it does here.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from trajforge.envs.hermes import runtime as _runtime
from trajforge.envs.hermes.config import BudgetConfig, HermesAgentEnvConfig
from trajforge.envs.hermes.context import ToolContext
from trajforge.envs.hermes.env import HermesAgentBaseEnv
from trajforge.envs.hermes.loop import (
    AgentResult,
    HermesAgentLoop,
    ToolError,
    _tool_executor,
    resize_tool_pool,
)

# -- tools.terminal_tool: the per-task sandbox controls the benchmark envs call


def register_task_env_overrides(task_id: str, overrides: dict[str, Any]) -> None:
    """The seed's per-task sandbox settings (``{"modal_image": ...}``): the image a docker
    sandbox of ``task_id`` runs (a path to a Dockerfile is built first)."""
    _runtime.current().overrides[task_id] = dict(overrides)


def clear_task_env_overrides(task_id: str) -> None:
    runtime = _runtime.CURRENT.get()
    if runtime is not None:
        runtime.overrides.pop(task_id, None)


def cleanup_vm(task_id: str) -> None:
    """End ``task_id``'s sandbox (its rollout is then recorded)."""
    runtime = _runtime.CURRENT.get()
    if runtime is not None:
        runtime.release(task_id)


def cleanup_all_environments() -> None:
    runtime = _runtime.CURRENT.get()
    if runtime is not None:
        runtime.release_all()


# -- environments.tool_call_parsers: the seed's client-side parsers, as trajforge's


class SeedParser:
    """A trajforge parser with the seed's interface: ``parse(text) -> (content, tool_calls)``."""

    def __init__(self, name: str) -> None:
        from trajforge.llm.parsers import get_parser as trajforge_parser

        self._parser = trajforge_parser(name)

    def parse(self, text: str) -> tuple[str | None, list[Any] | None]:
        from openai.types.chat.chat_completion_message_tool_call import ChatCompletionMessageToolCall

        from trajforge.llm.parsers.base import to_tool_calls

        result = self._parser.parse(text)
        calls = [ChatCompletionMessageToolCall.model_validate(c.to_openai()) for c in to_tool_calls(result)]
        return result.content, calls or None


def get_parser(name: str) -> SeedParser:
    """The seed's ``get_parser``: unknown names raise ``KeyError`` (as the seed's do)."""
    try:
        return SeedParser(name)
    except ValueError as exc:
        raise KeyError(str(exc)) from None


def list_parsers() -> list[str]:
    from trajforge.llm.parsers import list_parsers as names

    return names()


def _refuse_register(name: str) -> Any:
    raise NotImplementedError(
        f"register_parser({name!r}): trajforge's parsers are a fixed table (trajforge.llm.parsers); "
        "`trajforge parse --parser NAME` lists and tries them"
    )


def apply_patches() -> None:
    """The seed's monkey patches of its Modal backend: nothing to patch here."""


SEED_MODULES = (
    "environments",
    "environments.hermes_base_env",
    "environments.tool_context",
    "environments.agent_loop",
    "environments.patches",
    "environments.tool_call_parsers",
)
TOOL_MODULES = ("tools", "tools.terminal_tool", "tools.budget_config")


def _contents() -> dict[str, dict[str, Any]]:
    base = {
        "HermesAgentBaseEnv": HermesAgentBaseEnv,
        "HermesAgentEnvConfig": HermesAgentEnvConfig,
        "AgentResult": AgentResult,
        "HermesAgentLoop": HermesAgentLoop,
        "ToolContext": ToolContext,
    }
    return {
        "environments": dict(base),
        "environments.hermes_base_env": dict(base),
        "environments.tool_context": {"ToolContext": ToolContext},
        "environments.agent_loop": {
            "AgentResult": AgentResult,
            "HermesAgentLoop": HermesAgentLoop,
            "ToolError": ToolError,
            "resize_tool_pool": resize_tool_pool,
            "_tool_executor": _tool_executor,
        },
        "environments.patches": {"apply_patches": apply_patches},
        "environments.tool_call_parsers": {
            "get_parser": get_parser,
            "list_parsers": list_parsers,
            "ToolCallParser": SeedParser,
            "register_parser": _refuse_register,
        },
        "tools": {},
        "tools.terminal_tool": {
            "register_task_env_overrides": register_task_env_overrides,
            "clear_task_env_overrides": clear_task_env_overrides,
            "cleanup_vm": cleanup_vm,
            "cleanup_all_environments": cleanup_all_environments,
        },
        "tools.budget_config": {
            "BudgetConfig": BudgetConfig,
            "DEFAULT_RESULT_SIZE_CHARS": BudgetConfig().default_result_size,
            "DEFAULT_TURN_BUDGET_CHARS": BudgetConfig().turn_budget,
            "DEFAULT_PREVIEW_SIZE_CHARS": BudgetConfig().preview_size,
        },
    }


def seed_imports(source: str) -> bool:
    """Whether a file's source imports the seed's ``environments`` modules."""
    return "from environments" in source or "import environments" in source


def _ours(name: str) -> bool | None:
    """True: ``name`` is our stand-in already; False: a real module of that name exists; None:
    neither (ours can go in)."""
    current = sys.modules.get(name)
    if current is not None:
        return bool(getattr(current, "__trajforge_compat__", False))
    return False if importlib.util.find_spec(name) is not None else None


def seed_root(path: Path) -> Path | None:
    """The checkout a seed env file lives in: the parent of its nearest ``environments`` directory
    (``.../environments/benchmarks/tblite/tblite_env.py`` -> ``...``), or None."""
    for parent in path.resolve().parents:
        if parent.name == "environments":
            return parent.parent
    return None


def install_seed_modules(root: Path | None = None) -> bool:
    """Make the seed's module names importable as this package's names, unless a real
    ``environments`` package is importable (then that one is used). Returns whether the names
    are ours. Idempotent; the modules stay in ``sys.modules`` for the process (a seed env file's
    functions import them lazily too). ``tools.*`` go in only where no ``tools`` package exists.

    ``root``: the checkout the env file is in (:func:`seed_root`); its ``environments/`` is
    searched for the names that are not stand-ins, so a seed env importing a sibling
    (TBLite's ``from environments.benchmarks.terminalbench_2.terminalbench2_env import ...``)
    gets that file, unchanged. The stand-ins always win over the checkout's own copies."""
    found = _ours("environments")
    if found is not None:
        if found and root is not None:
            _search(root)
        return found
    contents = _contents()
    groups: list[tuple[str, ...]] = [SEED_MODULES]
    if _ours("tools") is None:
        groups.append(TOOL_MODULES)
    for group in groups:
        for name in group:
            module = ModuleType(name, f"trajforge's stand-in for the seed's {name} (trajforge.envs.hermes)")
            module.__dict__.update(contents[name])
            module.__trajforge_compat__ = True  # type: ignore[attr-defined]
            if "." not in name:
                module.__path__ = []  # a package, so its submodules import
            sys.modules[name] = module
        for name in group[1:]:
            parent, _, child = name.rpartition(".")
            setattr(sys.modules[parent], child, sys.modules[name])
    if root is not None:
        _search(root)
    return True


def _search(root: Path) -> None:
    """Let ``environments.X`` that is no stand-in be found in ``root/environments``."""
    package = sys.modules["environments"]
    where = str(root / "environments")
    if (root / "environments").is_dir() and where not in package.__path__:
        package.__path__.append(where)


__all__ = [
    "SEED_MODULES",
    "TOOL_MODULES",
    "apply_patches",
    "cleanup_all_environments",
    "cleanup_vm",
    "clear_task_env_overrides",
    "get_parser",
    "install_seed_modules",
    "list_parsers",
    "register_task_env_overrides",
    "seed_imports",
    "seed_root",
]
