"""Families whose calls carry JSON arguments: hermes, longcat, deepseek_v3/v31, kimi_k2, mistral, llama3_json.

Texts follow each family's documented output (chat templates / vLLM tool-parser docs).
"""

from __future__ import annotations

import pytest

from trajforge.llm.parsers import get_parser

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]
NESTED = {"q": {"filters": [{"k": "läge", "v": [1, 2.5, None, True]}], "emoji": "🌧️ 東京"}}


def _names(result):
    return [c.name for c in result.calls]


# --- hermes / longcat -------------------------------------------------------------------------


@pytest.mark.parametrize("family,tag", [("hermes", "tool_call"), ("longcat", "longcat_tool_call")])
def test_hermes_like_several_calls_with_text_around(family, tag):
    text = (
        "Let me check both cities.\n"
        f'<{tag}>\n{{"name": "get_weather", "arguments": {{"city": "Paris"}}}}\n</{tag}>\n'
        f'<{tag}>{{"name": "get_weather", "arguments": {{"city": "Tōkyō", "days": 3}}}}</{tag}>\n'
        "I will report back."
    )
    result = get_parser(family).parse(text)
    assert result.errors == []
    assert _names(result) == ["get_weather", "get_weather"]
    assert result.calls[1].arguments == {"city": "Tōkyō", "days": 3}
    assert result.content == "Let me check both cities.\n\n\nI will report back."
    assert result.parser == family


def test_hermes_nested_unicode_and_string_encoded_arguments():
    import json

    text = (
        f'<tool_call>{{"name": "search", "arguments": {json.dumps(NESTED, ensure_ascii=False)}}}</tool_call>'
        '<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}</tool_call>'
        '<tool_call>{"name": "ping"}</tool_call>'
    )
    result = get_parser("hermes").parse(text)
    assert result.errors == []
    assert [c.arguments for c in result.calls] == [NESTED, {"q": "x"}, {}]
    assert result.content is None


def test_hermes_unclosed_tag_is_an_error_and_does_not_swallow_the_next_call():
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}}\n'
        '<tool_call>{"name": "b", "arguments": {}}</tool_call> done\n'
        '<tool_call>{"name": "c", "arguments": {"y": 2'
    )
    result = get_parser("hermes").parse(text)
    assert _names(result) == ["b"]
    assert len(result.errors) == 2
    assert all("unclosed <tool_call>" in e.message for e in result.errors)
    assert result.errors[0].fragment.startswith('<tool_call>{"name": "a"')
    assert result.errors[1].fragment == '<tool_call>{"name": "c", "arguments": {"y": 2'
    assert result.errors[1].offset == text.index('<tool_call>{"name": "c"')
    assert result.content == "done"


@pytest.mark.parametrize(
    "body,message",
    [
        ('{"name": "f", "arguments": {"x": 1,}}', "invalid JSON"),
        ('{"arguments": {"x": 1}}', 'no "name"'),
        ('["f"]', "must be a JSON object"),
    ],
)
def test_hermes_malformed_call_is_reported(body, message):
    result = get_parser("hermes").parse(f"ok <tool_call>{body}</tool_call>")
    assert result.calls == []
    assert len(result.errors) == 1
    assert message in result.errors[0].message
    assert result.errors[0].fragment == f"<tool_call>{body}</tool_call>"
    assert result.content == "ok"


def test_hermes_json_numbers_keep_the_models_types_with_or_without_schema():
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": "5"}}</tool_call>'
    for tools in (None, TOOLS):
        assert get_parser("hermes").parse(text, tools).calls[0].arguments["days"] == "5"


def test_hermes_plain_text_has_no_calls():
    result = get_parser("hermes").parse("  just an answer \n")
    assert result.calls == [] and result.errors == [] and result.content == "just an answer"


# --- deepseek ---------------------------------------------------------------------------------

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def test_deepseek_v3_documented_format_two_calls():
    text = (
        "Checking the weather.\n"
        f"{B}{CB}function{SEP}get_weather\n```json\n"
        '{"city": "Hangzhou", "days": 2}\n```'
        f"{CE}\n{CB}function{SEP}search\n```json\n"
        '{"q": {"filters": [{"k": "läge"}]}}\n```'
        f"{CE}{E}Done."
    )
    result = get_parser("deepseek_v3").parse(text)
    assert result.errors == []
    assert _names(result) == ["get_weather", "search"]
    assert result.calls[0].arguments == {"city": "Hangzhou", "days": 2}
    assert result.calls[1].arguments == {"q": {"filters": [{"k": "läge"}]}}
    assert result.content == "Checking the weather.\n\nDone."


@pytest.mark.parametrize(
    "call,message",
    [
        (f'{CB}function{SEP}f\n```json\n{{"a": 1,\n```{CE}', "invalid JSON"),
        (f'{CB}function{SEP}f\n```json\n{{"a": 1}}\n{CE}', "unclosed ```json"),
        (f'{CB}function{SEP}f\n```json\n{{"a": 1}}\n```{E}', "unclosed"),
        (f"{CB}function f\n```json\n{{}}\n```{CE}", "no <｜tool▁sep｜>"),
        (f"{CB}function{SEP}\n```json\n{{}}\n```{CE}", 'no "name"'),
    ],
)
def test_deepseek_v3_malformed(call, message):
    result = get_parser("deepseek_v3").parse(f"text {B}{call}")
    assert result.calls == []
    assert len(result.errors) == 1 and message in result.errors[0].message
    assert result.errors[0].fragment.startswith(CB)
    assert result.content == "text"


def test_deepseek_section_without_calls_is_an_error():
    result = get_parser("deepseek_v31").parse(f"hi {B}garbage{E}")
    assert result.calls == [] and result.content == "hi"
    assert len(result.errors) == 1 and "without any" in result.errors[0].message


def test_deepseek_v31_format_and_errors():
    text = (
        f"Sure. {B}{CB}get_weather{SEP}"
        '{"city": "北京"}'
        f"{CE}{CB}get_weather{SEP}"
        '{"city": "Paris", "days": "5"}'
        f'{CE}{CB}broken{SEP}{{"city": }}{CE}{E} Anything else?'
    )
    result = get_parser("deepseek_v31").parse(text, TOOLS)
    assert [c.arguments for c in result.calls] == [{"city": "北京"}, {"city": "Paris", "days": "5"}]
    assert len(result.errors) == 1 and "invalid JSON" in result.errors[0].message
    assert "broken" in result.errors[0].fragment
    assert result.content == "Sure.  Anything else?"


# --- kimi k2 ----------------------------------------------------------------------------------

KS, KE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KB, KA, KC = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def test_kimi_k2_documented_format():
    text = (
        "Let me look.\n"
        f'{KS}{KB}functions.get_weather:0{KA}{{"city": "Beijing"}}{KC}'
        f'{KB}functions.search:1{KA}{{"q": {{"nested": ["ü", {{"x": 1}}]}}}}{KC}{KE}'
    )
    result = get_parser("kimi_k2").parse(text)
    assert result.errors == []
    assert _names(result) == ["get_weather", "search"]
    assert result.calls[1].arguments == {"q": {"nested": ["ü", {"x": 1}]}}
    assert result.content == "Let me look."


def test_kimi_k2_malformed_calls():
    text = (
        f'{KS}{KB}functions.ok:0{KA}{{"a": 1}}{KC}'
        f"{KB}functions.bad_json:1{KA}{{'a': 1}}{KC}"
        f'{KB}functions.no_args:2{{"a": 1}}{KC}'
        f'{KB}functions.cut:3{KA}{{"a": '
    )
    result = get_parser("kimi_k2").parse(text)
    assert _names(result) == ["ok"]
    messages = [e.message for e in result.errors]
    assert "invalid JSON" in messages[0]
    assert "no <|tool_call_argument_begin|>" in messages[1]
    assert "unclosed" in messages[2]
    assert result.errors[2].fragment == f'{KB}functions.cut:3{KA}{{"a": '


# --- mistral ----------------------------------------------------------------------------------


def test_mistral_pre_v11_json_list():
    text = (
        'Hello[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3.5, "b": 4}}, '
        '{"name": "get_weather", "arguments": {"city": "São Paulo"}}]'
    )
    result = get_parser("mistral").parse(text)
    assert result.errors == []
    assert [c.arguments for c in result.calls] == [{"a": 3.5, "b": 4}, {"city": "São Paulo"}]
    assert result.content == "Hello"


def test_mistral_v11_with_and_without_args_token():
    text = (
        "Working on it. "
        '[TOOL_CALLS]add{"a": 3.5, "b": 4}'
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich", "opts": {"units": ["C"]}}'
        '[TOOL_CALLS]lookup[CALL_ID]abc123XYZ[ARGS]{"id": "5"} trailing note'
    )
    result = get_parser("mistral").parse(text, TOOLS)
    assert result.errors == []
    assert _names(result) == ["add", "get_weather", "lookup"]
    assert result.calls[1].arguments == {"city": "Zürich", "opts": {"units": ["C"]}}
    assert result.calls[2].arguments == {"id": "5"}
    assert result.content == "Working on it.  trailing note"


@pytest.mark.parametrize(
    "text,message",
    [
        ('[TOOL_CALLS]add{"a": 3.5, }', "invalid JSON"),
        ("[TOOL_CALLS] not json at all", "expected a JSON object"),
        ('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}', "invalid JSON"),
        ('[TOOL_CALLS] [{"arguments": {"a": 1}}]', 'no "name"'),
        ("[TOOL_CALLS] []", "empty call list"),
        ("[TOOL_CALLS]", "expected a JSON list"),
    ],
)
def test_mistral_malformed(text, message):
    result = get_parser("mistral").parse("Before " + text)
    assert result.calls == []
    assert len(result.errors) == 1 and message in result.errors[0].message
    assert result.errors[0].fragment == text
    assert result.errors[0].offset == len("Before ")
    assert result.content == "Before"


def test_mistral_one_bad_call_keeps_the_good_ones():
    result = get_parser("mistral").parse('[TOOL_CALLS]a{"x": 1}[TOOL_CALLS]b{"x": [}[TOOL_CALLS]c{}')
    assert _names(result) == ["a", "c"]
    assert len(result.errors) == 1 and result.errors[0].fragment == '[TOOL_CALLS]b{"x": [}'


# --- llama3 json ------------------------------------------------------------------------------


def test_llama3_json_python_tag_and_semicolons():
    text = (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Lyon", "days": "2"}}; '
        '{"name": "search", "arguments": {"q": {"deep": ["ñ", 1]}}}'
    )
    result = get_parser("llama3_json").parse(text, TOOLS)
    assert result.errors == []
    assert _names(result) == ["get_weather", "search"]
    assert result.calls[0].arguments == {"city": "Lyon", "days": "2"}
    assert result.calls[1].arguments == {"q": {"deep": ["ñ", 1]}}
    assert result.content is None


def test_llama3_json_text_around_and_plain_json_stays_content():
    text = (
        'The user record is {"name": "Bob", "age": 3}. Calling now:\n'
        '{"type": "function", "name": "lookup", "parameters": {"id": 7}}\nThanks.'
    )
    result = get_parser("llama3_json").parse(text)
    assert result.errors == []
    assert _names(result) == ["lookup"]
    assert result.content == 'The user record is {"name": "Bob", "age": 3}. Calling now:\n\nThanks.'


def test_llama3_json_broken_call_is_an_error():
    text = 'Sure. {"name": "lookup", "parameters": {"id": 7}\n{"name": "ok", "parameters": {}}'
    result = get_parser("llama3_json").parse(text)
    assert _names(result) == ["ok"]
    assert len(result.errors) == 1 and "invalid JSON" in result.errors[0].message
    assert result.errors[0].fragment == '{"name": "lookup", "parameters": {"id": 7}\n'
    assert result.content == "Sure."


def test_llama3_json_non_object_arguments_are_passed_through():
    result = get_parser("llama3_json").parse('{"name": "f", "parameters": [1]}')
    assert result.errors == [] and result.calls[0].arguments == "[1]"
