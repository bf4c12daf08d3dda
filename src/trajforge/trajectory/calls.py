"""A saved conversation back to OpenAI messages, telling calls that ran from text that looks like one.

A batch line keeps its conversation as ShareGPT turns (:mod:`trajforge.trajectory.sharegpt`), where
a call the agent ran and call markup the model wrote as plain text look alike: both are
``<tool_call>`` blocks in a ``gpt`` turn. Re-parsing every block, as the exports once did, turned a
malformed call (one the parser could not read, status still ``completed``) into a call nobody made:
an empty name, the raw text as a string "argument", no tool reply after it. Chat templates render
that double-encoded and train on it, or raise.

What tells them apart is the structure the agent loop and the ShareGPT conversion leave:

* the calls that ran are the *last* blocks of their turn, each one line of JSON (``{"name",
  "arguments"}`` written by ``json.dumps``), and the ``tool`` turn right after holds one
  ``<tool_response>`` per call, in order;
* a reply whose call could not be parsed is followed by the loop's parse-error ``human`` turn
  (:data:`PARSE_ERROR_PREFIX`) and no ``tool`` turn: every block in it is the assistant's text;
* the last turn of a sample that did not end on a final answer (cut off while its calls ran)
  keeps its trailing well-formed blocks as calls that got no result.

Everything else in a turn is the assistant's text. :func:`to_messages` returns the messages and
every malformed call it found (:class:`Malformed`); a malformed call is always the assistant's
text in those messages, never a call. Whether such a sample is trained on is the caller's choice
(``trajforge export --malformed-calls``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from trajforge.messages import THINK_CLOSE, THINK_OPEN, content_text

# The agent loop's reply to an unparseable call (agent/loop.py ``_report_parse_errors``); repeated
# here because trajectory/ sits below agent/, and tests/test_export_calls.py checks that they agree.
PARSE_ERROR_PREFIX = "Your tool call could not be parsed"
CALL_OPEN, CALL_CLOSE = "<tool_call>\n", "\n</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

MalformedKind = Literal["unparsed_call", "call_markup_in_text", "non_object_arguments", "unmatched_results"]
MALFORMED_KINDS: tuple[MalformedKind, ...] = (
    "unparsed_call",
    "call_markup_in_text",
    "non_object_arguments",
    "unmatched_results",
)


@dataclass(frozen=True, slots=True)
class Malformed:
    """A call that cannot be exported as a call. ``turn`` indexes the ShareGPT turns.

    * ``unparsed_call``: the model's reply held a call the parser could not read (the loop told
      the model so in the next turn);
    * ``call_markup_in_text``: call markup (any call family's opening or closing tag, or a call
      the parser reads) in a turn's text or reasoning, taken as text: the agent loop's own check,
      handed in as ``markup``;
    * ``non_object_arguments``: a call whose arguments were not a JSON object (the loop refused
      to run it); the whole turn and its results become text;
    * ``unmatched_results``: tool results that do not line up with the calls before them."""

    turn: int
    kind: MalformedKind
    detail: str


@dataclass(slots=True)
class Conversation:
    """OpenAI messages (no system message) and the malformed calls found on the way."""

    messages: list[dict[str, Any]]
    malformed: list[Malformed] = field(default_factory=list)


def is_parse_error(text: Any) -> bool:
    """Whether a user turn is the agent loop's "your call could not be parsed" reply."""
    return isinstance(text, str) and text.startswith(PARSE_ERROR_PREFIX)


def unparsed_replies(turns: Iterable[Mapping[str, Any]]) -> int:
    """How many replies of a conversation had a call that could not be parsed: the loop's
    parse-error turns, in ShareGPT turns (``human``) or OpenAI messages (``user``) alike."""
    return sum(
        1
        for t in turns
        if (t.get("from") == "human" or t.get("role") == "user")
        and is_parse_error(t.get("value", t.get("content")))
    )


def split_think(value: str) -> tuple[str | None, str]:
    """(reasoning, rest) of a ``gpt`` turn: its leading ``<think>`` block, as the conversion wrote it."""
    if not value.startswith(THINK_OPEN):
        return None, value
    end = value.find(THINK_CLOSE)
    if end < 0:
        return None, value
    reasoning = value[len(THINK_OPEN) : end].strip("\n").strip()
    return reasoning or None, value[end + len(THINK_CLOSE) :].lstrip("\n")


def _peel_call(body: str) -> tuple[str, str] | None:
    """(text before, the JSON line) of the block that ends ``body``, when it is one well-formed
    block as the conversion writes it: ``<tool_call>\\n{one line}\\n</tool_call>``."""
    text = body.rstrip()
    if not text.endswith(CALL_CLOSE):
        return None
    inner_end = len(text) - len(CALL_CLOSE)
    start = text.rfind(CALL_OPEN, 0, inner_end)
    if start < 0:
        return None
    line = text[start + len(CALL_OPEN) : inner_end]
    if "\n" in line:
        return None
    return text[:start], line


def _call_object(line: str) -> dict[str, Any] | None:
    try:
        call = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "arguments" not in call:
        return None
    return call


def _trailing_calls(body: str, count: int | None) -> tuple[str, list[dict[str, Any]]] | None:
    """Peel ``count`` call blocks off the end of ``body`` (``None``: as many as there are).
    Returns (the text before them, the calls in order), or None when fewer than ``count`` are there."""
    calls: list[dict[str, Any]] = []
    while count is None or len(calls) < count:
        peeled = _peel_call(body)
        call = _call_object(peeled[1]) if peeled else None
        if peeled is None or call is None:
            if count is None:
                break
            return None
        body = peeled[0]
        calls.append(call)
    return body, calls[::-1]


def parse_responses(value: str) -> list[dict[str, Any]] | None:
    """The ``<tool_response>`` bodies of a ``tool`` turn (each one JSON line, as written), or None
    when the turn is not in that shape."""
    lines = value.split("\n")
    if len(lines) % 3:
        return None
    out = []
    for k in range(0, len(lines), 3):
        head, body, tail = lines[k : k + 3]
        if head != RESPONSE_OPEN or tail != RESPONSE_CLOSE:
            return None
        try:
            parsed = json.loads(body)
        except json.JSONDecodeError:
            return None
        out.append(parsed if isinstance(parsed, dict) else {"content": parsed})
    return out


def _tool_content(content: Any) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def _cut(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n] + "…"


MarkupCheck = Callable[[str | None, str | None], str | None]
"""(a turn's text, its reasoning) -> what in them is call markup, or None: the agent loop's own
check (``llm.parsers.markup.find_call_markup``), handed in by the caller, which sits above."""


class _Builder:
    def __init__(
        self, turns: Sequence[Mapping[str, Any]], ended_on_answer: bool | None, markup: MarkupCheck | None
    ) -> None:
        self.turns = turns
        self.ended_on_answer = ended_on_answer
        self.markup = markup
        self.messages: list[dict[str, Any]] = []
        self.malformed: list[Malformed] = []

    def _next(self, i: int) -> Mapping[str, Any] | None:
        return self.turns[i + 1] if i + 1 < len(self.turns) else None

    def _followed_by_parse_error(self, i: int) -> bool:
        j = i + 1
        while j < len(self.turns) and self.turns[j].get("from") == "tool":
            j += 1
        return (
            j < len(self.turns)
            and self.turns[j].get("from") == "human"
            and is_parse_error(self.turns[j].get("value"))
        )

    def assistant(self, i: int, value: str) -> int:
        """Convert the ``gpt`` turn at ``i`` (and its ``tool`` turn); returns the next index."""
        reasoning, body = split_think(value)
        nxt = self._next(i)
        responses: list[dict[str, Any]] | None = []
        if nxt is not None and nxt.get("from") == "tool":
            responses = parse_responses(str(nxt.get("value", "")))
            peeled = _trailing_calls(body, len(responses)) if responses is not None else None
        elif nxt is None and self.ended_on_answer is not True:
            peeled = _trailing_calls(body, None)  # cut off while its calls ran: no results
        else:
            peeled = (body, [])
        uses_tool_turn = nxt is not None and nxt.get("from") == "tool"
        if peeled is None or responses is None:
            self._flag(i, "unmatched_results", "the tool results do not line up with the calls before them")
            return self._as_text(i, reasoning, body, uses_tool_turn)
        text, calls = peeled
        bad = [c for c in calls if not isinstance(c["arguments"], dict)]
        if bad:
            self._flag(
                i, "non_object_arguments", f"{bad[0]['name']}: {_cut(json.dumps(bad[0]['arguments']))}"
            )
            return self._as_text(i, reasoning, body, uses_tool_turn)
        content = text.strip()
        found = self.markup(content, reasoning) if self.markup is not None else None
        if self._followed_by_parse_error(i):
            self._flag(i, "unparsed_call", _cut(content))
        elif found is not None:
            self._flag(i, "call_markup_in_text", f"{found}: {_cut(content or reasoning or '')}")
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        if calls:
            msg["tool_calls"] = [
                {
                    "id": f"call_{i}_{k}",
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for k, c in enumerate(calls)
            ]
        self.messages.append(msg)
        for k, (call, resp) in enumerate(zip(calls, responses or [], strict=False)):
            self.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": f"call_{i}_{k}",
                    "name": str(resp.get("name") or call["name"]),
                    "content": _tool_content(resp.get("content")),
                }
            )
        return i + (2 if uses_tool_turn else 1)

    def _as_text(self, i: int, reasoning: str | None, body: str, with_tool_turn: bool) -> int:
        """The turn exactly as its text reads, and its tool turn (if any) as the user text it was."""
        msg: dict[str, Any] = {"role": "assistant", "content": body.strip()}
        if reasoning is not None:
            msg["reasoning_content"] = reasoning
        self.messages.append(msg)
        if with_tool_turn:
            self.messages.append({"role": "user", "content": str(self.turns[i + 1].get("value", ""))})
            return i + 2
        return i + 1

    def _flag(self, turn: int, kind: MalformedKind, detail: str) -> None:
        self.malformed.append(Malformed(turn, kind, detail))

    def build(self) -> Conversation:
        i = 0
        while i < len(self.turns):
            turn = self.turns[i]
            role, value = turn.get("from"), turn.get("value")
            text = value if isinstance(value, str) else content_text(value)
            if role == "gpt":
                i = self.assistant(i, text)
                continue
            if role == "human":
                self.messages.append({"role": "user", "content": text})
            elif role == "tool":  # results after no call: keep what they said, as text
                self._flag(i, "unmatched_results", "tool results that follow no call")
                self.messages.append({"role": "user", "content": text})
            i += 1
        return Conversation(self.messages, self.malformed)


def to_messages(
    turns: Sequence[Mapping[str, Any]],
    *,
    ended_on_answer: bool | None = None,
    markup: MarkupCheck | None = None,
) -> Conversation:
    """ShareGPT turns (as a batch line keeps them) -> OpenAI messages without the system turn.

    Calls that ran become ``tool_calls`` with object ``arguments`` and ``tool`` messages with
    their ids; a malformed call stays the assistant's text and is listed in ``malformed``.
    ``ended_on_answer`` is whether the sample ended on a final answer (``termination ==
    "final_answer"``): then its last turn is text whatever it holds; unknown (None) or False, the
    last turn's trailing call blocks are calls that were cut off before their results.
    ``markup``: what counts as call markup left in an assistant turn's text or reasoning (a
    ``call_markup_in_text`` malformed call); None: not looked for."""
    return _Builder(turns, ended_on_answer, markup).build()
