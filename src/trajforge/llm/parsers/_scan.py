"""Shared, linear-time building blocks for the family parsers.

Every family wraps calls in some start/end markers and encodes arguments either as JSON or as
tagged strings. These helpers do the things they all need -- cut a text into prose and marked
blocks, read each block with the family's own reader while turning its failures into
:class:`ParseError`s, recover a last call whose end marker the end of generation ate, and decode
a JSON call -- in one pass over the text, so no parser is quadratic on long outputs (see
``benchmarks/parse_throughput.py``). A family module keeps only what is specific to its format:
its markers and how one call's body is read.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from trajforge.llm.parsers.base import ParsedCall, ParseError, ParseResult, build_result

Reader = Callable[[str], ParsedCall | list[ParsedCall]]


class MalformedCall(ValueError):
    """Raised inside a parser for a call it cannot read; becomes a :class:`ParseError`."""


@dataclass(frozen=True, slots=True)
class Block:
    """One marked region of a text: ``raw`` includes the markers, ``body`` excludes them.

    ``closed`` is False when the end marker is missing; ``at_end`` when such a block runs to the
    end of the text (the generation stopped inside it) rather than to the next start marker.
    """

    offset: int
    body: str
    raw: str
    closed: bool
    at_end: bool = False

    @property
    def end(self) -> int:
        return self.offset + len(self.raw)


def positions(text: str, marker: str) -> list[int]:
    """Every (non-overlapping) position of ``marker`` in ``text``."""
    out: list[int] = []
    i = text.find(marker)
    while i >= 0:
        out.append(i)
        i = text.find(marker, i + len(marker))
    return out


def split_blocks(text: str, start: str, end: str) -> tuple[list[str], list[Block]]:
    """Cut ``text`` into the prose outside ``start ... end`` blocks and the blocks themselves.

    A block whose end marker is missing, or that is interrupted by another start marker, is
    returned with ``closed=False`` and runs up to that next start (or the end of the text), so a
    single truncated call does not swallow the calls after it. All marker positions are found
    once, which keeps the cost linear however many unclosed blocks there are.
    """
    starts = positions(text, start)
    if not starts:
        return [text], []
    ends = positions(text, end)
    pieces: list[str] = []
    blocks: list[Block] = []
    pos = 0
    k = 0
    while k < len(starts):
        s = starts[k]
        pieces.append(text[pos:s])
        body_start = s + len(start)
        next_start = starts[k + 1] if k + 1 < len(starts) else len(text)
        j = bisect.bisect_left(ends, body_start)
        e = ends[j] if j < len(ends) else -1
        if e >= 0 and e < next_start:
            pos = e + len(end)
            blocks.append(Block(s, text[body_start:e], text[s:pos], True))
        else:
            pos = next_start
            blocks.append(Block(s, text[body_start:pos], text[s:pos], False, pos == len(text)))
        k += 1
        while k < len(starts) and starts[k] < pos:
            k += 1
    pieces.append(text[pos:])
    return pieces, blocks


def partial_suffix(text: str, marker: str, minimum: int = 2) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``marker`` (0 if shorter
    than ``minimum``): what is left of a closing tag the end of generation cut in half."""
    for n in range(min(len(marker) - 1, len(text)), minimum - 1, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def cut_partial(text: str, *markers: str, minimum: int = 2) -> str:
    """``text`` without a half-written closing marker at its end (the longest one found)."""
    n = max((partial_suffix(text, m, minimum) for m in markers), default=0)
    return text[: len(text) - n] if n else text


@dataclass(slots=True)
class BlockScan:
    """What :func:`scan_blocks` found: the prose, the blocks, and the calls and errors they gave."""

    pieces: list[str]
    blocks: list[Block]
    calls: list[ParsedCall]
    errors: list[ParseError]

    def flag_empty_section(self, text: str, openers: tuple[str, ...], message: str) -> None:
        """A call *section* opened without any call block inside is an error, not prose.

        For formats that wrap their call blocks in a section (DeepSeek, Kimi): when no block was
        found but one of ``openers`` is in ``text``, the text from the first opener on becomes
        the error's fragment and the prose stops there.
        """
        if self.blocks:
            return
        at = min((text.find(m) for m in openers if m in text), default=-1)
        if at >= 0:
            self.errors.append(ParseError(message, text[at:], at))
            self.pieces = [text[:at]]


def scan_blocks(
    text: str,
    start: str,
    end: str,
    read: Reader,
    *,
    read_truncated: Reader | None = None,
) -> BlockScan:
    """Cut ``text`` into ``start ... end`` blocks (:func:`split_blocks`) and read each one.

    The loop every block-delimited family shares: a closed block's body goes to ``read`` (the
    family's reader, returning one call or, when a body may hold several, a list), and a
    :class:`MalformedCall` it raises becomes an error carrying the block's raw text and offset.

    A block left open by the end of the text (a stop string or the end of generation ate its end
    marker, maybe half of it) is read by ``read_truncated`` (default ``read``) without that half
    marker: a complete body is a call, an incomplete one an error. Any other unclosed block is an
    error naming both markers. Nothing is dropped silently.
    """
    _, blocks = split_blocks(text, start, end)
    pieces: list[str] = []
    calls: list[ParsedCall] = []
    errors: list[ParseError] = []
    prose_from = 0
    for block in blocks:
        pieces.append(text[prose_from : block.offset])
        prose_from = block.end
        try:
            if block.closed:
                found = read(block.body)
            elif block.at_end:
                found = (read_truncated or read)(cut_partial(block.body, end))
            else:
                errors.append(unclosed(start, end, block))
                continue
        except MalformedCall as exc:
            message = str(exc) if block.closed else unclosed(start, end, block).message
            errors.append(ParseError(message, block.raw, block.offset))
            continue
        if isinstance(found, ParsedCall):
            calls.append(found)
        else:
            calls.extend(found)
    pieces.append(text[prose_from:])
    return BlockScan(pieces, blocks, calls, errors)


def scan_json_blocks(text: str, start: str, end: str) -> BlockScan:
    """``start`` + one JSON call (or a list of them) + ``end`` blocks.

    A block closed by ``end`` whose body is JSON is read as it is (the common case, fast). Else
    the JSON value after the start marker is decoded before any end marker is looked for, so an
    end marker *inside* a JSON string (a model writing a file about tool calls) does not cut the
    call, and a value followed by nothing (or half an end marker) at the end of the text is a
    call whose end marker was eaten. Anything else is an error for the block by the simple rule
    (up to its end marker, or to the next start when it has none) -- or, for an unclosed block
    whose body does not even start like JSON, prose that mentions the marker.
    """
    starts = positions(text, start)
    if not starts:
        return BlockScan([text], [], [], [])
    ends = positions(text, end)
    pieces: list[str] = []
    blocks: list[Block] = []
    calls: list[ParsedCall] = []
    errors: list[ParseError] = []
    prose_from = decoded_until = 0
    for k, s in enumerate(starts):
        if s < prose_from:
            continue
        body_start = s + len(start)
        next_start = starts[k + 1] if k + 1 < len(starts) else len(text)  # never overlaps s
        j = bisect.bisect_left(ends, body_start)
        if j < len(ends) and ends[j] < next_start:
            block = Block(s, text[body_start : ends[j]], text[s : ends[j] + len(end)], True)
        else:
            block = Block(s, text[body_start:next_start], text[s:next_start], False, next_start == len(text))
        value: Any = _NOTHING
        problem: MalformedCall | None = None
        if block.closed:
            try:
                value = loads(block.body.strip())
            except MalformedCall as exc:
                problem = exc
        if value is _NOTHING:
            found = _json_first(text, body_start, end, next_start) if s >= decoded_until else None
            if found is not None:
                value, block_end, decoded_until = found
                block = Block(s, text[body_start:block_end], text[s:block_end], True)
            elif not block.closed and not _starts_like_json(block.body):
                continue  # prose mentioning the marker
        pieces.append(text[prose_from:s])
        prose_from = block.end
        blocks.append(block)
        try:
            if value is _NOTHING:
                raise problem or MalformedCall(unclosed(start, end, block).message)
            calls.extend(json_calls(value))
        except MalformedCall as exc:
            errors.append(ParseError(str(exc), block.raw, block.offset))
    pieces.append(text[prose_from:])
    return BlockScan(pieces, blocks, calls, errors)


_NOTHING = object()


def _json_first(text: str, pos: int, end: str, bound: int) -> tuple[Any, int, int] | None:
    """(value, end of the block, end of the value) when a JSON value after ``pos`` is closed by
    ``end`` or by the end of the text; ``None`` otherwise. ``bound`` is the next start marker."""
    at = skip_space(text, pos)
    if not text.startswith(("{", "["), at):
        return None
    try:
        value, value_end = raw_decode(text, at, bound)
    except MalformedCall:
        return None
    after = skip_space(text, value_end)
    if text.startswith(end, after):
        return value, after + len(end), value_end
    rest = text[after:]
    if not rest or partial_suffix(rest, end) == len(rest):
        return value, len(text), value_end
    return None


def skip_space(text: str, pos: int) -> int:
    """The first index at or after ``pos`` that is not whitespace."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _starts_like_json(body: str) -> bool:
    head = body.lstrip()
    return not head or head[0] in "{["


class CallFailure(Exception):
    """A tagged call that could not be read: why, how far reading got, and whether it stopped
    at its limit inside a value (which may hold the end tag the limit was put at)."""

    def __init__(self, message: str, at: int, in_value: bool = False) -> None:
        super().__init__(message)
        self.at = at
        self.in_value = in_value


def read_tagged_calls(
    text: str,
    family: str,
    openings: Sequence[tuple[int, int]],
    extent: Callable[[int], tuple[int, bool]],
    is_attempt: Callable[[int, int, bool], bool],
    read: Callable[[int, int, bool], tuple[list[ParsedCall], int]],
) -> ParseResult:
    """The loop of the formats whose values are raw text between tags (Qwen3-Coder, GLM).

    ``openings`` are (tag index, position) of every tag that may open a call, in order;
    ``extent(i)`` is where that call ends by the simple rule -- its first end tag before the next
    opening -- and whether the end tag is there; ``is_attempt`` tells an opening that begins a
    call from one that prose mentions; ``read(i, limit, closed)`` reads the call up to ``limit``
    or raises :class:`CallFailure`.

    A value may hold the end tag the simple rule stopped at (a file about tool calls), so a call
    that fails *inside a value at its limit* is read again without the limit. That second read
    is tried only from past where the last one failed, which keeps the whole loop linear even
    over thousands of broken calls. A call that fails both ways is an error spanning its simple
    extent, so it never swallows the calls after it.
    """
    pieces: list[str] = []
    calls: list[ParsedCall] = []
    errors: list[ParseError] = []
    prose_from = reach = 0
    for i, start in openings:
        if start < prose_from:
            continue  # inside the call before
        limit, closed = extent(i)
        if not is_attempt(i, limit, closed):
            continue
        try:
            found, end = read(i, limit, closed)
        except CallFailure as bounded:
            found = None
            if bounded.in_value and limit < len(text) and start >= reach:
                try:
                    found, end = read(i, len(text), False)
                except CallFailure as unbounded:
                    reach = unbounded.at
            if found is None:
                pieces.append(text[prose_from:start])
                errors.append(ParseError(str(bounded), text[start:limit], start))
                prose_from = limit
                continue
        pieces.append(text[prose_from:start])
        calls.extend(found or ())
        prose_from = end
    pieces.append(text[prose_from:])
    return build_result(pieces, calls, errors, family)


def loads(text: str) -> Any:
    """Decode JSON text (orjson for speed; the stdlib for its error message and big ints)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedCall(f"invalid JSON ({exc.msg} at char {exc.pos})") from None
    except RecursionError:
        raise MalformedCall("invalid JSON (nested too deeply)") from None


_DECODER = json.JSONDecoder()
_FIRST_WINDOW = 1024


def raw_decode(text: str, pos: int, bound: int | None = None) -> tuple[Any, int]:
    """Decode one JSON value starting at ``pos``; return it and the index after it.

    The value is read from a window of the text that starts at ``pos`` and reaches ``bound``
    (the next place a call could start, when known) or a few KB, grown while the JSON runs past
    it. Decoding the whole text in place would be simpler, but every failure then
    scans the text before ``pos`` for its line and column: quadratic over thousands of broken
    calls. The window grows eightfold, so re-reading its start costs a small constant factor.
    """
    size = max((bound or 0) - pos, _FIRST_WINDOW)
    while True:
        stop = min(len(text), pos + size)
        window = text[pos:stop]
        try:
            value, end = _DECODER.raw_decode(window)
        except json.JSONDecodeError as exc:
            if stop < len(text) and _cut_by_window(exc, window):
                size *= 8
                continue
            raise MalformedCall(f"invalid JSON ({exc.msg} at char {exc.pos})") from None
        except RecursionError:
            raise MalformedCall("invalid JSON (nested too deeply)") from None
        return value, pos + end


def _cut_by_window(exc: json.JSONDecodeError, window: str) -> bool:
    """Whether decoding failed only because the window ended (a longer one may succeed)."""
    return exc.pos >= len(window) - 1 or exc.msg.startswith("Unterminated string")


def call_arguments_value(value: Any, written: str | None = None) -> dict[str, Any] | str:
    """The arguments of a call from their decoded JSON ``value``.

    An object is the normal case; ``null``, a missing value or a blank string mean no arguments;
    a JSON string holding an object is decoded (models double-encode, like OpenAI's wire format).
    Anything else -- a string that does not hold an object, an array, a number -- is passed
    through as arguments *text* (``written`` when the format wrote the arguments on their own,
    else the string's content or the value's JSON), never dropped or replaced by a guess: the
    agent loop tells the model when a tool needs an object.
    """
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            inner = loads(value)
        except MalformedCall:
            inner = None
        if isinstance(inner, dict):
            return inner
        return written if written is not None else value
    return written if written is not None else json.dumps(value, ensure_ascii=False)


def named_call(name: str, arguments: str) -> ParsedCall:
    """A call whose format writes the name and the JSON arguments apart (blank: no arguments)."""
    written = arguments.strip()
    value = loads(written) if written else None
    return ParsedCall(call_name(name), call_arguments_value(value, written or None))


def call_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise MalformedCall('tool call has no "name"')
    return name.strip()


def json_call(obj: Any, *, arg_keys: tuple[str, ...] = ("arguments", "parameters")) -> ParsedCall:
    """A call from a decoded ``{"name": ..., "arguments": ...}`` object."""
    if not isinstance(obj, dict):
        raise MalformedCall(f"a tool call must be a JSON object, got {type(obj).__name__}")
    name = call_name(obj.get("name"))
    args: Any = None
    for key in arg_keys:
        if key in obj:
            args = obj[key]
            break
    return ParsedCall(name, call_arguments_value(args))


def json_calls(value: Any) -> list[ParsedCall]:
    """One call object, or a non-empty list of them (some models put several in one block)."""
    if isinstance(value, list):
        if not value:
            raise MalformedCall("empty list of calls")
        return [json_call(item) for item in value]
    return [json_call(value)]


def unclosed(start: str, end: str, block: Block) -> ParseError:
    return ParseError(f"unclosed {start}: no {end} before the next call or the end", block.raw, block.offset)
