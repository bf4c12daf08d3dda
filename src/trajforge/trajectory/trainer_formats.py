"""OpenAI messages -> the row shapes other trainers' data loaders read without losing a turn.

Each function takes one conversation as OpenAI messages (tool-call ``arguments`` as JSON objects,
reasoning under ``reasoning_content``, the run's system prompt, if any, passed separately) and
returns one dataset row. Why each shape is what it is (checked against the trainers' own code):

* **LLaMA-Factory** (``formatting: sharegpt``): roles must alternate human/observation with
  gpt/function_call, or the converter drops the whole example; ``observation`` is the tool result
  *without* ``<tool_response>`` tags (the template adds them: writing them again double-wraps);
  ``function_call`` is the call JSON (``{"name", "arguments"}``, a list for parallel calls), with
  reasoning in a leading ``<think>`` block, the only text LLaMA-Factory keeps in such a turn, so
  prose an assistant wrote next to its calls goes into that block too instead of vanishing;
  ``tools`` is a JSON *string*. A conversation that ends on tool results or a user turn (a sample
  cut off after its last call) loses that tail: there is no answer to train on after it, and
  LLaMA-Factory rejects an example that does not end on a model turn. What its converter and
  function formatter would still refuse or misread (roles that do not alternate, as a user turn
  right after tool results; ``<tool_call>`` or ``</think>`` in the text of a call turn, which its
  formatter would take for the call or the thought's end) is named by
  :func:`llamafactory_problem`, so an export leaves such a row out and counts it.
* **Axolotl** (``type: chat_template``): OpenAI messages, but ``arguments`` as JSON strings and
  ``tools`` as one JSON string: Axolotl ``json.loads`` both before rendering (so the template sees
  objects, encoded once) and strings keep one Arrow schema however the arguments' keys vary.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

Message = Mapping[str, Any]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _call_object(call: Message) -> dict[str, Any]:
    func = call.get("function") or {}
    return {"name": func.get("name", ""), "arguments": func.get("arguments", {})}


def _think(reasoning: str | None, prose: str) -> str:
    inner = "\n\n".join(part for part in (reasoning or "", prose) if part)
    return f"<think>\n{inner}\n</think>\n\n" if inner else ""


def to_llamafactory(
    messages: Sequence[Message], tools: Sequence[Mapping[str, Any]], system: str | None = None
) -> dict[str, Any]:
    """One LLaMA-Factory ShareGPT row: ``conversations`` (human/gpt/function_call/observation),
    ``system`` and ``tools`` (a JSON string)."""
    turns: list[dict[str, str]] = []
    results: list[str] = []

    def flush_results() -> None:
        if results:
            value = results[0] if len(results) == 1 else _dumps(results)
            turns.append({"from": "observation", "value": value})
            results.clear()

    for msg in messages:
        role = msg.get("role")
        if role == "tool":
            results.append(str(msg.get("content") or ""))
            continue
        flush_results()
        if role == "user":
            turns.append({"from": "human", "value": str(msg.get("content") or "")})
        elif role == "assistant":
            calls = [_call_object(c) for c in msg.get("tool_calls") or ()]
            reasoning = msg.get("reasoning_content")
            content = str(msg.get("content") or "")
            if calls:
                body = _dumps(calls[0] if len(calls) == 1 else calls)
                turns.append({"from": "function_call", "value": _think(reasoning, content) + body})
            else:
                turns.append({"from": "gpt", "value": _think(reasoning, "") + content})
    flush_results()
    # a tail of tool results or user text has no model turn after it: nothing to learn, and
    # LLaMA-Factory drops an example that does not end on a model turn
    while turns and turns[-1]["from"] in ("observation", "human"):
        turns.pop()
    return {"conversations": turns, "system": system or "", "tools": _dumps(list(tools))}


_ODD, _EVEN = ("human", "observation"), ("gpt", "function_call")


def llamafactory_problem(row: Mapping[str, Any]) -> str | None:
    """Why LLaMA-Factory would drop or misread this row (None: it reads it as written).

    Mirrors ``SharegptDatasetConverter`` (roles alternate human|observation, gpt|function_call,
    an even count, at least one exchange) and ``FunctionFormatter`` (a call turn is a
    ``<think>`` block and the call JSON; a ``<tool_call>`` tag anywhere in it is taken for the
    call, a ``</think>`` inside the block ends the thought early)."""
    turns = row["conversations"]
    if not turns:
        return "no model turn"
    for k, turn in enumerate(turns):
        if turn["from"] not in (_ODD, _EVEN)[k % 2]:
            before = turns[k - 1]["from"] if k else "the start"
            return f"roles do not alternate ({turn['from']} after {before})"
    if len(turns) % 2:
        return "does not end on a model turn"
    for turn in turns:
        if turn["from"] != "function_call":
            continue
        value = turn["value"]
        thought, _, body = (
            value.rpartition("\n</think>\n\n") if value.startswith("<think>\n") else ("", "", value)
        )
        if "<tool_call>" in value or "</think>" in thought:
            return "call turn text holds <tool_call> or </think>"
        try:
            json.loads(body)
        except json.JSONDecodeError:
            return "call turn is not JSON after its thought"
    return None


def to_axolotl(
    messages: Sequence[Message], tools: Sequence[Mapping[str, Any]], system: str | None = None
) -> dict[str, Any]:
    """One Axolotl ``chat_template`` row: ``messages`` with string arguments, ``tools`` as JSON."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for msg in messages:
        row = dict(msg)
        if row.get("tool_calls"):
            row["tool_calls"] = [
                {
                    **call,
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": _as_string(call["function"].get("arguments", {})),
                    },
                }
                for call in row["tool_calls"]
            ]
        out.append(row)
    return {"messages": out, "tools": _dumps(list(tools))}


def _as_string(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else _dumps(arguments)
