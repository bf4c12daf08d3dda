"""The chat-completions wire format: the request body we send, the JSON body we get back.

Pure functions, no I/O, so the format can be read and tested apart from
:mod:`trajforge.llm.openai_client`'s HTTP, retries and errors (as
:mod:`trajforge.llm.completion_wire` is for the token-exact endpoints). Streamed answers are
folded by :mod:`trajforge.llm.chat_stream`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from trajforge.llm.dialects import Dialect, ReasoningStyle
from trajforge.llm.openai_config import OpenAIModelConfig
from trajforge.llm.types import AssistantTurn, SamplingParams, ToolCall, Usage
from trajforge.messages import THINK_CLOSE, THINK_OPEN, extract_reasoning

# --------------------------------------------------------------------------------------------
# Request


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _reasoning_body(style: ReasoningStyle, effort: str | None, disabled: bool) -> dict[str, Any]:
    if style == "none" or (effort is None and not disabled):
        return {}
    if style == "openrouter":
        return {"reasoning": {"enabled": False} if disabled else {"effort": effort}}
    if style == "chat_template":
        return {
            "chat_template_kwargs": {"enable_thinking": False} if disabled else {"reasoning_effort": effort}
        }
    return {"reasoning_effort": "none" if disabled else effort}


def _sampling_body(config: OpenAIModelConfig, s: SamplingParams, dialect: Dialect | None) -> dict[str, Any]:
    """The sampling fields that are set, under the names ``config``'s endpoint wants."""
    optional = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        config.max_tokens_field: s.max_tokens,
        "stop": s.stop,
        "seed": s.seed,
    }
    body = {k: v for k, v in optional.items() if v is not None}
    style = config.resolved_reasoning_style(dialect)
    body.update(_reasoning_body(style, s.reasoning_effort, s.reasoning_disabled))
    return body


def outgoing_messages(messages: list[dict[str, Any]], dialect: Dialect | None) -> list[dict[str, Any]]:
    """``messages`` as ``dialect``'s server reads them: each past turn's reasoning under the field
    it reads (or inline as ``<think>`` where it drops unknown fields), and ``content: ""`` where it
    wants a string. Saved messages keep ``reasoning`` (``AssistantTurn.to_message``); only the
    request is respelled. The list (and each message) is copied only where something changes."""
    if dialect is None:
        return messages
    target = dialect.reasoning_field
    out: list[dict[str, Any]] | None = None
    for i, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        fixed = _respelled(msg, target, dialect.null_content)
        if fixed is not msg:
            if out is None:
                out = list(messages)
            out[i] = fixed
    return out if out is not None else messages


_REASONING_FIELDS = ("reasoning", "reasoning_content")


def _respelled(msg: dict[str, Any], target: str, null_content: bool) -> dict[str, Any]:
    """One assistant message in the dialect's spelling (``msg`` itself when nothing changes)."""
    misplaced = [f for f in _REASONING_FIELDS if f != target and f in msg]
    if not misplaced and (null_content or msg.get("content") is not None):
        return msg
    fixed = dict(msg)
    reasoning = None
    for name in misplaced:
        value = fixed.pop(name)
        reasoning = reasoning or (value if isinstance(value, str) and value.strip() else None)
    text = fixed.get("content")
    if reasoning is not None and target == "content" and (text is None or isinstance(text, str)):
        # what a Hermes/Qwen template writes for a turn with reasoning: <think>\nR\n</think>\n, the text
        fixed["content"] = f"{THINK_OPEN}\n{reasoning.strip()}\n{THINK_CLOSE}\n{(text or '').strip()}"
    elif reasoning is not None and not fixed.get(target):
        fixed[target] = reasoning
    if not null_content and fixed.get("content") is None:
        fixed["content"] = ""
    return fixed


def build_request_body(
    config: OpenAIModelConfig,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    sampling: SamplingParams | None,
    dialect: Dialect | None = None,
) -> dict[str, Any]:
    """The JSON body of one chat-completions request, exactly as it goes on the wire.

    Built as a plain dict (and handed to the SDK whole) so what is sent is what this returns:
    provider-specific keys (``reasoning``, ``provider``, ``chat_template_kwargs``) need no
    special casing, and ``sampling.extra_body`` is merged last, one level deep. ``dialect``
    (the endpoint's, :mod:`trajforge.llm.dialects`) respells past reasoning, picks the reasoning
    style when the config leaves it to ``auto``, and leaves out what the server rejects.
    """
    s = sampling or SamplingParams()
    body: dict[str, Any] = {"model": config.model, "messages": outgoing_messages(messages, dialect)}
    if tools:
        body["tools"] = tools
    body.update(_sampling_body(config, s, dialect))
    if config.stream:
        body["stream"] = True
        if config.stream_include_usage and (dialect is None or dialect.stream_usage):
            body["stream_options"] = {"include_usage": True}
    if dialect is not None:
        for name, value in dialect.sampling_defaults.items():
            body.setdefault(name, value)
        for name in dialect.unsupported_sampling:
            body.pop(name, None)
    return _deep_merge(body, s.extra_body) if s.extra_body else body


# --------------------------------------------------------------------------------------------
# Response


class MalformedResponseError(Exception):
    """The endpoint answered 200 with something that is not a usable completion."""


def new_call_id() -> str:
    """An id for a tool call the endpoint sent without one."""
    return f"call_{uuid.uuid4().hex[:24]}"


def decode_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MalformedResponseError(f"response body is not JSON ({exc}): {raw[:200]!r}") from None


def _count(value: Any) -> int | None:
    """A token count as the endpoint gave it; None (unknown) when absent or not a count."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _detail(raw: Mapping[str, Any], details_key: str, key: str) -> int | None:
    """``raw[details_key][key]``, or None (unknown) when either is missing or not what it should be."""
    details = raw.get(details_key)
    return _count(details.get(key)) if isinstance(details, Mapping) else None


def usage_from(raw: Any) -> Usage:
    """Usage from a decoded JSON ``usage`` object or the SDK's ``CompletionUsage``; what the
    endpoint did not report stays None (unknown), never 0 (a missing ``usage`` is all unknown)."""
    if hasattr(raw, "model_dump"):
        raw = raw.model_dump()
    if not isinstance(raw, Mapping):
        return Usage()
    prompt, completion = _count(raw.get("prompt_tokens")), _count(raw.get("completion_tokens"))
    total = _count(raw.get("total_tokens"))
    if total is None and prompt is not None and completion is not None:
        total = prompt + completion
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=total,
        reasoning_tokens=_detail(raw, "completion_tokens_details", "reasoning_tokens"),
        cached_tokens=_detail(raw, "prompt_tokens_details", "cached_tokens"),
    )


def _first_choice(payload: Any) -> Mapping[str, Any]:
    """``choices[0]`` of a chat-completion body, which must hold a ``message`` object."""
    if not isinstance(payload, Mapping):
        raise MalformedResponseError(f"response is a JSON {type(payload).__name__}, not an object")
    if isinstance(payload.get("error"), Mapping):  # some proxies answer 200 with an error body
        raise MalformedResponseError(f"endpoint answered with an error: {payload['error'].get('message')}")
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise MalformedResponseError("response has no choices")
    if not isinstance(choices[0].get("message"), Mapping):
        raise MalformedResponseError("response choice has no message")
    choice: Mapping[str, Any] = choices[0]
    return choice


def _tool_call(tc: Any) -> ToolCall:
    fn = tc.get("function") if isinstance(tc, Mapping) else None
    if not isinstance(fn, Mapping) or not fn.get("name"):
        raise MalformedResponseError("tool call without a function name")
    args = fn.get("arguments")
    if not isinstance(args, str):  # a few servers send an object; keep the wire form
        args = orjson.dumps(args).decode() if args is not None else "{}"
    return ToolCall(id=tc.get("id") or new_call_id(), name=fn["name"], arguments=args or "{}")


def turn_from_payload(payload: Any, default_model: str) -> AssistantTurn:
    """An :class:`AssistantTurn` from a decoded (non-streamed) chat-completion JSON body."""
    choice = _first_choice(payload)
    message = choice["message"]
    raw_content = message.get("content")
    content, reasoning = extract_reasoning(
        message, raw_content if isinstance(raw_content, str) and raw_content else None
    )
    return AssistantTurn(
        content=content,
        reasoning=reasoning,
        tool_calls=[_tool_call(tc) for tc in message.get("tool_calls") or ()],
        finish_reason=choice.get("finish_reason"),
        usage=usage_from(payload.get("usage")),
        model=payload.get("model") or default_model,
    )
