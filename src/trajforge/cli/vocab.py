"""One CLI vocabulary: the old spellings of renamed flags, kept working for one release.

docs/cli.md is the vocabulary (each flag, its one meaning, its default); ``tests/test_cli_vocabulary.py``
walks every command of the real app against it. A command whose flags were renamed is built with
``cls=renamed({...})``: before click parses, each old spelling is replaced by the new one and a
one-line note goes to stderr, so ``--help`` shows only the new names and old scripts keep running.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import typer
from typer.core import TyperCommand


def deprecation_note(old: str, new: str) -> str:
    """The one line an old spelling prints (stderr)."""
    return f"note: {old} is deprecated and goes in the next release; use {new} (docs/cli.md)"


def modernize(args: list[str], renames: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """``args`` with each old flag spelling replaced (``--old``, ``--old=value``; nothing after
    ``--``), and the notes to print, one per old flag used."""
    out: list[str] = []
    notes: list[str] = []
    rest = iter(args)
    for arg in rest:
        if arg == "--":
            out += [arg, *rest]
            break
        flag, eq, value = arg.partition("=")
        new = renames.get(flag)
        if new is None:
            out.append(arg)
            continue
        out.append(new + eq + value)
        note = deprecation_note(flag, new)
        if note not in notes:
            notes.append(note)
    return out, notes


class RenamedCommand(TyperCommand):
    """A command that still accepts the old spellings in ``renames`` (old -> new)."""

    renames: Mapping[str, str] = {}

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        args, notes = modernize(list(args), self.renames)
        for note in notes:
            typer.echo(note, err=True)
        return super().parse_args(ctx, args)


def renamed(renames: Mapping[str, str]) -> Any:
    """The command class for ``app.command(..., cls=renamed({"--old": "--new"}))``."""
    return type("Renamed", (RenamedCommand,), {"renames": dict(renames)})
