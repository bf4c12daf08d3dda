"""What an environment hands out (items), what its reward code returns, and the episode record."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

Item = dict[str, Any]
"""One task of an environment. Plain JSON data: it is stored in every episode record (so a run
can be rescored and resumed) and it crosses process boundaries (Atropos, Ray) as it is."""


class RewardBreakdown(BaseModel):
    """A reward with its parts and the reason for it.

    ``components`` are named partial scores (tests passed, format, length penalty, ...) kept for
    analysis; ``reward`` is what trainers use. ``token_advantages`` (optional) gives one value
    per sampled token of the episode's token trace, for envs that score tokens (distillation).
    """

    reward: float
    components: dict[str, float] = Field(default_factory=dict)
    reason: str = ""
    token_advantages: list[float] | None = None

    @classmethod
    def of(cls, value: float | RewardBreakdown) -> RewardBreakdown:
        if isinstance(value, RewardBreakdown):
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(
                f"compute_reward must return a float or a RewardBreakdown, not {type(value).__name__}"
            )
        return cls(reward=float(value))


class TokenRecord(BaseModel):
    """The episode's exact tokens, in the Atropos convention: ``masks`` is -100 where the model
    did not sample (prompt, tool results: not trained) and the token id where it did;
    ``logprobs`` are the sampler's (1.0 where masked, as Atropos writes it). All of equal length."""

    tokens: list[int]
    masks: list[int]
    logprobs: list[float]
    token_advantages: list[float] | None = None
    span_versions: list[tuple[int, int, int]] | None = None
    """``(start, end, model_version)`` of each sampled turn when the server named the weights
    that sampled it: a multi-turn episode can straddle a weight reload (staleness per span)."""


class Episode(BaseModel):
    """One rollout of one item, judged. One record serves SFT (messages), DPO (reward within a
    group) and RL (tokens/masks/logprobs + reward)."""

    env: str
    item_id: str
    rollout: int = Field(description="index of this rollout within its group")
    group_size: int
    seed: int = Field(description="seeds this rollout's toolset draw (and sampling, where supported)")
    category: str | None = None
    item: Item
    toolsets: list[str]
    tools: list[str]
    messages: list[dict[str, Any]]
    status: str = Field(description="completed | partial | failed (as in batch lines)")
    reason: str | None = None
    termination: str
    turns: int = 0
    reward: float = 0.0
    reward_components: dict[str, float] = Field(default_factory=dict)
    reward_reason: str = ""
    reward_error: str | None = Field(None, description="the reward code raised: scored 0 for this reason")
    trace: TokenRecord | None = None
    trace_error: str | None = Field(None, description="why a token-level endpoint gave no usable trace")
    kept: dict[str, Any] = Field(
        default_factory=dict, description="what the env declared to keep for `env rescore`"
    )
    model: str | None = None
    wall_s: float = 0.0
    reward_s: float = 0.0
    # what a batch line records too (the run report reads both): tokens and where the time went
    usage: dict[str, int] = Field(default_factory=dict, description="token usage summed over the model calls")
    model_s: float = Field(0.0, description="seconds spent waiting for the model")
    tool_s: float = Field(0.0, description="seconds spent running tools")
    finished_at: str | None = Field(None, description="when the episode was recorded (ISO 8601, UTC)")

    @property
    def key(self) -> str:
        return f"{self.item_id}#{self.rollout}"
