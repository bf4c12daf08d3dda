"""What models really emit, per kind and family (the held-out score is in test_parsers_heldout.py).

1. calls cut off by the end of generation before their end marker;
2. arguments that are a JSON string or another non-object value;
3. Qwen3-Coder ``<function=...>`` blocks without ``<tool_call>``;
4. values holding the format's own tags, and values typed by the tool schema;
5. the text around calls kept exactly, and text without calls returned untouched.
"""

from __future__ import annotations

import json

import pytest

from trajforge.llm.parsers import ParsedCall, get_parser, list_parsers, to_tool_calls

FAMILIES = [name for name in list_parsers() if name != "auto"]
PROPS = {
    "city": {"type": "string"},
    "days": {"type": "integer"},
    "opts": {"type": "object"},
    "ok": {"type": "boolean"},
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": PROPS, "required": list(PROPS)},
        },
    },
    {
        "type": "function",
        "function": {"name": "list_files", "parameters": {"type": "object", "properties": {}}},
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
]
CALLS = [
    ParsedCall(
        "get_weather", {"city": "Tōkyō", "days": 5, "opts": {"units": ["C", "F"], "x": None}, "ok": True}
    ),
    ParsedCall("list_files", {}),
]
B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
KS, KE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KB, KA, KC = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def parse(family, text, tools=TOOLS):
    return get_parser(family).parse(text, tools)


# --- 1. cut off by the end of generation --------------------------------------------------------

END_MARKERS = {
    "hermes": "</tool_call>",
    "longcat": "</longcat_tool_call>",
    "qwen3_coder": "</tool_call>",
    "glm45": "</tool_call>",
    "glm47": "</tool_call>",
    "deepseek_v3": CE + E,
    "deepseek_v31": CE + E,
    "kimi_k2": KC + KE,
    "mistral": None,  # no end marker; the pre-v11 list's "]" is tested below
    "llama3_json": None,
    "pythonic": "]",
}


@pytest.mark.parametrize("family", [f for f, end in END_MARKERS.items() if end])
@pytest.mark.parametrize("eaten", ["all", "half"])
def test_a_call_whose_end_marker_was_eaten_is_still_a_call(family, eaten):
    parser = get_parser(family)
    text = "Let me check.\n" + parser.format_calls(CALLS)
    end = END_MARKERS[family]
    assert text.endswith(end)
    cut = len(end) if eaten == "all" else max(1, len(end) - 3)
    result = parse(family, text[:-cut])
    assert result.errors == []
    assert result.calls == CALLS
    assert result.content == "Let me check."


@pytest.mark.parametrize("family", FAMILIES)
def test_every_prefix_gives_a_prefix_of_the_calls_or_an_error(family):
    """Cut anywhere, a parse never invents a call, drops one silently or returns a wrong one."""
    parser = get_parser(family)
    head = "Okay.\n"
    text = head + parser.format_calls(CALLS)
    for cut in range(len(head), len(text) + 1):
        prefix = text[:cut]
        result = parser.parse(prefix, TOOLS)
        assert result.calls == CALLS[: len(result.calls)], repr(prefix)
        attempted = any(m in prefix for m in parser.markers if len(m) > 1)
        if attempted and family not in ("llama3_json", "pythonic"):  # their markers are prose-like
            assert result.calls or result.errors, repr(prefix)


@pytest.mark.parametrize(
    "family,text",
    [
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'),
        ("hermes", "<tool_call>\n"),
        ("longcat", '<longcat_tool_call>{"name": "list_files", "argu'),
        (
            "qwen3_coder",
            "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n<parameter=content>\nimp",
        ),
        (
            "qwen3_coder",
            "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n",
        ),  # content required
        ("qwen3_coder", "<function=write_file>\n<parameter=path>\na.py\n</pa"),  # half a tag is not enough
        ("glm45", "<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>a.py</arg_value>\n"),
        ("glm45", "<tool_call>get_wea"),  # with tools given, an unknown name was cut
        ("glm47", "<tool_call>write_file<arg_key>path</arg_key><arg_value>a.p"),
        ("deepseek_v3", f"{B}{CB}function{SEP}get_weather\n```json\n"),
        ("deepseek_v3", f'{B}{CB}function{SEP}get_weather\n```json\n{{"city": '),
        ("deepseek_v31", f"{B}{CB}list_files{SEP}"),
        ("kimi_k2", f"{KS}{KB}functions.list_files:0{KA}"),
        ("kimi_k2", f"{KS}{KB}functions.list_files:0"),
        ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Par'),
        ("mistral", '[TOOL_CALLS] [{"name": "list_files", "arguments": {'),
        ("llama3_json", '<|python_tag|>{"name": "list_files", "parameters": {'),
        ("pythonic", "[get_weather(city='Par"),
    ],
)
def test_a_call_cut_inside_is_an_error_never_dropped(family, text):
    result = parse(family, "Sure.\n" + text)
    assert result.calls == []
    assert len(result.errors) == 1
    assert result.errors[0].fragment.strip() and result.errors[0].fragment in text
    assert result.content == "Sure."


def test_a_cut_call_after_complete_ones_keeps_them_and_reports_the_cut_one():
    mistral = parse("mistral", '[TOOL_CALLS] [{"name": "list_files", "arguments": {}}, {"name": "get_wea')
    assert mistral.calls == [CALLS[1]] and len(mistral.errors) == 1
    assert mistral.errors[0].fragment == '{"name": "get_wea'
    pythonic = parse("pythonic", "[list_files(), get_weather(city='Pa")
    assert pythonic.calls == [CALLS[1]] and len(pythonic.errors) == 1
    hermes = parse(
        "hermes", get_parser("hermes").format_calls([CALLS[1]]) + '\n<tool_call>\n{"name": "get_we'
    )
    assert hermes.calls == [CALLS[1]] and "unclosed" in hermes.errors[0].message


def test_without_a_schema_the_string_families_recover_after_complete_parameters():
    text = "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n"
    assert parse("qwen3_coder", text, None).calls == [ParsedCall("write_file", {"path": "a.py"})]
    glm = parse("glm45", "<tool_call>list_files", None)
    assert glm.calls == [ParsedCall("list_files", {})] and glm.errors == []


def test_an_unclosed_call_before_the_next_call_is_still_an_error():
    """Only the end of the text can eat an end marker; a missing one mid-text is the model's error."""
    hermes = get_parser("hermes")
    one = hermes.format_calls([CALLS[1]])
    result = hermes.parse(one[: -len("</tool_call>")] + "\n" + one)
    assert result.calls == [CALLS[1]] and len(result.errors) == 1


# --- 2. arguments that are not a JSON object ------------------------------------------------------

NON_OBJECT = [
    # family, text, arguments text the agent sees
    ("hermes", '<tool_call>{"name": "f", "arguments": "ls -la"}</tool_call>', "ls -la"),
    ("hermes", '<tool_call>{"name": "f", "arguments": ["a", 1]}</tool_call>', '["a", 1]'),
    ("hermes", '<tool_call>{"name": "f", "arguments": 3.5}</tool_call>', "3.5"),
    ("hermes", '<tool_call>{"name": "f", "arguments": "[1, 2]"}</tool_call>', "[1, 2]"),
    ("longcat", '<longcat_tool_call>{"name": "f", "arguments": "pwd"}</longcat_tool_call>', "pwd"),
    ("llama3_json", '{"name": "f", "parameters": "x=1"}', "x=1"),
    ("llama3_json", '{"name": "f", "parameters": [true]}', "[true]"),
    ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": "go"}]', "go"),
    ("mistral", '[TOOL_CALLS]f[ARGS]"ls -la"', '"ls -la"'),
    ("mistral", "[TOOL_CALLS]f[ARGS][1,2]", "[1,2]"),
    ("deepseek_v3", f'{B}{CB}function{SEP}f\n```json\n["a",  "b"]\n```{CE}{E}', '["a",  "b"]'),
    ("deepseek_v31", f'{B}{CB}f{SEP}"pwd"{CE}{E}', '"pwd"'),
    ("deepseek_v31", f"{B}{CB}f{SEP}42{CE}{E}", "42"),
    ("kimi_k2", f"{KS}{KB}functions.f:0{KA}[1, 2]{KC}{KE}", "[1, 2]"),
    ("kimi_k2", f'{KS}{KB}functions.f:0{KA}"ls"{KC}{KE}', '"ls"'),
]


@pytest.mark.parametrize("family,text,arguments", NON_OBJECT)
def test_non_object_arguments_are_passed_through_as_written(family, text, arguments):
    result = parse(family, text)
    assert result.errors == []
    [call] = to_tool_calls(result)
    assert call.name == "f" and call.arguments == arguments


@pytest.mark.parametrize(
    "family,text",
    [
        ("hermes", '<tool_call>{"name": "f", "arguments": "{\\"a\\": [1]}"}</tool_call>'),
        ("llama3_json", '{"name": "f", "parameters": "{\\"a\\": [1]}"}'),
        ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": "{\\"a\\": [1]}"}]'),
        ("deepseek_v31", B + CB + "f" + SEP + json.dumps('{"a": [1]}') + CE + E),
        ("kimi_k2", KS + KB + "functions.f:0" + KA + json.dumps('{"a": [1]}') + KC + KE),
    ],
)
def test_a_json_string_holding_an_object_is_decoded(family, text):
    assert parse(family, text).calls == [ParsedCall("f", {"a": [1]})]


@pytest.mark.parametrize("family", ["hermes", "longcat", "llama3_json"])
def test_passed_through_arguments_round_trip_through_format_calls(family):
    parser = get_parser(family)
    calls = [ParsedCall("f", "ls -la"), ParsedCall("g", "[1, 2]")]
    assert parser.parse(parser.format_calls(calls)).calls == calls


def test_tag_formats_refuse_to_write_non_object_arguments():
    for family in ("qwen3_coder", "glm45", "pythonic"):
        with pytest.raises(ValueError, match="object arguments"):
            get_parser(family).format_calls([ParsedCall("f", "ls")])


def test_invalid_json_arguments_stay_an_error():
    result = parse("deepseek_v31", f"{B}{CB}f{SEP}{{'a': 1}}{CE}{E}")
    assert result.calls == [] and "invalid JSON" in result.errors[0].message


# --- 3. Qwen3-Coder without the <tool_call> wrapper -----------------------------------------------


def _fn(name, params):
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<function={name}>\n{inner}</function>"


def test_bare_function_blocks_are_calls():
    text = (
        "I'll check the weather.\n"
        + _fn(
            "get_weather",
            {"city": "Tōkyō", "days": "5", "opts": '{"units": ["C", "F"], "x": null}', "ok": "true"},
        )
        + "\n"
        + _fn("list_files", {})
        + "\nDone."
    )
    result = parse("qwen3_coder", text)
    assert result.errors == []
    assert result.calls == CALLS
    assert result.prose == "I'll check the weather.\n\n\nDone."


def test_bare_and_wrapped_calls_mix():
    wrapped = get_parser("qwen3_coder").format_calls([CALLS[1]])
    result = parse("qwen3_coder", _fn("write_file", {"path": "a", "content": "b"}) + "\n" + wrapped)
    assert [c.name for c in result.calls] == ["write_file", "list_files"] and result.errors == []


def test_a_bare_function_cut_off_is_recovered_or_reported():
    ok = parse(
        "qwen3_coder",
        "<function=write_file>\n<parameter=path>\na\n</parameter>\n<parameter=content>\nb\n</param",
    )
    assert ok.calls == [ParsedCall("write_file", {"path": "a", "content": "b"})]
    cut = parse(
        "qwen3_coder", "<function=write_file>\n<parameter=path>\na\n</parameter>\n<parameter=content>\nb"
    )
    assert cut.calls == [] and "unclosed <function=write_file>" in cut.errors[0].message


@pytest.mark.parametrize(
    "text",
    [
        "Use <function=NAME> to call a tool.",
        "The tag <function=f> is followed by prose here, not a parameter.\n",
        "A template: <function=f>{{ args }}</function> is not a call",
    ],
)
def test_prose_that_mentions_a_function_tag_stays_prose(text):
    result = parse("qwen3_coder", text)
    assert result.calls == [] and result.errors == [] and result.prose == text


def test_a_malformed_bare_function_is_an_error():
    result = parse("qwen3_coder", "<function=f>\n<parameter=a>\n1\n</parameter>\njunk\n</function>")
    assert result.calls == [] and len(result.errors) == 1  # not a value "1</parameter>junk"


def test_auto_detects_bare_qwen3_coder_blocks():
    result = get_parser("auto").parse("Sure.\n" + _fn("list_files", {}), TOOLS)
    assert result.parser == "qwen3_coder" and result.calls == [CALLS[1]]


# --- 4. values holding markup, values typed by the schema -----------------------------------------

MARKUP = [
    "<div>\n  <parameter=lang>en</parameter>\n</div>",
    'END = "</parameter>"\nprint(END)',
    "Close calls with </function> and </tool_call>.",
    "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
    "<function=g>\n<parameter=b>\n2\n</parameter>\n</function>",
    "a <parameter=x> mention without its end tag",
    "<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>",
    "x < y && y > z; </p> <p>",
]


@pytest.mark.parametrize("content", MARKUP)
@pytest.mark.parametrize(
    "family", ["qwen3_coder", "glm45", "glm47", "hermes", "kimi_k2", "mistral", "pythonic"]
)
def test_values_holding_the_formats_own_tags_are_kept(family, content):
    parser = get_parser(family)
    calls = [ParsedCall("write_file", {"path": "doc.md", "content": content}), CALLS[1]]
    text = "Writing the file.\n" + parser.format_calls(calls) + "\nDone."
    result = parser.parse(text, TOOLS)
    assert result.errors == []
    assert result.calls == calls
    assert result.prose == "Writing the file.\n" + _between(parser, calls) + "\nDone."


def test_qwen3_coder_value_with_a_nested_call_and_a_missing_parameter_end_elsewhere():
    fixture = "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"
    text = (
        _fn("write_file", {"path": "t.py", "content": fixture})
        + "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n"
        + "</parameter>\n<parameter=opts>\n{}\n</parameter>\n<parameter=ok>\nfalse\n</parameter>\n</function>\n</tool_call>"
    )
    result = parse("qwen3_coder", text)
    assert result.errors == []
    assert result.calls == [
        ParsedCall("write_file", {"path": "t.py", "content": fixture}),
        ParsedCall("get_weather", {"city": "Oslo", "days": 2, "opts": {}, "ok": False}),
    ]


def test_a_parameter_tag_in_a_value_is_not_a_new_parameter_unless_the_tool_has_it():
    text = "<tool_call>\n<function=write_file>\n<parameter=content>\nsee\n<parameter=x>\n</function>\n</tool_call>"
    result = parse("qwen3_coder", text)
    assert result.calls == [ParsedCall("write_file", {"content": "see\n<parameter=x>"})]


def test_a_broken_call_after_a_value_with_an_end_tag_does_not_swallow_the_next_call():
    text = "<tool_call>\n<function=write_file>\n<parameter=content>\nno end </tool_call>\n" + get_parser(
        "qwen3_coder"
    ).format_calls([CALLS[1]])
    result = parse("qwen3_coder", text)
    assert result.calls == [CALLS[1]] and len(result.errors) == 1


TYPED = {
    "city": '{"not": "an object"}',  # a string parameter that looks like JSON stays a string
    "days": " 7 ",
    "opts": "{'units': ['K']}",
    "ok": "False",
}
TYPED_ARGS = {"city": '{"not": "an object"}', "days": 7, "opts": {"units": ["K"]}, "ok": False}


def test_qwen3_coder_values_typed_by_the_schema():
    assert parse("qwen3_coder", _fn("get_weather", TYPED)).calls == [ParsedCall("get_weather", TYPED_ARGS)]


@pytest.mark.parametrize("family,nl", [("glm45", "\n"), ("glm47", "")])
def test_glm_values_typed_by_the_schema(family, nl):
    pairs = "".join(f"<arg_key>{k}</arg_key>{nl}<arg_value>{v}</arg_value>{nl}" for k, v in TYPED.items())
    text = f"<tool_call>get_weather{nl}{pairs}</tool_call>"
    assert parse(family, text).calls == [ParsedCall("get_weather", TYPED_ARGS)]


def test_schema_without_type_is_read_from_properties_or_items():
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "properties": {"o": {"properties": {"a": {"type": "integer"}}}, "l": {"items": {}}}
                },
            },
        }
    ]
    result = parse(
        "glm47",
        "<tool_call>f<arg_key>o</arg_key><arg_value>{'a': 1}</arg_value>"
        "<arg_key>l</arg_key><arg_value>[1]</arg_value></tool_call>",
        tools,
    )
    assert result.calls == [ParsedCall("f", {"o": {"a": 1}, "l": [1]})]


def test_glm47_literal_newline_after_the_name():
    result = parse("glm47", "<tool_call>list_files\\n</tool_call>")
    assert result.calls == [CALLS[1]]


# --- 5. the text around calls, and text without calls ---------------------------------------------

PLAIN = [
    "The answer is 42.",
    "\n\n  Indented answer with trailing space.  \n",
    'Markup is fine: <b>bold</b>, a < b, [link](http://x), {"name": "Bob"}, `code`.\n',
    "多语言 ✓ émoji 🙂\r\nand CRLF lines\r\n",
    "",
    "   ",
]


@pytest.mark.parametrize("family", [*FAMILIES, "auto"])
@pytest.mark.parametrize("text", PLAIN)
def test_text_without_calls_comes_back_untouched(family, text):
    result = parse(family, text)
    assert result.calls == [] and result.errors == []
    assert result.prose == text
    assert result.content == (text.strip() or None)


def _between(parser, calls):
    """The layout ``format_calls`` writes between two calls (kept: it is outside both)."""
    both, first, second = (parser.format_calls(c) for c in (calls, calls[:1], calls[1:]))
    if not (both.startswith(first) and both.endswith(second)):
        return ""  # one section or list around all calls: no text between them
    between = both[len(first) : len(both) - len(second)]
    return between.replace(";", "") if parser.name == "llama3_json" else between  # ";" is syntax


@pytest.mark.parametrize("family", FAMILIES)
def test_text_around_calls_is_kept_exactly(family):
    parser = get_parser(family)
    before, after = "  Let me look at that:\n\n", "\n\nI'll report back.  \n"
    text = before + parser.format_calls(CALLS) + after
    result = parser.parse(text, TOOLS)
    assert result.errors == [] and result.calls == CALLS
    assert result.prose == before + _between(parser, CALLS) + after
    assert result.content == result.prose.strip()


@pytest.mark.parametrize(
    "family,text",
    [
        ("hermes", "Wrap every call in a <tool_call> tag."),
        ("longcat", "LongCat uses <longcat_tool_call> tags"),
        ("qwen3_coder", "Qwen writes <tool_call> and then a function."),
        ("glm45", "GLM opens calls with <tool_call> tags."),
        ("glm47", "GLM opens calls with <tool_call> tags."),
        ("pythonic", "[docs(v2)](https://example.com) and\n[print(x) for x in xs]\n"),
        ("llama3_json", 'Data: {"name": "Bob", "age": 3} and {"type": "function"} ok'),
    ],
)
def test_prose_that_mentions_a_marker_stays_prose(family, text):
    result = parse(family, text)
    assert result.calls == [] and result.errors == [] and result.prose == text


def test_section_markers_and_separators_are_call_syntax_not_prose():
    ds = parse("deepseek_v31", f"A {B}{CB}list_files{SEP}{{}}{CE}{E} B")
    assert ds.prose == "A  B"
    llama = parse("llama3_json", '<|python_tag|>{"name": "list_files", "parameters": {}};  x')
    assert llama.prose == "  x"


@pytest.mark.parametrize(
    "family,opening",
    [
        ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\nx "),
        ("glm45", "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>x "),
        ("hermes", '<tool_call>{"name": "f", "arguments": {"a": '),
        ("mistral", '[TOOL_CALLS] [{"name": "f", "arguments": {"a": '),
    ],
)
def test_thousands_of_cut_calls_are_each_reported_and_the_good_one_kept(family, opening):
    """Each open value is read again past its end tag once at most (the parse stays linear)."""
    parser = get_parser(family)
    result = parser.parse(opening * 5000 + "\n" + parser.format_calls([CALLS[1]]), TOOLS)
    assert result.calls == [CALLS[1]]
    assert len(result.errors) == 5000
