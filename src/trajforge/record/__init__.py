"""The one record of a rollout (docs/formats.md, "The record"): its type, the reader that
upgrades older lines into it, and the reference's ShareGPT view of it.

On the ground floor with ``trajectory/`` and ``report/``: the factory, the envs and the trainers
write it; everything that reads run files reads it, without importing any of them.
"""

from trajforge.record.model import SCHEMA_VERSION, Record, Status, Timings, TokenRecord, ToolCounts
from trajforge.record.reward import Reward
from trajforge.record.upgrade import RecordError, load, read

__all__ = [
    "SCHEMA_VERSION",
    "Record",
    "RecordError",
    "Reward",
    "Status",
    "Timings",
    "TokenRecord",
    "ToolCounts",
    "load",
    "read",
]
