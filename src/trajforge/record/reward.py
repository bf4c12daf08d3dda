"""The one reward type: what an env's ``compute_reward`` returns, what the judge hands the rollout
step, and what the record keeps, whole (``Record.reward``; docs/formats.md).

It sits on the ground floor with the record so that every floor can name it: the envs build it
(``RewardBreakdown`` is this class, under the name env files have always used), the rollout step
carries it, the record stores it, and the conversions a trainer needs (a scalar score, token
advantages aligned to a trace) live in ``rl/`` beside the trainers that need them.
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator


class Reward(BaseModel):
    """A judged rollout's reward, with its parts, its reason, and what the judge kept.

    ``value`` is what trainers use; None means not judged (the model was never reached, the
    rollout failed before its judge ran, the env's own ``evaluate()`` reported no score): a trainer
    reads it as 0 (:attr:`score`), reports leave it out of means. ``components`` are named partial
    scores (tests passed, format, length penalty, ...) kept for analysis; ``reason`` says why.
    ``error``: the reward code raised (or timed out); the rollout is scored 0 and this says why.
    ``token_advantages`` (optional): one value per sampled token of the episode's token trace, or
    one per position, for envs that score tokens (distillation: ``opd``); ``trajforge.rl`` aligns
    them to the trace.

    ``kept`` belongs here because the judge produces it (the env's ``keep`` hook runs in the judge,
    beside ``compute_reward``, in the same sandbox) and its only reader re-judges from it (``env
    rescore`` computes a new reward from the item, the messages and ``kept``): it is the judge's
    evidence, and a rollout that was never judged has none. How long judging took is not here:
    it is execution provenance (two runs of the same rollout differ in it), so the rollout step
    times the judge and the record keeps it in ``timings.reward_s``.

    Constructed as ``Reward(value=...)``; ``reward=`` is accepted as the same field, the spelling
    env files have always used (``RewardBreakdown(reward=1.0, components=..., reason=...)``), and
    so is ``breakdown.reward = 1.0`` on one the env is still building: a ``compute_reward``
    written against the old mutable ``RewardBreakdown`` that sets its fields as it goes must keep
    scoring what it scored (a frozen reward made such code raise, and a correct rollout scored 0
    as a reward failure). Assignments are validated as construction is. Past the env, trajforge
    itself never edits a reward on its way: a rescore or an env's own ``evaluate()`` makes a new
    one (:meth:`model_copy`)."""

    model_config = ConfigDict(populate_by_name=True, validate_assignment=True)

    value: float | None = Field(
        validation_alias=AliasChoices("value", "reward"),
        description="what trainers use; null: not judged (a trainer reads 0)",
    )
    components: dict[str, float] = Field(default_factory=dict, description="named partial scores")
    reason: str = ""
    error: str | None = Field(None, description="the reward code raised: scored 0 for this reason")
    token_advantages: list[float] | None = Field(
        None, description="per sampled token (or per position) of the token trace, for envs that score tokens"
    )
    kept: dict[str, Any] = Field(default_factory=dict, description="what the env kept for `env rescore`")

    @field_validator("value", mode="before")
    @classmethod
    def _no_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):  # pydantic would read True as 1.0
            raise ValueError("a reward is a number or null, not a boolean")
        return value

    @classmethod
    def of(cls, value: float | Reward) -> Reward:
        """What ``compute_reward`` returned, as a reward: a :class:`Reward` as it is, a number as
        its value. Anything else (a boolean included: it is no score) raises ``TypeError``."""
        if isinstance(value, Reward):
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(
                f"compute_reward must return a float or a RewardBreakdown, not {type(value).__name__}"
            )
        return cls(value=float(value))

    @classmethod
    def not_judged(cls, reason: str) -> Reward:
        """No reward, and why (a trainer reads it as 0; means leave it out)."""
        return cls(value=None, reason=reason)

    @classmethod
    def failed(cls, error: str) -> Reward:
        """The reward code raised ``error``: scored 0, the error kept."""
        return cls(value=0.0, reason=f"reward failed: {error}", error=error)

    @property
    def reward(self) -> float | None:
        """:attr:`value`, under the name env code has always read and set it by
        (``breakdown.reward``)."""
        return self.value

    @reward.setter
    def reward(self, value: float | None) -> None:
        self.value = value

    @property
    def judged(self) -> bool:
        return self.value is not None

    @property
    def score(self) -> float:
        """The reward a trainer uses: 0.0 when not judged."""
        return 0.0 if self.value is None else float(self.value)
