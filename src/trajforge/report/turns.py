"""A line -> the compact record the browser shows: turns cut into think, text, call and result.

The ShareGPT turns carry the structure as tags (``<think>``, ``<REASONING_SCRATCHPAD>``,
``<tool_call>``, ``<tool_response>``); they are split here, in Python, so the page's script only
places text. Each piece of text is cut to ``max_chars`` (head and tail kept, the cut said). The
system turn (the same long tools prompt on every line of a run) is stored once per distinct text.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trajforge.messages import SCRATCHPAD_CLOSE, SCRATCHPAD_OPEN, THINK_CLOSE, THINK_OPEN
from trajforge.report.facts import as_dict, tools_used

_TAGS = {
    THINK_OPEN[1:-1]: "think",
    SCRATCHPAD_OPEN[1:-1]: "think",
    "tool_call": "call",
    "tool_response": "result",
}
assert THINK_CLOSE == "</think>" and SCRATCHPAD_CLOSE == "</REASONING_SCRATCHPAD>"
_BLOCK = re.compile(r"<(think|REASONING_SCRATCHPAD|tool_call|tool_response)>(.*?)(?:</\1>|\Z)", re.DOTALL)
_ROLES = {"system": "system", "human": "user", "gpt": "assistant", "tool": "tool"}


def cut(text: str, max_chars: int) -> str:
    """``text`` whole when short, else its head and tail around a note of how much was cut."""
    if len(text) <= max_chars:
        return text
    head = max_chars * 3 // 4
    tail = max_chars - head
    return f"{text[:head]}\n… [{len(text) - max_chars:,} characters cut] …\n{text[-tail:]}"


def _pretty(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=1)


def _call(body: str, max_chars: int) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError:
        return {"k": "call", "name": "?", "text": cut(body.strip(), max_chars), "bad": True}
    if not isinstance(parsed, dict):
        return {"k": "call", "name": "?", "text": cut(body.strip(), max_chars), "bad": True}
    return {
        "k": "call",
        "name": str(parsed.get("name", "?")),
        "text": cut(_pretty(parsed.get("arguments")), max_chars),
    }


def _result(body: str, max_chars: int) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError:
        return {"k": "result", "name": "?", "text": cut(body.strip(), max_chars)}
    if not isinstance(parsed, dict):
        return {"k": "result", "name": "?", "text": cut(body.strip(), max_chars)}
    content = parsed.get("content")
    seg: dict[str, Any] = {"k": "result", "name": str(parsed.get("name", "?"))}
    if isinstance(content, dict) and "output" in content:  # terminal-style {"output", "exit_code"}
        seg["text"] = cut(_pretty(content.get("output")), max_chars)
        rest = {k: v for k, v in content.items() if k != "output"}
        if rest:
            seg["meta"] = cut(json.dumps(rest, ensure_ascii=False), 400)
        if content.get("error") or (isinstance(content.get("exit_code"), int) and content["exit_code"] != 0):
            seg["err"] = True
    else:
        seg["text"] = cut(_pretty(content), max_chars)
        if (isinstance(content, dict) and content.get("error")) or (
            isinstance(content, str) and content.startswith("Error:")
        ):
            seg["err"] = True
    return seg


def segments(value: str, max_chars: int) -> list[dict[str, Any]]:
    """A turn's text as pieces: ``{"k": "think"|"text"|"call"|"result", "text": ..., ...}``."""
    out: list[dict[str, Any]] = []
    pos = 0
    for match in _BLOCK.finditer(value):
        before = value[pos : match.start()].strip()
        if before:
            out.append({"k": "text", "text": cut(before, max_chars)})
        kind, body = _TAGS[match.group(1)], match.group(2)
        if kind == "think":
            if body.strip():
                out.append({"k": "think", "text": cut(body.strip(), max_chars)})
        elif kind == "call":
            out.append(_call(body, max_chars))
        else:
            out.append(_result(body, max_chars))
        pos = match.end()
    rest = value[pos:].strip()
    if rest:
        out.append({"k": "text", "text": cut(rest, max_chars)})
    return out


class RecordBuilder:
    """Builds browser records; keeps the distinct system texts (``systems``) they point into."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.systems: list[str] = []
        self._system_ids: dict[str, int] = {}

    def _system(self, text: str) -> int:
        if text not in self._system_ids:
            self._system_ids[text] = len(self.systems)
            self.systems.append(cut(text, self.max_chars * 4))
        return self._system_ids[text]

    def record(self, line: dict[str, Any]) -> dict[str, Any]:
        """The browser's view of one line (short keys: thousands of them go in one file)."""
        turns: list[list[Any]] = []
        system: int | None = None
        prompt = ""
        conversations = line.get("conversations")
        for turn in conversations if isinstance(conversations, list) else ():
            if not isinstance(turn, dict):
                continue
            role = _ROLES.get(str(turn.get("from")), str(turn.get("from")))
            value = turn.get("value")
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            if role == "system" and system is None and not turns:
                system = self._system(text)
                continue
            if role == "user" and not prompt:
                prompt = text
            segs = (
                segments(text, self.max_chars)
                if role in ("assistant", "tool")
                else [{"k": "text", "text": cut(text, self.max_chars)}]
            )
            turns.append([role, segs])
        used, failed = tools_used(line)
        usage, timings = as_dict(line.get("usage")), as_dict(line.get("timings"))
        reward = line.get("reward")
        toolsets = line.get("toolsets_used")
        meta = as_dict(line.get("metadata"))
        return {
            "i": line.get("prompt_index"),
            "key": str(line.get("key", "")),
            "s": str(line.get("status") or "unknown"),
            "r": str(line.get("reason") or ""),
            "ts": [str(t) for t in toolsets] if isinstance(toolsets, list) else [],
            "tu": used,
            "tf": failed,
            "n": line.get("api_calls"),
            "tok": usage.get("total_tokens"),
            "w": timings.get("wall_s"),
            "rw": reward if isinstance(reward, int | float) and not isinstance(reward, bool) else None,
            "rb": line.get("reward_breakdown") if isinstance(line.get("reward_breakdown"), dict) else None,
            "p": cut(prompt, 300),
            "m": str(meta.get("model") or ""),
            "sys": system,
            "t": turns,
        }
