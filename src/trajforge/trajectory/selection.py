"""Which samples of a run an export keeps: rejection sampling over the record's own fields.

A run keeps every sample with its status and, when graded, its reward; training usually wants
only some of them (the solved ones, the best few per prompt, those whose answer its own tool
outputs support). :class:`Selection` says which, and :func:`left_out_reason` says of one record
why it is not kept, so an export can count every sample it leaves out by reason instead of
dropping it silently. Everything here reads the fields a record carries (``status``, ``reward``,
``prompt_index``, ``key``); nothing depends on which file a record came from.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trajforge.trajectory.pairs import reward_of

Status = Literal["completed", "partial", "failed", "filtered"]
STATUSES: tuple[Status, ...] = ("completed", "partial", "failed", "filtered")
# where each status lives in a batch run directory
STATUS_FILES: dict[Status, str] = {
    "completed": "trajectories.jsonl",
    "partial": "failed.jsonl",
    "failed": "failed.jsonl",
    "filtered": "filtered.jsonl",
}


class Selection(BaseModel):
    """What a sample must be to be exported (for ``dpo``: to be the chosen answer of a pair)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    statuses: frozenset[Status] | None = Field(
        None, description="keep only samples with one of these statuses (default: every status read)"
    )
    min_reward: float | None = Field(
        None,
        description="keep only graded samples whose reward is at least this (ungraded ones are left out)",
    )
    max_per_prompt: int | None = Field(
        None, ge=1, description="keep at most N samples per prompt_index, highest reward first"
    )
    grounded: bool = Field(
        False,
        description="keep only samples whose final answer states no number that neither the prompt nor "
        "one of its own tool results shows (trajectory.grounding)",
    )

    @field_validator("min_reward")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("min_reward must be a finite number, e.g. 1 or 0.5")
        return value

    def files(self) -> list[str] | None:
        """The run files that can hold the selected statuses (None: no status filter)."""
        if self.statuses is None:
            return None
        return sorted({STATUS_FILES[s] for s in self.statuses}, key=list(STATUS_FILES.values()).index)

    def left_out_reason(self, line: Mapping[str, Any]) -> str | None:
        """Why ``line`` is not selected by status or reward (None: it is)."""
        if self.statuses is not None and line.get("status") not in self.statuses:
            return f"status {line.get('status')} not selected"
        if self.min_reward is not None:
            reward = reward_of(line)
            if reward is None:
                return "ungraded (no reward) with --min-reward"
            if reward < self.min_reward:
                return f"reward below {self.min_reward:g}"
        return None


def best_per_prompt(records: Iterable[tuple[Any, float | None, str]], limit: int) -> set[str]:
    """The keys to keep when each ``prompt_index`` keeps at most ``limit`` samples: highest reward
    first (ungraded last), then key order, so the choice is the same on every run of the export.
    ``records`` are (prompt_index, reward, key)."""
    groups: dict[Any, list[tuple[float | None, str]]] = {}
    for index, reward, key in records:
        groups.setdefault(index, []).append((reward, key))
    keep: set[str] = set()
    for members in groups.values():
        members.sort(key=lambda m: (m[0] is None, -(m[0] or 0.0), m[1]))
        keep.update(key for _, key in members[:limit])
    return keep
