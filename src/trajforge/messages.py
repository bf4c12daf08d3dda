"""Message text and reasoning conventions, in one place on the ground floor (stdlib only).

Every layer needs the same few facts about chat messages: the ``<think>`` and
``<REASONING_SCRATCHPAD>`` tags, the text of a ``content`` that may be a list of parts, and where
a message keeps its reasoning. The model clients, the local server, the trajectory converters and
the test servers all import them from here.

Reasoning text out of whatever field a provider put it in.

Providers disagree on where a model's reasoning goes: ``reasoning_content`` (DeepSeek, vLLM,
SGLang), ``reasoning`` (OpenRouter), ``reasoning_details[].text`` (OpenRouter's structured form)
or inline ``<think>...</think>`` at the start of the content (raw open-weights models). The
same fields appear on a full message and on a streaming delta. These pure functions normalise
all of them, so the rest of trajforge only knows ``AssistantTurn.reasoning``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
SCRATCHPAD_OPEN = "<REASONING_SCRATCHPAD>"
SCRATCHPAD_CLOSE = "</REASONING_SCRATCHPAD>"

# Fields a *saved* message may carry native reasoning in, in order of preference. Our own
# ``AssistantTurn.to_message`` writes ``reasoning``; providers and other tools use the others.
MESSAGE_REASONING_FIELDS = ("reasoning", "reasoning_content")

# Order matters: a provider sending both ``reasoning`` and ``reasoning_details`` (OpenRouter
# does) sends the same text twice; the first non-empty field wins.
_TEXT_FIELDS = ("reasoning_content", "reasoning")
_LEADING_THINK = re.compile(r"\A\s*<think>(.*?)</think>[ \t]*\n?", re.DOTALL)


def reasoning_from_fields(fields: Mapping[str, Any] | None) -> str | None:
    """Reasoning carried in the fields of a message or delta (not inline ``<think>``).

    ``fields`` is the message/delta as a mapping -- for the openai SDK, ``model_extra`` or
    ``model_dump()``, since these fields are not part of its schema. Returns ``None`` when there
    is none. For a delta the result is that delta's fragment.
    """
    if not fields:
        return None
    for name in _TEXT_FIELDS:
        value = fields.get(name)
        if isinstance(value, str) and value:
            return value
    return _text_of_details(fields.get("reasoning_details"))


def _text_of_details(details: Any, sep: str = "", summaries: bool = True) -> str | None:
    """Joins ``reasoning_details[].text`` (or ``.summary``); encrypted entries carry no text."""
    if not isinstance(details, list):
        return None
    parts: list[str] = []
    for item in details:
        if not isinstance(item, Mapping):
            continue
        text = item.get("text")
        if (not isinstance(text, str) or not text) and summaries:
            text = item.get("summary")
        if isinstance(text, str) and text:
            parts.append(text)
    return sep.join(parts) or None


def content_text(content: Any) -> str:
    """The text of a message ``content``: ``None`` -> ``""``; a list of parts -> its text parts,
    one per line (images and other non-text parts are left out: trajectories are text only, and
    an image part would embed megabytes of base64 in every line)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return str(content)


def message_reasoning(msg: Mapping[str, Any]) -> str | None:
    """Native reasoning of a saved message: ``reasoning``, ``reasoning_content`` or
    ``reasoning_details[].text`` (one per line); whitespace-only counts as none."""
    for key in MESSAGE_REASONING_FIELDS:
        value = msg.get(key)
        if isinstance(value, str) and value.strip():
            return value
    joined = _text_of_details(msg.get("reasoning_details"), sep="\n", summaries=False)
    return joined if joined and joined.strip() else None


def split_think(content: str | None) -> tuple[str | None, str | None]:
    """Splits a leading ``<think>...</think>`` off ``content``: ``(content, reasoning)``.

    Also handles the two shapes raw reasoning models produce besides a full block: an unclosed
    ``<think>`` (the turn was cut off while thinking: everything is reasoning, content is None)
    and a bare ``</think>`` with no opening tag (the chat template already emitted ``<think>``
    in the prompt, so the completion starts inside the block). Content that becomes empty is
    returned as None. Text without think tags comes back unchanged.
    """
    if not content:
        return content, None
    match = _LEADING_THINK.match(content)
    if match:
        return _none_if_blank(content[match.end() :]), _none_if_blank(match.group(1).strip())
    stripped = content.lstrip()
    if stripped.startswith(THINK_OPEN):
        return None, _none_if_blank(stripped[len(THINK_OPEN) :].strip())
    if THINK_CLOSE in content and THINK_OPEN not in content:
        head, _, tail = content.partition(THINK_CLOSE)
        return _none_if_blank(tail.lstrip("\n")), _none_if_blank(head.strip())
    return content, None


def _none_if_blank(text: str) -> str | None:
    return text if text.strip() else None


def combine_reasoning(*parts: str | None) -> str | None:
    """Joins reasoning from several sources, dropping empties and exact duplicates."""
    seen: list[str] = []
    for part in parts:
        if part and part.strip() and part not in seen:
            seen.append(part)
    return "\n\n".join(seen) or None


def extract_reasoning(fields: Mapping[str, Any] | None, content: str | None) -> tuple[str | None, str | None]:
    """Full extraction for a finished message: ``(content without think block, reasoning)``."""
    content, inline = split_think(content)
    return content, combine_reasoning(reasoning_from_fields(fields), inline)
