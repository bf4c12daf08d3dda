"""``trajforge export``: turn a batch run directory into a trainer's input format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trajforge.cli.errors import fail

_FORMATS_HELP = "messages (TRL) | sharegpt | llamafactory | axolotl | hermes | parquet | dpo"


def export(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `trajforge batch`")],
    fmt: Annotated[str, typer.Option("--format", "-f", help=_FORMATS_HELP)] = "messages",
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="default: RUN_DIR/export/FORMAT.jsonl (parquet: RUN_NAME.parquet)"
        ),
    ] = None,
    include: Annotated[
        str | None,
        typer.Option(
            help="comma-separated outputs to export: trajectories,filtered,failed "
            "(default: trajectories; dpo: all three)"
        ),
    ] = None,
) -> None:
    """Export a run for a trainer: TRL messages, ShareGPT, LLaMA-Factory, Axolotl, the reference's
    padded format, Parquet, DPO pairs (docs/formats.md has each trainer's config)."""
    from trajforge.batch.export import ExportError
    from trajforge.batch.export import export as run_export

    names = None
    if include is not None:
        names = [f"{part.strip()}.jsonl" for part in include.split(",") if part.strip()]
        bad = [n for n in names if n not in {"trajectories.jsonl", "filtered.jsonl", "failed.jsonl"}]
        if bad or not names:
            raise fail("--include takes trajectories, filtered and/or failed")
    try:
        report = run_export(run_dir, fmt, output, include=names)
    except ExportError as exc:
        raise fail(str(exc)) from None
    typer.echo(f"wrote {report.rows} rows to {report.path}")
    if report.pairing is not None:
        p = report.pairing
        typer.echo(
            f"pairs by {p.ground}: {p.pairs} pairs from {p.lines} lines in {p.groups} groups "
            f"({p.tied_pairs_skipped} tied skipped, {p.ungraded_lines} ungraded); details in {report.sidecar}"
        )
        for note in p.notes:
            typer.echo(f"note: {note}")


def register(app: typer.Typer) -> None:
    app.command("export")(export)
