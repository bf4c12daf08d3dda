"""OpenAI chat messages -> ShareGPT turns, text-compatible with the reference conversion.

Users of the reference train on its exact text (the canonical function-calling system prompt,
``<think>`` blocks on every ``gpt`` turn, ``<tool_call>``/``<tool_response>`` JSON), so for the
same messages this module produces the same strings, byte for byte. Text is built with the
stdlib ``json`` on purpose: its default separators and ``ensure_ascii=False`` ARE the format.

Where the reference loses information we keep it and say so in :class:`ConversionIssue`:

* tool-call arguments that are not valid JSON: the reference silently writes ``{}``; we keep the
  raw string under ``"arguments"`` (so the text shows what the model really produced) and report
  an ``invalid_arguments`` issue. A ``None`` or blank arguments string is the usual encoding of
  "no arguments" and becomes ``{}`` without an issue.
* tool results that follow no assistant tool call: the reference drops them; we keep them as a
  ``tool`` turn (name from the message, else ``"unknown"``) and report an ``orphan_tool_result``.

Not saved, as in the reference: ``system``/``developer`` messages (the runtime system prompt,
ephemeral prompts) and prefill messages (``prefill_messages`` says how many lead the list).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from trajforge.trajectory.think import THINK_OPEN, content_text, message_reasoning, scratchpad_to_think

SYSTEM_PROMPT_HEAD = (
    "You are a function calling AI model. You are provided with function signatures within <tools> </tools> XML tags. "
    "You may call one or more functions to assist with the user query. If available tools are not relevant in assisting "
    "with user query, just respond in natural conversational language. Don't make assumptions about what values to plug "
    "into functions. After calling & executing the functions, you will be provided with function results within "
    "<tool_response> </tool_response> XML tags. Here are the available tools:\n"
)
SYSTEM_PROMPT_TAIL = (
    "For each function call return a JSON object, with the following pydantic model json schema for each:\n"
    "{'title': 'FunctionCall', 'type': 'object', 'properties': {'name': {'title': 'Name', 'type': 'string'}, "
    "'arguments': {'title': 'Arguments', 'type': 'object'}}, 'required': ['name', 'arguments']}\n"
    "Each function call should be enclosed within <tool_call> </tool_call> XML tags.\n"
    "Example:\n<tool_call>\n{'name': <function-name>,'arguments': <args-dict>}\n</tool_call>"
)
EMPTY_THINK = "<think>\n</think>\n"

# Message roles that carry runtime instructions, never saved into a trajectory.
_INSTRUCTION_ROLES = frozenset({"system", "developer"})

IssueKind = Literal["invalid_arguments", "orphan_tool_result"]


@dataclass(frozen=True)
class ConversionIssue:
    """Something in the messages the reference would have lost silently; ``turn`` indexes the output."""

    kind: IssueKind
    turn: int
    detail: str


@dataclass
class ShareGPTConversion:
    """The converted conversation plus what was worth flagging on the way."""

    conversations: list[dict[str, str]]
    issues: list[ConversionIssue] = field(default_factory=list)

    @property
    def invalid_arguments(self) -> list[ConversionIssue]:
        return [i for i in self.issues if i.kind == "invalid_arguments"]


def tool_function(tool: Any) -> Mapping[str, Any]:
    """The ``function`` part of a tool, from an OpenAI tools entry, a bare function dict or a ``Tool``."""
    if isinstance(tool, Mapping):
        func = tool.get("function", tool)
        if isinstance(func, Mapping) and isinstance(func.get("name"), str):
            return func
    elif isinstance(getattr(tool, "name", None), str):
        return {
            "name": tool.name,
            "description": getattr(tool, "description", ""),
            "parameters": getattr(tool, "parameters", {}),
        }
    raise TypeError(
        "each tool must be an OpenAI tools entry {'type': 'function', 'function': {'name': ...}}, "
        f"a function dict with a 'name', or a Tool object; got {tool!r:.200}"
    )


def format_tools(tools: Iterable[Any] | None) -> str:
    """The JSON list inside ``<tools>``: name, description, parameters and ``"required": null``."""
    entries = [
        {
            "name": func["name"],
            "description": func.get("description", ""),
            "parameters": func.get("parameters", {}),
            "required": None,
        }
        for func in map(tool_function, tools or ())
    ]
    return json.dumps(entries, ensure_ascii=False) if entries else "[]"


def system_prompt(tools: Iterable[Any] | None) -> str:
    """The canonical function-calling system text of the reference, listing ``tools``."""
    return f"{SYSTEM_PROMPT_HEAD}<tools>\n{format_tools(tools)}\n</tools>\n{SYSTEM_PROMPT_TAIL}"


def _think_prefix(msg: Mapping[str, Any]) -> str:
    reasoning = message_reasoning(msg)
    return f"<think>\n{reasoning}\n</think>\n" if reasoning is not None else ""


def _with_think(value: str) -> str:
    """Every ``gpt`` turn carries a think block, empty when the turn had no reasoning."""
    return value if THINK_OPEN in value else EMPTY_THINK + value


def _call_parts(call: Mapping[str, Any]) -> tuple[str, Any]:
    func = call.get("function") or {}
    return str(func.get("name", "")), func.get("arguments")


def _parse_arguments(raw: Any) -> tuple[Any, bool]:
    """(arguments for the text, whether they were valid). Non-JSON text is kept raw, not replaced by {}."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, True
    if not isinstance(raw, str):
        return raw, isinstance(raw, Mapping)
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        return raw, False
    return parsed, isinstance(parsed, dict)


def _tool_content(content: Any) -> Any:
    """Tool result content, parsed when it looks like JSON (``{``/``[``) and parses, else the text.

    ``None`` stays ``null`` as in the reference; a list of content parts becomes its text.
    """
    if content is None:
        return None
    text = content_text(content)
    if text.strip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


def _tool_response(msg: Mapping[str, Any], name: str) -> str:
    body = {
        "tool_call_id": msg.get("tool_call_id") or "",
        "name": name,
        "content": _tool_content(msg.get("content")),
    }
    return f"<tool_response>\n{json.dumps(body, ensure_ascii=False)}\n</tool_response>"


class _Converter:
    """One conversion's state: the output turns and the issues found."""

    def __init__(self, tools: Iterable[Any] | None, prompt: str) -> None:
        self.turns: list[dict[str, str]] = [
            {"from": "system", "value": system_prompt(tools)},
            {"from": "human", "value": prompt},
        ]
        self.issues: list[ConversionIssue] = []

    def assistant_with_calls(self, msg: Mapping[str, Any], calls: list[Mapping[str, Any]]) -> None:
        value = _think_prefix(msg)
        text = content_text(msg.get("content"))
        if text.strip():
            value += scratchpad_to_think(text) + "\n"
        for call in calls:
            name, raw = _call_parts(call)
            arguments, valid = _parse_arguments(raw)
            if not valid:
                self.issues.append(
                    ConversionIssue("invalid_arguments", len(self.turns), f"{name}: {str(raw)[:200]!r}")
                )
            body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
            value += f"<tool_call>\n{body}\n</tool_call>\n"
        self.turns.append({"from": "gpt", "value": _with_think(value).rstrip()})

    def assistant_text(self, msg: Mapping[str, Any]) -> None:
        value = _think_prefix(msg) + scratchpad_to_think(content_text(msg.get("content")))
        self.turns.append({"from": "gpt", "value": _with_think(value).strip()})

    def tool_results(self, results: Sequence[Mapping[str, Any]], call_names: Sequence[str] | None) -> None:
        if call_names is None:  # no assistant call precedes them
            names = [str(m.get("name") or "unknown") for m in results]
            self.issues.append(
                ConversionIssue("orphan_tool_result", len(self.turns), f"{len(results)} tool result(s)")
            )
        else:
            names = [call_names[k] if k < len(call_names) else "unknown" for k in range(len(results))]
        value = "\n".join(_tool_response(m, n) for m, n in zip(results, names, strict=True))
        self.turns.append({"from": "tool", "value": value})


def _split_prompt(
    messages: Sequence[Mapping[str, Any]], prompt: str | None, prefill_messages: int
) -> tuple[str, list[Mapping[str, Any]]]:
    """Drop instructions and prefill; take out the first user message (the dataset prompt)."""
    body = [m for m in messages if m.get("role") not in _INSTRUCTION_ROLES][prefill_messages:]
    first_user = next((k for k, m in enumerate(body) if m.get("role") == "user"), None)
    if first_user is None:
        if prompt is None:
            raise ValueError("the messages have no user message to take the prompt from; pass prompt=")
        return prompt, body
    if prompt is None:
        prompt = content_text(body[first_user].get("content"))
    return prompt, body[:first_user] + body[first_user + 1 :]


def _end_of_tool_run(body: Sequence[Mapping[str, Any]], start: int) -> int:
    """Index just past the consecutive ``tool`` messages starting at ``start``."""
    end = start
    while end < len(body) and body[end].get("role") == "tool":
        end += 1
    return end


def convert(
    messages: Sequence[Mapping[str, Any]],
    tools: Iterable[Any] | None = None,
    prompt: str | None = None,
    *,
    prefill_messages: int = 0,
) -> ShareGPTConversion:
    """Convert OpenAI-format ``messages`` to ShareGPT, reporting what the reference would lose.

    ``tools`` are the tools OFFERED to this conversation (OpenAI tools entries, function dicts or
    ``Tool`` objects); ``prompt`` is the dataset prompt (default: the first user message's text).
    """
    prompt, body = _split_prompt(messages, prompt, prefill_messages)
    out = _Converter(tools, prompt)
    i = 0
    while i < len(body):
        msg, role, nxt = body[i], body[i].get("role"), i + 1
        if role == "assistant":
            calls = [c for c in msg.get("tool_calls") or () if isinstance(c, Mapping)]
            if calls:
                out.assistant_with_calls(msg, calls)
                nxt = _end_of_tool_run(body, i + 1)
                if nxt > i + 1:
                    out.tool_results(body[i + 1 : nxt], [_call_parts(c)[0] for c in calls])
            else:
                out.assistant_text(msg)
        elif role == "tool":
            nxt = _end_of_tool_run(body, i)
            out.tool_results(body[i:nxt], None)
        elif role == "user":
            out.turns.append({"from": "human", "value": content_text(msg.get("content"))})
        else:
            raise ValueError(
                f"unsupported message role {role!r}; expected system, developer, user, assistant or tool"
            )
        i = nxt
    return ShareGPTConversion(conversations=out.turns, issues=out.issues)


def to_sharegpt(
    messages: Sequence[Mapping[str, Any]],
    tools: Iterable[Any] | None = None,
    prompt: str | None = None,
    *,
    prefill_messages: int = 0,
) -> list[dict[str, str]]:
    """The ShareGPT turns of ``messages`` (see :func:`convert` for the flagged issues too)."""
    return convert(messages, tools, prompt, prefill_messages=prefill_messages).conversations
