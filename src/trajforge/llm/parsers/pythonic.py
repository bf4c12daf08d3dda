"""Pythonic tool calls (Llama 3.2 / Llama 4, ToolACE, ...): ``[f(a=1), g(b="x")]``.

A call list starts a line (or follows ``<|python_start|>``) with ``[name(``; its extent is found
by bracket matching that skips string literals, then it is parsed with :mod:`ast` -- never
evaluated. Only keyword arguments with literal values are accepted (strings, numbers, booleans,
None, and lists/tuples/dicts of them; JSON's ``true``/``false``/``null`` too). A positional
argument, a non-literal value (``f(x=open("/etc/passwd"))``) or a syntax error is an error,
never a silent "no call".

A list the end of generation cut off keeps its complete calls: a missing ``]`` alone is no loss,
and a call cut in the middle is an error next to the complete ones before it. What only looks
like a call list -- a Markdown link ``[text(x)](url)``, a list comprehension -- stays prose.
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
    build_result,
    object_arguments_of,
)

PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"
_START = re.compile(r"(?:^|(?<=<\|python_start\|>))[ \t]*\[\s*[A-Za-z_][\w.]*\s*\(", re.MULTILINE)
_INTERESTING = re.compile(r"[\[\](){}'\"]")
_INTERESTING_COMMA = re.compile(r"[\[\](){}'\",]")
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
        pos = search_from = 0
        while (m := _START.search(text, search_from)) is not None:
            start = text.index("[", m.start())
            end = _match_bracket(text, start)
            if end is None:
                pieces.append(text[pos:start])
                pos = _read_cut_list(text, start, calls, errors)
                break
            if text.startswith(("(", "["), end):  # a Markdown link, not a call list
                search_from = end
                continue
            try:
                found = _read_list(text[start:end])
            except MalformedCall as exc:
                errors.append(ParseError(str(exc), text[start:end], start))
                found = []
            if found is None:  # a list comprehension: prose
                search_from = end
                continue
            pieces.append(text[pos:start])
            calls.extend(found)
            pos = search_from = end
        pieces.append(text[pos:])
        pieces = [p.replace(PYTHON_START, "").replace(PYTHON_END, "") for p in pieces]
        return build_result(pieces, calls, errors, self.name)

    def format_calls(self, calls: Sequence[Any]) -> str:
        if not calls:
            return ""
        rendered = []
        for call in calls:
            args = object_arguments_of(call, self.name)
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


def _read_cut_list(text: str, start: int, calls: list[ParsedCall], errors: list[ParseError]) -> int:
    """A call list without its closing bracket, which runs to the end of the text (or to
    ``<|python_end|>``): its complete calls are calls, a call cut in the middle is an error.
    Returns where the list ends."""
    stop = text.find(PYTHON_END, start)
    stop = len(text) if stop < 0 else stop
    whole, last_comma = _cut_list_shape(text, start, stop)
    candidates: list[tuple[str, int | None]] = [(whole, None)] if whole is not None else []
    if last_comma is not None:  # the calls before the last top-level comma, the rest was cut
        candidates.append((text[start:last_comma] + "]", last_comma + 1))
    for source, cut in candidates:
        try:
            found = _read_list(source)
        except MalformedCall:
            continue
        if found is None:
            break
        calls.extend(found)
        if cut is not None:
            errors.append(ParseError("call cut off by the end of the text", text[cut:stop], cut))
        return stop
    errors.append(ParseError("unclosed call list: no matching ']'", text[start:stop], start))
    return stop


def _cut_list_shape(text: str, start: int, stop: int) -> tuple[str | None, int | None]:
    """For an unclosed list ``text[start:stop]``: its source closed with ``]`` when only that
    bracket is missing (else ``None``), and its last top-level comma."""
    depth, pos, last_comma = 0, start, None
    while (m := _INTERESTING_COMMA.search(text, pos, stop)) is not None:
        char, at = m.group(0), m.start()
        if char in "'\"":
            quote = char * 3 if text.startswith(char * 3, at) else char
            string = _STRING_END[quote].match(text, at, stop)
            if string is None:
                depth = -1  # the text ends inside a string
                break
            pos = string.end()
            continue
        if char == ",":
            if depth == 1:
                last_comma = at
        else:
            depth += 1 if char in "([{" else -1
        pos = at + 1
    whole = text[start:stop].rstrip() + "]" if depth == 1 else None
    return whole, last_comma


def _read_list(source: str) -> list[ParsedCall] | None:
    """The calls of a call list (``None`` for a list comprehension, which is not one)."""
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise MalformedCall(f"not a valid Python call list ({type(exc).__name__}: {exc})") from None
    if isinstance(tree, ast.ListComp):
        return None
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
        out: dict[str, Any] = {}
        for key, item in zip(node.keys, node.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                raise MalformedCall(f"{where}: dict keys must be strings")
            out[key.value] = _literal(item, where)
        return out
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _literal(node.operand, where)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    elif isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise MalformedCall(f"{where}: not a literal value: {ast.unparse(node)[:60]!r}")
