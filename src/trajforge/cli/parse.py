"""``trajforge parse --parser NAME [--tools FILE] < text``: show how a parser reads a model output.

For debugging a model's tool calls: prints the :class:`~trajforge.llm.parsers.ParseResult`
(content, calls, errors, and the family ``auto`` picked) as JSON. Parse errors are part of the
output, not a failure of the command; bad options or an unreadable tools file exit with code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import typer

from trajforge.cli import complete
from trajforge.cli.errors import fail
from trajforge.cli.vocab import renamed
from trajforge.llm.parsers import get_parser, list_parsers


def _load_tools(path: Path) -> list[dict[str, Any]]:
    """An OpenAI-style tools list from a JSON file (a list, or an object with ``tools``)."""
    try:
        data = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise fail(f"cannot read tools file {path}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise fail(f"tools file {path} is not valid JSON: {exc}") from None
    if isinstance(data, dict) and "tools" in data:
        data = data["tools"]
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise fail(
            f"tools file {path} must hold a JSON list of tools "
            '([{"type": "function", "function": {"name": ..., "parameters": ...}}])'
        )
    return data


def parse(
    parser: str = typer.Option(
        "auto",
        "--tool-call-parser",
        "-p",
        help=f"Tool-call format: {', '.join(list_parsers())}.",
        autocompletion=complete.parser_names,
    ),
    tools: Path | None = typer.Option(
        None, "--tools", help="JSON file with the OpenAI-style tools list (types string-carried values)."
    ),
) -> None:
    """Parse a model output read from stdin and print content, calls and errors as JSON."""
    try:
        tool_parser = get_parser(parser)
    except ValueError as exc:
        raise fail(str(exc)) from None
    tool_list = _load_tools(tools) if tools is not None else None
    if sys.stdin.isatty():
        raise fail(
            "pipe the model output on stdin, e.g. trajforge parse --tool-call-parser hermes < output.txt"
        )
    result = tool_parser.parse(sys.stdin.read(), tool_list)
    data = result.to_dict()
    if data["parser"] is None:  # auto found no family's markup: say so, never "parser": null
        data["parser"] = parser
        data["note"] = "no tool-call markup of any family found: the whole text is content"
    typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


def register(app: typer.Typer) -> None:
    """Add the ``parse`` command to the ``trajforge`` app."""
    app.command("parse", cls=renamed({"--parser": "--tool-call-parser"}))(parse)
