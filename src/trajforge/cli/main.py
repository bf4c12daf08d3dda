"""Entry point of the ``trajforge`` command.

Each command lives in its own module under :mod:`trajforge.cli` and exposes ``register(app)``;
this module only assembles them, so importing the CLI stays cheap and modules stay small.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="trajforge",
    help="Agent trajectory factory and RL environments for tool-using LLMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from trajforge import __version__

        typer.echo(f"trajforge {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit.", metavar=""
    ),
) -> None:
    """Agent trajectory factory and RL environments for tool-using LLMs."""


# Fixed map of command modules (no import-time registry): each exposes ``register(app)``.
_COMMAND_MODULES = (
    "trajforge.cli.run",
    "trajforge.cli.distributions",
    "trajforge.cli.parse",
    "trajforge.cli.batch",
    "trajforge.cli.export",
    "trajforge.cli.report",
    "trajforge.cli.serve",
    "trajforge.cli.model",
    "trajforge.cli.tools",
    "trajforge.cli.env",
    "trajforge.cli.rl",
)

for _name in _COMMAND_MODULES:
    try:
        _module = importlib.import_module(_name)
    except ModuleNotFoundError as exc:  # pragma: no cover - only while a command is being written
        if exc.name != _name:
            raise
        continue
    _module.register(app)


def main() -> None:  # pragma: no cover - console script shim
    app()
