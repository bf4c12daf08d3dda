"""What a generated task is, what a checker returns, and what a reference solution looks like.

A task is plain data (so it round-trips through JSONL and a batch dataset); the code that checks
it lives with its family (:mod:`trajforge.tasks.families`) and is looked up by the family name.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Task(BaseModel):
    """One generated task: a prompt, files to place in the sandbox first, and what counts as right.

    ``expected`` is the answer the checker wants (a number, a value, or a file's text), kept
    separately from ``metadata`` so reward code never has to guess where it lives.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    family: str
    prompt: str
    setup_files: dict[str, str] = Field(
        default_factory=dict, description="path (relative to the sandbox workdir) -> text content"
    )
    expected: str = Field(description="the answer the checker accepts")
    metadata: dict[str, Any] = Field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        """A ``trajforge batch`` dataset row: ``prompt`` plus everything needed to set up and check."""
        return {
            "prompt": self.prompt,
            "task_id": self.id,
            "family": self.family,
            "setup_files": dict(self.setup_files),
            "expected": self.expected,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Task:
        """Inverse of :meth:`to_row`; raises ``ValueError`` naming the missing field."""
        for key in ("prompt", "task_id", "family", "expected"):
            if key not in row:
                raise ValueError(
                    f"task row has no {key!r} field; rows are written by trajforge.tasks.write_jsonl"
                )
        return cls(
            id=row["task_id"],
            family=row["family"],
            prompt=row["prompt"],
            setup_files=row.get("setup_files") or {},
            expected=str(row["expected"]),
            metadata=row.get("metadata") or {},
        )


class CheckResult(BaseModel):
    """A checker's verdict: a reward in [0, 1] and why (every verdict carries its reason)."""

    reward: float = Field(ge=0.0, le=1.0)
    reason: str

    @property
    def success(self) -> bool:
        return self.reward >= 1.0


class SolutionStep(BaseModel):
    """One tool call of a reference solution, with the short thought that precedes it."""

    thought: str
    tool: str
    arguments: dict[str, Any]


class Solution(BaseModel):
    """A reference solution: tool calls to make, then an answer built from their real outputs.

    ``answer_template`` is formatted with ``{result}``: the value read back from the last tool
    output by the family (so the answer in synthetic data is what the sandbox actually printed).
    """

    steps: list[SolutionStep]
    final_thought: str
    answer_template: str
