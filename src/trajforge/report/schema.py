"""Env-run episodes (``episodes.jsonl``) in the batch line's shape, so one report reads both.

An episode keeps OpenAI ``messages`` rather than ShareGPT turns, ``toolsets``/``turns``/``wall_s``/
``model_s``/``tool_s``/``finished_at`` rather than ``toolsets_used``/``api_calls``/``timings``,
``reward_components`` for the breakdown, and no ``prompt_index`` (an episode is ``item_id`` and
``rollout``). Tokens come from its ``usage`` (episodes recorded before it was kept: the length of a
token trace, when there is one). Tool statistics are derived from the messages: a call per assistant ``tool_calls``
entry, a failure per tool result that starts with ``Error`` (what the tools return on failure).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from trajforge.messages import content_text


def is_episode(line: dict[str, Any]) -> bool:
    return "conversations" not in line and isinstance(line.get("messages"), list)


def normalize(line: dict[str, Any]) -> dict[str, Any]:
    """``line`` itself when it is a batch line, else the episode with the batch fields added."""
    if not is_episode(line):
        return line
    calls, failures = _tool_counts(line["messages"])
    trace = line.get("trace")
    tokens = (
        len(trace["tokens"]) if isinstance(trace, dict) and isinstance(trace.get("tokens"), list) else None
    )
    reason = line.get("reason") or line.get("termination") or ""
    usage = line.get("usage") if isinstance(line.get("usage"), dict) and line.get("usage") else None
    if usage is None:
        usage = {"total_tokens": tokens} if tokens is not None else {}
    timings = {
        k: line.get(k) for k in ("wall_s", "model_s", "tool_s", "finished_at") if line.get(k) is not None
    }
    return {
        **line,
        "key": line.get("key") or f"{line.get('item_id', '?')}#{line.get('rollout', 0)}",
        "prompt_index": line.get("prompt_index"),
        "reason": str(reason),
        "toolsets_used": line.get("toolsets") if isinstance(line.get("toolsets"), list) else [],
        "tool_stats": {
            name: {"count": n, "success": n - failures[name], "failure": failures[name]}
            for name, n in calls.items()
        },
        "api_calls": line.get("turns"),
        "usage": usage,
        "timings": timings,
        "reward_breakdown": line.get("reward_breakdown") or line.get("reward_components"),
        "metadata": {"model": line.get("model")},
    }


def _tool_counts(messages: list[Any]) -> tuple[Counter[str], Counter[str]]:
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
    return calls, failures
