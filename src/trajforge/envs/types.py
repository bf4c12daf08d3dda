"""What an environment hands out (items), what its reward code returns; its rollouts' record is
the one :class:`~trajforge.record.Record`."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from trajforge.record import Record, TokenRecord

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


Episode = Record
"""An env's rollout record: the one :class:`~trajforge.record.Record` (the name stays for env
code; ``episodes.jsonl`` lines are records, keyed as ``batch`` keys its rows: ``record.keys``)."""

__all__ = ["Episode", "Item", "RewardBreakdown", "TokenRecord"]
