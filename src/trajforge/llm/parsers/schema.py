"""Schema-aware typing of argument values for formats that carry every value as a string.

Qwen3-Coder (``<parameter=k>v</parameter>``) and GLM (``<arg_value>v</arg_value>``) write ``5``
the same whether the tool wants the integer 5 or the string "5". The tool's JSON schema decides.

Rules, in order:

- the parameter's schema types are read from ``type`` (a string or a list) or ``anyOf``/``oneOf``;
- a parameter whose only type is ``string`` keeps the raw text, even when it looks like JSON;
- a schema without ``type`` but with ``properties`` is an object, with ``items`` an array;
- otherwise each non-string type is tried (null, boolean, integer, number, object, array) and the
  first that converts wins; when none does, the raw string is kept and the tool's own argument
  validation reports the mismatch (we never guess a different value);
- without a schema for the parameter (no tools, unknown tool or parameter, no type), values stay
  strings, except text that is an obvious JSON object or array (starts with ``{``/``[`` and
  decodes), which is decoded.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Sequence
from typing import Any

import orjson

_INT = re.compile(r"[-+]?\d+")
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_TRY_ORDER = ("null", "boolean", "integer", "number", "object", "array")
_MISSING = object()


class ToolSchemas:
    """The parameter types of an OpenAI-style tools list, looked up by tool and parameter name."""

    def __init__(self, tools: Sequence[dict[str, Any]] | None) -> None:
        self._props: dict[str, dict[str, Any]] = {}
        self._required: dict[str, frozenset[str]] = {}
        for tool in tools or ():
            fn = tool.get("function", tool) if isinstance(tool, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                continue
            params = fn.get("parameters") or {}
            props = params.get("properties") if isinstance(params, dict) else None
            required = params.get("required") if isinstance(params, dict) else None
            self._props[fn["name"]] = props if isinstance(props, dict) else {}
            self._required[fn["name"]] = frozenset(
                r for r in (required if isinstance(required, list) else ()) if isinstance(r, str)
            )

    def __bool__(self) -> bool:
        """Whether any tool is known."""
        return bool(self._props)

    def params_of(self, tool: str) -> frozenset[str] | None:
        """The parameter names of ``tool`` (``None`` when the tool is not known)."""
        props = self._props.get(tool)
        return None if props is None else frozenset(props)

    def missing_required(self, tool: str, given: Any) -> list[str]:
        """The parameters ``tool``'s schema requires that ``given`` lacks (sorted)."""
        return sorted(self._required.get(tool, frozenset()) - set(given))

    def types_of(self, tool: str, param: str) -> tuple[str, ...]:
        """The JSON types the schema allows for ``param`` of ``tool`` (empty when unknown)."""
        schema = self._props.get(tool, {}).get(param)
        return _schema_types(schema) if isinstance(schema, dict) else ()

    def convert(self, tool: str, param: str, raw: str) -> Any:
        """The typed value of one string-carried argument (see the module rules)."""
        types = self.types_of(tool, param)
        if not types:
            return _obvious_json(raw)
        if types == ("string",):
            return raw
        for kind in _TRY_ORDER:
            if kind in types:
                value = _CONVERTERS[kind](raw.strip())
                if value is not _MISSING:
                    return value
        return raw


def _schema_types(schema: dict[str, Any]) -> tuple[str, ...]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return (kind,)
    if isinstance(kind, list):
        return tuple(k for k in kind if isinstance(k, str))
    if isinstance(schema.get("properties"), dict):
        return ("object",)
    if isinstance(schema.get("items"), dict | list):
        return ("array",)
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            if isinstance(sub, dict):
                out.extend(_schema_types(sub))
    return tuple(out)


def _obvious_json(raw: str) -> Any:
    text = raw.strip()
    if text[:1] in ("{", "["):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            return raw
    return raw


def _to_null(text: str) -> Any:
    return None if text.lower() in ("null", "none") else _MISSING


def _to_bool(text: str) -> Any:
    low = text.lower()
    return True if low == "true" else False if low == "false" else _MISSING


def _to_int(text: str) -> Any:
    if _INT.fullmatch(text):
        return int(text)
    if _NUMBER.fullmatch(text):
        value = float(text)
        if value.is_integer():
            return int(value)
    return _MISSING


def _to_number(text: str) -> Any:
    if _INT.fullmatch(text):
        return int(text)
    if _NUMBER.fullmatch(text):
        value = float(text)
        return value if math.isfinite(value) else _MISSING
    return _MISSING


def _container(kind: type) -> Any:
    def convert(text: str) -> Any:
        for decode in (orjson.loads, ast.literal_eval):
            try:
                value = decode(text)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(value, kind) and _json_safe(value):
                return value
        return _MISSING

    return convert


def _json_safe(value: Any) -> bool:
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


_CONVERTERS = {
    "null": _to_null,
    "boolean": _to_bool,
    "integer": _to_int,
    "number": _to_number,
    "object": _container(dict),
    "array": _container(list),
}
