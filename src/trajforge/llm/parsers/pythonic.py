"""Pythonic tool calls (Llama 3.2 / Llama 4, ToolACE, ...): ``[f(a=1), g(b="x")]``.

A call list starts a line (or follows ``<|python_start|>``) with ``[name(``; its extent is found
by bracket matching that skips string literals, then it is parsed with :mod:`ast` -- never
evaluated. Only keyword arguments with literal values are accepted (strings, numbers, booleans,
None, and lists/tuples/dicts of them; JSON's ``true``/``false``/``null`` too). A positional
argument, a non-literal value (``f(x=open("/etc/passwd"))``), a syntax error or a missing
closing bracket is an error, never a silent "no call".
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Sequence
from typing import Any

from trajforge.llm.parsers._scan import MalformedCall
from trajforge.llm.parsers.base import (
    ParsedCall,
    ParseError,
    ParseResult,
    Tools,
    call_arguments,
    make_content,
)

PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"
_START = re.compile(r"(?:^|(?<=<\|python_start\|>))[ \t]*\[\s*[A-Za-z_][\w.]*\s*\(", re.MULTILINE)
_INTERESTING = re.compile(r"[\[\](){}'\"]")
_STRING_END = {
    "'": re.compile(r"'(?:[^'\\]|\\.)*'", re.DOTALL),
    '"': re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL),
    "'''": re.compile(r"'''(?:[^\\]|\\.)*?'''", re.DOTALL),
    '"""': re.compile(r'"""(?:[^\\]|\\.)*?"""', re.DOTALL),
}
_JSON_NAMES = {"true": True, "false": False, "null": None}


class PythonicParser:
    """A Python list of keyword-argument calls, read with :mod:`ast` (literals only)."""

    name = "pythonic"
    start_marker = "["
    markers = (PYTHON_START, "[")

    def parse(self, text: str, tools: Tools = None) -> ParseResult:
        pieces: list[str] = []
        calls: list[ParsedCall] = []
        errors: list[ParseError] = []
        pos = 0
        while (m := _START.search(text, pos)) is not None:
            start = text.index("[", m.start())
            pieces.append(text[pos:start])
            end = _match_bracket(text, start)
            if end is None:
                errors.append(ParseError("unclosed call list: no matching ']'", text[start:], start))
                pos = len(text)
                break
            try:
                calls.extend(_read_list(text[start:end]))
            except MalformedCall as exc:
                errors.append(ParseError(str(exc), text[start:end], start))
            pos = end
        pieces.append(text[pos:])
        content = make_content([p.replace(PYTHON_START, "").replace(PYTHON_END, "") for p in pieces])
        return ParseResult(content, calls, errors, self.name)

    def format_calls(self, calls: Sequence[Any]) -> str:
        if not calls:
            return ""
        rendered = []
        for call in calls:
            args = call_arguments(call)
            bad = [k for k in args if not str(k).isidentifier()]
            if bad:
                raise ValueError(f"cannot write argument names {bad} as Python keywords")
            rendered.append(f"{call.name}({', '.join(f'{k}={v!r}' for k, v in args.items())})")
        return f"[{', '.join(rendered)}]"


def _match_bracket(text: str, start: int) -> int | None:
    """Index just after the bracket closing the one at ``start``; string literals are skipped."""
    depth = 0
    pos = start
    while (m := _INTERESTING.search(text, pos)) is not None:
        char, at = m.group(0), m.start()
        if char in "'\"":
            quote = char * 3 if text.startswith(char * 3, at) else char
            string = _STRING_END[quote].match(text, at)
            if string is None:
                return None
            pos = string.end()
            continue
        depth += 1 if char in "([{" else -1
        pos = at + 1
        if depth == 0:
            return pos
    return None


def _read_list(source: str) -> list[ParsedCall]:
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise MalformedCall(f"not a valid Python call list ({type(exc).__name__}: {exc})") from None
    if not isinstance(tree, ast.List):
        raise MalformedCall("expected a list of calls")
    return [_read_call(node) for node in tree.elts]


def _read_call(node: ast.expr) -> ParsedCall:
    if not isinstance(node, ast.Call):
        raise MalformedCall(f"list item is not a call: {ast.unparse(node)[:60]!r}")
    name = _dotted(node.func)
    if node.args:
        raise MalformedCall(f"{name}(): positional arguments are not supported, use name=value")
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            raise MalformedCall(f"{name}(): **kwargs are not supported")
        args[kw.arg] = _literal(kw.value, f"{name}({kw.arg}=...)")
    return ParsedCall(name, args)


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise MalformedCall(f"call target is not a name: {ast.unparse(node)[:60]!r}")


def _literal(node: ast.expr, where: str) -> Any:
    """A JSON value from a literal expression; anything else is rejected, never evaluated."""
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, float) and not math.isfinite(value):
            raise MalformedCall(f"{where}: non-finite number")
        if value is None or isinstance(value, str | int | float):
            return value
    elif isinstance(node, ast.List | ast.Tuple):
        return [_literal(item, where) for item in node.elts]
    elif isinstance(node, ast.Dict):
        out = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                raise MalformedCall(f"{where}: dict keys must be strings")
            out[key.value] = _literal(value, where)
        return out
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _literal(node.operand, where)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    elif isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise MalformedCall(f"{where}: not a literal value: {ast.unparse(node)[:60]!r}")
