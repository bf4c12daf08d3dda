"""Small helpers for reading tool arguments with errors the model can act on."""

from __future__ import annotations

from typing import Any


class ArgumentError(ValueError):
    """A missing or mistyped argument; its message goes back to the model verbatim."""


def req_str(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise ArgumentError(f"argument {name!r} is required and must be a string")
    return value


def opt_str(args: dict[str, Any], name: str, default: str | None = None) -> str | None:
    value = args.get(name, default)
    if value is not None and not isinstance(value, str):
        raise ArgumentError(f"argument {name!r} must be a string")
    return value


def opt_num(args: dict[str, Any], name: str, default: float | None = None) -> float | None:
    value = args.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ArgumentError(f"argument {name!r} must be a number") from None
    return float(value)


def opt_bool(args: dict[str, Any], name: str, default: bool = False) -> bool:
    value = args.get(name, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in {"true", "false"}:
        return value.lower() == "true"
    raise ArgumentError(f"argument {name!r} must be a boolean")
