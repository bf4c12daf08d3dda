"""``EnvConfig``: how an environment runs its rollouts (the reference's fields, typed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trajforge.distributions import get_distribution
from trajforge.sandbox.types import SandboxKind
from trajforge.tools.toolsets import check_toolsets

MAX_READ_BYTES = 64 << 20
"""What reward code reads of a rollout's sandbox at most, per file or command output (64 MiB)."""


class EnvConfigError(ValueError):
    """An environment config that cannot be used; the message says what to change."""


class EnvConfig(BaseModel):
    """Validated at construction; impossible combinations say which field to change."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled_toolsets: list[str] | None = Field(
        None, description="toolsets offered to every rollout (exclusive with distribution)"
    )
    disabled_toolsets: list[str] = Field(default_factory=list, description="never offered")
    distribution: str | None = Field(
        None, description="toolset distribution each rollout draws from (seeded, recorded)"
    )
    max_agent_turns: int = Field(12, ge=1, description="model calls per rollout")
    system_prompt: str | None = Field(None, description="system prompt (the env's own when None)")
    agent_temperature: float = Field(1.0, ge=0.0, description="sampling temperature of rollouts")
    max_tokens: int | None = Field(None, ge=1, description="max new tokens per model call")
    sandbox: SandboxKind = Field("bwrap", description="sandbox backend: bwrap, local or docker")
    command_timeout_s: float = Field(60.0, gt=0, description="default timeout of one command")
    sandbox_lifetime_s: float = Field(600.0, gt=0, description="deadline of one rollout, reward included")
    reward_timeout_s: float = Field(300.0, gt=0, description="deadline of compute_reward")
    dataset_name: str | None = Field(None, description="Hugging Face dataset name (from the local cache)")
    dataset_split: str = Field("train", description="split of dataset_name")
    dataset_file: str | None = Field(None, description="local JSONL/JSON/Parquet file of items")
    prompt_field: str = Field("prompt", description="item field holding the prompt")
    tool_call_parser: str = Field("hermes", description="tool-call parser of a token-level endpoint")
    group_size: int = Field(4, ge=1, description="rollouts per item (GRPO group)")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="extra request fields")
    seed: int = Field(0, description="seeds item order and toolset draws")
    max_concurrent_rollouts: int = Field(16, ge=1, description="rollouts at once (changeable while running)")
    max_parallel_tools: int = Field(8, ge=1, description="concurrent tool calls within a rollout")
    max_read_bytes: int = Field(
        MAX_READ_BYTES,
        ge=1,
        description="most bytes reward code reads of one sandbox file or one verifier command's output; "
        "larger ones fail the read (checked before reading: a sparse file costs the sandbox no disk, "
        "the host its size in memory)",
    )
    stop_processes_before_reward: bool = Field(
        True,
        description="kill what the rollout left running before reward code looks (so nothing rewrites "
        "what it checks); an env that tests a service the agent started sets this False",
    )
    reward_shell: Literal["fresh", "session"] = Field(
        "fresh",
        description="where ctx.terminal runs reward commands: 'fresh' (a clean shell, the hardened "
        "environment; the safe default) or 'session' (the rollout's own shell: its cwd, variables and "
        "live processes, which are then not stopped before the reward; for checking a running service; "
        "see docs/security.md)",
    )

    @model_validator(mode="after")
    def _check(self) -> EnvConfig:
        if self.enabled_toolsets is not None and self.distribution is not None:
            raise ValueError(
                "enabled_toolsets and distribution are exclusive: keep enabled_toolsets for a fixed "
                "set, or distribution to draw one per rollout (set the other to null)"
            )
        if self.enabled_toolsets is not None:
            check_toolsets(self.enabled_toolsets)
        check_toolsets(self.disabled_toolsets)
        if self.distribution is not None:
            get_distribution(self.distribution)
        if self.dataset_name is not None and self.dataset_file is not None:
            raise ValueError("dataset_name and dataset_file are exclusive: keep one")
        return self

    def with_overrides(self, overrides: dict[str, Any]) -> EnvConfig:
        """A copy with ``overrides`` applied (None = not given; validated: a bad value raises
        ``EnvConfigError``). Both ``enabled_toolsets`` and ``distribution`` given is an error."""
        data = self.model_dump()
        given = {k: v for k, v in overrides.items() if v is not None}
        # Choosing one way to pick toolsets replaces the env's default of the other way.
        if "distribution" in given and "enabled_toolsets" not in given:
            data["enabled_toolsets"] = None
        if "enabled_toolsets" in given and "distribution" not in given:
            data["distribution"] = None
        data.update(given)
        return parse_env_config(data, type(self))


def parse_env_config(data: dict[str, Any], base: type[EnvConfig] = EnvConfig) -> EnvConfig:
    try:
        return base.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}" for err in exc.errors()
        )
        raise EnvConfigError(f"invalid env config: {problems}") from None


def load_env_config(
    path: Path,
    base: type[EnvConfig] | EnvConfig = EnvConfig,
    overrides: dict[str, Any] | None = None,
) -> EnvConfig:
    """Read a YAML config (an ``env:`` section or the fields at top level), then apply flags.
    With an env's default config as ``base``, the file changes only the fields it names (the
    env's own defaults -- toolsets, turns -- stay), as flags do."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise EnvConfigError(f"cannot read env config {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise EnvConfigError(f"env config {path} must be a mapping of fields")
    data = raw.get("env", raw)
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if isinstance(base, EnvConfig):
        return base.with_overrides(data)
    return parse_env_config(data, base)
