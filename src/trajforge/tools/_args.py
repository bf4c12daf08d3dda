"""Small helpers for reading tool arguments with errors the model can act on.

Durations and sizes a model sets are *bounded*: a value that is not a finite number in range is
an :class:`ArgumentError` that states the allowed range (the tool then does not run), and a
value above the maximum is clamped to it, with a note for the tool's result
(see :mod:`trajforge.tools.limits`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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
    """A number (a numeric string is accepted); NaN and infinities are returned as such."""
    value = args.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ArgumentError(f"argument {name!r} must be a number")
    try:
        return float(value)
    except (ValueError, OverflowError):
        raise ArgumentError(f"argument {name!r} must be a number") from None


def opt_bool(args: dict[str, Any], name: str, default: bool = False) -> bool:
    value = args.get(name, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in {"true", "false"}:
        return value.lower() == "true"
    raise ArgumentError(f"argument {name!r} must be a boolean")


@dataclass(frozen=True, slots=True)
class Bounded:
    """A model-set number after bounds checks; ``clamped`` says what was changed, for the model."""

    value: float
    clamped: str | None = None


def _fmt(x: float) -> str:
    return f"{x:g}"


def bounded_seconds(args: dict[str, Any], name: str, *, maximum: float) -> Bounded | None:
    """A duration in seconds, ``None`` when absent: finite and > 0, or an error stating the range;
    above ``maximum`` it is clamped."""
    value = opt_num(args, name)
    if value is None:
        return None
    if not math.isfinite(value) or value <= 0:
        raise ArgumentError(
            f"argument {name!r} must be a number of seconds greater than 0 and at most "
            f"{_fmt(maximum)}; got {args.get(name)!r}. The command was not run"
        )
    if value > maximum:
        return Bounded(
            maximum,
            f"{name} {_fmt(value)}s is more than the {_fmt(maximum)}s allowed; "
            f"it was set to {_fmt(maximum)}s",
        )
    return Bounded(value)


def bounded_int(
    args: dict[str, Any], name: str, *, default: int | None, maximum: int | None, minimum: int = 1
) -> Bounded | None:
    """A whole number, ``default`` when absent: from ``minimum`` up, or an error stating the range;
    above ``maximum`` (if any) it is clamped. ``value`` is then an ``int``."""
    value = opt_num(args, name)
    if value is None:
        return None if default is None else Bounded(default)
    if not math.isfinite(value) or value != int(value) or value < minimum:
        allowed = f"from {minimum} to {maximum}" if maximum is not None else f"of at least {minimum}"
        raise ArgumentError(
            f"argument {name!r} must be a whole number {allowed}; got {args.get(name)!r}. "
            "The tool was not run"
        )
    if maximum is not None and value > maximum:
        return Bounded(
            maximum, f"{name} {_fmt(value)} is more than the {maximum} allowed; it was set to {maximum}"
        )
    return Bounded(int(value))
