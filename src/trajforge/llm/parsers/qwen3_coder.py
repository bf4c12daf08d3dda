"""Qwen3-Coder XML format.

::

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

Values are raw text (one newline after the opening and before the closing parameter tag is
layout, not value) typed by the tool schema (:mod:`trajforge.llm.parsers.schema`). What models
really emit is read too:

- ``<function=...>`` blocks without the ``<tool_call>`` wrapper (a ``<function=NAME>`` followed
  by a parameter or ``</function>``; one followed by prose is prose);
- values that hold the format's own tags -- a file documenting the format, a test fixture, HTML
  with a ``<parameter=...>`` element: inside a value, tags that open and close in pairs are
  text, and a ``</parameter>`` ends the value only when the next thing is another parameter,
  ``</function>`` or ``</tool_call>``;
- a missing ``</parameter>`` when the next ``<parameter=`` (on a new line, for a parameter the
  tool has) or ``</function>`` makes the end of the value unambiguous (not when the value holds
  a ``</parameter>`` read as text: then the model did write one, and stray text followed it);
- a call the end of generation cut off after its last complete parameter (``</function>`` and/or
  ``</tool_call>`` eaten, maybe half of one): still a call, unless the tool's schema requires a
  parameter it lacks. A call cut inside a value is an error.

A missing ``</function>`` before ``</tool_call>``, stray text between tags, a nameless function
or a parameter given twice is an error. Every tag is found in one pass and each call is read by
a small state machine over them, so parsing stays linear in the text.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from typing import Any

from trajforge.llm.parsers._scan import (
    CallFailure,
    MalformedCall,
    cut_partial,
    partial_suffix,
    read_tagged_calls,
)
from trajforge.llm.parsers.base import (
    ParsedCall,
    ParseResult,
    Tools,
    build_result,
    object_arguments_of,
    render_value,
)
from trajforge.llm.parsers.schema import ToolSchemas

_TAG = re.compile(
    r"<tool_call>|</tool_call>|<function=([^<>\n]*)>|</function>|<parameter=([^<>\n]*)>|</parameter>"
)
TO, TC, FO, FC, PO, PC = range(6)
_KIND = {"<tool_call>": TO, "</tool_call>": TC, "</function>": FC, "</parameter>": PC}
_TEXT = {TO: "<tool_call>", TC: "</tool_call>", FC: "</function>", PC: "</parameter>"}
Tok = tuple[int, int, int, str]  # kind, start, end, name


class Qwen3CoderParser:
    """``<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>``."""

    name = "qwen3_coder"
    start_marker = "<tool_call>"
    end_marker = "</tool_call>"
    markers = ("<tool_call>", "<function=", "<parameter=")

    def parse(self, text: str, tools: Tools = None) -> ParseResult:
        if "<tool_call>" not in text and "<function=" not in text:
            return build_result([text], [], [], self.name)
        return _Scan(text, ToolSchemas(tools)).run(self.name)

    def format_calls(self, calls: Sequence[Any]) -> str:
        out = []
        for call in calls:
            params = "".join(
                f"<parameter={key}>\n{render_value(value)}\n</parameter>\n"
                for key, value in object_arguments_of(call, self.name).items()
            )
            out.append(f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>")
        return "\n".join(out)


class _Scan:
    """The tags of one text and the calls read from them."""

    def __init__(self, text: str, schemas: ToolSchemas) -> None:
        self.text = text
        self.schemas = schemas
        self.toks: list[Tok] = []
        for m in _TAG.finditer(text):
            token = m.group(0)
            if token.startswith("<function="):
                self.toks.append((FO, m.start(), m.end(), m.group(1)))
            elif token.startswith("<parameter="):
                self.toks.append((PO, m.start(), m.end(), m.group(2)))
            else:
                self.toks.append((_KIND[token], m.start(), m.end(), ""))
        self.starts = [t[1] for t in self.toks]
        self.by_kind: dict[int, list[int]] = {k: [] for k in range(6)}
        for i, tok in enumerate(self.toks):
            self.by_kind[tok[0]].append(i)
        self._counts: tuple[list[int], list[int]] | None = None

    def nested_parameter(self, i: int) -> bool:
        """Whether the ``<parameter=`` at token ``i``, inside a value, is closed there too: more
        ``</parameter>`` follow it than ``<parameter=`` start from it on (one each for every
        later parameter, one more for the value it sits in)."""
        if self._counts is None:  # only values holding parameter tags need the counts
            n = len(self.toks)
            closes_after, opens_from = [0] * (n + 1), [0] * (n + 1)
            for j in range(n - 1, -1, -1):
                closes_after[j] = closes_after[j + 1] + (j + 1 < n and self.toks[j + 1][0] == PC)
                opens_from[j] = opens_from[j + 1] + (self.toks[j][0] == PO)
            self._counts = (closes_after, opens_from)
        closes_after, opens_from = self._counts
        return closes_after[i] > opens_from[i]

    # -- the text ------------------------------------------------------------------------------

    def run(self, family: str) -> ParseResult:
        openings = [(i, tok[1]) for i, tok in enumerate(self.toks) if tok[0] in (TO, FO)]
        return read_tagged_calls(self.text, family, openings, self._extent, self._is_attempt, self._read)

    def _next(self, kind: int, after: int) -> int:
        """Index of the first token of ``kind`` after token ``after`` (len(toks) when none)."""
        idx = self.by_kind[kind]
        j = bisect.bisect_right(idx, after)
        return idx[j] if j < len(idx) else len(self.toks)

    def _start_of(self, i: int) -> int:
        return self.toks[i][1] if i < len(self.toks) else len(self.text)

    def _extent(self, i: int) -> tuple[int, bool]:
        """Where the call starting at token ``i`` ends by the simple rule (its first end tag
        before the next start), and whether that end tag is there."""
        if self.toks[i][0] == TO:
            close, interrupt = self._next(TC, i), self._next(TO, i)
        else:
            close, interrupt = self._next(FC, i), min(self._next(FO, i), self._next(TO, i))
        if close < interrupt:
            return self.toks[close][2], True
        return self._start_of(interrupt), False

    def _is_attempt(self, i: int, limit: int, closed: bool) -> bool:
        """Whether the start tag at ``i`` begins a call, rather than being mentioned in prose."""
        kind, _, end, _ = self.toks[i]
        if kind == TO:
            after = self.text[end:limit].lstrip()
            return closed or not after or _starts_like(after, "<function=")
        nxt = i + 1
        if nxt < len(self.toks) and self.toks[nxt][1] < limit:
            gap = self.text[end : self.toks[nxt][1]]
            return not gap.strip() and self.toks[nxt][0] in (PO, FC)
        after = self.text[end:limit].lstrip()
        return limit == len(self.text) and (
            not after or _starts_like(after, "<parameter=") or _starts_like(after, "</function>")
        )

    # -- one call ------------------------------------------------------------------------------

    def _read(self, i0: int, limit: int, closed: bool) -> tuple[list[ParsedCall], int]:
        """The calls of the block starting at token ``i0``, read up to ``limit``, and its end.

        Raises :class:`CallFailure` with the reason and how far it read.
        """
        call = _Call(self, i0, limit, closed)
        try:
            return call.read()
        except MalformedCall as exc:
            in_value = call.reached >= limit and call.param is not None
            raise CallFailure(str(exc), call.reached, in_value) from None


class _Call:
    """The state machine reading one ``<tool_call>`` (or bare ``<function=``) block."""

    def __init__(self, scan: _Scan, i0: int, limit: int, closed: bool) -> None:
        self.scan, self.text, self.toks = scan, scan.text, scan.toks
        self.i0, self.limit, self.closed = i0, limit, closed
        self.wrapped = self.toks[i0][0] == TO
        self.last = bisect.bisect_left(scan.starts, limit)  # first token past the limit
        self.calls: list[ParsedCall] = []
        self.fn: str | None = None
        self.args: dict[str, Any] = {}
        self.param: str | None = None
        self.value_start = 0
        self.stack: list[int] = []
        self.kept_close = False
        self.pos = self.toks[i0][2]
        self.reached = self.pos

    def read(self) -> tuple[list[ParsedCall], int]:
        if not self.wrapped:
            self.fn = _name(self.toks[self.i0][3], "function")
        i = self.i0 + 1
        while i < self.last:
            kind, start, end, name = self.toks[i]
            self.reached = start
            if self.param is not None:
                if self._in_value(i):
                    return self.calls, end
                i += 1
                continue
            gap = self.text[self.pos : start]
            if gap.strip():
                where = "between tags" if self.fn is not None or not self.calls else "after </function>"
                raise MalformedCall(f"unexpected text {gap.strip()[:40]!r} {where}")
            self.pos = end
            step = self._between_functions if self.fn is None else self._in_function
            if step(kind, name):
                return self.calls, end
            i += 1
        return self._at_limit()

    def _between_functions(self, kind: int, name: str) -> bool:
        if kind == FO:
            self.fn, self.args = _name(name, "function"), {}
            return False
        if kind == TC:
            if not self.calls:
                raise MalformedCall("no <function=NAME> inside <tool_call>")
            return True
        if kind == TO:
            raise MalformedCall(self._unclosed())
        raise MalformedCall(f"{_TEXT.get(kind, '<parameter=...>')} outside <function=...>")

    def _in_function(self, kind: int, name: str) -> bool:
        if kind == PO:
            self._open_param(name)
            return False
        if kind == FC:
            return self._close_function()
        if kind == FO:
            raise MalformedCall(f"<function={self.fn}> is not closed before the next <function=")
        if kind == PC:
            raise MalformedCall("</parameter> without an opening <parameter=...>")
        raise MalformedCall(f"unclosed <function={self.fn}>: no </function>")

    def _open_param(self, name: str) -> None:
        param = _name(name, "parameter")
        if param in self.args:
            raise MalformedCall(f"parameter {param!r} given twice in function {self.fn!r}")
        self.param, self.value_start, self.stack = param, self.pos, []
        self.kept_close = False  # a </parameter> was read as text in this value

    def _close_param(self, end: int) -> None:
        assert self.fn is not None and self.param is not None
        raw = _trim(self.text[self.value_start : end])
        self.args[self.param] = self.scan.schemas.convert(self.fn, self.param, raw)
        self.param = None

    def _close_function(self) -> bool:
        assert self.fn is not None
        self.calls.append(ParsedCall(self.fn, self.args))
        self.fn = None
        return not self.wrapped

    def _in_value(self, i: int) -> bool:
        """One tag inside a parameter value: text, or the end of the value (and maybe of a bare
        function: then True)."""
        kind, start, end, name = self.toks[i]
        top = self.stack[-1] if self.stack else None
        if kind == PC:
            if top == PO:
                self.stack.pop()
            elif self._followed_by(i, (PO, FC, TC)):
                self._close_param(start)
                self.pos = end
            else:
                self.kept_close = True
        elif kind == FC:
            if top == FO:
                self.stack.pop()
            elif top is None and not self.kept_close and self._ends_function(i):
                self._close_param(start)
                self.pos = end
                return self._close_function()
        elif kind == TC:
            if top == TO:
                self.stack.pop()
        elif kind == PO:
            if self.stack or self.scan.nested_parameter(i):
                self.stack.append(PO)  # a <parameter=...> element inside the value, closed later
            elif self._starts_next_param(i, name):
                self._close_param(start)
                self.pos = end
                self._open_param(name)
        else:  # <tool_call> / <function=...> written inside the value
            self.stack.append(kind)
        return False

    def _followed_by(self, i: int, kinds: tuple[int, ...]) -> bool:
        """Whether only whitespace separates token ``i`` from a token of ``kinds`` (or from the
        end of what is read, maybe half an end tag at the end of the text)."""
        end = self.toks[i][2]
        nxt = i + 1
        if nxt < self.last:
            return not self.text[end : self.toks[nxt][1]].strip() and self.toks[nxt][0] in kinds
        rest = self.text[end : self.limit].strip()
        return not rest or (self.limit == len(self.text) and _is_partial_close(rest))

    def _ends_function(self, i: int) -> bool:
        """A ``</function>`` inside a value whose ``</parameter>`` is missing."""
        if self._followed_by(i, (TC, FO, TO)):
            return True
        end = self.toks[i][2]
        return not self.wrapped and (end == len(self.text) or self.text[end] == "\n")

    def _starts_next_param(self, i: int, name: str) -> bool:
        """A ``<parameter=`` inside a value starts the next parameter (``</parameter>`` missing)
        when it opens a line and names a parameter the tool has that is not given yet."""
        before = self.text[self.value_start : self.toks[i][1]].rstrip(" \t")
        param = name.strip()
        if self.kept_close or not before.endswith("\n") or not param or param in self.args:
            return False
        assert self.fn is not None
        known = self.scan.schemas.params_of(self.fn)
        return known is None or param in known

    def _at_limit(self) -> tuple[list[ParsedCall], int]:
        """The end of what may be read, without the block's end: a cut-off call or an error."""
        self.reached = self.limit
        if self.closed or self.limit < len(self.text):
            if self.param is not None and self.closed:
                raise MalformedCall(f"unclosed <parameter={self.param}>: no </parameter>")
            raise MalformedCall(self._unclosed())
        if self.param is not None:  # cut inside a value: complete only with half its end tag
            value = self.text[self.value_start :]
            cut = partial_suffix(value, "</parameter>", minimum=len("</par"))
            if not cut or self.stack:
                raise MalformedCall(self._unclosed())
            self._close_param(len(self.text) - cut)
            rest = ""
        else:
            rest = self.text[self.pos :].strip()
        if rest and not _is_partial_close(rest):
            raise MalformedCall(self._unclosed())
        if self.fn is not None:  # cut between parameters: complete if nothing required is missing
            missing = self.scan.schemas.missing_required(self.fn, self.args)
            if missing:
                raise MalformedCall(f"{self._unclosed()} (cut off before the required {', '.join(missing)})")
            self._close_function()
        if not self.calls:
            raise MalformedCall(self._unclosed())
        return self.calls, len(self.text)

    def _unclosed(self) -> str:
        if self.wrapped:
            return "unclosed <tool_call>: no </tool_call> before the next call or the end"
        return f"unclosed <function={self.toks[self.i0][3]}>: no </function> before the next call or the end"


def _is_partial_close(rest: str) -> bool:
    """``rest`` is nothing or half an end tag: what the end of generation left of the call's end."""
    rest = rest.strip()
    return not rest or not cut_partial(rest, "</function>", "</tool_call>")


def _starts_like(text: str, tag: str) -> bool:
    """``text`` starts with ``tag``, or is a start of it cut by the end of the text."""
    return text.startswith(tag) or (bool(text) and tag.startswith(text))


def _name(raw: str, what: str) -> str:
    name = raw.strip()
    if not name or "<" in name or "\n" in name:
        raise MalformedCall(f"invalid {what} name {raw!r}")
    return name


def _trim(value: str) -> str:
    """Drop the layout newline after the opening and before the closing tag (one each)."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value
