"""``trajforge export``: turn a batch run directory into a trainer's input format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trajforge.cli.errors import fail


def export(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `trajforge batch`")],
    fmt: Annotated[
        str, typer.Option("--format", "-f", help="messages|sharegpt|hermes|parquet|dpo")
    ] = "messages",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="default: RUN_DIR/export/FORMAT.*")
    ] = None,
    include: Annotated[
        str,
        typer.Option(help="comma-separated outputs to export (not for dpo): trajectories,filtered,failed"),
    ] = "trajectories",
) -> None:
    """Export a run: TRL messages, ShareGPT, the reference's padded format, Parquet, DPO pairs."""
    from trajforge.batch.export import ExportError, export_run

    names = [f"{part.strip()}.jsonl" for part in include.split(",") if part.strip()]
    bad = [n for n in names if n not in {"trajectories.jsonl", "filtered.jsonl", "failed.jsonl"}]
    if bad or not names:
        raise fail("--include takes trajectories, filtered and/or failed")
    try:
        path, rows = export_run(run_dir, fmt, output, include=names)
    except ExportError as exc:
        raise fail(str(exc)) from None
    typer.echo(f"wrote {rows} rows to {path}")


def register(app: typer.Typer) -> None:
    app.command("export")(export)
