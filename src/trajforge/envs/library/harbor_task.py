"""A Harbor task directory's ``task.toml`` and instruction, read as the ``harbor`` package (0.26,
``harbor.models.task``) reads them, for the fields trajforge acts on.

Why not import harbor: it needs Python >= 3.12 and brings a web stack; the task model is a small
schema. Equal parsing is proven instead: ``tests/test_harbor_parity.py`` runs harbor's own
``Task`` in ``.venv-bench`` on every shipped task (and on edge cases) and compares field by field.

Kept from harbor: the defaults (verifier and build timeouts 600 s, network ``public``, os
``linux``), ``version`` as the old name of ``schema_version``, the task name from ``[task] name``
(``org/name``) else the directory's, the legacy ``memory``/``storage`` strings ("2G") and
``allow_internet``, canary lines stripped from the instruction's top, ``[[steps]]`` (multi-step
tasks). Not kept: everything trajforge does not act on (MCP servers, artifacts, healthchecks,
verifier collection); those keys are accepted and ignored, as harbor ignores unknown ones.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# harbor/constants.py ORG_NAME_PATTERN
ORG_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")
# harbor/models/task/task.py: an HTML or hash comment naming a canary, at the top
_CANARY_LINE = re.compile(r"^(<!--.*canary.*-->|#.*canary.*)$", re.IGNORECASE)
_TEMPLATE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore")


class HarborPackage(_Section):
    name: str = Field(description="org/name, as harbor's registry names tasks")

    @field_validator("name")
    @classmethod
    def _org_name(cls, value: str) -> str:
        if not ORG_NAME.match(value) or ".." in value:
            raise ValueError(
                f"[task] name must be 'org/name' (letters, digits, '.', '_', '-'), got {value!r}"
            )
        return value


class HarborVerifier(_Section):
    timeout_sec: float = 600.0
    env: dict[str, str] = Field(default_factory=dict)


class HarborAgent(_Section):
    timeout_sec: float | None = None


class HarborSolution(_Section):
    env: dict[str, str] = Field(default_factory=dict)


class HarborEnvironment(_Section):
    build_timeout_sec: float = 600.0
    docker_image: str | None = None
    os: Literal["linux", "windows"] = "linux"
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int | None = None
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    network_mode: Literal["public", "no-network", "allowlist"] = "public"

    @model_validator(mode="before")
    @classmethod
    def _legacy(cls, data: Any) -> Any:
        """harbor's migrations: ``memory``/``storage`` = "2G" | "512M" | "1024K"; ``allow_internet``."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for old in ("memory", "storage"):
            value = data.pop(old, None)
            if isinstance(value, str):
                data.setdefault(f"{old}_mb", _size_mb(value))
        allow = data.pop("allow_internet", None)
        if allow is not None and "network_mode" not in data and data.get("allowed_hosts") is None:
            data["network_mode"] = "public" if allow else "no-network"
        if isinstance(data.get("os"), str):
            data["os"] = data["os"].lower()
        return data


def _size_mb(size: str) -> int:
    size = size.strip().upper()
    units = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
    if size[-1:] not in units:
        raise ValueError(f"invalid size {size!r}: expected e.g. '1G' or '512M'")
    return int(float(size[:-1]) * units[size[-1]])


class HarborTaskConfig(_Section):
    """task.toml: the sections trajforge acts on, with harbor's defaults."""

    schema_version: str = "1.4"
    task: HarborPackage | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: HarborVerifier = Field(default_factory=HarborVerifier)
    agent: HarborAgent = Field(default_factory=HarborAgent)
    environment: HarborEnvironment = Field(default_factory=HarborEnvironment)
    solution: HarborSolution = Field(default_factory=HarborSolution)
    steps: list[dict[str, Any]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _version_rename(cls, data: Any) -> Any:
        if isinstance(data, dict) and "version" in data:
            data = dict(data)
            data.setdefault("schema_version", data.pop("version"))
        return data

    @classmethod
    def from_toml(cls, text: str) -> HarborTaskConfig:
        return cls.model_validate(tomllib.loads(text))

    def name_for(self, directory: str) -> str:
        """harbor's ``Task.name``: ``[task] name`` when given, else the directory's name."""
        return self.task.name if self.task is not None else directory

    @property
    def category(self) -> str:
        return str(self.metadata.get("category") or self.metadata.get("difficulty") or "task")

    @property
    def requires(self) -> list[str]:
        """``[metadata] requires``: programs the task needs on PATH (a trajforge extension: a
        task whose program the bwrap sandbox's read-only /usr lacks is skipped, saying which)."""
        value = self.metadata.get("requires") or []
        return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def strip_canary(text: str) -> str:
    """harbor's ``strip_canary``: leading canary comment lines, then blank lines, are dropped."""
    lines = text.split("\n")
    i = 0
    while i < len(lines) and _CANARY_LINE.match(lines[i].strip()):
        i += 1
    while i < len(lines) and lines[i].strip() == "":
        i += 1
    return "\n".join(lines[i:])


def literal_env(env: dict[str, str], where: str) -> tuple[dict[str, str], str | None]:
    """A task's env table with harbor's ``${VAR:-default}`` templates resolved to their default.
    A template with no default names a host variable (an API key, say): trajforge passes nothing
    of the host's environment into a sandbox, so that is a reason to skip the task."""
    out: dict[str, str] = {}
    for key, value in env.items():
        missing = [m.group(1) for m in _TEMPLATE.finditer(value) if m.group(2) is None]
        if missing:
            return (
                {},
                f"[{where}] env {key} needs the host variable ${{{missing[0]}}}, which is never passed in",
            )
        out[key] = _TEMPLATE.sub(lambda m: m.group(2) or "", value)
    return out, None
