"""GLM-4.5 / GLM-4.6 format.

::

    <tool_call>NAME
    <arg_key>KEY</arg_key>
    <arg_value>VALUE</arg_value>
    </tool_call>

The function name ends at a newline (GLM-4.5 always writes one); values are raw text typed by
the tool schema (:mod:`trajforge.llm.parsers.schema`). Only whitespace may separate the tags; a
key without a value, an unclosed tag or a missing name is an error. :mod:`.glm47` is the looser
variant (no newline needed after the name, literal ``\\n`` between tags tolerated).

What models really emit is read too:

- values that hold the format's own tags (a file about GLM tool calls, XML): inside a value,
  tags that open and close in pairs are text, and ``</arg_value>`` ends the value only when the
  next thing is another ``<arg_key>`` or ``</tool_call>``; a ``</tool_call>`` in a value does not
  end the call;
- a call the end of generation cut off after its last complete argument (``</tool_call>`` eaten,
  maybe half of it), or right after its name: still a call, unless the tool's schema requires an
  argument it lacks (or, with tools given, names no tool: the name itself was cut); one cut
  inside a key or value is an error;
- a ``<tool_call>`` left open by prose that only mentions it (not followed by a name) is prose.

Every tag is found in one pass and each call is read by a small state machine over them, so
parsing stays linear in the text.
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

_TAG = re.compile(r"</?(?:tool_call|arg_key|arg_value)>")
TO, TC, KO, KC, VO, VC = range(6)
_KIND = {
    "<tool_call>": TO,
    "</tool_call>": TC,
    "<arg_key>": KO,
    "</arg_key>": KC,
    "<arg_value>": VO,
    "</arg_value>": VC,
}
_TEXT = {kind: tag for tag, kind in _KIND.items()}
_PAIRS = {TC: TO, KC: KO, VC: VO}
_NAME = re.compile(r"[^\s<>]+")
# states of one call
HEAD, KEY_NEXT, KEY, VALUE_NEXT, VALUE = range(5)
_EXPECTED = {KEY_NEXT: "<arg_key>", KEY: "</arg_key>", VALUE_NEXT: "<arg_value>", VALUE: "</arg_value>"}


class Glm45Parser:
    """``<tool_call>NAME\\n<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>``."""

    name = "glm45"
    start_marker = "<tool_call>"
    end_marker = "</tool_call>"
    markers = ("<tool_call>", "<arg_key>", "<arg_value>")
    newline_after_name = True
    separator = re.compile(r"\s*")
    layout = "\n"

    def parse(self, text: str, tools: Tools = None) -> ParseResult:
        if self.start_marker not in text:
            return build_result([text], [], [], self.name)
        return _Scan(self, text, ToolSchemas(tools)).run()

    def format_calls(self, calls: Sequence[Any]) -> str:
        nl = self.layout
        out = []
        for call in calls:
            pairs = "".join(
                f"<arg_key>{k}</arg_key>{nl}<arg_value>{render_value(v)}</arg_value>{nl}"
                for k, v in object_arguments_of(call, self.name).items()
            )
            out.append(f"<tool_call>{call.name}{nl if pairs else ''}{pairs}</tool_call>")
        return "\n".join(out)

    def function_name(self, head: str) -> str:
        """The function name written between ``<tool_call>`` and the first argument."""
        return head.strip()


class _Scan:
    """The tags of one text and the calls read from them."""

    def __init__(self, family: Glm45Parser, text: str, schemas: ToolSchemas) -> None:
        self.family, self.text, self.schemas = family, text, schemas
        self.toks = [(_KIND[m.group(0)], m.start(), m.end()) for m in _TAG.finditer(text)]
        self.starts = [t[1] for t in self.toks]
        self.opens = [i for i, t in enumerate(self.toks) if t[0] == TO]
        self.closes = [i for i, t in enumerate(self.toks) if t[0] == TC]
        self._counts: tuple[list[int], list[int]] | None = None

    def nested_value(self, i: int) -> bool:
        """Whether the ``<arg_value>`` at token ``i``, inside a value, is closed there too: more
        ``</arg_value>`` follow it than ``<arg_value>`` start from it on (one each for every
        later argument, one more for the value it sits in)."""
        if self._counts is None:  # only values holding value tags need the counts
            n = len(self.toks)
            closes_after, opens_from = [0] * (n + 1), [0] * (n + 1)
            for j in range(n - 1, -1, -1):
                closes_after[j] = closes_after[j + 1] + (j + 1 < n and self.toks[j + 1][0] == VC)
                opens_from[j] = opens_from[j + 1] + (self.toks[j][0] == VO)
            self._counts = (closes_after, opens_from)
        closes_after, opens_from = self._counts
        return closes_after[i] > opens_from[i]

    def run(self) -> ParseResult:
        openings = [(i, self.toks[i][1]) for i in self.opens]
        return read_tagged_calls(
            self.text, self.family.name, openings, self._extent, self._is_attempt, self._read
        )

    def _extent(self, i: int) -> tuple[int, bool]:
        """Where the call starting at token ``i`` ends by the simple rule (its first
        ``</tool_call>`` before the next ``<tool_call>``), and whether that end tag is there."""
        k = bisect.bisect_right(self.opens, i)
        nxt = self.opens[k] if k < len(self.opens) else len(self.toks)
        j = bisect.bisect_right(self.closes, i)
        if j < len(self.closes) and self.closes[j] < nxt:
            return self.toks[self.closes[j]][2], True
        return (self.toks[nxt][1] if nxt < len(self.toks) else len(self.text)), False

    def _is_attempt(self, i: int, limit: int, closed: bool) -> bool:
        """A ``<tool_call>`` begins a call when it is closed, or when a name (or nothing: the
        text ends) follows it; otherwise prose mentions it."""
        if closed:
            return True
        nxt = i + 1
        end = self.toks[nxt][1] if nxt < len(self.toks) and self.toks[nxt][1] < limit else limit
        head = self.text[self.toks[i][2] : end]
        if head[:1] in (" ", "\t"):  # GLM writes the name right after the tag: this is prose
            return False
        if end == len(self.text):  # the text may end in the middle of the next tag
            head = cut_partial(head, "</tool_call>", "<arg_key>", minimum=1)
        head = self.family.function_name(head)
        return not head or _NAME.fullmatch(head) is not None

    def _read(self, i0: int, limit: int, closed: bool) -> tuple[list[ParsedCall], int]:
        call = _Call(self, i0, limit, closed)
        try:
            found, end = call.read()
        except MalformedCall as exc:
            in_value = call.reached >= limit and call.state == VALUE
            raise CallFailure(str(exc), call.reached, in_value) from None
        return [found], end


class _Call:
    """The state machine reading one ``<tool_call>`` block."""

    def __init__(self, scan: _Scan, i0: int, limit: int, closed: bool) -> None:
        self.scan, self.text, self.toks, self.family = scan, scan.text, scan.toks, scan.family
        self.i0, self.limit, self.closed = i0, limit, closed
        self.last = bisect.bisect_left(scan.starts, limit)
        self.state = HEAD
        self.name = ""
        self.key = ""
        self.args: dict[str, Any] = {}
        self.pos = self.reached = self.toks[i0][2]
        self.stack: list[int] = []

    def read(self) -> tuple[ParsedCall, int]:
        for i in range(self.i0 + 1, self.last):
            kind, start, end = self.toks[i]
            self.reached = start
            if self.state == VALUE:
                if self._in_value(i):
                    self.pos = end
                continue
            between = self.text[self.pos : start]
            self.pos = end
            if self.state == HEAD:
                self._head(between, kind)
            elif self.state == KEY:
                self._key(between, kind)
            else:
                if not self.family.separator.fullmatch(between):
                    raise MalformedCall(f"unexpected text {between.strip()[:40]!r} between argument tags")
                if self.state == KEY_NEXT and kind == TC:
                    return ParsedCall(self.name, self.args), end
                expected = KO if self.state == KEY_NEXT else VO
                if kind != expected:
                    self._unexpected(kind)
                self.state = KEY if kind == KO else VALUE
                self.stack = []
            if self.state == HEAD:  # a call without arguments
                return ParsedCall(self.name, self.args), end
        return self._at_limit()

    def _head(self, head: str, kind: int) -> None:
        self.name = self._name(head)
        if kind == TC:
            return  # state stays HEAD: the caller returns the call
        if kind == TO:
            raise MalformedCall(_UNCLOSED)
        if kind != KO:
            raise MalformedCall(f"expected <arg_key> but found {_TEXT[kind]}")
        if self.family.newline_after_name and "\n" not in head:
            raise MalformedCall(
                f"expected a newline after the function name {self.name!r} (GLM-4.5 format; "
                "use the glm47 parser for the looser format)"
            )
        self.state = KEY

    def _name(self, head: str) -> str:
        name = self.family.function_name(head)
        if not name:
            raise MalformedCall("tool call has no function name")
        if _NAME.fullmatch(name) is None:
            raise MalformedCall(f"invalid function name {name!r}")
        return name

    def _key(self, between: str, kind: int) -> None:
        if kind != KC:
            self._unexpected(kind)
        key = between.strip()
        if not key:
            raise MalformedCall("empty <arg_key>")
        if key in self.args:
            raise MalformedCall(f"argument {key!r} given twice")
        self.key, self.state = key, VALUE_NEXT

    def _unexpected(self, kind: int) -> None:
        if kind == TC:
            raise MalformedCall(f"unclosed argument: expected {_EXPECTED[self.state]}")
        if kind == TO:
            raise MalformedCall(_UNCLOSED)
        raise MalformedCall(f"expected {_EXPECTED[self.state]} but found {_TEXT[kind]}")

    def _in_value(self, i: int) -> bool:
        """One tag inside a value: text, or the end of the value (then True)."""
        kind, start, _ = self.toks[i]
        top = self.stack[-1] if self.stack else None
        if kind == VC and top != VO:
            if not self._followed_by_key_or_end(i):
                return False
            self._close_value(start)
            return True
        if kind in _PAIRS:
            if top == _PAIRS[kind]:
                self.stack.pop()
        elif kind != VO or self.stack or self.scan.nested_value(i):
            self.stack.append(kind)  # tags written inside the value, closed later
        return False

    def _close_value(self, end: int) -> None:
        value = self.text[self.pos : end]  # inside a value, pos stays just after <arg_value>
        self.args[self.key] = self.scan.schemas.convert(self.name, self.key, value)
        self.state = KEY_NEXT

    def _followed_by_key_or_end(self, i: int) -> bool:
        end = self.toks[i][2]
        nxt = i + 1
        if nxt < self.last:
            between = self.text[end : self.toks[nxt][1]]
            return self.family.separator.fullmatch(between) is not None and self.toks[nxt][0] in (KO, TC)
        rest = self.text[end : self.limit]
        if self.limit == len(self.text):
            rest = cut_partial(rest, "</tool_call>")
        return self.family.separator.fullmatch(rest) is not None

    def _at_limit(self) -> tuple[ParsedCall, int]:
        """The end of what may be read, without ``</tool_call>``: a cut-off call or an error."""
        self.reached = self.limit
        if self.closed:
            raise MalformedCall(f"unclosed argument: expected {_EXPECTED.get(self.state, '</tool_call>')}")
        if self.limit < len(self.text):
            raise MalformedCall(_UNCLOSED)
        if self.state == VALUE:  # cut inside a value: complete only with half its end tag
            value = self.text[self.pos :]
            cut = partial_suffix(value, "</arg_value>", minimum=len("</arg"))
            if not cut or self.stack:
                raise MalformedCall(_UNCLOSED)
            self._close_value(len(self.text) - cut)
            rest = ""
        else:
            rest = cut_partial(self.text[self.pos :], "</tool_call>")
        if self.state == HEAD:
            if not self.family.function_name(rest):
                raise MalformedCall(_UNCLOSED)
            self.name = self._name(rest)
            schemas = self.scan.schemas
            if schemas and schemas.params_of(self.name) is None:
                raise MalformedCall(f"{_UNCLOSED} (cut off in the name {self.name!r}?)")
        elif self.state != KEY_NEXT or not self.family.separator.fullmatch(rest):
            raise MalformedCall(_UNCLOSED)
        missing = self.scan.schemas.missing_required(self.name, self.args)
        if missing:
            raise MalformedCall(f"{_UNCLOSED} (cut off before the required {', '.join(missing)})")
        return ParsedCall(self.name, self.args), len(self.text)


_UNCLOSED = "unclosed <tool_call>: no </tool_call> before the next call or the end"
