"""Pythonic calls ``[f(a=1), g(b="x")]``: read with ast, literals only, never evaluated."""

from __future__ import annotations

import pytest

from trajforge.llm.parsers import get_parser


def parse(text, tools=None):
    return get_parser("pythonic").parse(text, tools)


def test_several_calls_nested_and_unicode_literals():
    text = (
        "[get_weather(city='San Francisco', metric=\"celsius\"), "
        "search(q={'filters': [{'k': 'läge', 'v': (1, -2.5, None, True)}]}, note='東京 🌧️'), "
        "ns.tool.run(flag=false, empty=null, n=+3)]"
    )
    result = parse(text)
    assert result.errors == []
    assert [c.name for c in result.calls] == ["get_weather", "search", "ns.tool.run"]
    assert result.calls[1].arguments == {
        "q": {"filters": [{"k": "läge", "v": [1, -2.5, None, True]}]},
        "note": "東京 🌧️",
    }
    assert result.calls[2].arguments == {"flag": False, "empty": None, "n": 3}
    assert result.content is None


def test_text_before_and_after_and_python_start_markers():
    text = (
        "I'll look it up [see notes(1)] first.\n"
        '<|python_start|>[lookup(id=\'a]b)c\', sql="""select \']\' from t""")]<|python_end|>\n'
        "Then answer."
    )
    result = parse(text)
    assert result.errors == []
    assert result.calls[0].arguments == {"id": "a]b)c", "sql": "select ']' from t"}
    assert result.content == "I'll look it up [see notes(1)] first.\n\nThen answer."


def test_numbers_as_strings_stay_strings_with_or_without_schema():
    tools = [
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}},
        }
    ]
    for schema in (None, tools):
        assert parse("[f(n='5', m=5)]", schema).calls[0].arguments == {"n": "5", "m": 5}


@pytest.mark.parametrize(
    "text,message",
    [
        ("[f(a=1", "unclosed call list"),
        ("[f(a='unterminated)]", "unclosed call list"),
        ("[f(1, a=2)]", "positional arguments"),
        ("[f(a=open('/etc/passwd'))]", "not a literal"),
        ("[f(a=x + 1)]", "not a literal"),
        ("[f(**kw)]", "**kwargs"),
        ("[f(a=1) g(b=2)]", "not a valid Python call list"),
        ("[f(a={1: 2})]", "dict keys must be strings"),
        ("[f(a=b'x')]", "not a literal"),
        ("[f(a=1), 3]", "not a call"),
        ("[f()(a=1)]", "not a name"),
    ],
)
def test_malformed(text, message):
    result = parse("Before\n" + text)
    assert result.calls == []
    assert len(result.errors) == 1 and message in result.errors[0].message, result.errors
    assert result.errors[0].fragment == text
    assert result.content == "Before"


def test_bad_list_does_not_hide_a_later_good_one():
    result = parse("[f(a=g())]\n[h(b=1)]")
    assert [c.name for c in result.calls] == ["h"]
    assert len(result.errors) == 1


def test_format_calls_rejects_non_identifier_keys():
    from trajforge.llm.parsers.base import ParsedCall

    with pytest.raises(ValueError, match="Python keywords"):
        get_parser("pythonic").format_calls([ParsedCall("f", {"not valid": 1})])
