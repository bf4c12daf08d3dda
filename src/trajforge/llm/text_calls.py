"""Tool calls a chat endpoint returned as text, recovered into real calls (``--tool-call-parser``).

A server without a parser for the model's call format (llama-cpp-python, a vLLM started without
``--enable-auto-tool-choice``, plain completion servers behind a chat shim) hands the model's
well-formed ``<tool_call>`` back as ``content`` with ``finish_reason: "stop"``. Bounced as "your
call could not be parsed", a model that called correctly is told it did not, and collapses (0 of
30 tiny tasks solved against llama-cpp-python, issue 37). Parsed here, in the llm layer, the agent
loop receives ordinary ``tool_calls`` and runs them; the turn says which parser recovered them
(``AssistantTurn.calls_from_text``), which the record keeps (``Record.recovered_calls``).

Only a text that calls an offered tool is taken for calls: an answer that merely holds JSON with
a ``name`` key stays an answer. Markup that does not parse becomes ``parse_errors`` (the loop shows
the model what was wrong), as the token-exact client does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from trajforge.llm.chat_wire import new_call_id
from trajforge.llm.parsers import ToolCallParser, get_parser
from trajforge.llm.types import AssistantTurn, ToolCall


def text_call_parser(name: str, server_parses_calls: bool) -> ToolCallParser | None:
    """The parser ``--tool-call-parser name`` means on the chat path: a family by name, ``auto``
    (detect the family) unless the server always parses calls itself, ``none``: no parsing."""
    if name == "none" or (name == "auto" and server_parses_calls):
        return None
    return get_parser(name)


def recover_calls(
    turn: AssistantTurn, parser: ToolCallParser, tools: Sequence[dict[str, Any]] | None
) -> AssistantTurn:
    """``turn`` with the calls its text holds as real tool calls (``turn`` itself when there are none).

    Left alone: a turn that already has calls (the server parsed them), one without text, and a
    text whose calls name no offered tool (prose or an answer that looks like a call format).
    """
    if turn.tool_calls or not turn.content or not tools:
        return turn
    parsed = parser.parse(turn.content, tools)
    offered = {(t.get("function") or {}).get("name") for t in tools}
    if any(call.name in offered for call in parsed.calls):
        calls = [
            ToolCall(
                id=new_call_id(),
                name=call.name,
                arguments=call.arguments
                if isinstance(call.arguments, str)
                else json.dumps(call.arguments, ensure_ascii=False),
            )
            for call in parsed.calls
        ]
        return turn.model_copy(
            update={
                "content": parsed.content,
                "tool_calls": calls,
                "parse_errors": [*turn.parse_errors, *(e.describe() for e in parsed.errors)],
                "finish_reason": "tool_calls" if turn.finish_reason == "stop" else turn.finish_reason,
                "calls_from_text": parsed.parser or parser.name,
            }
        )
    if parsed.errors and not turn.parse_errors:
        return turn.model_copy(update={"parse_errors": [e.describe() for e in parsed.errors]})
    return turn
