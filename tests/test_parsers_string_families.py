"""Families that carry argument values as strings: qwen3_coder, glm45, glm47 (schema-aware typing)."""

from __future__ import annotations

import pytest

from trajforge.llm.parsers import get_parser
from trajforge.llm.parsers.schema import ToolSchemas

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "parameters": {
                "type": "object",
                "properties": {
                    "cmd": {"type": "string"},
                    "timeout": {"type": "integer"},
                    "ratio": {"type": "number"},
                    "verbose": {"type": "boolean"},
                    "env": {"type": "object"},
                    "args": {"type": "array"},
                    "limit": {"type": ["integer", "null"]},
                    "tag": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                    "code": {"type": "string"},
                },
            },
        },
    }
]


def _qwen(fn: str, params: dict[str, str]) -> str:
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={fn}>\n{inner}</function>\n</tool_call>"


# --- qwen3_coder ------------------------------------------------------------------------------


def test_qwen3_coder_documented_format_with_text_around_and_two_calls():
    text = (
        "I'll run two commands.\n"
        + _qwen("run", {"cmd": "ls -la", "timeout": "5"})
        + "\n"
        + _qwen("run", {"cmd": "echo 'héllo 世界'"})
        + "\nThen I'll summarise."
    )
    result = get_parser("qwen3_coder").parse(text)
    assert result.errors == []
    assert [c.name for c in result.calls] == ["run", "run"]
    assert result.calls[0].arguments == {"cmd": "ls -la", "timeout": "5"}  # no schema: strings stay
    assert result.calls[1].arguments == {"cmd": "echo 'héllo 世界'"}
    assert result.content == "I'll run two commands.\n\n\nThen I'll summarise."


def test_qwen3_coder_schema_types_values():
    text = _qwen(
        "run",
        {
            "timeout": "5",
            "ratio": "0.25",
            "verbose": "True",
            "env": '{"A": {"B": [1, "ü"]}}',
            "args": '["-x", 2]',
            "limit": "null",
            "tag": "7",
            "cmd": "42",
        },
    )
    result = get_parser("qwen3_coder").parse(text, TOOLS)
    assert result.errors == []
    assert result.calls[0].arguments == {
        "timeout": 5,
        "ratio": 0.25,
        "verbose": True,
        "env": {"A": {"B": [1, "ü"]}},
        "args": ["-x", 2],
        "limit": None,
        "tag": 7,
        "cmd": "42",
    }


def test_qwen3_coder_multiline_code_value_is_kept_verbatim():
    code = "def f(x):\n    return x < 3 and x > 1\n\n"
    result = get_parser("qwen3_coder").parse(_qwen("run", {"code": code}), TOOLS)
    assert result.calls[0].arguments == {"code": code}


def test_qwen3_coder_tolerates_missing_parameter_close_when_unambiguous():
    text = "<tool_call><function=run><parameter=cmd>\nls\n<parameter=timeout>\n9\n</function></tool_call>"
    result = get_parser("qwen3_coder").parse(text, TOOLS)
    assert result.errors == []
    assert result.calls[0].arguments == {"cmd": "ls", "timeout": 9}


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n</tool_call>",
            "unclosed <function=run>",
        ),
        ("<tool_call>\n<function=run>\n<parameter=cmd>\nls", "unclosed <tool_call>"),
        ("<tool_call>\nrun ls\n</tool_call>", "unexpected text"),
        ("<tool_call>\n<function=>\n</function>\n</tool_call>", "invalid function name"),
        ("<tool_call>\n\n</tool_call>", "no <function=NAME>"),
        (
            "<tool_call><function=run><parameter=cmd>a</parameter><parameter=cmd>b</parameter></function></tool_call>",
            "given twice",
        ),
        (
            "<tool_call><function=run>junk<parameter=cmd>a</parameter></function></tool_call>",
            "unexpected text",
        ),
    ],
)
def test_qwen3_coder_malformed(text, message):
    result = get_parser("qwen3_coder").parse("before " + text)
    assert result.calls == []
    assert len(result.errors) == 1 and message in result.errors[0].message
    assert result.errors[0].fragment == text
    assert result.content == "before"


def test_qwen3_coder_type_mismatch_keeps_the_string():
    result = get_parser("qwen3_coder").parse(_qwen("run", {"timeout": "soon", "verbose": "maybe"}), TOOLS)
    assert result.calls[0].arguments == {"timeout": "soon", "verbose": "maybe"}


# --- glm45 / glm47 ----------------------------------------------------------------------------


def test_glm45_documented_format():
    text = (
        "Let me check.\n"
        "<tool_call>run\n<arg_key>cmd</arg_key>\n<arg_value>grep -r 'ß' .</arg_value>\n"
        "<arg_key>timeout</arg_key>\n<arg_value>30</arg_value>\n</tool_call>\n"
        '<tool_call>run\n<arg_key>env</arg_key>\n<arg_value>{"PATH": ["/bin"]}</arg_value>\n</tool_call>'
        "\nDone."
    )
    for tools, timeout in ((None, "30"), (TOOLS, 30)):
        result = get_parser("glm45").parse(text, tools)
        assert result.errors == []
        assert result.calls[0].arguments == {"cmd": "grep -r 'ß' .", "timeout": timeout}
        # without a schema, an obvious JSON object is decoded (documented); with one it is typed
        assert result.calls[1].arguments == {"env": {"PATH": ["/bin"]}}
        assert result.content == "Let me check.\n\n\nDone."


def test_glm45_requires_newline_after_name_glm47_does_not():
    text = "<tool_call>run<arg_key>timeout</arg_key><arg_value>5</arg_value></tool_call>"
    strict = get_parser("glm45").parse(text, TOOLS)
    assert strict.calls == [] and "newline after the function name" in strict.errors[0].message
    loose = get_parser("glm47").parse(text, TOOLS)
    assert loose.errors == [] and loose.calls[0].arguments == {"timeout": 5}


def test_glm47_literal_backslash_n_between_tags_and_no_arg_call():
    text = (
        "<tool_call>run<arg_key>cmd</arg_key>\\n<arg_value>ls</arg_value>\\n</tool_call>"
        "<tool_call>list_files</tool_call>"
    )
    result = get_parser("glm47").parse(text, TOOLS)
    assert result.errors == []
    assert [(c.name, c.arguments) for c in result.calls] == [("run", {"cmd": "ls"}), ("list_files", {})]


@pytest.mark.parametrize("family", ["glm45", "glm47"])
@pytest.mark.parametrize(
    "text,message",
    [
        ("<tool_call>run\n<arg_key>cmd</arg_key>\n<arg_value>ls\n</tool_call>", "unclosed argument"),
        ("<tool_call>run\n<arg_key>cmd</arg_key>\n</tool_call>", "unclosed argument"),
        ("<tool_call>run\n<arg_value>ls</arg_value>\n</tool_call>", "expected <arg_key>"),
        ("<tool_call>\n<arg_key>cmd</arg_key>\n<arg_value>ls</arg_value>\n</tool_call>", "no function name"),
        ("<tool_call>run\n<arg_key>cmd</arg_key>x<arg_value>ls</arg_value></tool_call>", "unexpected text"),
        ("<tool_call>run\n<arg_key>cmd</arg_key>\n<arg_value>ls</arg_value>", "unclosed <tool_call>"),
    ],
)
def test_glm_malformed(family, text, message):
    result = get_parser(family).parse(text + " tail")
    assert result.calls == []
    assert len(result.errors) == 1 and message in result.errors[0].message
    assert result.errors[0].fragment.startswith(text)


# --- schema typing ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "param,raw,expected",
    [
        ("timeout", "5", 5),
        ("timeout", " -12 ", -12),
        ("timeout", "5.0", 5),
        ("timeout", "5.5", "5.5"),
        ("ratio", "1e3", 1000.0),
        ("ratio", "7", 7),
        ("ratio", "nan", "nan"),
        ("verbose", "false", False),
        ("env", "{'a': 1}", {"a": 1}),
        ("env", "[1]", "[1]"),
        ("args", "not a list", "not a list"),
        ("limit", "None", None),
        ("limit", "3", 3),
        ("tag", "x7", "x7"),
        ("cmd", " 5 ", " 5 "),
        ("unknown", "5", "5"),
        ("unknown", '{"a": 1}', {"a": 1}),
        ("unknown", "{not json", "{not json"),
    ],
)
def test_schema_conversion_rules(param, raw, expected):
    assert ToolSchemas(TOOLS).convert("run", param, raw) == expected


def test_schema_ignores_malformed_tools_entries():
    schemas = ToolSchemas([{"type": "function"}, "nope", {"function": {"name": "f", "parameters": None}}])  # type: ignore[list-item]
    assert schemas.convert("f", "x", "5") == "5"
