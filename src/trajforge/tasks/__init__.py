"""Seeded task generators with checkers: the training data of the tiny policy and RL environments.

>>> from trajforge.tasks import generate
>>> tasks = generate("arithmetic", 3, seed=1)
"""

from trajforge.tasks.families import FAMILIES, Family, last_integer, terminal_output
from trajforge.tasks.generate import (
    HELD_OUT_SEED,
    POLICY_FAMILIES,
    UnknownFamilyError,
    check,
    generate,
    generate_mixed,
    get_family,
    read_jsonl,
    setup_task,
    write_jsonl,
)
from trajforge.tasks.types import CheckResult, Solution, SolutionStep, Task

__all__ = [
    "HELD_OUT_SEED",
    "POLICY_FAMILIES",
    "FAMILIES",
    "CheckResult",
    "Family",
    "Solution",
    "SolutionStep",
    "Task",
    "UnknownFamilyError",
    "check",
    "generate",
    "generate_mixed",
    "get_family",
    "last_integer",
    "read_jsonl",
    "setup_task",
    "terminal_output",
    "write_jsonl",
]
