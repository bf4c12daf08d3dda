"""Scratchpad/think helpers and where reasoning is found on a message."""

from __future__ import annotations

import pytest

from trajforge.trajectory.think import (
    content_text,
    has_incomplete_scratchpad,
    has_reasoning,
    has_unclosed_think,
    message_reasoning,
    scratchpad_to_think,
)


def test_scratchpad_to_think() -> None:
    text = "a <REASONING_SCRATCHPAD>x</REASONING_SCRATCHPAD> b <REASONING_SCRATCHPAD>y</REASONING_SCRATCHPAD>"
    assert scratchpad_to_think(text) == "a <think>x</think> b <think>y</think>"
    assert scratchpad_to_think("") == ""
    # Like the reference: a lone closing tag is left alone.
    assert scratchpad_to_think("x</REASONING_SCRATCHPAD>") == "x</REASONING_SCRATCHPAD>"


@pytest.mark.parametrize(
    ("text", "incomplete"),
    [
        ("<REASONING_SCRATCHPAD>thinking...", True),
        ("<REASONING_SCRATCHPAD>done</REASONING_SCRATCHPAD> answer", False),
        ("<REASONING_SCRATCHPAD>a</REASONING_SCRATCHPAD><REASONING_SCRATCHPAD>b", True),
        ("no tags", False),
        ("", False),
        (None, False),
        ("answer </REASONING_SCRATCHPAD>", False),
    ],
)
def test_has_incomplete_scratchpad(text: str | None, incomplete: bool) -> None:
    assert has_incomplete_scratchpad(text) is incomplete


def test_has_unclosed_think() -> None:
    assert has_unclosed_think("<think>cut off")
    assert not has_unclosed_think("<think>x</think>y")
    assert not has_unclosed_think("stray </think> only")


def test_message_reasoning_fields_in_order() -> None:
    assert message_reasoning({"reasoning": "r", "reasoning_content": "rc"}) == "r"
    assert message_reasoning({"reasoning": "  ", "reasoning_content": "rc"}) == "rc"
    assert message_reasoning({"reasoning_details": [{"text": "a"}, {"type": "enc"}, {"text": "b"}]}) == "a\nb"
    assert message_reasoning({"content": "x"}) is None


@pytest.mark.parametrize(
    ("msg", "expected"),
    [
        ({"role": "assistant", "content": "x", "reasoning": "r"}, True),
        ({"role": "assistant", "content": "<REASONING_SCRATCHPAD>r</REASONING_SCRATCHPAD>x"}, True),
        ({"role": "assistant", "content": "<think>r</think>x"}, True),
        ({"role": "assistant", "content": "just text"}, False),
        ({"role": "assistant", "content": None}, False),
    ],
)
def test_has_reasoning(msg: dict, expected: bool) -> None:
    assert has_reasoning(msg) is expected


def test_content_text() -> None:
    assert content_text(None) == ""
    assert content_text([{"type": "text", "text": "a"}, {"type": "image_url"}, "b"]) == "a\nb"
