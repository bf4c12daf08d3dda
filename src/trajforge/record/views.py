"""Views of a :class:`Record`: the reference's ShareGPT line, which batch lines carry beside the
record (so a reader of the reference's format reads them unchanged) and which exports render.

A view is computed from the record and never read back as its truth: the record's ``messages``
are the conversation; ``conversations`` are how the reference writes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trajforge.record.model import Record
from trajforge.trajectory import system_prompt, to_sharegpt

VIEW_FIELDS = ("conversations", "metadata", "completed", "partial", "api_calls", "toolsets_used")
"""The reference line's fields that a version-2 batch line carries beside the record."""


def prompt_of(record: Record) -> str:
    """The user prompt the rollout was asked (the item's ``prompt``, else the first user message)."""
    prompt = record.item.get("prompt")
    if isinstance(prompt, str):
        return prompt
    return next((str(m.get("content") or "") for m in record.messages if m.get("role") == "user"), "")


def conversations(record: Record, tools: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """The ShareGPT turns: the ones a batch line stored, else rendered from the messages with the
    canonical system turn listing ``tools`` (the schemas offered)."""
    stored = (record.model_extra or {}).get("conversations")
    if isinstance(stored, list):
        return stored
    if record.messages:
        return to_sharegpt(record.messages, tools, prompt=prompt_of(record))
    return [{"from": "system", "value": system_prompt(tools)}, {"from": "human", "value": prompt_of(record)}]


def metadata(record: Record) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "batch_num": record.timings.worker if record.timings.worker is not None else 0,
        "timestamp": record.timings.finished_at,
        "model": record.model,
        "seed": record.seed,
    }
    if record.system_prompt is not None:
        meta["system_prompt"] = record.system_prompt
    row = {k: v for k, v in record.item.items() if k not in ("prompt", "setup_files")}
    if row:
        meta["row"] = row
    if record.group_size > 1:
        meta["sample_index"] = record.rollout
        meta["samples_per_prompt"] = record.group_size
    return meta


def reference_view(record: Record, tools: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The reference line's fields of ``record`` (``tools``: the schemas it was offered)."""
    return {
        "conversations": conversations(record, tools),
        "metadata": metadata(record),
        "completed": record.status == "completed",
        "partial": record.status == "partial",
        "api_calls": record.turns,
        "toolsets_used": record.toolsets,
    }


def with_view(record: Record, tools: Sequence[dict[str, Any]] = ()) -> Record:
    """``record`` carrying its reference view (what a batch line is on disk)."""
    return record.model_copy(update=reference_view(record, tools))
