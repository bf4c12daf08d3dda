"""Seeded task generation, sandbox setup, checking and JSONL export.

Generation is a pure function of (family, n, seed): the same call always yields the same tasks,
so a training set and a held-out set are just two seeds.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from trajforge.tasks.families import FAMILIES, Family
from trajforge.tasks.types import CheckResult, Task

if TYPE_CHECKING:  # imported for annotations only: keeps this package free of import cycles
    from trajforge.protocols import Sandbox


POLICY_FAMILIES = ("arithmetic", "write_file", "count_lines", "count_words", "find_value")
"""The families the embedded policy is trained and measured on (the ``tiny_tasks`` env too)."""

HELD_OUT_SEED = 1_000_003
"""The seed of the held-out tasks every evaluation of the policy uses (model eval, env eval)."""


class UnknownFamilyError(ValueError):
    """A task family name that does not exist."""


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise UnknownFamilyError(
            f"unknown task family {name!r}; known families: {', '.join(FAMILIES)}"
        ) from None


def generate(family: str, n: int, seed: int = 0) -> list[Task]:
    """``n`` tasks of one family; reproducible for a given ``seed``."""
    fam = get_family(family)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"trajforge-tasks:{family}:{seed}")
    return [fam.make(rng, f"{family}-s{seed}-{i}") for i in range(n)]


def generate_mixed(families: Sequence[str], n: int, seed: int = 0) -> list[Task]:
    """``n`` tasks spread evenly over ``families`` (round-robin), reproducible for ``seed``."""
    if not families:
        raise ValueError("give at least one task family")
    per = -(-n // len(families))
    pools = {f: generate(f, per, seed) for f in families}
    return [pools[families[i % len(families)]][i // len(families)] for i in range(n)]


async def setup_task(task: Task, sandbox: Sandbox) -> None:
    """Place the task's files in the sandbox (before the model sees the prompt)."""
    for path, text in task.setup_files.items():
        await sandbox.write_bytes(path, text.encode())


async def check(task: Task, answer: str | None, sandbox: Sandbox | None = None) -> CheckResult:
    """Score an attempt: the final answer text and, for file tasks, the sandbox it left behind."""
    return await get_family(task.family).check(task, answer, sandbox)


def write_jsonl(tasks: Iterable[Task], path: str | Path) -> int:
    """Write tasks as ``trajforge batch`` dataset rows; returns how many were written."""
    rows = [orjson.dumps(t.to_row()) for t in tasks]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(b"".join(r + b"\n" for r in rows))
    return len(rows)


def read_jsonl(path: str | Path) -> list[Task]:
    """Read tasks written by :func:`write_jsonl`; a bad line raises naming its line number."""
    tasks = []
    for lineno, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            tasks.append(Task.from_row(orjson.loads(line)))
        except (orjson.JSONDecodeError, ValueError) as exc:
            raise ValueError(f"{path}:{lineno}: not a task row: {exc}") from exc
    return tasks
