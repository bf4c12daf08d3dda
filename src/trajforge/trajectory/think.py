"""Reasoning text helpers: scratchpad tags, think blocks, and where a message keeps its reasoning.

Models reason in one of two ways: natively (the provider returns the reasoning in a separate
field) or inline, inside ``<REASONING_SCRATCHPAD>`` / ``<think>`` tags in the content. Training
data uses ``<think>`` only, so the scratchpad tags are rewritten when a trajectory is saved; a
scratchpad that was opened and never closed means the model was cut off mid-thought, and such a
turn must not become training data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trajforge.messages import (
    SCRATCHPAD_CLOSE,
    SCRATCHPAD_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    content_text,
    message_reasoning,
)


def scratchpad_to_think(text: str) -> str:
    """Rewrite ``<REASONING_SCRATCHPAD>`` tags as ``<think>`` tags (everything else untouched).

    Like the reference, nothing is rewritten unless an opening tag is present, so a stray closing
    tag alone stays as it was and the saved text matches the reference conversion.
    """
    if not text or SCRATCHPAD_OPEN not in text:
        return text
    return text.replace(SCRATCHPAD_OPEN, THINK_OPEN).replace(SCRATCHPAD_CLOSE, THINK_CLOSE)


def _unclosed(text: str, open_tag: str, close_tag: str) -> bool:
    """True when the last ``open_tag`` is not followed by a ``close_tag``.

    Stricter than the reference's "opened somewhere, closed nowhere": a second scratchpad opened
    after a complete first one is also caught.
    """
    if not text:
        return False
    last_open = text.rfind(open_tag)
    return last_open != -1 and text.find(close_tag, last_open + len(open_tag)) == -1


def has_incomplete_scratchpad(text: str | None) -> bool:
    """Whether ``text`` opens a ``<REASONING_SCRATCHPAD>`` that it never closes."""
    return _unclosed(text or "", SCRATCHPAD_OPEN, SCRATCHPAD_CLOSE)


def has_unclosed_think(text: str | None) -> bool:
    """Whether ``text`` opens a ``<think>`` block that it never closes (reasoning cut off)."""
    return _unclosed(text or "", THINK_OPEN, THINK_CLOSE)


def has_reasoning(msg: Mapping[str, Any]) -> bool:
    """Whether an assistant message reasoned: a native field, or think/scratchpad tags in content."""
    if message_reasoning(msg) is not None:
        return True
    text = content_text(msg.get("content"))
    return SCRATCHPAD_OPEN in text or THINK_OPEN in text


__all__ = [
    "SCRATCHPAD_CLOSE",
    "SCRATCHPAD_OPEN",
    "THINK_CLOSE",
    "THINK_OPEN",
    "content_text",
    "has_incomplete_scratchpad",
    "has_reasoning",
    "has_unclosed_think",
    "message_reasoning",
    "scratchpad_to_think",
]
