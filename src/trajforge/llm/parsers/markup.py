"""Tool-call markup left in text: the one check the agent loop and the exports share.

A model's call that reached the agent as *text* (an endpoint that did not parse it, a call cut
off, a stray closing tag after a call that did parse, a call written inside the reasoning) never
ran. The agent loop must not end a session on it as if it were the answer (it tells the model, as
for a call that did not parse: ``agent/loop.py``), and an SFT export must not hold it (it teaches
the model to write calls that never run: ``export/formats.py``). Both ask :func:`find_call_markup`,
so what counts as markup is decided once.

What counts, in any text: an opening or a closing tag of a tool-call family the parser knows
(``auto``: every family). The tags come from each family's own markers (``markers``,
``start_marker``, ``end_marker``), with the closing form of each opening tag (``<tool_call>`` ->
``</tool_call>``, ``<function=`` -> ``</function>``, ``..._begin|>`` -> ``..._end|>``); bare-JSON
and ``[name(...)]`` families have no tag, only a shape. With ``tools`` given (an answer's
content, where the offered tools are known) a text the parser reads as a call naming an offered
tool, or as a call it could not parse, also counts: that catches the tagless families.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

from trajforge.llm.parsers import get_parser, list_parsers

_OPENING = re.compile(r"^<([A-Za-z_][\w]*)(>|=)$")


def _closings(tag: str) -> list[str]:
    found = _OPENING.match(tag)
    if found:
        return [f"</{found.group(1)}>"]
    for begin, end in (("begin", "end"), ("start", "end")):
        if begin in tag:
            return [tag.replace(begin, end)]
    return []


def _is_tag(marker: str) -> bool:
    """A marker that is a tag (``<...``, ``[TOOL_CALLS]``), not a shape (``[``, ``{"name"``)."""
    return len(marker) > 2 and (marker.startswith("<") or (marker.startswith("[") and marker.endswith("]")))


@functools.cache
def call_tags(parser: str = "auto") -> tuple[str, ...]:
    """Every opening and closing call tag of the family ``parser`` (``auto``: of every family)."""
    families = [n for n in list_parsers() if n != "auto"] if parser == "auto" else [parser]
    tags: list[str] = []
    for name in families:
        family = get_parser(name)
        markers = [*getattr(family, "markers", ()), getattr(family, "start_marker", "")]
        markers.append(getattr(family, "end_marker", ""))
        for marker in markers:
            if _is_tag(marker):
                tags += [marker, *_closings(marker)]
    return tuple(dict.fromkeys(tags))


def find_call_markup(
    text: str | None, *, parser: str = "auto", tools: Sequence[dict[str, Any]] | None = None
) -> str | None:
    """What in ``text`` is tool-call markup, shown short (``'</tool_call>'``, ``"a call to
    'terminal'"``), or None when there is none. ``parser``: the family the model's calls are read
    with (``auto``: any); ``tools``: the tools offered, for the calls the parser reads in an answer
    (none: tags only, e.g. for reasoning)."""
    if not text:
        return None
    if tools:  # first: a call the parser reads is named by its tool, which tells the model most
        found = get_parser(parser).parse(text, tools)
        offered = {t.get("function", {}).get("name") for t in tools}
        named = [c.name for c in found.calls if c.name in offered]
        if named:
            return f"a call to {named[0]!r}"
        if found.errors:
            return "a tool call that does not parse"
    for tag in call_tags(parser):
        if tag in text:
            return f"the call tag {tag}"
    return None
