"""How a ``trajforge`` command fails on a user error: one ``error:`` line on stderr, exit code 2."""

from __future__ import annotations

import typer


def fail(message: str) -> typer.Exit:
    """Print ``error: message`` to stderr; ``raise fail(...)`` ends the command with code 2."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)
