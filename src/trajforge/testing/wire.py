"""How a :class:`~trajforge.testing.replies.Reply` looks on the chat-completions wire.

A ``chat.completion`` JSON body, or the ``chat.completion.chunk`` events of an SSE stream
(content, reasoning and tool-call arguments cut into ``chunk_chars`` pieces, as real servers
fragment them), OpenAI-shaped error bodies, and the broken bodies of a malformed reply. Pure
functions and bytes: no sockets (the server is :mod:`trajforge.testing.scripted_server`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from trajforge.testing.replies import Reply

SSE_DONE = b"data: [DONE]\n\n"
MALFORMED_JSON = b'{"id": "chatcmpl-x", "choices": [{"index": 0, "mess'
"""A malformed reply's body: JSON cut off mid-key."""
CUT_EVENT = b'data: {"choices": [{"delta": {"cont'
"""What follows the first event of a malformed stream: an unterminated, invalid JSON event."""

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_exceeded",
}


def error_body(message: str, status: int, code: str | None = None) -> bytes:
    """An OpenAI-shaped error body: ``{"error": {"message", "type", "code", "param"}}``."""
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"error": {"message": message, "type": kind, "code": code, "param": None}})


def sse_event(chunk: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def usage(body: Mapping[str, Any], reply: Reply) -> dict[str, Any]:
    """The reply's own ``usage``, or one estimated at four characters a token."""
    if reply.usage is not None:
        return reply.usage
    prompt = _estimate_tokens(orjson.dumps(body.get("messages", [])).decode())
    reasoning = _estimate_tokens(reply.reasoning) if reply.reasoning else 0
    answer = _estimate_tokens(reply.content or "") + sum(
        _estimate_tokens(tc.name + tc.arguments_json()) for tc in reply.tool_calls
    )
    return {
        "prompt_tokens": prompt,
        "completion_tokens": reasoning + answer,
        "total_tokens": prompt + reasoning + answer,
        "completion_tokens_details": {"reasoning_tokens": reasoning},
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def _reasoning_fields(reply: Reply, text: str) -> dict[str, Any]:
    if reply.reasoning_field == "reasoning_details":
        return {
            "reasoning_details": [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]
        }
    if reply.reasoning_field == "think":
        return {}
    return {reply.reasoning_field: text}


def _separate_reasoning(reply: Reply) -> str | None:
    """The reasoning that travels in its own field (not inline ``think``), if any."""
    return reply.reasoning if reply.reasoning and reply.reasoning_field != "think" else None


def _content_with_think(reply: Reply) -> str | None:
    if reply.reasoning_field == "think" and reply.reasoning:
        return f"<think>{reply.reasoning}</think>\n{reply.content or ''}"
    return reply.content


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class WireEncoder:
    """Renders replies as one server's ``chat.completion`` bodies or SSE chunks.

    One per server: it numbers the completion and tool-call ids it makes up.
    """

    def __init__(self, model: str, chunk_chars: int) -> None:
        self.model = model
        self.chunk_chars = chunk_chars
        self._ids = itertools.count(1)

    def completion(self, body: Mapping[str, Any], reply: Reply) -> bytes:
        choice = {
            "index": 0,
            "message": self._message(reply),
            "finish_reason": reply.resolved_finish_reason(),
        }
        return orjson.dumps(
            {
                "id": f"chatcmpl-{next(self._ids)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model,
                "choices": [choice],
                "usage": usage(body, reply),
            }
        )

    def chunks(self, body: Mapping[str, Any], reply: Reply) -> Iterator[dict[str, Any]]:
        """The chunk dicts of a streamed reply, in order (without the ``[DONE]`` sentinel)."""
        yield self._chunk({"role": "assistant", "content": ""})
        if reasoning := _separate_reasoning(reply):
            for piece in _pieces(reasoning, self.chunk_chars):
                yield self._chunk(_reasoning_fields(reply, piece))
        if content := _content_with_think(reply):
            for piece in _pieces(content, self.chunk_chars):
                yield self._chunk({"content": piece})
        yield from self._tool_call_chunks(reply)
        yield self._chunk({}, finish_reason=reply.resolved_finish_reason())
        options = body.get("stream_options") or {}
        if isinstance(options, dict) and options.get("include_usage"):
            yield {**self._envelope(), "choices": [], "usage": usage(body, reply)}

    def _tool_call_ids(self, reply: Reply) -> list[str]:
        return [tc.id or f"call_{next(self._ids)}" for tc in reply.tool_calls]

    def _message(self, reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": _content_with_think(reply)}
        if reasoning := _separate_reasoning(reply):
            message.update(_reasoning_fields(reply, reasoning))
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": tc.name, "arguments": tc.arguments_json()},
                }
                for cid, tc in zip(self._tool_call_ids(reply), reply.tool_calls, strict=True)
            ]
        return message

    def _tool_call_chunks(self, reply: Reply) -> Iterator[dict[str, Any]]:
        """Per call: a head with id and name, then the arguments in pieces."""
        for index, (cid, tc) in enumerate(zip(self._tool_call_ids(reply), reply.tool_calls, strict=True)):
            head = {
                "index": index,
                "id": cid,
                "type": "function",
                "function": {"name": tc.name, "arguments": ""},
            }
            yield self._chunk({"tool_calls": [head]})
            for piece in _pieces(tc.arguments_json(), self.chunk_chars):
                yield self._chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})

    def _envelope(self) -> dict[str, Any]:
        return {"id": "chatcmpl-stream", "object": "chat.completion.chunk", "created": 0, "model": self.model}

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**self._envelope(), "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
