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

from trajforge.messages import (
    SCRATCHPAD_CLOSE,
    SCRATCHPAD_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    content_text,
    message_reasoning,
)
from trajforge.record import Record
from trajforge.report.facts import tools_used
from trajforge.trajectory.calls import is_parse_error, parse_responses

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
    return result_segment(str(parsed.get("name", "?")), parsed.get("content"), max_chars)


def result_segment(name: str, content: Any, max_chars: int) -> dict[str, Any]:
    """A tool result: terminal-style ``{"output", "exit_code"}`` shows the output, the rest as a note;
    an error (``error`` field, non-zero exit, text starting ``Error``) is marked."""
    seg: dict[str, Any] = {"k": "result", "name": name}
    if isinstance(content, dict) and "output" in content:
        seg["text"] = cut(_pretty(content.get("output")), max_chars)
        rest = {k: v for k, v in content.items() if k != "output"}
        if rest:
            seg["meta"] = cut(json.dumps(rest, ensure_ascii=False), 400)
        if content.get("error") or (isinstance(content.get("exit_code"), int) and content["exit_code"] != 0):
            seg["err"] = True
    else:
        seg["text"] = cut(_pretty(content), max_chars)
        if (isinstance(content, dict) and content.get("error")) or (
            isinstance(content, str) and content.startswith("Error")
        ):
            seg["err"] = True
    return seg


def _json_or_text(text: str) -> Any:
    if text.strip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


def message_turns(messages: list[Any], max_chars: int) -> tuple[str | None, list[list[Any]]]:
    """OpenAI ``messages`` (an env episode) -> (system text, turns) in the same pieces."""
    system: str | None = None
    turns: list[list[Any]] = []
    names: dict[str, str] = {}
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        role, text = str(msg.get("role")), content_text(msg.get("content"))
        if role in ("system", "developer") and system is None and not turns:
            system = text
            continue
        if role == "assistant":
            segs: list[dict[str, Any]] = []
            reasoning = message_reasoning(msg)
            if reasoning:
                segs.append({"k": "think", "text": cut(reasoning.strip(), max_chars)})
            segs += _unparsed(segments(text, max_chars), 0, None)  # markup in the text never ran
            for call in msg.get("tool_calls") or ():
                if not isinstance(call, dict):
                    continue
                func = call.get("function") or {}
                name = str(func.get("name", "?"))
                names[str(call.get("id", ""))] = name
                args = func.get("arguments")
                parsed = _json_or_text(args) if isinstance(args, str) else args
                seg: dict[str, Any] = {"k": "call", "name": name, "text": cut(_pretty(parsed), max_chars)}
                if not isinstance(parsed, dict):
                    seg["bad"] = True
                segs.append(seg)
            turns.append(["assistant", segs])
        elif role == "tool":
            name = names.get(str(msg.get("tool_call_id", "")), str(msg.get("name") or "?"))
            turns.append(["tool", [result_segment(name, _json_or_text(text), max_chars)]])
        else:
            turns.append([role, [{"k": "text", "text": cut(text, max_chars)}]])
    return system, turns


def _unparsed(segs: list[dict[str, Any]], start: int, ran: int | None) -> list[dict[str, Any]]:
    """Mark the call pieces of ``segs[start:]`` that never ran: all but the last ``ran`` of them
    (None: all). A call that ran ends its turn and has a result; text that only looks like a call
    (an unparsed call the loop told the model about) does not (trajectory.calls)."""
    calls = [seg for seg in segs[start:] if seg["k"] == "call"]
    for seg in calls[: len(calls) - ran] if ran else calls:
        seg["unp"] = True
    return segs


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

    def _sharegpt_turns(self, line: dict[str, Any]) -> tuple[str | None, list[list[Any]]]:
        system: str | None = None
        turns: list[list[Any]] = []
        conversations = line.get("conversations")
        for turn in conversations if isinstance(conversations, list) else ():
            if not isinstance(turn, dict):
                continue
            role = _ROLES.get(str(turn.get("from")), str(turn.get("from")))
            value = turn.get("value")
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            if role == "system" and system is None and not turns:
                system = text
                continue
            segs = (
                segments(text, self.max_chars)
                if role in ("assistant", "tool")
                else [{"k": "text", "text": cut(text, self.max_chars)}]
            )
            turns.append([role, segs])
        _mark_unparsed(conversations if isinstance(conversations, list) else [], turns)
        return system, turns

    def record(self, record: Record) -> dict[str, Any]:
        """The browser's view of one record (short keys: thousands of them go in one file)."""
        stored = (record.model_extra or {}).get("conversations")
        system_text, turns = (
            self._sharegpt_turns({"conversations": stored})
            if isinstance(stored, list)
            else message_turns(record.messages, self.max_chars)
        )
        system = self._system(system_text) if system_text is not None else None
        prompt = next((t[1][0]["text"] for t in turns if t[0] == "user" and t[1]), "")
        used, failed = tools_used(record)
        index = record.prompt_index
        # a prompt's rollouts (env groups, batch --group-size) are told apart in the list itself:
        # four rows of one item otherwise read alike
        rollout = f" #{record.rollout}" if record.group_size > 1 else ""
        if record.item_id is not None:  # an env's item (env eval, batch --env): it and a rollout of it
            label = record.item_id + rollout
            title = f"{record.item_id} · rollout {record.rollout}" + (
                f" · {record.category}" if record.category else ""
            )
        else:
            label = "" if index is None else str(index) + rollout
            title = f"sample {label} · {record.key}" if label else record.key
        return {
            "i": index,
            "lbl": label,
            "ttl": title,
            "key": record.key,
            "s": record.status,
            "r": record.reason or record.termination or "",
            "ts": list(record.toolsets),
            "tu": used,
            "tf": failed,
            "n": record.turns,
            "tok": record.usage.get("total_tokens"),
            "w": record.timings.wall_s,
            "ms": record.timings.model_s,
            "tls": record.timings.tool_s,
            "rw": record.reward_value,
            "rb": dict(record.reward.components)
            if record.reward_value is not None and record.reward
            else None,
            "p": cut(prompt, 300),
            "m": record.model or "",
            "sys": system,
            "t": turns,
        }


def _mark_unparsed(conversations: list[Any], turns: list[list[Any]]) -> None:
    """In ShareGPT turns, a ``gpt`` turn followed by the loop's parse-error turn held call markup
    that never ran; only its last blocks, as many as the next ``tool`` turn has results, did."""
    shown = [t for t in conversations if isinstance(t, dict) and t.get("from") != "system"][: len(turns)]
    for k, turn in enumerate(shown):
        if turn.get("from") != "gpt":
            continue
        nxt = shown[k + 1] if k + 1 < len(shown) else None
        results = parse_responses(str(nxt.get("value", ""))) if nxt and nxt.get("from") == "tool" else None
        after = (
            shown[k + (2 if results is not None else 1)]
            if k + (2 if results is not None else 1) < len(shown)
            else None
        )
        if after is not None and after.get("from") == "human" and is_parse_error(after.get("value")):
            _unparsed(turns[k][1], 0, len(results) if results else None)
