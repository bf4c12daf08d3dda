"""What an environment hands out (items), what its reward code returns; its rollouts' record is
the one :class:`~trajforge.record.Record`."""

from __future__ import annotations

from typing import Any

from trajforge.record import Record, Reward, TokenRecord

Item = dict[str, Any]
"""One task of an environment. Plain JSON data: it is stored in every episode record (so a run
can be rescored and resumed) and it crosses process boundaries (Atropos, Ray) as it is."""

RewardBreakdown = Reward
"""What ``compute_reward`` may return besides a float: the one :class:`~trajforge.record.Reward`,
under the name env files have always used. ``RewardBreakdown(value=1.0, components=...,
reason=..., token_advantages=...)`` builds it (``reward=`` is the value's env-side spelling;
``value=`` is the same field); the judge hands it to the record whole."""

Episode = Record
"""An env's rollout record: the one :class:`~trajforge.record.Record` (the name stays for env
code; ``episodes.jsonl`` lines are records, keyed as ``batch`` keys its rows: ``record.keys``)."""

__all__ = ["Episode", "Item", "Reward", "RewardBreakdown", "TokenRecord"]
