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

from trajforge.llm.openai_config import OpenAIModelConfig, ReasoningStyle
from trajforge.llm.types import AssistantTurn, SamplingParams, ToolCall, Usage
from trajforge.messages import extract_reasoning

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


def _sampling_body(config: OpenAIModelConfig, s: SamplingParams) -> dict[str, Any]:
    """The sampling fields that are set, under the names ``config``'s endpoint wants."""
    optional = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        config.max_tokens_field: s.max_tokens,
        "stop": s.stop,
        "seed": s.seed,
    }
    body = {k: v for k, v in optional.items() if v is not None}
    body.update(_reasoning_body(config.resolved_reasoning_style(), s.reasoning_effort, s.reasoning_disabled))
    return body


def build_request_body(
    config: OpenAIModelConfig,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    sampling: SamplingParams | None,
) -> dict[str, Any]:
    """The JSON body of one chat-completions request, exactly as it goes on the wire.

    Built as a plain dict (and handed to the SDK whole) so what is sent is what this returns:
    provider-specific keys (``reasoning``, ``provider``, ``chat_template_kwargs``) need no
    special casing, and ``sampling.extra_body`` is merged last, one level deep.
    """
    s = sampling or SamplingParams()
    body: dict[str, Any] = {"model": config.model, "messages": messages}
    if tools:
        body["tools"] = tools
    body.update(_sampling_body(config, s))
    if config.stream:
        body["stream"] = True
        if config.stream_include_usage:
            body["stream_options"] = {"include_usage": True}
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


def _count(raw: Mapping[str, Any], details_key: str, key: str) -> int:
    """``raw[details_key][key]``, or 0 when either is missing or not what it should be."""
    details = raw.get(details_key) or {}
    return (details.get(key) or 0) if isinstance(details, Mapping) else 0


def usage_from(raw: Any) -> Usage:
    """Usage from a decoded JSON ``usage`` object or the SDK's ``CompletionUsage`` (or None)."""
    if hasattr(raw, "model_dump"):
        raw = raw.model_dump()
    if not isinstance(raw, Mapping):
        return Usage()
    return Usage(
        prompt_tokens=raw.get("prompt_tokens") or 0,
        completion_tokens=raw.get("completion_tokens") or 0,
        total_tokens=raw.get("total_tokens") or 0,
        reasoning_tokens=_count(raw, "completion_tokens_details", "reasoning_tokens"),
        cached_tokens=_count(raw, "prompt_tokens_details", "cached_tokens"),
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
