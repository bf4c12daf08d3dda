"""A held-out set of model outputs per family and kind, scored as a whole (calls right on >= 95%).

The cases were written from the formats' documentation (chat templates, the family modules'
docstrings) and from outputs real models produce, *before* the parsers were changed to recover
them, and were not tuned against the parsers afterwards. Kinds:

- ``plain``: no call at all -- the text must come back untouched (``prose`` byte-identical);
- ``content``: text around calls, kept exactly;
- ``truncated``: a call cut off before its closing tag (a stop string or the end of generation
  ate it) -- a complete body is a call, an incomplete one an error;
- ``non_object``: arguments written as a JSON string or another non-object value, passed through;
- ``bare``: Qwen3-Coder ``<function=...>`` blocks without the ``<tool_call>`` wrapper;
- ``markup``: values holding the format's own tags or other markup;
- ``typed``: string-carried values typed by the tool schema;
- ``wellformed`` / ``malformed``: the ordinary cases, as a control.

A case is right when the calls (name and arguments, as the agent will see them through
:func:`to_tool_calls`) and the number of errors match, and, where the case gives it, the exact text
outside the calls (``ParseResult.prose``).

Scores when the set was written: the parsers before this change, 53/147 (73/147 on calls and
errors alone; they had no ``prose`` and trimmed ``content``); after, 146/147. The miss is
``a-mention``: ``<tool_call> and </tool_call>`` in prose, which ``auto`` reads as a GLM call
named ``and`` (a closed block is always taken as an attempt).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trajforge.llm.parsers import get_parser, to_tool_calls

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout": {"type": "integer"},
                    "background": {"type": "boolean"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "max_results": {"type": "integer"},
                    "threshold": {"type": "number"},
                    "filters": {"type": "object"},
                    "tags": {"type": "array"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "list_files", "parameters": {"type": "object", "properties": {}}},
    },
]


@dataclass(frozen=True)
class Case:
    id: str
    family: str
    kind: str
    text: str
    calls: list[tuple[str, Any]] = field(default_factory=list)
    errors: int = 0
    prose: str | None = None
    tools: Any = None


def _norm(value: Any) -> Any:
    """Arguments as the agent sees them: a decoded JSON value; a string however it was spelled."""
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return ("text", value)
        return ("text", decoded) if isinstance(decoded, str) else ("json", decoded)
    return ("json", value)


# --- hermes / longcat -------------------------------------------------------------------------


def _hermes(name: str, args: Any, tag: str = "tool_call") -> str:
    return f"<{tag}>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + f"\n</{tag}>"


RUN_LS = ("run", {"command": "ls -la"})
CASES: list[Case] = [
    Case("h-plain", "hermes", "plain", "The answer is 42."),
    Case(
        "h-plain-ws",
        "hermes",
        "plain",
        "\n  Nothing to run here — done.\n\n",
        prose="\n  Nothing to run here — done.\n\n",
    ),
    Case(
        "h-content",
        "hermes",
        "content",
        "Let me check.\n" + _hermes(*RUN_LS) + "\nWaiting for the output. ",
        [RUN_LS],
        prose="Let me check.\n\nWaiting for the output. ",
    ),
    Case(
        "h-trunc",
        "hermes",
        "truncated",
        "Listing.\n<tool_call>\n" + json.dumps({"name": "run", "arguments": {"command": "ls -la"}}) + "\n",
        [RUN_LS],
    ),
    Case(
        "h-trunc-partial-close",
        "hermes",
        "truncated",
        '<tool_call>\n{"name": "run", "arguments": {"command": "ls -la"}}\n</tool_',
        [RUN_LS],
    ),
    Case(
        "h-trunc-incomplete",
        "hermes",
        "truncated",
        '<tool_call>\n{"name": "run", "arguments": {"command": "ls -l',
        errors=1,
    ),
    Case(
        "h-trunc-second",
        "hermes",
        "truncated",
        _hermes("list_files", {}) + "\n" + '<tool_call>\n{"name": "run", "arguments": {"command": "ls -la"}}',
        [("list_files", {}), RUN_LS],
    ),
    Case("h-trunc-empty", "hermes", "truncated", "Let me run it.\n<tool_call>\n", errors=1),
    Case(
        "h-str-obj",
        "hermes",
        "non_object",
        '<tool_call>\n{"name": "run", "arguments": "{\\"command\\": \\"ls -la\\"}"}\n</tool_call>',
        [RUN_LS],
    ),
    Case(
        "h-str",
        "hermes",
        "non_object",
        '<tool_call>\n{"name": "run", "arguments": "ls -la"}\n</tool_call>',
        [("run", "ls -la")],
    ),
    Case(
        "h-array",
        "hermes",
        "non_object",
        '<tool_call>\n{"name": "search", "arguments": ["cats", 3]}\n</tool_call>',
        [("search", ["cats", 3])],
    ),
    Case(
        "h-number",
        "hermes",
        "non_object",
        '<tool_call>{"name": "search", "arguments": 7}</tool_call>',
        [("search", 7)],
    ),
    Case(
        "h-markup",
        "hermes",
        "markup",
        _hermes(
            "write_file",
            {"path": "notes.md", "content": "Calls look like <tool_call>{...}</tool_call> in Hermes."},
        ),
        [
            (
                "write_file",
                {"path": "notes.md", "content": "Calls look like <tool_call>{...}</tool_call> in Hermes."},
            )
        ],
    ),
    Case(
        "h-mention",
        "hermes",
        "plain",
        "Wrap each call in a <tool_call> tag, then stop.",
        prose="Wrap each call in a <tool_call> tag, then stop.",
    ),
    Case(
        "h-bad-json",
        "hermes",
        "malformed",
        '<tool_call>\n{"name": "run", "arguments": {"command": "ls",}}\n</tool_call>',
        errors=1,
    ),
    Case(
        "h-two",
        "hermes",
        "wellformed",
        _hermes("run", {"command": "pwd"}) + "\n" + _hermes("list_files", {}),
        [("run", {"command": "pwd"}), ("list_files", {})],
    ),
    Case("lc-plain", "longcat", "plain", "  Plain answer.\n", prose="  Plain answer.\n"),
    Case(
        "lc-content",
        "longcat",
        "content",
        "I will look.\n" + _hermes(*RUN_LS, tag="longcat_tool_call") + "\n",
        [RUN_LS],
        prose="I will look.\n\n",
    ),
    Case(
        "lc-trunc",
        "longcat",
        "truncated",
        '<longcat_tool_call>\n{"name": "run", "arguments": {"command": "ls -la"}}\n',
        [RUN_LS],
    ),
    Case(
        "lc-trunc-partial",
        "longcat",
        "truncated",
        '<longcat_tool_call>{"name": "run", "arguments": {"command": "ls -la"}}</longcat_tool',
        [RUN_LS],
    ),
    Case(
        "lc-trunc-incomplete",
        "longcat",
        "truncated",
        '<longcat_tool_call>{"name": "run", "arguments": {"comm',
        errors=1,
    ),
    Case(
        "lc-str",
        "longcat",
        "non_object",
        '<longcat_tool_call>{"name": "run", "arguments": "pwd"}</longcat_tool_call>',
        [("run", "pwd")],
    ),
    Case(
        "lc-array",
        "longcat",
        "non_object",
        '<longcat_tool_call>{"name": "search", "arguments": [1, 2]}</longcat_tool_call>',
        [("search", [1, 2])],
    ),
    Case(
        "lc-markup",
        "longcat",
        "markup",
        _hermes(
            "write_file",
            {"path": "a.txt", "content": "end tag: </longcat_tool_call>"},
            tag="longcat_tool_call",
        ),
        [("write_file", {"path": "a.txt", "content": "end tag: </longcat_tool_call>"})],
    ),
    Case(
        "lc-bad", "longcat", "malformed", '<longcat_tool_call>{"arguments": {}}</longcat_tool_call>', errors=1
    ),
]

# --- qwen3_coder ------------------------------------------------------------------------------


def _q(fn: str, params: dict[str, str], wrap: bool = True) -> str:
    inner = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    body = f"<function={fn}>\n{inner}</function>"
    return f"<tool_call>\n{body}\n</tool_call>" if wrap else body


HTML = '<div class="note">\n  <parameter=lang>en</parameter>\n</div>'
PY_FIXTURE = 'CALL = """<tool_call>\n<function=run>\n<parameter=command>\nls\n</parameter>\n</function>\n</tool_call>"""\n'
CASES += [
    Case(
        "q-plain",
        "qwen3_coder",
        "plain",
        "All tests pass; nothing else to do.\n",
        prose="All tests pass; nothing else to do.\n",
        tools=TOOLS,
    ),
    Case(
        "q-content",
        "qwen3_coder",
        "content",
        "I'll list the files first.\n\n" + _q("run", {"command": "ls -la"}) + "\nThen I'll read them.",
        [RUN_LS],
        prose="I'll list the files first.\n\n\nThen I'll read them.",
        tools=TOOLS,
    ),
    Case(
        "q-trunc-toolcall",
        "qwen3_coder",
        "truncated",
        _q("run", {"command": "ls -la"})[: -len("</tool_call>")],
        [RUN_LS],
        tools=TOOLS,
    ),
    Case(
        "q-trunc-function",
        "qwen3_coder",
        "truncated",
        "<tool_call>\n<function=run>\n<parameter=command>\nls -la\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n",
        [("run", {"command": "ls -la", "timeout": 30})],
        tools=TOOLS,
    ),
    Case(
        "q-trunc-partial",
        "qwen3_coder",
        "truncated",
        _q("run", {"command": "ls -la"})[:-5],
        [RUN_LS],
        tools=TOOLS,
    ),
    Case(
        "q-trunc-value",
        "qwen3_coder",
        "truncated",
        "<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n<parameter=content>\nimport o",
        errors=1,
        tools=TOOLS,
    ),
    Case(
        "q-trunc-empty", "qwen3_coder", "truncated", "Running it now.\n<tool_call>\n", errors=1, tools=TOOLS
    ),
    Case(
        "q-bare", "qwen3_coder", "bare", _q("run", {"command": "ls -la"}, wrap=False), [RUN_LS], tools=TOOLS
    ),
    Case(
        "q-bare-two",
        "qwen3_coder",
        "bare",
        _q("run", {"command": "pwd"}, wrap=False) + "\n" + _q("list_files", {}, wrap=False),
        [("run", {"command": "pwd"}), ("list_files", {})],
        tools=TOOLS,
    ),
    Case(
        "q-bare-text",
        "qwen3_coder",
        "bare",
        "Let me search.\n" + _q("search", {"query": "tool parsers", "max_results": "5"}, wrap=False) + "\n",
        [("search", {"query": "tool parsers", "max_results": 5})],
        prose="Let me search.\n\n",
        tools=TOOLS,
    ),
    Case(
        "q-bare-trunc",
        "qwen3_coder",
        "bare",
        "<function=run>\n<parameter=command>\nls -la\n</parameter>\n",
        [RUN_LS],
        tools=TOOLS,
    ),
    Case(
        "q-bare-untyped",
        "qwen3_coder",
        "bare",
        _q("run", {"command": "make test", "timeout": "600"}, wrap=False),
        [("run", {"command": "make test", "timeout": "600"})],
    ),
    Case(
        "q-markup-param",
        "qwen3_coder",
        "markup",
        _q("write_file", {"path": "note.html", "content": HTML}),
        [("write_file", {"path": "note.html", "content": HTML})],
        tools=TOOLS,
    ),
    Case(
        "q-markup-close",
        "qwen3_coder",
        "markup",
        _q("write_file", {"path": "p.py", "content": 'END = "</parameter>"\nprint(END)'}),
        [("write_file", {"path": "p.py", "content": 'END = "</parameter>"\nprint(END)'})],
        tools=TOOLS,
    ),
    Case(
        "q-markup-nested",
        "qwen3_coder",
        "markup",
        _q("write_file", {"path": "tests/fixture.py", "content": PY_FIXTURE}),
        [("write_file", {"path": "tests/fixture.py", "content": PY_FIXTURE})],
        tools=TOOLS,
    ),
    Case(
        "q-markup-function",
        "qwen3_coder",
        "markup",
        _q("write_file", {"path": "t.txt", "content": "close with </function> then </tool_call>"}),
        [("write_file", {"path": "t.txt", "content": "close with </function> then </tool_call>"})],
        tools=TOOLS,
    ),
    Case(
        "q-markup-html",
        "qwen3_coder",
        "markup",
        _q("write_file", {"path": "i.html", "content": "<html><body><p>Hi & bye</p></body></html>"}),
        [("write_file", {"path": "i.html", "content": "<html><body><p>Hi & bye</p></body></html>"})],
        tools=TOOLS,
    ),
    Case(
        "q-typed",
        "qwen3_coder",
        "typed",
        _q(
            "search",
            {
                "query": "x",
                "max_results": "10",
                "threshold": "0.5",
                "filters": '{"lang": "py"}',
                "tags": '["a", "b"]',
            },
        ),
        [
            (
                "search",
                {
                    "query": "x",
                    "max_results": 10,
                    "threshold": 0.5,
                    "filters": {"lang": "py"},
                    "tags": ["a", "b"],
                },
            )
        ],
        tools=TOOLS,
    ),
    Case(
        "q-typed-json-string",
        "qwen3_coder",
        "typed",
        _q("write_file", {"path": "c.json", "content": '{"a": 1, "b": [true]}'}),
        [("write_file", {"path": "c.json", "content": '{"a": 1, "b": [true]}'})],
        tools=TOOLS,
    ),
    Case(
        "q-typed-bool",
        "qwen3_coder",
        "typed",
        _q("run", {"command": "42", "background": "true", "timeout": "5"}),
        [("run", {"command": "42", "background": True, "timeout": 5})],
        tools=TOOLS,
    ),
    Case(
        "q-missing-param-close",
        "qwen3_coder",
        "wellformed",
        "<tool_call>\n<function=run>\n<parameter=command>\nls\n<parameter=timeout>\n9\n</function>\n</tool_call>",
        [("run", {"command": "ls", "timeout": 9})],
        tools=TOOLS,
    ),
    Case(
        "q-junk",
        "qwen3_coder",
        "malformed",
        "<tool_call>\n<function=run>\njunk\n</function>\n</tool_call>",
        errors=1,
        tools=TOOLS,
    ),
    Case(
        "q-two-blocks",
        "qwen3_coder",
        "wellformed",
        _q("run", {"command": "pwd"}) + "\nand\n" + _q("list_files", {}),
        [("run", {"command": "pwd"}), ("list_files", {})],
        prose="\nand\n",
        tools=TOOLS,
    ),
]

# --- glm45 / glm47 ----------------------------------------------------------------------------


def _g45(fn: str, params: dict[str, str]) -> str:
    inner = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in params.items())
    return f"<tool_call>{fn}\n{inner}</tool_call>"


def _g47(fn: str, params: dict[str, str]) -> str:
    inner = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in params.items())
    return f"<tool_call>{fn}{inner}</tool_call>"


CASES += [
    Case(
        "g-plain",
        "glm45",
        "plain",
        "\nNo tool is needed: 2 + 2 = 4.",
        prose="\nNo tool is needed: 2 + 2 = 4.",
        tools=TOOLS,
    ),
    Case(
        "g-content",
        "glm45",
        "content",
        "Checking.\n" + _g45("run", {"command": "ls -la"}) + "\n",
        [RUN_LS],
        prose="Checking.\n\n",
        tools=TOOLS,
    ),
    Case(
        "g-trunc",
        "glm45",
        "truncated",
        _g45("run", {"command": "ls -la"})[: -len("</tool_call>")],
        [RUN_LS],
        tools=TOOLS,
    ),
    Case(
        "g-trunc-partial",
        "glm45",
        "truncated",
        _g45("run", {"command": "ls -la"})[:-3],
        [RUN_LS],
        tools=TOOLS,
    ),
    Case(
        "g-trunc-value",
        "glm45",
        "truncated",
        "<tool_call>run\n<arg_key>command</arg_key>\n<arg_value>ls -",
        errors=1,
        tools=TOOLS,
    ),
    Case("g-trunc-name", "glm45", "truncated", "<tool_call>list_files", [("list_files", {})], tools=TOOLS),
    Case(
        "g-markup-close",
        "glm45",
        "markup",
        _g45("write_file", {"path": "a.py", "content": 'TAG = "</arg_value>"'}),
        [("write_file", {"path": "a.py", "content": 'TAG = "</arg_value>"'})],
        tools=TOOLS,
    ),
    Case(
        "g-markup-key",
        "glm45",
        "markup",
        _g45("write_file", {"path": "d.md", "content": "Keys go in <arg_key>name</arg_key> tags."}),
        [("write_file", {"path": "d.md", "content": "Keys go in <arg_key>name</arg_key> tags."})],
        tools=TOOLS,
    ),
    Case(
        "g-markup-toolcall",
        "glm45",
        "markup",
        _g45("write_file", {"path": "d.md", "content": "Calls end with </tool_call>."}),
        [("write_file", {"path": "d.md", "content": "Calls end with </tool_call>."})],
        tools=TOOLS,
    ),
    Case(
        "g-typed",
        "glm45",
        "typed",
        _g45("search", {"query": "q", "max_results": "3", "filters": '{"year": 2024}', "tags": "[1, 2]"}),
        [("search", {"query": "q", "max_results": 3, "filters": {"year": 2024}, "tags": [1, 2]})],
        tools=TOOLS,
    ),
    Case(
        "g-typed-json-string",
        "glm45",
        "typed",
        _g45("write_file", {"path": "x.json", "content": "[1, 2, 3]"}),
        [("write_file", {"path": "x.json", "content": "[1, 2, 3]"})],
        tools=TOOLS,
    ),
    Case(
        "g-name-only",
        "glm45",
        "wellformed",
        "<tool_call>list_files</tool_call>",
        [("list_files", {})],
        tools=TOOLS,
    ),
    Case(
        "g-mention",
        "glm45",
        "plain",
        "GLM writes <tool_call> blocks for tools.",
        prose="GLM writes <tool_call> blocks for tools.",
        tools=TOOLS,
    ),
    Case(
        "g-bad",
        "glm45",
        "malformed",
        "<tool_call>run\n<arg_value>ls</arg_value>\n</tool_call>",
        errors=1,
        tools=TOOLS,
    ),
    Case("g7-plain", "glm47", "plain", "Done.  ", prose="Done.  ", tools=TOOLS),
    Case(
        "g7-content",
        "glm47",
        "content",
        "On it." + _g47("run", {"command": "ls -la"}) + " More soon.",
        [RUN_LS],
        prose="On it. More soon.",
        tools=TOOLS,
    ),
    Case(
        "g7-trunc",
        "glm47",
        "truncated",
        _g47("run", {"command": "ls -la"})[: -len("</tool_call>")],
        [RUN_LS],
        tools=TOOLS,
    ),
    Case(
        "g7-trunc-partial",
        "glm47",
        "truncated",
        _g47("run", {"command": "ls -la"})[:-7],
        [RUN_LS],
        tools=TOOLS,
    ),
    Case(
        "g7-trunc-value",
        "glm47",
        "truncated",
        "<tool_call>run<arg_key>command</arg_key><arg_value>ls",
        errors=1,
        tools=TOOLS,
    ),
    Case(
        "g7-escaped-nl",
        "glm47",
        "wellformed",
        "<tool_call>run\\n<arg_key>command</arg_key>\\n<arg_value>ls -la</arg_value>\\n</tool_call>",
        [RUN_LS],
        tools=TOOLS,
    ),
    Case(
        "g7-markup-close",
        "glm47",
        "markup",
        _g47("write_file", {"path": "x.xml", "content": "<arg_value>1</arg_value>"}),
        [("write_file", {"path": "x.xml", "content": "<arg_value>1</arg_value>"})],
        tools=TOOLS,
    ),
    Case(
        "g7-markup-nested",
        "glm47",
        "markup",
        _g47("write_file", {"path": "f.txt", "content": _g47("run", {"command": "ls"})}),
        [("write_file", {"path": "f.txt", "content": _g47("run", {"command": "ls"})})],
        tools=TOOLS,
    ),
    Case(
        "g7-typed",
        "glm47",
        "typed",
        _g47("run", {"command": "true", "timeout": "15", "background": "false"}),
        [("run", {"command": "true", "timeout": 15, "background": False})],
        tools=TOOLS,
    ),
    Case(
        "g7-typed-number",
        "glm47",
        "typed",
        _g47("search", {"query": "3.14", "threshold": "0.75"}),
        [("search", {"query": "3.14", "threshold": 0.75})],
        tools=TOOLS,
    ),
    Case(
        "g7-two",
        "glm47",
        "wellformed",
        _g47("run", {"command": "pwd"}) + _g47("list_files", {}),
        [("run", {"command": "pwd"}), ("list_files", {})],
        tools=TOOLS,
    ),
]

# --- deepseek ---------------------------------------------------------------------------------

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def _d3(name: str, args: str) -> str:
    return f"{CB}function{SEP}{name}\n```json\n{args}\n```{CE}"


def _d31(name: str, args: str) -> str:
    return f"{CB}{name}{SEP}{args}{CE}"


LS = '{"command": "ls -la"}'
CASES += [
    Case(
        "d3-plain",
        "deepseek_v3",
        "plain",
        "I can answer directly: Paris.\n",
        prose="I can answer directly: Paris.\n",
    ),
    Case(
        "d3-content",
        "deepseek_v3",
        "content",
        "Let me check.\n" + B + _d3("run", LS) + E + "\nDone.",
        [RUN_LS],
        prose="Let me check.\n\nDone.",
    ),
    Case("d3-trunc", "deepseek_v3", "truncated", B + _d3("run", LS)[: -len(CE)], [RUN_LS]),
    Case(
        "d3-trunc-fence", "deepseek_v3", "truncated", B + f"{CB}function{SEP}run\n```json\n{LS}\n", [RUN_LS]
    ),
    Case("d3-trunc-partial", "deepseek_v3", "truncated", B + _d3("run", LS)[:-4], [RUN_LS]),
    Case(
        "d3-trunc-json",
        "deepseek_v3",
        "truncated",
        B + f'{CB}function{SEP}run\n```json\n{{"command": "ls',
        errors=1,
    ),
    Case(
        "d3-trunc-second",
        "deepseek_v3",
        "truncated",
        B + _d3("list_files", "{}") + _d3("run", LS)[: -len(CE)],
        [("list_files", {}), RUN_LS],
    ),
    Case(
        "d3-array",
        "deepseek_v3",
        "non_object",
        B + _d3("search", '["cats", "dogs"]') + E,
        [("search", ["cats", "dogs"])],
    ),
    Case("d3-string", "deepseek_v3", "non_object", B + _d3("run", '"ls -la"') + E, [("run", "ls -la")]),
    Case("d3-bad", "deepseek_v3", "malformed", B + _d3("run", '{"command": }') + E, errors=1),
    Case(
        "d31-plain",
        "deepseek_v31",
        "plain",
        "  Sure: the capital is Paris.",
        prose="  Sure: the capital is Paris.",
    ),
    Case(
        "d31-content",
        "deepseek_v31",
        "content",
        "Running.\n" + B + _d31("run", LS) + E + " ok",
        [RUN_LS],
        prose="Running.\n ok",
    ),
    Case("d31-trunc", "deepseek_v31", "truncated", B + _d31("run", LS)[: -len(CE)], [RUN_LS]),
    Case("d31-trunc-partial", "deepseek_v31", "truncated", B + _d31("run", LS)[:-3], [RUN_LS]),
    Case("d31-trunc-json", "deepseek_v31", "truncated", B + f'{CB}run{SEP}{{"command": "l', errors=1),
    Case(
        "d31-trunc-second",
        "deepseek_v31",
        "truncated",
        B + _d31("run", '{"command": "pwd"}') + _d31("list_files", "{}")[: -len(CE)],
        [("run", {"command": "pwd"}), ("list_files", {})],
    ),
    Case(
        "d31-array",
        "deepseek_v31",
        "non_object",
        B + _d31("search", "[1, 2, 3]") + E,
        [("search", [1, 2, 3])],
    ),
    Case("d31-string-obj", "deepseek_v31", "non_object", B + _d31("run", json.dumps(LS)) + E, [RUN_LS]),
    Case("d31-string", "deepseek_v31", "non_object", B + _d31("run", '"pwd"') + E, [("run", "pwd")]),
    Case(
        "d31-two",
        "deepseek_v31",
        "wellformed",
        B + _d31("run", LS) + _d31("list_files", "{}") + E,
        [RUN_LS, ("list_files", {})],
    ),
]

# --- kimi_k2 ----------------------------------------------------------------------------------

KS, KE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KB, KA, KC = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def _k(name: str, idx: int, args: str) -> str:
    return f"{KB}functions.{name}:{idx}{KA}{args}{KC}"


CASES += [
    Case(
        "k-plain",
        "kimi_k2",
        "plain",
        "Here is the summary you asked for.\n\n",
        prose="Here is the summary you asked for.\n\n",
    ),
    Case(
        "k-content",
        "kimi_k2",
        "content",
        "Let me look. " + KS + _k("run", 0, LS) + KE,
        [RUN_LS],
        prose="Let me look. ",
    ),
    Case("k-trunc", "kimi_k2", "truncated", KS + _k("run", 0, LS)[: -len(KC)], [RUN_LS]),
    Case("k-trunc-partial", "kimi_k2", "truncated", KS + _k("run", 0, LS)[:-6], [RUN_LS]),
    Case("k-trunc-json", "kimi_k2", "truncated", KS + f'{KB}functions.run:0{KA}{{"command": ', errors=1),
    Case(
        "k-trunc-second",
        "kimi_k2",
        "truncated",
        KS + _k("list_files", 0, "{}") + _k("run", 1, LS)[: -len(KC)],
        [("list_files", {}), RUN_LS],
    ),
    Case("k-array", "kimi_k2", "non_object", KS + _k("search", 0, '["x"]') + KE, [("search", ["x"])]),
    Case("k-string", "kimi_k2", "non_object", KS + _k("run", 0, '"ls -la"') + KE, [("run", "ls -la")]),
    Case(
        "k-singular",
        "kimi_k2",
        "wellformed",
        "<|tool_call_section_begin|>" + _k("run", 0, LS) + "<|tool_call_section_end|>",
        [RUN_LS],
    ),
    Case("k-bad", "kimi_k2", "malformed", KS + _k("run", 0, "{'command': 'ls'}") + KE, errors=1),
]

# --- mistral ----------------------------------------------------------------------------------

CASES += [
    Case("m-plain", "mistral", "plain", "Bonjour ! Rien à exécuter.\n", prose="Bonjour ! Rien à exécuter.\n"),
    Case(
        "m-content",
        "mistral",
        "content",
        'Sure. [TOOL_CALLS]run[ARGS]{"command": "ls -la"}',
        [RUN_LS],
        prose="Sure. ",
    ),
    Case(
        "m-list",
        "mistral",
        "wellformed",
        '[TOOL_CALLS] [{"name": "run", "arguments": {"command": "ls -la"}}, {"name": "list_files", "arguments": {}}]',
        [RUN_LS, ("list_files", {})],
    ),
    Case(
        "m-list-trunc",
        "mistral",
        "truncated",
        '[TOOL_CALLS] [{"name": "run", "arguments": {"command": "ls -la"}}',
        [RUN_LS],
    ),
    Case(
        "m-list-trunc-item",
        "mistral",
        "truncated",
        '[TOOL_CALLS] [{"name": "run", "arguments": {"command": "ls -la"}}, {"name": "list_fi',
        [RUN_LS],
        errors=1,
    ),
    Case(
        "m-list-trunc-only",
        "mistral",
        "truncated",
        '[TOOL_CALLS] [{"name": "run", "arguments": {"comma',
        errors=1,
    ),
    Case("m-v11-trunc", "mistral", "truncated", '[TOOL_CALLS]run[ARGS]{"command": "ls', errors=1),
    Case("m-v11-string", "mistral", "non_object", '[TOOL_CALLS]run[ARGS]"ls -la"', [("run", "ls -la")]),
    Case("m-v11-array", "mistral", "non_object", "[TOOL_CALLS]search[ARGS][1, 2]", [("search", [1, 2])]),
    Case(
        "m-list-string-obj",
        "mistral",
        "non_object",
        '[TOOL_CALLS] [{"name": "run", "arguments": "{\\"command\\": \\"ls -la\\"}"}]',
        [RUN_LS],
    ),
    Case(
        "m-markup",
        "mistral",
        "markup",
        '[TOOL_CALLS]write_file[ARGS]{"path": "m.txt", "content": "[TOOL_CALLS]add{\\"a\\": 1}"}',
        [("write_file", {"path": "m.txt", "content": '[TOOL_CALLS]add{"a": 1}'})],
    ),
    Case(
        "m-two",
        "mistral",
        "wellformed",
        '[TOOL_CALLS]run{"command": "pwd"}[TOOL_CALLS]list_files{}',
        [("run", {"command": "pwd"}), ("list_files", {})],
    ),
]

# --- llama3_json ------------------------------------------------------------------------------

CASES += [
    Case(
        "l-plain",
        "llama3_json",
        "plain",
        'The record is {"name": "Bob", "age": 3}.\n',
        prose='The record is {"name": "Bob", "age": 3}.\n',
    ),
    Case(
        "l-plain-ws", "llama3_json", "plain", "\n\nIt is sunny in Lyon.  ", prose="\n\nIt is sunny in Lyon.  "
    ),
    Case(
        "l-tag",
        "llama3_json",
        "wellformed",
        '<|python_tag|>{"name": "run", "parameters": {"command": "ls -la"}}',
        [RUN_LS],
    ),
    Case(
        "l-content",
        "llama3_json",
        "content",
        'Checking now.\n{"name": "run", "parameters": {"command": "ls -la"}}',
        [RUN_LS],
        prose="Checking now.\n",
    ),
    Case(
        "l-str-obj",
        "llama3_json",
        "non_object",
        '{"name": "run", "parameters": "{\\"command\\": \\"ls -la\\"}"}',
        [RUN_LS],
    ),
    Case(
        "l-str", "llama3_json", "non_object", '{"name": "run", "parameters": "ls -la"}', [("run", "ls -la")]
    ),
    Case(
        "l-array",
        "llama3_json",
        "non_object",
        '{"name": "search", "parameters": ["a", "b"]}',
        [("search", ["a", "b"])],
    ),
    Case(
        "l-trunc",
        "llama3_json",
        "truncated",
        '<|python_tag|>{"name": "run", "parameters": {"command": "ls',
        errors=1,
    ),
    Case(
        "l-two",
        "llama3_json",
        "wellformed",
        '{"name": "run", "parameters": {"command": "pwd"}}; {"name": "list_files", "parameters": {}}',
        [("run", {"command": "pwd"}), ("list_files", {})],
    ),
    Case(
        "l-markup",
        "llama3_json",
        "markup",
        '{"name": "write_file", "parameters": {"path": "x.json", "content": "{\\"name\\": \\"f\\", \\"parameters\\": {}}"}}',
        [("write_file", {"path": "x.json", "content": '{"name": "f", "parameters": {}}'})],
    ),
]

# --- pythonic ---------------------------------------------------------------------------------

CASES += [
    Case("p-plain", "pythonic", "plain", "Nothing to call.\n", prose="Nothing to call.\n"),
    Case(
        "p-basic",
        "pythonic",
        "wellformed",
        '[run(command="ls -la"), list_files()]',
        [RUN_LS, ("list_files", {})],
    ),
    Case(
        "p-trunc-bracket",
        "pythonic",
        "truncated",
        '[run(command="ls -la"), list_files()',
        [RUN_LS, ("list_files", {})],
    ),
    Case(
        "p-trunc-call",
        "pythonic",
        "truncated",
        '[run(command="ls -la"), search(query="ca',
        [RUN_LS],
        errors=1,
    ),
    Case("p-trunc-only", "pythonic", "truncated", '[run(command="ls', errors=1),
    Case("p-python-start-trunc", "pythonic", "truncated", '<|python_start|>[run(command="ls -la")', [RUN_LS]),
    Case(
        "p-content",
        "pythonic",
        "content",
        'I will run it.\n<|python_start|>[run(command="ls -la")]<|python_end|>\nThen report.',
        [RUN_LS],
        prose="I will run it.\n\nThen report.",
    ),
    Case(
        "p-markdown-link",
        "pythonic",
        "plain",
        "[docs(v2)](https://example.com/docs) explains it.\n",
        prose="[docs(v2)](https://example.com/docs) explains it.\n",
    ),
    Case(
        "p-listcomp",
        "pythonic",
        "plain",
        "Try this:\n[print(x) for x in range(3)]\n",
        prose="Try this:\n[print(x) for x in range(3)]\n",
    ),
    Case(
        "p-typed",
        "pythonic",
        "typed",
        "[search(query='x', max_results=5, filters={'lang': 'py'}, tags=['a'], threshold=0.5)]",
        [
            (
                "search",
                {"query": "x", "max_results": 5, "filters": {"lang": "py"}, "tags": ["a"], "threshold": 0.5},
            )
        ],
    ),
    Case("p-bad", "pythonic", "malformed", "[run(command=open('/etc/passwd'))]", errors=1),
]

# --- auto -------------------------------------------------------------------------------------

CASES += [
    Case(
        "a-plain",
        "auto",
        "plain",
        "  Just text, with <b>markup</b>.\n",
        prose="  Just text, with <b>markup</b>.\n",
    ),
    Case(
        "a-bare-qwen",
        "auto",
        "bare",
        "I'll run it.\n" + _q("run", {"command": "ls -la"}, wrap=False),
        [RUN_LS],
        tools=TOOLS,
    ),
    Case(
        "a-qwen-trunc",
        "auto",
        "truncated",
        _q("run", {"command": "ls -la"})[: -len("</tool_call>")],
        [RUN_LS],
        tools=TOOLS,
    ),
    Case(
        "a-hermes-trunc",
        "auto",
        "truncated",
        '<tool_call>\n{"name": "run", "arguments": {"command": "ls -la"}}\n',
        [RUN_LS],
    ),
    Case(
        "a-glm-trunc",
        "auto",
        "truncated",
        _g47("run", {"command": "ls -la"})[: -len("</tool_call>")],
        [RUN_LS],
        tools=TOOLS,
    ),
    Case("a-kimi-trunc", "auto", "truncated", KS + _k("run", 0, LS)[: -len(KC)], [RUN_LS]),
    Case("a-ds31-trunc", "auto", "truncated", B + _d31("run", LS)[: -len(CE)], [RUN_LS]),
    Case(
        "a-mistral-trunc",
        "auto",
        "truncated",
        '[TOOL_CALLS] [{"name": "run", "arguments": {"command": "ls -la"}}',
        [RUN_LS],
    ),
    Case(
        "a-mention",
        "auto",
        "plain",
        "Models wrap calls in <tool_call> and </tool_call> tags.",
        prose="Models wrap calls in <tool_call> and </tool_call> tags.",
    ),
    Case("a-llama", "auto", "wellformed", '{"name": "run", "parameters": {"command": "ls -la"}}', [RUN_LS]),
    Case(
        "a-hermes-str",
        "auto",
        "non_object",
        '<tool_call>{"name": "run", "arguments": "ls -la"}</tool_call>',
        [("run", "ls -la")],
    ),
]


def score_case(case: Case, parse: Any = None) -> str | None:
    """``None`` when the parse of ``case`` is right, else a one-line reason."""
    parse = parse or (lambda family, text, tools: get_parser(family).parse(text, tools))
    try:
        result = parse(case.family, case.text, case.tools)
        got = [(c.name, _norm(c.arguments)) for c in to_tool_calls(result)]
    except Exception as exc:  # a crash is a miss, with its reason
        return f"{case.id}: raised {type(exc).__name__}: {exc}"
    want = [(name, _norm(args)) for name, args in case.calls]
    if got != want:
        return f"{case.id}: calls {got!r} != {want!r}"
    if len(result.errors) != case.errors:
        return (
            f"{case.id}: {len(result.errors)} errors != {case.errors} ({[e.message for e in result.errors]})"
        )
    prose = getattr(result, "prose", result.content)
    if case.prose is not None and prose != case.prose:
        return f"{case.id}: prose {prose!r} != {case.prose!r}"
    return None


def test_the_set_covers_every_family_and_kind():
    assert len(CASES) >= 120
    assert len({c.id for c in CASES}) == len(CASES)
    families = {c.family for c in CASES}
    assert families == {
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
    }
    kinds = {c.kind for c in CASES}
    assert {"plain", "content", "truncated", "non_object", "bare", "markup", "typed"} <= kinds


def test_calls_are_right_on_at_least_95_percent_of_the_held_out_set():
    misses = [reason for case in CASES if (reason := score_case(case)) is not None]
    right = len(CASES) - len(misses)
    assert right >= 0.95 * len(CASES), f"{right}/{len(CASES)} right; misses:\n" + "\n".join(misses)
