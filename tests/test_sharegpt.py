"""OpenAI messages -> ShareGPT: golden files with hand-written reference text, plus our deviations."""

from __future__ import annotations

import copy
import difflib
import json
from pathlib import Path

import pytest

from trajforge.tools.base import FunctionTool, ToolOutput, openai_schema
from trajforge.trajectory import convert, format_tools, system_prompt, to_sharegpt

GOLDEN = sorted((Path(__file__).parent / "golden").glob("*.json"))


def _diff(expected: list[dict], actual: list[dict]) -> str:
    exp = json.dumps(expected, indent=1, ensure_ascii=False).splitlines()
    act = json.dumps(actual, indent=1, ensure_ascii=False).splitlines()
    return "\n".join(difflib.unified_diff(exp, act, "expected", "actual", lineterm=""))


def test_golden_files_exist() -> None:
    assert len(GOLDEN) >= 9


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden(path: Path) -> None:
    case = json.loads(path.read_text(encoding="utf-8"))
    messages = case["messages"]
    before = copy.deepcopy(messages)
    actual = to_sharegpt(messages, case["tools"], case.get("prompt"))
    assert actual == case["expected"], _diff(case["expected"], actual)
    assert messages == before, "conversion must not modify its input"


def _search_tool() -> FunctionTool:
    async def handler(args, ctx):  # pragma: no cover - never called
        return ToolOutput(content="")

    return FunctionTool(
        name="web_search",
        toolset="web",
        description="Search the web — fast.",
        parameters={"type": "object", "properties": {"query": {"type": "string"}}},
        handler=handler,
    )


def test_tools_as_objects_schemas_or_functions_give_the_same_system_text() -> None:
    tool = _search_tool()
    schema = openai_schema(tool)
    texts = {system_prompt([tool]), system_prompt([schema]), system_prompt([schema["function"]])}
    assert len(texts) == 1
    assert format_tools([tool]) == (
        '[{"name": "web_search", "description": "Search the web — fast.", '
        '"parameters": {"type": "object", "properties": {"query": {"type": "string"}}}, "required": null}]'
    )


def test_bad_tool_entry_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="OpenAI tools entry"):
        format_tools([{"type": "function"}])


def _call(name: str, args: str) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}


def test_invalid_json_arguments_are_kept_raw_and_flagged() -> None:
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [_call("terminal", '{"command": "ls"')]},
        {"role": "tool", "tool_call_id": "c1", "content": "Error: invalid JSON arguments"},
    ]
    result = convert(msgs, [])
    gpt = result.conversations[2]["value"]
    # The reference would have written {} and lost what the model produced.
    assert '{"name": "terminal", "arguments": "{\\"command\\": \\"ls\\""}' in gpt
    [issue] = result.invalid_arguments
    assert issue.turn == 2 and "terminal" in issue.detail


@pytest.mark.parametrize("raw", [None, "", "  "])
def test_missing_arguments_mean_no_arguments(raw: str | None) -> None:
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [_call("process", raw)]}]
    result = convert(msgs, [])
    assert '{"name": "process", "arguments": {}}' in result.conversations[2]["value"]
    assert result.issues == []


def test_non_object_arguments_are_flagged() -> None:
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [_call("terminal", "[1]")]}]
    result = convert(msgs, [])
    assert '"arguments": [1]' in result.conversations[2]["value"]
    assert [i.kind for i in result.issues] == ["invalid_arguments"]


def test_orphan_tool_results_are_kept_and_flagged() -> None:
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "no calls"},
        {"role": "tool", "tool_call_id": "x", "name": "terminal", "content": "out"},
    ]
    result = convert(msgs, [])
    assert result.conversations[-1] == {
        "from": "tool",
        "value": '<tool_response>\n{"tool_call_id": "x", "name": "terminal", "content": "out"}\n</tool_response>',
    }
    assert [i.kind for i in result.issues] == ["orphan_tool_result"]


def test_prefill_messages_are_not_saved() -> None:
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "prefill question"},
        {"role": "assistant", "content": "prefill answer"},
        {"role": "user", "content": "real prompt"},
        {"role": "assistant", "content": "real answer"},
    ]
    conv = to_sharegpt(msgs, [], prefill_messages=2)
    assert [t["from"] for t in conv] == ["system", "human", "gpt"]
    assert conv[1]["value"] == "real prompt"
    assert conv[2]["value"] == "<think>\n</think>\nreal answer"


def test_prompt_taken_from_multimodal_user_content() -> None:
    msgs = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {}}],
        },
        {"role": "assistant", "content": "a cat"},
    ]
    assert to_sharegpt(msgs, [])[1] == {"from": "human", "value": "describe"}


def test_no_user_message_needs_a_prompt() -> None:
    with pytest.raises(ValueError, match="pass prompt="):
        to_sharegpt([{"role": "system", "content": "s"}], [])
    conv = to_sharegpt([{"role": "assistant", "content": "hi"}], [], prompt="p")
    assert [t["value"] for t in conv[1:]] == ["p", "<think>\n</think>\nhi"]


def test_unknown_role_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unsupported message role 'function'"):
        to_sharegpt([{"role": "user", "content": "q"}, {"role": "function", "content": "x"}], [])


def test_agent_turn_messages_round_trip() -> None:
    """Messages built by AssistantTurn.to_message (our agent loop) convert with their reasoning."""
    from trajforge.llm.types import AssistantTurn, ToolCall

    turn = AssistantTurn(
        content="checking",
        reasoning="think first",
        tool_calls=[ToolCall(id="i", name="terminal", arguments="{}")],
    )
    msgs = [{"role": "user", "content": "q"}, turn.to_message()]
    assert to_sharegpt(msgs, [])[2]["value"] == (
        '<think>\nthink first\n</think>\nchecking\n<tool_call>\n{"name": "terminal", "arguments": {}}\n</tool_call>'
    )


def test_tool_result_without_content_is_null_like_the_reference() -> None:
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "tool_calls": [_call("process", "{}")]},
        {"role": "tool", "tool_call_id": "c1", "content": None},
    ]
    assert to_sharegpt(msgs, [])[-1]["value"] == (
        '<tool_response>\n{"tool_call_id": "c1", "name": "process", "content": null}\n</tool_response>'
    )
