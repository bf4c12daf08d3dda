"""``TrainConfig``: every setting of ``trajforge rl train``, typed and validated before any model loads.

The CLI flags are fields of this model and ``--config FILE`` (YAML or JSON) gives the rest, so a
run directory's ``config.json`` is the whole recipe, and a resumed run can check it is the same
recipe it started with (:data:`RESUME_KEYS`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Trainer = Literal["builtin", "trl"]


class TrainConfigError(ValueError):
    """A training config that cannot be used; the message says what to change."""


DEFAULT_WARM_UPDATES = 250


class WarmPhase(BaseModel):
    """One stage of a phased warm start: so many updates on demonstrations of one item mix."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    updates: int = Field(ge=1, description="optimizer updates of this phase")
    env_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="EnvConfig fields for this phase's items, applied over the warm start's own",
    )


class WarmStart(BaseModel):
    """Supervised updates on the env's reference trajectories before the first GRPO step
    (:mod:`trajforge.rl.warm_start`): how many, how large, how fast, on which item mix -- or, with
    ``phases``, on which mixes in turn."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    updates: int | None = Field(
        None,
        ge=1,
        description=f"optimizer updates (each on `batch` demonstrations: fresh ones, or the next of the "
        f"fixed `demos` set); {DEFAULT_WARM_UPDATES} "
        "when there are no `phases`",
    )
    batch: int = Field(10, ge=1, description="demonstrations per update")
    demos: int | None = Field(
        None,
        ge=1,
        description="a fixed set of this many oracle episodes per phase, collected once and cycled "
        "through (epochs), in place of fresh demonstrations for every update: a demonstration "
        "dataset of a given size, as a user has one (kept as demonstrations.jsonl beside the model; "
        "rl demo's supervised control trains on the same set)",
    )
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate of the warm start")
    decay: float = Field(
        0.2, ge=0, le=1, description="linear lr decay to 0 over this last share of the updates"
    )
    focal: float = Field(
        0.0,
        ge=0,
        description="weight each demonstrated token's loss by (1 - p)^focal (0 = plain NLL): the "
        "update goes to the tokens the policy gets wrong (a value to copy) rather than the many it "
        "already writes right",
    )
    env_overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="EnvConfig fields for the demonstration items, applied over the run's env_overrides "
        "(e.g. every family, so families GRPO does not train on are replayed, not forgotten)",
    )
    phases: list[WarmPhase] = Field(
        default_factory=list,
        description="a curriculum in place of `updates`: each phase's updates on its own item mix, in "
        "order, one optimizer and one lr schedule over all of them (e.g. a skill the mix drowns "
        "alone first, then every family to win the others back)",
    )

    @model_validator(mode="after")
    def _updates_or_phases(self) -> WarmStart:
        # `updates` stays None beside `phases`, so a dumped config (config.json, a managed run's
        # train.yaml) validates again as it was written.
        if self.phases and self.updates is not None:
            raise ValueError(
                "warm_start: give either `updates` (one phase) or `phases` (each with its own updates), "
                "not both"
            )
        if not self.phases and self.updates is None:
            self.updates = DEFAULT_WARM_UPDATES
        return self

    def schedule(self) -> list[WarmPhase]:
        """The phases to run: ``phases``, or one of ``updates`` on ``env_overrides``."""
        return list(self.phases) or [WarmPhase(updates=self.updates or DEFAULT_WARM_UPDATES)]

    @property
    def total_updates(self) -> int:
        return sum(p.updates for p in self.schedule())


class LoraSettings(BaseModel):
    """LoRA adapters through ``peft`` in place of full fine-tuning (:mod:`trajforge.rl.fit`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    r: int = Field(16, ge=1, description="adapter rank")
    alpha: int = Field(32, ge=1, description="scale: the update is B @ A * alpha / r")
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="dropout on the adapters' input; 0 keeps the on-policy ratio at exactly 1",
    )
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="module names to adapt (e.g. [q_proj, v_proj]), or all-linear: every linear "
        "layer but the output head",
    )
    reload: Literal["adapter", "merged"] = Field(
        "adapter",
        description="what the rollout server loads after each step: the adapters alone (it merges "
        "them onto the base it started from: small files) or the merged weights (a full checkpoint "
        "every step, as a server that takes no adapter needs)",
    )


Precision = Literal["auto", "fp32", "bf16"]


class TrainConfig(BaseModel):
    """GRPO on an env's rollouts. Step = ``groups_per_step`` items x ``group_size`` rollouts."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), allow_inf_nan=False)

    env: str = Field(description="env name or path/to/file.py:ClassName")
    model: Path = Field(description="local transformers model directory (weights + tokenizer)")
    trainer: Trainer = Field("builtin", description="builtin (torch GRPO against trajforge serve) or trl")
    output_dir: Path = Field(Path("runs/rl"), description="checkpoints, metrics.jsonl, state.json")
    steps: int = Field(20, ge=1, description="optimizer steps (each on one fresh batch of groups)")
    group_size: int = Field(8, ge=2, description="rollouts per item; advantages are normalised within it")
    groups_per_step: int = Field(8, ge=1, description="items per step")
    lr: float = Field(3e-4, gt=0, description="AdamW learning rate")
    warmup_steps: int = Field(
        0,
        ge=0,
        description="linear lr warm-up over the first N steps (0 = none): AdamW's first updates move "
        "every weight by ~lr whatever its gradient, which at a high lr wrecks a policy in one step",
    )
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping")
    clip_low: float = Field(0.2, gt=0, lt=1, description="ratio clipped below at 1 - clip_low")
    clip_high: float = Field(0.28, gt=0, description="ratio clipped above at 1 + clip_high")
    kl_coef: float = Field(
        0.0, ge=0, description="weight of the KL to the initial (reference) policy; 0 = none"
    )
    minibatches: int = Field(
        1, ge=1, description="optimizer updates per epoch (the batch split in this many)"
    )
    epochs: int = Field(
        1,
        ge=1,
        description="passes over a step's batch (>1 reuses samples; the clipped ratio bounds the drift)",
    )
    max_staleness: int = Field(
        1,
        ge=0,
        description="rollouts for step k+1 may be sampled while step k trains, from weights at most "
        "this many steps old (0 = strictly on-policy); the clipped ratio corrects the difference",
    )
    scale_rewards: bool = Field(True, description="divide group advantages by the group's std")
    skip_uniform_groups: bool = Field(
        True, description="drop groups whose rewards are all equal (zero advantage: no signal)"
    )
    guide: Literal["none", "oracle"] = Field(
        "none",
        description="oracle: in a group with no success, replace one episode by the env's reference "
        "solution (needs oracle_calls), trained off-policy with the current policy's logprobs",
    )
    warm_start: WarmStart | None = Field(
        None,
        description="supervised warm start on the env's oracle trajectories before GRPO (None = off); "
        "GRPO then starts from, and takes its KL reference from, the warm-started weights",
    )
    temperature: float | None = Field(
        None, ge=0, description="rollout sampling temperature (default: the env's agent_temperature)"
    )
    max_tokens: int | None = Field(
        None, ge=1, description="max new tokens per model call (default: the env's, else 256)"
    )
    max_turns: int | None = Field(None, ge=1, description="model calls per rollout (default: the env's)")
    concurrency: int = Field(32, ge=1, description="rollouts at once")
    max_batch: int = Field(32, ge=1, description="sequences the server decodes together")
    micro_batch: int = Field(
        16,
        ge=1,
        description="sequences per forward/backward pass; an update accumulates the gradients of "
        "its micro-batches (gradient accumulation: the same update as one batch, in less memory)",
    )
    lora: LoraSettings | None = Field(
        None, description="train LoRA adapters (peft) instead of every weight (None = full fine-tuning)"
    )
    precision: Precision = Field(
        "auto",
        description="bf16: autocast the forward pass to bf16 (weights, gradients and optimizer stay "
        "float32); auto: bf16 on a CUDA device that has it, else fp32",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="recompute each layer's activations in the backward pass (less memory, ~30% more compute)",
    )
    device: str = Field("auto", description="training device: auto (cuda when present), cpu, cuda, cuda:N")
    serve_device: str = Field("cpu", description="device of the rollout server (trajforge serve --device)")
    serve_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "float32",
        description="rollout server dtype; float32 keeps its logprobs equal to the trainer's (ratio 1 on-policy)",
    )
    checkpoint_every: int = Field(1, ge=1, description="keep a resumable checkpoint every N steps")
    keep_checkpoints: int = Field(2, ge=1, description="newest resumable checkpoints kept on disk")
    seed: int = Field(0, description="seeds training items, rollouts and torch")
    env_overrides: dict[str, Any] = Field(
        default_factory=dict, description="EnvConfig fields for the training env (e.g. families: [...])"
    )
    sandbox: str | None = Field(None, description="sandbox backend (default: the env's)")
    records: Path | None = Field(
        None,
        description="train on the records of this run directory (batch --env --tokenizer, env eval) "
        "instead of sampling rollouts: groups by prompt, the ratio against the recorded logprobs",
    )

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if not (self.model / "config.json").is_file():
            raise ValueError(
                f"model {str(self.model)!r} is not a local transformers model directory (no config.json); "
                "pass a directory written by save_pretrained (with its tokenizer)"
            )
        if self.minibatches > self.groups_per_step:
            raise ValueError(
                f"minibatches={self.minibatches} > groups_per_step={self.groups_per_step}: each update "
                "needs at least one group; lower minibatches or raise groups_per_step"
            )
        if self.trainer == "trl" and self.warm_start is not None:
            raise ValueError(
                "warm_start runs in the builtin trainer only; use --trainer builtin, or warm-start with "
                "the builtin trainer first and pass its OUTPUT_DIR/warm_start as --model"
            )
        if self.records is not None and (self.trainer != "builtin" or self.warm_start is not None):
            raise ValueError(
                "records train with the builtin trainer and no warm start; drop --trainer/warm_start"
            )
        if self.trainer == "trl" and self.max_staleness:
            object.__setattr__(self, "max_staleness", 0)  # TRL samples between its own steps
        return self

    @property
    def episodes_per_step(self) -> int:
        return self.group_size * self.groups_per_step


def step_lr(config: TrainConfig, step: int) -> float:
    """The learning rate of (1-based) ``step``: ramps linearly to ``lr`` over ``warmup_steps``.
    A function of the step alone, so a resumed run continues the same schedule."""
    if config.warmup_steps <= 0:
        return config.lr
    return config.lr * min(1.0, step / config.warmup_steps)


RESUME_KEYS = ("env", "trainer", "group_size", "groups_per_step", "seed", "env_overrides", "warm_start")
"""Fields a resumed run must share with the run it continues (the rest may change, e.g. steps)."""


def load_config_file(path: Path) -> dict[str, Any]:
    """A YAML or JSON mapping of :class:`TrainConfig` fields."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise TrainConfigError(f"cannot read --config {path}: {exc}") from None
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TrainConfigError(
            f"--config {path} must hold a mapping of TrainConfig fields, not {type(data).__name__}"
        )
    return data


def build_config(file_data: dict[str, Any], flags: dict[str, Any]) -> TrainConfig:
    """File values, then the flags that were given (None = not given); errors name the field."""
    data = dict(file_data)
    data.update({k: v for k, v in flags.items() if v is not None})
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors()
        )
        raise TrainConfigError(f"invalid training config: {problems}") from None
