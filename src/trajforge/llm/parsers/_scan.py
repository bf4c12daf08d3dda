"""Shared, linear-time building blocks for the family parsers.

Every family wraps calls in some start/end markers and encodes arguments either as JSON or as
tagged strings. These helpers do the things they all need -- cut a text into prose and marked
blocks, read each block with the family's own reader while turning its failures into
:class:`ParseError`s, and decode a JSON call -- in one pass over the text, so no parser is
quadratic on long outputs (see ``benchmarks/parse_throughput.py``). A family module keeps only
what is specific to its format: its markers and how one call's body is read.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from trajforge.llm.parsers.base import ParsedCall, ParseError


class MalformedCall(ValueError):
    """Raised inside a parser for a call it cannot read; becomes a :class:`ParseError`."""


@dataclass(frozen=True, slots=True)
class Block:
    """One marked region of a text: ``raw`` includes the markers, ``body`` excludes them."""

    offset: int
    body: str
    raw: str
    closed: bool


def split_blocks(text: str, start: str, end: str) -> tuple[list[str], list[Block]]:
    """Cut ``text`` into the prose outside ``start ... end`` blocks and the blocks themselves.

    A block whose end marker is missing, or that is interrupted by another start marker, is
    returned with ``closed=False`` and runs up to that next start (or the end of the text), so a
    single truncated call does not swallow the calls after it. All marker positions are found
    once, which keeps the cost linear however many unclosed blocks there are.
    """
    starts = _positions(text, start)
    if not starts:
        return [text], []
    ends = _positions(text, end)
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
            blocks.append(Block(s, text[body_start:pos], text[s:pos], False))
        k += 1
        while k < len(starts) and starts[k] < pos:
            k += 1
    pieces.append(text[pos:])
    return pieces, blocks


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
    text: str, start: str, end: str, read: Callable[[str], ParsedCall | list[ParsedCall]]
) -> BlockScan:
    """Cut ``text`` into ``start ... end`` blocks (:func:`split_blocks`) and read each one.

    The loop every block-delimited family shares: an unclosed block is an error naming both
    markers; a closed block's body goes to ``read`` (the family's reader, returning one call or,
    when a body may hold several, a list), and a :class:`MalformedCall` it raises becomes an
    error carrying the block's raw text and offset. Nothing is dropped silently.
    """
    pieces, blocks = split_blocks(text, start, end)
    calls: list[ParsedCall] = []
    errors: list[ParseError] = []
    for block in blocks:
        if not block.closed:
            errors.append(unclosed(start, end, block))
            continue
        try:
            found = read(block.body)
        except MalformedCall as exc:
            errors.append(ParseError(str(exc), block.raw, block.offset))
            continue
        if isinstance(found, ParsedCall):
            calls.append(found)
        else:
            calls.extend(found)
    return BlockScan(pieces, blocks, calls, errors)


def _positions(text: str, marker: str) -> list[int]:
    out: list[int] = []
    i = text.find(marker)
    while i >= 0:
        out.append(i)
        i = text.find(marker, i + len(marker))
    return out


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


def raw_decode(text: str, pos: int) -> tuple[Any, int]:
    """Decode one JSON value starting at ``pos``; return it and the index after it."""
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        raise MalformedCall(f"invalid JSON ({exc.msg} at char {exc.pos - pos})") from None
    except RecursionError:
        raise MalformedCall("invalid JSON (nested too deeply)") from None


def object_arguments(value: Any) -> dict[str, Any]:
    """Arguments must be a JSON object; a JSON string holding one is decoded (some models do that)."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = loads(value) if value.strip() else {}
    if not isinstance(value, dict):
        raise MalformedCall(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


def named_call(name: str, arguments: str) -> ParsedCall:
    """A call whose format writes the name and the JSON arguments apart (blank: no arguments)."""
    return json_call({"name": name, "arguments": loads(arguments) if arguments.strip() else None})


def json_call(obj: Any, *, arg_keys: tuple[str, ...] = ("arguments", "parameters")) -> ParsedCall:
    """A call from a decoded ``{"name": ..., "arguments": {...}}`` object."""
    if not isinstance(obj, dict):
        raise MalformedCall(f"a tool call must be a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        raise MalformedCall('tool call has no "name"')
    args: Any = None
    for key in arg_keys:
        if key in obj:
            args = obj[key]
            break
    return ParsedCall(name.strip(), object_arguments(args))


def unclosed(start: str, end: str, block: Block) -> ParseError:
    return ParseError(f"unclosed {start}: no {end} before the next call or the end", block.raw, block.offset)
