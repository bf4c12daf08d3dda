"""Any line trajforge ever wrote -> a :class:`Record`: runs written before the record existed, or
before its current version, still export, report and resume.

Version 3 differs from version 4 only in the reward: flat ``reward``, ``reward_components``,
``reward_reason``, ``reward_error``, ``kept`` and ``trace.token_advantages``, now one nested
:class:`~trajforge.record.reward.Reward` (``reward``: value, components, reason, error,
token_advantages, kept). Version 2 differs from version 3 only in where ``worker`` is (top level,
now ``timings.worker``). Each older version is read into the next, up to this one.

Version 1 had two shapes: the batch line (ShareGPT ``conversations``, ``metadata``,
``toolsets_used``, ``api_calls``, nested ``timings``, ``reward_breakdown``, ``graded_by``) and the
env ``Episode`` (``messages``, ``item_id``/``rollout``, flat ``wall_s``/``model_s``/...,
``reward_components``, no tool statistics). Each is mapped field by field; what version 1 never
stored is derived the one way it can be (a batch line's messages from its ShareGPT turns, an
episode's tool statistics from its messages) and said so in docs/formats.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from trajforge.messages import content_text
from trajforge.record.model import SCHEMA_VERSION, Record
from trajforge.trajectory.calls import to_messages


class RecordError(ValueError):
    """A line that is no record of any version; the message says which line and why."""


def load(line: dict[str, Any]) -> Record:
    """The record a line holds, upgraded from versions 1, 2 and 3 when it is older."""
    if not isinstance(line, dict):
        raise RecordError(f"a record is a JSON object, not {type(line).__name__}")
    version = line.get("schema_version")
    try:
        if version is None:
            return Record.model_validate(_from_v3(_from_v1(line)))
        if version == 2:
            return Record.model_validate(_from_v3(_from_v2(line)))
        if version == 3:
            return Record.model_validate(_from_v3(line))
        if isinstance(version, int) and version <= SCHEMA_VERSION:
            return Record.model_validate(line)
    except ValidationError as exc:
        raise RecordError(f"not a trajforge record: {_first_error(exc)}") from None
    raise RecordError(
        f"schema_version {version!r} is newer than this trajforge reads ({SCHEMA_VERSION}); upgrade trajforge"
    )


def read(path: Path) -> Iterator[Record]:
    """The records of a JSONL file, in order; a torn last line (a writer died mid-line) is skipped,
    any other bad line raises with its number."""
    if not path.exists():
        return
    with open(path, "rb") as fh:
        data = fh.read()
    complete = data[: data.rfind(b"\n") + 1] if not data.endswith(b"\n") else data
    for n, raw in enumerate(complete.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            yield load(orjson.loads(raw))
        except (orjson.JSONDecodeError, RecordError) as exc:
            raise RecordError(f"{path}:{n}: {exc}") from None


def is_v1_episode(line: dict[str, Any]) -> bool:
    return "conversations" not in line and "item_id" in line and isinstance(line.get("messages"), list)


def _from_v1(line: dict[str, Any]) -> dict[str, Any]:
    if "conversations" in line:
        return _batch_v1(line)
    if is_v1_episode(line):
        return _episode_v1(line)
    raise RecordError("neither a record, a batch line (conversations) nor an episode (item_id, messages)")


def _batch_v1(line: dict[str, Any]) -> dict[str, Any]:
    meta = line.get("metadata") or {}
    turns = line.get("conversations") or []
    termination = line.get("termination")
    chat = to_messages(turns, ended_on_answer=None if termination is None else termination == "final_answer")
    system = meta.get("system_prompt")
    prompt = next((t.get("value", "") for t in turns if t.get("from") == "human"), "")
    trace = line.get("trace")
    timings = line.get("timings") or {}
    return {
        # the reference view (conversations, metadata, completed, ...) rides along
        **{k: v for k, v in line.items() if k != "reward_breakdown"},
        "key": line.get("key") or f"row-{line.get('prompt_index')}",
        "prompt_index": line.get("prompt_index"),
        "rollout": meta.get("sample_index", 0),
        "group_size": meta.get("samples_per_prompt", 1),
        "env": line.get("graded_by"),
        "item": {**(meta.get("row") or {}), "prompt": prompt},
        "messages": ([{"role": "system", "content": system}] if system else []) + chat.messages,
        "system_prompt": system,
        "status": line.get("status") or ("completed" if line.get("completed") else "failed"),
        "termination": termination or "not_run",
        "turns": line.get("api_calls") or 0,
        "attempts": line.get("attempts", 1),
        "reward_components": line.get("reward_breakdown") or {},
        "reward_reason": line.get("reward_reason") or "",
        "trace": trace if isinstance(trace, dict) and "tokens" in trace else None,
        "trace_error": trace.get("error") if isinstance(trace, dict) else None,
        "timings": {**{k: v for k, v in timings.items() if v is not None}, "worker": meta.get("batch_num")},
        "model": meta.get("model"),
        "seed": meta.get("seed", 0),
        "toolsets": line.get("toolsets_used") or [],
        "tools": sorted(line.get("tool_stats") or {}),
    }


def _episode_v1(line: dict[str, Any]) -> dict[str, Any]:
    stats, errors = _tool_counts(line["messages"])
    trace = line.get("trace")
    usage = line.get("usage") or {}
    if not usage and isinstance(trace, dict) and isinstance(trace.get("tokens"), list):
        usage = {"total_tokens": len(trace["tokens"])}  # episodes recorded before usage was kept
    moved = ("wall_s", "model_s", "tool_s", "reward_s", "finished_at")
    return {
        **{k: v for k, v in line.items() if k not in moved},
        "key": f"{line.get('item_id')}#{line.get('rollout', 0)}",
        "usage": usage,
        "tool_stats": stats,
        "tool_error_counts": errors,
        "timings": {k: line[k] for k in moved if line.get(k) is not None},
    }


def _from_v2(line: dict[str, Any]) -> dict[str, Any]:
    """Version 2 kept the worker beside the rollout's identity; version 3 keeps it in ``timings``
    (execution provenance, like the clock). Nothing else changed."""
    out = {k: v for k, v in line.items() if k not in ("worker", "schema_version")}
    timings = line.get("timings")
    out["timings"] = {**(timings if isinstance(timings, dict) else {}), "worker": line.get("worker")}
    return out


FLAT_REWARD = ("reward", "reward_components", "reward_reason", "reward_error", "kept")
"""The version-3 fields (and, read into that shape, version 1's and 2's) that version 4 nests in
one ``reward`` object."""


def _from_v3(line: dict[str, Any]) -> dict[str, Any]:
    """Version 3's flat reward fields and the trace's ``token_advantages`` -> one ``reward``
    object. A line with none of them set had no judge (a batch without ``--env``): ``reward``
    null. One whose judge could not judge it (``reward`` null with its reason) keeps that reason
    under a reward whose value is null."""
    out = {k: v for k, v in line.items() if k not in (*FLAT_REWARD, "schema_version")}
    trace = line.get("trace")
    advantages = None
    if isinstance(trace, dict) and "token_advantages" in trace:
        advantages = trace["token_advantages"]
        out["trace"] = {k: v for k, v in trace.items() if k != "token_advantages"}
    reward = {
        "value": line.get("reward"),
        "components": line.get("reward_components") or {},
        "reason": line.get("reward_reason") or "",
        "error": line.get("reward_error"),
        "token_advantages": advantages,
        "kept": line.get("kept") or {},
    }
    out["reward"] = reward if any(v not in (None, "", {}) for v in reward.values()) else None
    return out


def _tool_counts(messages: list[Any]) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """A version-1 episode's tool statistics, which it never stored: a call per assistant
    ``tool_calls`` entry, a failure per tool result starting with ``Error`` (what tools return
    on failure). Records of version 2 carry the loop's own counts."""
    calls: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    names: dict[str, str] = {}
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        for call in msg.get("tool_calls") or ():
            if isinstance(call, dict):
                name = str((call.get("function") or {}).get("name", "?"))
                calls[name] += 1
                names[str(call.get("id", ""))] = name
        if msg.get("role") == "tool" and content_text(msg.get("content")).lstrip().startswith("Error"):
            failures[names.get(str(msg.get("tool_call_id", "")), str(msg.get("name") or "?"))] += 1
    stats = {n: {"count": c, "success": c - failures[n], "failure": failures[n]} for n, c in calls.items()}
    return stats, {n: failures[n] for n in calls}


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "line"
    return f"{where}: {err['msg']}"
