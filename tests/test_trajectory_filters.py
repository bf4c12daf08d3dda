"""Filters return reasons; hallucination is judged against the tools offered to the sample."""

from __future__ import annotations

from trajforge.trajectory import (
    HALLUCINATED_TOOL,
    INCOMPLETE_SCRATCHPAD,
    NO_REASONING,
    ReasoningCoverage,
    evaluate_filters,
    reasoning_coverage,
)


def _call(name: str) -> dict:
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": "{}"}}


def _conv(*assistants: dict) -> list[dict]:
    msgs: list[dict] = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    for a in assistants:
        msgs.append({"role": "assistant", **a})
        if a.get("tool_calls"):
            msgs.append({"role": "tool", "tool_call_id": "c", "content": "ok"})
    return msgs


def test_clean_sample_passes() -> None:
    msgs = _conv({"content": None, "reasoning": "r", "tool_calls": [_call("terminal")]}, {"content": "done"})
    assert evaluate_filters(msgs, ["terminal", "process"]) == []


def test_no_reasoning_is_rejected_with_reason_and_can_be_turned_off() -> None:
    msgs = _conv({"content": "a", "tool_calls": [_call("terminal")]}, {"content": "b"})
    [verdict] = evaluate_filters(msgs, ["terminal"])
    assert verdict.name == NO_REASONING
    assert "2 assistant turn" in verdict.reason
    assert evaluate_filters(msgs, ["terminal"], require_reasoning=False) == []


def test_reasoning_found_in_scratchpad_content_or_reasoning_content() -> None:
    scratch = _conv({"content": "<REASONING_SCRATCHPAD>r</REASONING_SCRATCHPAD>ok"})
    native = _conv({"content": "ok", "reasoning_content": "r"})
    assert evaluate_filters(scratch, []) == []
    assert evaluate_filters(native, []) == []


def test_no_assistant_turn_has_no_reasoning() -> None:
    [verdict] = evaluate_filters([{"role": "user", "content": "q"}], [])
    assert verdict.name == NO_REASONING and "no assistant turn" in verdict.reason


def test_hallucinated_tool_is_checked_against_offered_tools_not_a_global_registry() -> None:
    # `terminal` exists in trajforge, but this sample was only offered web tools.
    msgs = _conv({"content": None, "reasoning": "r", "tool_calls": [_call("web_search"), _call("terminal")]})
    [verdict] = evaluate_filters(msgs, ["web_search", "web_extract"])
    assert verdict.name == HALLUCINATED_TOOL
    assert "'terminal' (assistant turn 1)" in verdict.reason
    assert "web_search" not in verdict.reason.split(";")[0]
    assert evaluate_filters(msgs, ["web_search", "terminal"]) == []


def test_incomplete_scratchpad_and_unclosed_think() -> None:
    msgs = _conv({"content": "<REASONING_SCRATCHPAD>was thinking and then", "reasoning": "r"})
    [verdict] = evaluate_filters(msgs, [])
    assert verdict.name == INCOMPLETE_SCRATCHPAD
    assert "assistant turn 1 content" in verdict.reason
    msgs = _conv({"content": "<think>cut", "reasoning": "r"})
    assert [v.name for v in evaluate_filters(msgs, [])] == [INCOMPLETE_SCRATCHPAD]


def test_all_failing_filters_are_reported_together() -> None:
    msgs = _conv({"content": "<REASONING_SCRATCHPAD>", "tool_calls": [_call("made_up")]})
    # The scratchpad counts as reasoning, so only the other two fire.
    assert [v.name for v in evaluate_filters(msgs, [])] == [HALLUCINATED_TOOL, INCOMPLETE_SCRATCHPAD]
    msgs = _conv({"content": "x", "tool_calls": [_call("made_up")]})
    assert [v.name for v in evaluate_filters(msgs, [])] == [NO_REASONING, HALLUCINATED_TOOL]


def test_reasoning_coverage_counts_and_sums() -> None:
    msgs = _conv(
        {"content": "a", "reasoning": "r"},
        {"content": "<REASONING_SCRATCHPAD>s</REASONING_SCRATCHPAD>"},
        {"content": "plain"},
    )
    cov = reasoning_coverage(msgs)
    assert cov == ReasoningCoverage(with_reasoning=2, without_reasoning=1)
    total = cov + ReasoningCoverage(1, 3)
    assert (total.with_reasoning, total.without_reasoning, total.total) == (3, 4, 7)
    assert ReasoningCoverage().ratio == 0.0
