"""The env host's wire: one JSON object per line, both ways, and nothing but JSON.

Shared by the host (:mod:`.host`) and the env host inside the sandbox (:mod:`.child`), so it is
stdlib only. What crosses is data: never a pickle, never code. Every line is bounded
(:data:`MAX_LINE`), ``NaN``/``Infinity`` are refused in both directions (a reward of ``inf`` is
not a reward), and bytes travel as ``{"b64": ...}``.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from typing import Any

MAX_LINE = 64 * 1024 * 1024
"""The longest line either side accepts (a verifier's 50 MB of test output still fits, base64)."""

MAX_ERROR = 4000
"""Error texts are cut to this many characters."""


class WireError(ValueError):
    """A line that is not one bounded JSON object of finite numbers."""


def _no_constants(name: str) -> Any:
    raise WireError(f"{name} is not a number the env host accepts")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # "1e999" parses to infinity without any constant
        raise WireError(f"{text[:40]} is not a finite number")
    return value


def encode(message: Mapping[str, Any]) -> bytes:
    """One line; ``WireError`` when the message holds NaN/infinity, non-JSON values or is too long."""
    try:
        # ASCII with \u escapes: a lone surrogate in a model's text crosses intact, never as bad UTF-8
        text = json.dumps(message, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise WireError(f"not sendable as JSON: {exc}") from None
    line = text.encode("ascii") + b"\n"
    if len(line) > MAX_LINE:
        raise WireError(f"a message of {len(line)} bytes is over the env host's limit of {MAX_LINE}")
    return line


def decode(line: bytes) -> dict[str, Any]:
    """The object on ``line``; ``WireError`` for anything else (non-JSON, NaN, deep nesting, not an object)."""
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        raise WireError(f"a line over {MAX_LINE} bytes (or cut short)")
    try:
        value = json.loads(line, parse_constant=_no_constants, parse_float=_finite)
    except (ValueError, RecursionError) as exc:
        raise WireError(f"not a JSON line: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise WireError(f"a {type(value).__name__} where a JSON object was expected")
    return value


def blob(data: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(bytes(data)).decode("ascii")}


def unblob(value: Any) -> bytes:
    if not isinstance(value, dict) or set(value) != {"b64"} or not isinstance(value["b64"], str):
        raise WireError("expected bytes as {'b64': '...'}")
    try:
        return base64.b64decode(value["b64"], validate=True)
    except ValueError as exc:
        raise WireError(f"bad base64: {exc}") from None


def files_out(files: Mapping[str, bytes | str]) -> dict[str, Any]:
    """Setup/verifier files as JSON: text stays text, bytes travel as base64."""
    out: dict[str, Any] = {}
    for path, content in files.items():
        if not isinstance(path, str):
            raise WireError(f"file names must be strings, not {type(path).__name__}")
        if isinstance(content, str):
            out[path] = {"text": content}
        elif isinstance(content, bytes | bytearray | memoryview):
            out[path] = blob(bytes(content))
        else:
            raise WireError(f"file {path!r}: content must be str or bytes, not {type(content).__name__}")
    return out


def files_in(value: Any) -> dict[str, bytes | str]:
    if not isinstance(value, dict):
        raise WireError("expected a mapping of file name -> content")
    out: dict[str, bytes | str] = {}
    for path, content in value.items():
        if isinstance(content, dict) and set(content) == {"text"} and isinstance(content["text"], str):
            out[path] = content["text"]
        else:
            out[path] = unblob(content)
    return out


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:MAX_ERROR]
