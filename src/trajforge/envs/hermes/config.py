"""``HermesAgentEnvConfig``: the seed's env config as a trajforge :class:`EnvConfig`.

A seed env's ``config_init()`` builds one with the seed's own field names (``terminal_backend``,
``terminal_timeout``, ``max_token_length``, ...) and atroposlib's ``BaseEnvConfig`` fields; its
code reads them back (``self.config.max_token_length``, ``self.config.terminal_backend``) and
sometimes sets them (Terminal-Bench 2's ``setup`` sets ``terminal_lifetime``). So every one of
them is a real field here, with the seed's default, and the ones that mean something to
trajforge also give the trajforge field its value:

=====================  ======================  ==================================================
seed field             trajforge field         how
=====================  ======================  ==================================================
``terminal_backend``   ``sandbox``             :data:`SEED_BACKENDS` (one note says which)
``terminal_timeout``   ``command_timeout_s``   seconds, as is
``terminal_lifetime``  ``sandbox_lifetime_s``  the seed's idle limit is the rollout's whole deadline
``max_token_length``   ``max_tokens``          per model call, as the seed sends it
=====================  ======================  ==================================================

The trajforge field is derived only when not given itself: a ``--sandbox`` on the command line
wins over the file's ``terminal_backend``, and a ``--config`` that changes ``terminal_backend``
derives ``sandbox`` again (:meth:`HermesAgentEnvConfig.with_overrides`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from trajforge.envs.config import EnvConfig, parse_env_config

# The seed's terminal backends -> trajforge's sandbox, and why that one.
SEED_BACKENDS: dict[str, str] = {
    "local": "bwrap",
    "docker": "docker",
    "modal": "bwrap",
    "daytona": "bwrap",
    "singularity": "bwrap",
    "ssh": "bwrap",
}
_WHY = {
    "local": "the seed ran commands on this machine without isolation; --sandbox local does that here",
    "docker": "a container per rollout, as the seed's",
    "modal": "a cloud sandbox per rollout there; an isolated sandbox per rollout on this machine here",
    "daytona": "a cloud sandbox per rollout there; an isolated sandbox per rollout on this machine here",
    "singularity": "a rootless container there; bubblewrap is the rootless isolation here",
    "ssh": "a remote machine there; commands run isolated on this machine here",
}

# The seed field -> (the trajforge field it gives a value, how).
_DERIVED: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "terminal_backend": ("sandbox", lambda b: SEED_BACKENDS.get(str(b), b)),
    "terminal_timeout": ("command_timeout_s", float),
    "terminal_lifetime": ("sandbox_lifetime_s", float),
    "max_token_length": ("max_tokens", int),
}

# atroposlib 0.4 ``BaseEnvConfig`` fields that trajforge does not use (group_size and
# max_token_length it does). Kept as fields so a seed config that sets them, and seed code that
# reads them, work; docs/hermes.md says what becomes of each.
ATROPOS_FIELDS = (
    "max_num_workers",
    "max_eval_workers",
    "max_num_workers_per_node",
    "steps_per_eval",
    "eval_handling",
    "eval_limit_ratio",
    "inference_weight",
    "batch_size",
    "max_batches_offpolicy",
    "tokenizer_name",
    "use_wandb",
    "rollout_server_url",
    "total_steps",
    "wandb_name",
    "num_rollouts_to_keep",
    "num_rollouts_per_group_for_logging",
    "ensure_scores_are_not_same",
    "data_path_to_save_groups",
    "data_dir_to_save_evals",
    "min_items_sent_before_logging",
    "include_messages",
    "min_batch_allocation",
    "worker_timeout",
    "thinking_mode",
    "reasoning_effort",
    "max_reasoning_tokens",
    "custom_thinking_prompt",
)


class BudgetConfig(BaseModel):
    """The seed's tool-result budget (``tools.budget_config.BudgetConfig``), as
    ``build_budget_config()`` returns it. Accepted and not applied: trajforge's tool output limits
    (``ToolLimits``: head and tail of a long output kept) decide what the model sees."""

    default_result_size: int = 100_000
    turn_budget: int = 200_000
    preview_size: int = 2_000
    tool_overrides: dict[str, int] = Field(default_factory=dict)


class HermesAgentEnvConfig(EnvConfig):
    """The seed's env config (its defaults: 30 agent turns, 120 s per command, ...) on trajforge's."""

    max_agent_turns: int = Field(30, ge=1, description="model calls per rollout (the seed's default 30)")
    # -- the seed's own fields
    terminal_backend: str = Field(
        "local", description="the seed's terminal backend; sets sandbox (see SEED_BACKENDS) unless given"
    )
    terminal_timeout: int = Field(
        120, ge=1, description="the seed's per-command timeout; sets command_timeout_s"
    )
    terminal_lifetime: int = Field(
        3600, ge=1, description="the seed's sandbox lifetime; sets sandbox_lifetime_s"
    )
    tool_pool_size: int = Field(
        128, ge=1, description="the seed's tool thread pool; unused (tools are async)"
    )
    default_result_size_chars: int = Field(100_000, description="the seed's tool-result budget; not applied")
    turn_budget_chars: int = Field(200_000, description="the seed's tool-result budget; not applied")
    preview_size_chars: int = Field(2_000, description="the seed's tool-result budget; not applied")
    tool_result_overrides: dict[str, int] | None = Field(None, description="the seed's; not applied")
    # -- atroposlib BaseEnvConfig (0.4)
    max_token_length: int = Field(2048, ge=1, description="atroposlib's; sets max_tokens (per model call)")
    max_num_workers: int = -1
    max_eval_workers: int = 16
    max_num_workers_per_node: int = 8
    steps_per_eval: int = 100
    eval_handling: Any = "STOP_TRAIN"
    eval_limit_ratio: float = 0.5
    inference_weight: float = 1.0
    batch_size: int = -1
    max_batches_offpolicy: int = 3
    tokenizer_name: str = "NousResearch/DeepHermes-3-Llama-3-3B-Preview"
    use_wandb: bool = True
    rollout_server_url: str = "http://localhost:8000"
    total_steps: int = 1000
    wandb_name: str | None = None
    num_rollouts_to_keep: int = 32
    num_rollouts_per_group_for_logging: int = 1
    ensure_scores_are_not_same: bool = True
    data_path_to_save_groups: str | None = None
    data_dir_to_save_evals: str | None = None
    min_items_sent_before_logging: int = 2
    include_messages: bool = False
    min_batch_allocation: float | None = None
    worker_timeout: float = 600.0
    thinking_mode: bool = False
    reasoning_effort: str | None = None
    max_reasoning_tokens: int | None = None
    custom_thinking_prompt: str | None = None
    # -- trajforge's, for a seed env
    evaluation: Literal["auto", "rollouts", "evaluate"] = Field(
        "auto",
        description="what `env eval` runs: 'rollouts' (items from get_next_item, each scored by "
        "compute_reward), 'evaluate' (the env's own evaluate(), its HermesAgentLoop runs recorded as "
        "episodes), or 'auto' (evaluate when compute_reward only returns a constant: an eval-only env)",
    )
    sandbox_path: list[str] = Field(
        default_factory=list,
        description="host directories put first on the sandbox's PATH (bound read-only into bwrap "
        "and docker sandboxes): where programs the env's tasks run live (the seed's local backend "
        "saw the host's PATH)",
    )

    @field_validator("sandbox_path")
    @classmethod
    def _absolute(cls, dirs: list[str]) -> list[str]:
        for d in dirs:
            if not d.startswith("/"):
                raise ValueError(f"sandbox_path: {d!r} must be an absolute path")
        return dirs

    @model_validator(mode="before")
    @classmethod
    def _seed_fields(cls, data: Any) -> Any:
        """Derive the trajforge fields from the seed's, each only where not given itself."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        backend = data.get("terminal_backend", "local")
        if backend not in SEED_BACKENDS and backend != "bwrap":
            raise ValueError(
                f"terminal_backend {backend!r} is not one of the seed's backends "
                f"({', '.join(SEED_BACKENDS)}); or set sandbox: bwrap|docker|local"
            )
        for seed, (ours, convert) in _DERIVED.items():
            if ours not in data:
                value = data.get(seed, cls.model_fields[seed].default)
                data[ours] = convert(value)
        if data.get("disabled_toolsets") is None:
            data.pop("disabled_toolsets", None)
        if data.get("extra_body") is None:
            data.pop("extra_body", None)
        return data

    def with_overrides(self, overrides: dict[str, Any]) -> EnvConfig:
        """As :meth:`EnvConfig.with_overrides`; a seed field given without the trajforge field it
        sets (``terminal_backend`` without ``sandbox``) derives that field again."""
        given = {k: v for k, v in overrides.items() if v is not None}
        data = self.model_dump()
        if "distribution" in given and "enabled_toolsets" not in given:
            data["enabled_toolsets"] = None
        if "enabled_toolsets" in given and "distribution" not in given:
            data["distribution"] = None
        for seed, (ours, _) in _DERIVED.items():
            if seed in given and ours not in given:
                data.pop(ours, None)
        data.update(given)
        return parse_env_config(data, type(self))

    def build_budget_config(self) -> BudgetConfig:
        """The seed's tool-result budget of this config (accepted, not applied: see BudgetConfig)."""
        return BudgetConfig(
            default_result_size=self.default_result_size_chars,
            turn_budget=self.turn_budget_chars,
            preview_size=self.preview_size_chars,
            tool_overrides=dict(self.tool_result_overrides or {}),
        )

    def seed_notes(self) -> list[str]:
        """One line per seed setting whose meaning here differs, for the operator."""
        notes = []
        backend = self.terminal_backend
        mapped = SEED_BACKENDS.get(backend, backend)
        if backend != "bwrap" and self.sandbox == mapped:
            notes.append(
                f"terminal_backend {backend!r} runs in trajforge's {self.sandbox} sandbox "
                f"({_WHY.get(backend, 'as named')}); --sandbox bwrap|docker|local chooses another"
            )
        elif backend != "bwrap":
            notes.append(f"terminal_backend {backend!r} is not used: sandbox {self.sandbox!r} was given")
        return notes


def sandbox_for(backend: str) -> str:
    """The trajforge sandbox the seed's ``terminal_backend`` runs in (:data:`SEED_BACKENDS`)."""
    return SEED_BACKENDS.get(backend, backend)


__all__ = [
    "ATROPOS_FIELDS",
    "SEED_BACKENDS",
    "BudgetConfig",
    "HermesAgentEnvConfig",
    "sandbox_for",
]
