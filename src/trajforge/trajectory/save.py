"""Append single-agent trajectories to JSONL files, the way the reference's users expect them.

A completed run goes to ``trajectory_samples.jsonl``, a failed one to
``failed_trajectories.jsonl``; each line holds ``conversations``, ``timestamp``, ``model`` and
``completed`` like the reference.

Lossless record: the ShareGPT text drops the runtime system prompt, native reasoning fields and
the raw tool-call arguments' exact bytes, so the original OpenAI messages are kept on the SAME
line under ``"messages"`` (when given). One line per trajectory keeps the pair atomic: there is
no sibling file that could disagree with this one after a crash, and readers of the reference
format simply ignore the extra key.

Each line is written with a single ``write`` on an ``O_APPEND`` descriptor under an exclusive
``flock``, so concurrent writers (threads or processes) never interleave or tear lines.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson
from pydantic import BaseModel

COMPLETED_FILE: Final = "trajectory_samples.jsonl"
FAILED_FILE: Final = "failed_trajectories.jsonl"
CORE_KEYS: Final = frozenset({"conversations", "timestamp", "model", "completed", "messages"})


def _orjson_default(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot write a {type(obj).__name__} into a trajectory line: {obj!r:.100}")


def dumps_line(obj: Mapping[str, Any]) -> bytes:
    """One compact JSON line (UTF-8, newline-terminated)."""
    return orjson.dumps(obj, default=_orjson_default, option=orjson.OPT_APPEND_NEWLINE)


def trajectory_line(
    conversations: Sequence[Mapping[str, Any]],
    model: str,
    completed: bool,
    messages: Sequence[Mapping[str, Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
    timestamp: str | None = None,
) -> dict[str, Any]:
    """The record saved for one trajectory; ``extra`` keys may not shadow the core ones."""
    line: dict[str, Any] = {
        "conversations": list(conversations),
        "timestamp": timestamp or datetime.now(UTC).isoformat(),
        "model": model,
        "completed": completed,
    }
    if messages is not None:
        line["messages"] = list(messages)
    clash = sorted(CORE_KEYS & set(extra or ()))
    if clash:
        raise ValueError(f"extra fields {clash} would overwrite the trajectory's own fields; rename them")
    line.update(extra or {})
    return line


def append_jsonl(path: Path, line: bytes) -> None:
    """Append one already-encoded line atomically with respect to other appenders, then flush."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)  # closing releases the lock


def read_complete_objects(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file that another process may be appending to (or died
    appending to): only complete lines are read (a torn last one is not yet, or never, a record),
    and a line that is not a JSON object is skipped. A missing file has none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    rows = []
    for line in data[: data.rfind(b"\n") + 1].splitlines():
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def trajectory_file(path_dir: str | os.PathLike[str], completed: bool) -> Path:
    """Where a trajectory with this outcome is appended."""
    return Path(path_dir) / (COMPLETED_FILE if completed else FAILED_FILE)


def save_trajectory(
    path_dir: str | os.PathLike[str],
    conversations: Sequence[Mapping[str, Any]],
    model: str,
    completed: bool,
    messages: Sequence[Mapping[str, Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Append one trajectory to the completed or failed file in ``path_dir``; returns that file.

    Blocking (file I/O): from async code use :func:`asave_trajectory`.
    """
    directory = Path(path_dir)
    directory.mkdir(parents=True, exist_ok=True)
    target = trajectory_file(directory, completed)
    append_jsonl(target, dumps_line(trajectory_line(conversations, model, completed, messages, extra)))
    return target


async def asave_trajectory(
    path_dir: str | os.PathLike[str],
    conversations: Sequence[Mapping[str, Any]],
    model: str,
    completed: bool,
    messages: Sequence[Mapping[str, Any]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """:func:`save_trajectory` in a worker thread, so the event loop never waits on the disk."""
    return await asyncio.to_thread(
        save_trajectory, path_dir, conversations, model, completed, messages, extra
    )
