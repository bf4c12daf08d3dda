"""Command options derived from a typed config: one ``--flag`` per pydantic field.

A command built this way (``batch`` from ``BatchConfig``, ``serve`` from ``ServeConfig``) gets each
field's description as help and its default, so a new setting is one line in the config and the
flag cannot drift from it. The flag is the field's name with dashes, unless the field names another
in ``json_schema_extra={"flag": "--x"}`` (the vocabulary of docs/cli.md: ``--network``,
``--group-size``, ``--tool-call-parser``); ``"negatable": True`` makes a switch ``--x/--no-x``.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Union

import orjson
import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from trajforge.cli.errors import fail

KEYWORD = inspect.Parameter.KEYWORD_ONLY


def _extra(field: FieldInfo) -> dict[str, Any]:
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def flag_of(name: str, field: FieldInfo) -> str:
    """The ``--flag`` of a config field."""
    return str(_extra(field).get("flag") or "--" + name.replace("_", "-"))


def value_type(field: FieldInfo) -> type:
    """The field's type without ``None``: what a flag's text becomes (list, dict and Literal: str)."""
    annotation = field.annotation
    if typing.get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    origin = typing.get_origin(annotation)
    if origin is not None:
        return origin if origin in (list, dict) else str
    return annotation if isinstance(annotation, type) else str


def _default(field: FieldInfo, kind: type) -> Any:
    """The default ``--help`` shows (a list or JSON object flag shows none: it has no text form)."""
    if field.is_required() or kind in (list, dict):
        return None
    return field.get_default(call_default_factory=True)


def option(name: str, field: FieldInfo, *, required: bool = False) -> inspect.Parameter:
    """The ``--flag`` of one config field: a switch for a bool (``--x/--no-x`` when on by default
    or negatable), text for a list (comma-separated) or a JSON object, else the field's own type."""
    kind = value_type(field)
    flag = flag_of(name, field)
    negatable = field.default is True or bool(_extra(field).get("negatable"))
    decls = (f"{flag}/--no-{flag[2:]}" if negatable else flag,) if kind is bool else (flag,)
    text = (field.description or "") + (", comma-separated" if kind is list else "")
    cli_type: Any = kind if kind in (bool, int, float, Path) else str  # a type chosen at runtime
    annotation: Any
    if required:
        annotation = Annotated[cli_type, typer.Option(*decls, help=text)]
        return inspect.Parameter(name, KEYWORD, annotation=annotation)
    annotation = Annotated[cli_type | None, typer.Option(*decls, help=text)]
    return inspect.Parameter(name, KEYWORD, default=_default(field, kind), annotation=annotation)


def options(
    config: type[BaseModel], skip: Iterable[str] = (), required: Iterable[str] = ()
) -> list[inspect.Parameter]:
    """One option per field of ``config`` but ``skip``; ``required`` ones have no default."""
    left_out, needed = frozenset(skip), frozenset(required)
    return [
        option(name, field, required=name in needed)
        for name, field in config.model_fields.items()
        if name not in left_out
    ]


def given_by_user(ctx: typer.Context, name: str) -> bool:
    """Whether the user gave ``name`` (not its default). By the source's name: typer carries its
    own copy of click, whose ParameterSource is not ``click``'s."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def from_text(config: type[BaseModel], name: str, value: Any) -> Any:
    """A flag's value as the config takes it: lists split at commas, JSON objects parsed."""
    field = config.model_fields.get(name)
    if field is None or value is None:
        return value
    kind = value_type(field)
    if kind is list and isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if kind is dict and isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise fail(f"{flag_of(name, field)} is not valid JSON: {exc}") from None
    return value
