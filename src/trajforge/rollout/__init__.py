"""One rollout step below the factory and the environments (floor 4): draw -> sandbox ->
session -> judge -> trace -> status -> one :class:`~trajforge.record.Record`."""

from trajforge.rollout.records import Asked, Identity, build_record, seeded, sent_sampling
from trajforge.rollout.status import Outcome, classify
from trajforge.rollout.step import (
    Judge,
    RolloutBackends,
    RolloutOutcome,
    RolloutRequest,
    draw_toolsets,
    run_rollout,
)

__all__ = [
    "Asked",
    "Identity",
    "Judge",
    "Outcome",
    "RolloutBackends",
    "RolloutOutcome",
    "RolloutRequest",
    "build_record",
    "classify",
    "draw_toolsets",
    "run_rollout",
    "seeded",
    "sent_sampling",
]
