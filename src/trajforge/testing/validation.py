"""What a strict real endpoint rejects in a chat-completions request.

The scripted server checks every request with :func:`validate_request` (unless built with
``strict=False``), so an agent-loop bug -- a tool message answering no call, arguments sent as
a dict -- fails in tests instead of only against a real provider.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

_DATA_URL = re.compile(r"^data:image/(png|jpeg|gif|webp);base64,")
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def validate_request(body: Any) -> str | None:
    """What a strict real endpoint would reject in a chat request, or None when it is fine."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "'model' is required"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    if problem := _messages_problem(messages):
        return problem
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        return "'tools' must be an array"
    return None


def _messages_problem(messages: list[Any]) -> str | None:
    """The first bad message: no valid role, a malformed tool call, or a tool answer to no call."""
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            return f"messages[{i}] must be an object with a valid 'role'"
        for tc in m.get("tool_calls") or ():
            if not _well_formed_call(tc):
                return f"messages[{i}].tool_calls: each call needs an 'id' and string 'function.arguments'"
            open_calls.add(tc["id"])
        if m["role"] == "tool" and m.get("tool_call_id") not in open_calls:
            return f"messages[{i}]: tool message answers unknown tool_call_id {m.get('tool_call_id')!r}"
        if isinstance(m.get("content"), list) and (problem := _parts_problem(m["content"], m["role"])):
            return f"messages[{i}].content: {problem}"
    return None


def _parts_problem(parts: list[Any], role: str) -> str | None:
    """What the real API rejects in an array of content parts: unknown types, a text part without
    text, an image part anywhere but a user message, or an image URL that is neither http(s) nor a
    base64 ``data:image/...`` URL with a valid payload."""
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                return f"part {j}: a text part needs a string 'text'"
        elif kind == "image_url":
            if role != "user":
                return f"part {j}: image parts are only allowed in messages with role 'user'"
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else None
            if not isinstance(url, str):
                return f"part {j}: an image_url part needs 'image_url': {{'url': ...}}"
            if problem := _image_url_problem(url):
                return f"part {j}: {problem}"
        else:
            return f"part {j}: unknown content part type {kind!r}"
    return None


def _image_url_problem(url: str) -> str | None:
    if url.startswith(("http://", "https://")):
        return None
    if not _DATA_URL.match(url):
        return "image_url.url must be an http(s) URL or a data:image/(png|jpeg|gif|webp);base64, URL"
    try:
        base64.b64decode(url.partition(",")[2], validate=True)
    except (binascii.Error, ValueError):
        return "the image data URL holds invalid base64"
    return None


def _well_formed_call(tc: Any) -> bool:
    fn = tc.get("function") if isinstance(tc, dict) else None
    return isinstance(fn, dict) and isinstance(fn.get("arguments"), str) and bool(tc.get("id"))
