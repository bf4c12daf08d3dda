"""Every float of a typed config -- a duration, a size, a rate, a weight -- is a finite number.

Before (53e87f8) ``EnvConfig(reward_timeout_s=inf)`` was accepted: every reward then failed while
the episode read "completed". The class of the bug is a float field whose ``gt=0`` lets infinity
through (and whose comparisons NaN skips), so this walks every config model of trajforge and
tries infinity and NaN on each float field: each must be refused at construction, by name.
"""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
import typing
from typing import Any

import pytest
from pydantic import BaseModel

import trajforge
from trajforge.envs.config import EnvConfig, EnvConfigError

_CONFIG_SUFFIXES = ("Config", "Settings", "Limits", "Check", "Start", "Phase")
# Config models that are not trajforge's to change here, each with why:
_ELSEWHERE = {
    # subclasses of third-party config models (their fields are the libraries')
    "trajforge.rl.adapters.atropos.AtroposEnvConfig",
    "trajforge.rl.adapters.verifiers.EnvHarnessConfig",
}


def _has_float(annotation: Any) -> bool:
    return annotation is float or any(_has_float(a) for a in typing.get_args(annotation))


def _configs() -> list[type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {}
    for info in pkgutil.walk_packages(trajforge.__path__, "trajforge."):
        if "swe_tasks" in info.name:
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception:  # an optional extra that is not installed here
            continue
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseModel)
                and obj.__module__ == module.__name__
                and name.endswith(_CONFIG_SUFFIXES)
                and f"{obj.__module__}.{name}" not in _ELSEWHERE
            ):
                found[f"{obj.__module__}.{name}"] = obj
    return [found[k] for k in sorted(found)]


CONFIGS = _configs()
CASES = [
    (cls, field) for cls in CONFIGS for field, info in cls.model_fields.items() if _has_float(info.annotation)
]


def test_the_walk_finds_the_configs_it_must() -> None:
    names = {c.__name__ for c in CONFIGS}
    assert {"EnvConfig", "TrainConfig", "ServeConfig", "BatchConfig", "AgentConfig", "SandboxConfig"} <= names
    assert len(CASES) >= 40


@pytest.mark.parametrize(("cls", "field"), CASES, ids=[f"{c.__name__}.{f}" for c, f in CASES])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, "inf", "NaN"], ids=repr)
def test_no_float_of_a_config_takes_infinity_or_nan(cls: type[BaseModel], field: str, value: Any) -> None:
    from pydantic import ValidationError

    listed = typing.get_origin(cls.model_fields[field].annotation) is list  # a list of floats: one item
    try:
        cls.model_validate({field: [value] if listed else value})
    except ValidationError as exc:
        errors = [e for e in exc.errors() if e["loc"][:1] == (field,)]
    else:
        errors = []
    assert errors and all(e["type"] == "finite_number" for e in errors), (
        f"{cls.__name__}.{field} accepted {value!r}"
    )


def test_an_env_timeout_of_inf_is_refused_by_name() -> None:
    with pytest.raises(EnvConfigError, match="reward_timeout_s"):
        EnvConfig().with_overrides({"reward_timeout_s": "inf"})
