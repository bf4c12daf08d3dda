"""The parser registry, auto detection, round trips through format_calls, ToolCall conversion, the CLI."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from trajforge.llm.parsers import ParsedCall, ParseResult, get_parser, list_parsers, to_tool_calls
from trajforge.llm.parsers.base import ToolCallParser
from trajforge.llm.types import ToolCall

FAMILIES = [name for name in list_parsers() if name != "auto"]
CALLS = [
    ParsedCall(
        "get_weather", {"city": "Tōkyō", "days": 5, "opts": {"units": ["C", "F"], "x": None}, "ok": True}
    ),
    ParsedCall("list_files", {}),
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "opts": {"type": "object"},
                    "ok": {"type": "boolean"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "list_files", "parameters": {"type": "object", "properties": {}}},
    },
]


def test_list_parsers_names_every_family():
    assert list_parsers() == sorted(
        [
            "auto",
            "deepseek_v3",
            "deepseek_v31",
            "glm45",
            "glm47",
            "hermes",
            "kimi_k2",
            "llama3_json",
            "longcat",
            "mistral",
            "pythonic",
            "qwen3_coder",
        ]
    )


def test_unknown_parser_lists_the_names():
    with pytest.raises(ValueError, match=r"unknown tool-call parser 'qwen9'.*hermes.*qwen3_coder"):
        get_parser("qwen9")


@pytest.mark.parametrize("family", FAMILIES)
def test_each_parser_follows_the_protocol_and_names_its_markers(family):
    parser = get_parser(family)
    assert isinstance(parser, ToolCallParser)
    assert parser.name == family
    assert parser.start_marker and parser.start_marker in parser.markers
    assert parser.start_marker in parser.format_calls(CALLS) or family == "llama3_json"


@pytest.mark.parametrize("family", FAMILIES)
def test_format_then_parse_round_trips_with_text_around(family):
    parser = get_parser(family)
    text = "Thinking about it.\n" + parser.format_calls(CALLS) + "\nWaiting for results."
    result = parser.parse(text, TOOLS)
    assert result.errors == []
    assert result.calls == CALLS
    assert result.content is not None
    assert result.content.startswith("Thinking about it.") and result.content.endswith("Waiting for results.")


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_detects_each_family(family):
    text = "Okay.\n" + get_parser(family).format_calls(CALLS)
    result = get_parser("auto").parse(text, TOOLS)
    expected = "glm47" if family == "glm45" else family  # auto cannot tell GLM-4.5 from 4.7
    assert result.parser == expected
    assert result.calls == CALLS


def test_auto_without_markers_is_all_content_and_reports_broken_calls():
    auto = get_parser("auto")
    plain = auto.parse("  No tools needed: the answer is 4.  ")
    text = "  No tools needed: the answer is 4.  "
    assert plain == ParseResult("No tools needed: the answer is 4.", [], [], None, prose=text)
    broken = auto.parse('<tool_call>{"name": "f", </tool_call>')
    assert broken.parser == "hermes" and broken.calls == [] and len(broken.errors) == 1
    with pytest.raises(ValueError, match="pick a family"):
        auto.format_calls(CALLS)


def test_to_tool_calls_deterministic_ids_and_json_arguments():
    result = get_parser("hermes").parse(get_parser("hermes").format_calls(CALLS))
    calls = to_tool_calls(result)
    assert [c.id for c in calls] == ["call_0", "call_1"]
    assert all(isinstance(c, ToolCall) for c in calls)
    assert json.loads(calls[0].arguments) == CALLS[0].arguments
    assert "Tōkyō" in calls[0].arguments
    assert calls[1].arguments == "{}"
    assert [c.id for c in to_tool_calls(result, start=5)] == ["call_5", "call_6"]
    assert to_tool_calls(result) == calls


def test_format_calls_accepts_agent_tool_calls():
    calls = [ToolCall(id="x", name="f", arguments='{"a": [1]}')]
    assert get_parser("hermes").parse(get_parser("hermes").format_calls(calls)).calls == [
        ParsedCall("f", {"a": [1]})
    ]


def test_many_unclosed_tags_are_each_reported():
    text = "<tool_call>{" * 20_000 + '<tool_call>{"name": "f"}</tool_call>'
    result = get_parser("hermes").parse(text)
    assert len(result.errors) == 20_000
    assert result.calls == [ParsedCall("f", {})]


# --- CLI --------------------------------------------------------------------------------------


@pytest.fixture
def app() -> typer.Typer:
    from trajforge.cli.parse import register

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """Keeps ``parse`` a subcommand, as in the real app."""

    register(app)
    return app


def test_cli_prints_the_parse_as_json(app, tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps({"tools": TOOLS}))
    text = (
        "Hi <tool_call>\n<function=get_weather>\n<parameter=days>\n5\n</parameter>\n</function>\n</tool_call>"
    )
    out = CliRunner().invoke(
        app, ["parse", "--tool-call-parser", "qwen3_coder", "--tools", str(tools)], input=text
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout) == {
        "parser": "qwen3_coder",
        "content": "Hi",
        "calls": [{"name": "get_weather", "arguments": {"days": 5}}],
        "errors": [],
    }
    untyped = CliRunner().invoke(app, ["parse", "-p", "qwen3_coder"], input=text)
    assert json.loads(untyped.stdout)["calls"][0]["arguments"] == {"days": "5"}


def test_cli_reports_parse_errors_in_the_output(app):
    out = CliRunner().invoke(app, ["parse"], input="[TOOL_CALLS]f{bad")
    assert out.exit_code == 0
    payload = json.loads(out.stdout)
    assert payload["parser"] == "mistral" and payload["calls"] == []
    assert payload["errors"][0]["fragment"] == "[TOOL_CALLS]f{bad"


@pytest.mark.parametrize(
    "args,content,message",
    [
        (["--tool-call-parser", "nope"], None, "unknown tool-call parser 'nope'"),
        (["--tools", "{missing}"], None, "cannot read tools file"),
        (["--tools", "{file}"], "{not json", "is not valid JSON"),
        (["--tools", "{file}"], '{"a": 1}', "must hold a JSON list of tools"),
    ],
)
def test_cli_bad_input_exits_2_with_a_clear_error(app, tmp_path, args, content, message):
    path = tmp_path / "tools.json"
    if content is not None:
        path.write_text(content)
    args = [a.format(file=path, missing=tmp_path / "absent.json") for a in args]
    out = CliRunner().invoke(app, ["parse", *args], input="text")
    assert out.exit_code == 2
    assert message in out.stderr


@pytest.mark.parametrize(
    "family,text",
    [
        (
            "hermes",
            '<tool_call>{"name": "f", "arguments": {"a": ' + "[" * 5000 + "]" * 5000 + "}}</tool_call>",
        ),
        ("llama3_json", '{"name": "f", "parameters": {"a": ' + "[" * 5000),
        ("mistral", "[TOOL_CALLS]f" + '{"a": ' * 3000),
    ],
)
def test_absurdly_nested_json_is_an_error_not_a_crash(family, text):
    result = get_parser(family).parse(text)
    assert result.calls == []
    assert [e.message for e in result.errors] == ["invalid JSON (nested too deeply)"]


def test_cli_is_wired_into_the_trajforge_app():
    from trajforge.cli.main import app as main_app

    out = CliRunner().invoke(
        main_app, ["parse", "--tool-call-parser", "hermes"], input='<tool_call>{"name": "f"}</tool_call>'
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["calls"] == [{"name": "f", "arguments": {}}]
