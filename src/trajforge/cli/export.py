"""``trajforge export``: turn a batch run directory into a trainer's input format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, cast

import orjson
import typer

from trajforge.cli import complete
from trajforge.cli.errors import fail
from trajforge.cli.live import LiveProgress, silence_library_bars

_FORMATS_HELP = "messages (TRL) | sharegpt | llamafactory | axolotl | hermes | parquet | dpo"
_FILES = ("trajectories", "filtered", "failed")


def _names(value: str | None, flag: str, allowed: tuple[str, ...]) -> list[str] | None:
    if value is None:
        return None
    names = [part.strip() for part in value.split(",") if part.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise fail(f"{flag} takes {', '.join(allowed)} (comma-separated); got {value!r}")
    return names


def export(
    run_dir: Annotated[Path, typer.Argument(help="a batch or env eval run directory")],
    fmt: Annotated[
        str, typer.Option("--format", "-f", help=_FORMATS_HELP, autocompletion=complete.export_formats)
    ] = "messages",
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="default: RUN_DIR/export/FORMAT.jsonl (parquet: RUN_NAME.parquet)"
        ),
    ] = None,
    include: Annotated[
        str | None,
        typer.Option(
            autocompletion=complete.run_files,
            help="comma-separated outputs to export: trajectories,filtered,failed "
            "(default: trajectories; dpo: all three; with --status: the files holding those statuses)",
        ),
    ] = None,
    status: Annotated[
        str | None,
        typer.Option(
            help="keep only samples with these statuses: completed,partial,failed,filtered "
            "(dpo: what the chosen answer may be)"
        ),
    ] = None,
    min_reward: Annotated[
        float | None,
        typer.Option(
            help="keep only graded samples with reward >= X: rejection sampling (dpo: the chosen answer's)"
        ),
    ] = None,
    max_per_prompt: Annotated[
        int | None,
        typer.Option(
            min=1, help="keep at most N samples per prompt_index, highest reward first (dpo: N pairs)"
        ),
    ] = None,
    grounded: Annotated[
        bool,
        typer.Option(
            "--grounded",
            help="keep only samples whose final answer states no number missing from the prompt and "
            "its own tool outputs (dpo: the chosen answer must be; ties of reward go to the grounded one)",
        ),
    ] = False,
    malformed_calls: Annotated[
        str,
        typer.Option(
            help="skip: leave out samples with a malformed tool call (counted); text: keep them with "
            "the call as the assistant's text (docs/formats.md)"
        ),
    ] = "skip",
    progress: Annotated[
        str,
        typer.Option(
            help="auto|rich|plain|none (auto: rich on a terminal, plain lines otherwise)",
            autocompletion=complete.progress_modes,
        ),
    ] = "auto",
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Export a run for a trainer: TRL, ShareGPT, LLaMA-Factory, Axolotl, Parquet, DPO pairs.

    Also the reference's padded format (hermes); docs/formats.md has each trainer's config."""
    from pydantic import ValidationError

    from trajforge.export.formats import NOT_A_MODEL_FORK, ExportError, ExportOptions, MalformedPolicy
    from trajforge.export.formats import export as run_export
    from trajforge.trajectory.selection import STATUSES, Selection, Status

    files = _names(include, "--include", _FILES)
    statuses = _names(status, "--status", STATUSES)
    if malformed_calls not in ("skip", "text"):
        raise fail(f"--malformed-calls takes skip or text; got {malformed_calls!r}")
    # both checked against their vocabularies just above; pydantic checks them again
    chosen = cast("frozenset[Status] | None", frozenset(statuses) if statuses else None)
    try:
        options = ExportOptions(
            include=tuple(f"{n}.jsonl" for n in files) if files else None,
            select=Selection(
                statuses=chosen,
                min_reward=min_reward,
                max_per_prompt=max_per_prompt,
                grounded=grounded,
            ),
            malformed_calls=cast("MalformedPolicy", malformed_calls),
        )
    except ValidationError as exc:
        raise fail(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
    if progress not in ("auto", "rich", "plain", "none"):
        raise fail(f"--progress takes auto, rich, plain or none; got {progress!r}")
    if fmt == "parquet":
        silence_library_bars("datasets")
    live = LiveProgress(f"export {fmt}", unit="KiB", mode=progress)  # type: ignore[arg-type]
    try:
        with live:
            report = run_export(run_dir, fmt, output, options=options, progress=live.step)
    except ExportError as exc:
        raise fail(str(exc)) from None
    if json_out:
        typer.echo(orjson.dumps(_as_json(report), option=orjson.OPT_INDENT_2).decode())
        return
    typer.echo(f"wrote {report.rows} rows to {report.path}")
    if report.rows == 0:  # parquet only: the JSONL formats refuse to write an empty file
        typer.echo(
            "note: a zero-row Parquet file: load it with streaming=True or "
            "datasets.Dataset(pyarrow.parquet.read_table(path)) (docs/formats.md)"
        )
    for why, n in sorted(report.left_out.items(), key=lambda kv: -kv[1]):
        typer.echo(f"left out {n}: {why}")
    if any(why.startswith("malformed tool call") for why in report.left_out):
        typer.echo("note: --malformed-calls text keeps those samples, the call as the assistant's text")
    if report.pairing is not None:
        p = report.pairing
        typer.echo(
            f"pairs by {p.ground}: {p.pairs} pairs from {p.lines} lines in {p.groups} groups "
            f"({p.tied_pairs_skipped} tied skipped, {p.ungraded_lines} ungraded"
            + (f", {p.ties_broken} ties broken by grounding" if p.ties_broken else "")
            + f"); details in {report.sidecar}"
        )
        for why, n in p.pairs_left_out.items():
            if why == NOT_A_MODEL_FORK:
                typer.echo(f"pairs left out {n}: {why}")
            else:
                typer.echo(f"pairs left out {n}: the better-rewarded answer may not be chosen: {why}")
        for note in p.notes:
            typer.echo(f"note: {note}")


def _as_json(report: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "path": str(report.path),
        "rows": report.rows,
        "read": report.read,
        "left_out": dict(report.left_out),
    }
    if report.pairing is not None:
        data["pairing"] = report.pairing.as_dict()
        data["pairing_file"] = str(report.sidecar)
    return data


def register(app: typer.Typer) -> None:
    app.command("export")(export)
