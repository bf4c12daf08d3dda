"""``trajforge distributions [NAME]``: list the toolset distributions, or show one."""

from __future__ import annotations

import sys

import orjson
import typer
from rich.console import Console
from rich.table import Table

from trajforge.cli.errors import fail
from trajforge.distributions import (
    Distribution,
    UnknownDistributionError,
    get_distribution,
    list_distributions,
)


def _table(dists: list[Distribution], title: str) -> Table:
    table = Table(title=title, show_lines=False)
    table.add_column("name", style="bold cyan", no_wrap=True)
    table.add_column("description")
    table.add_column("toolsets (chance per sample)")
    for dist in dists:
        table.add_row(dist.name, dist.description, dist.describe_toolsets())
    return table


def _as_json(dists: list[Distribution]) -> str:
    rows = [{"name": d.name, "description": d.description, "toolsets": dict(d.toolsets)} for d in dists]
    return orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode()


def distributions(
    name: str | None = typer.Argument(None, help="Show only this distribution."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the toolset distributions (each toolset is drawn independently with its chance)."""
    if name is None:
        dists = list_distributions()
    else:
        try:
            dists = [get_distribution(name)]
        except UnknownDistributionError as exc:
            raise fail(str(exc)) from None
    if as_json:
        typer.echo(_as_json(dists))
        return
    title = "Toolset distributions" if name is None else f"Distribution {name}"
    Console(file=sys.stdout).print(_table(dists, title))
    if name is None:
        typer.echo("If a draw selects no toolset, the most likely one is used.")


def register(app: typer.Typer) -> None:
    """Add the ``distributions`` command to the ``trajforge`` app."""
    app.command("distributions")(distributions)
