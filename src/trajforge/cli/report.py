"""``trajforge report``: one static HTML file about a run directory (opens from disk, offline)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trajforge.cli.errors import fail
from trajforge.cli.vocab import renamed


def report(
    run_dir: Annotated[
        Path, typer.Argument(help="a run directory written by `trajforge batch` or an env run")
    ],
    out: Annotated[Path | None, typer.Option("--output", "-o", help="default: RUN_DIR/report.html")] = None,
    max_trajectories: Annotated[
        int, typer.Option(help="trajectories embedded for the browser (sampled within each status beyond it)")
    ] = 2000,
    max_size_mb: Annotated[float, typer.Option(help="the largest the file may grow, in MiB")] = 25.0,
    max_text_chars: Annotated[
        int, typer.Option(help="longest text kept of one message, think block or tool result")
    ] = 4000,
    seed: Annotated[int, typer.Option(help="seed of the sampling")] = 0,
    progress: Annotated[
        str, typer.Option(help="auto|rich|plain|none (auto: rich on a terminal, plain lines otherwise)")
    ] = "auto",
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Write a run report: statistics, charts and a trajectory browser, in one HTML file."""
    from pydantic import ValidationError

    from trajforge.report import ReportError, ReportOptions, build_report

    try:
        options = ReportOptions(
            max_trajectories=max_trajectories,
            max_text_chars=max_text_chars,
            max_bytes=int(max_size_mb * 2**20),
            seed=seed,
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise fail(f"invalid report options ({problems}); --max-size-mb must be at least 0.5") from None
    from trajforge.cli.live import LiveProgress

    if progress not in ("auto", "rich", "plain", "none"):
        raise fail(f"--progress takes auto, rich, plain or none; got {progress!r}")
    try:
        with LiveProgress("report", unit="lines", mode=progress) as live:  # type: ignore[arg-type]
            summary = build_report(run_dir, out, options, progress=live.step)
    except ReportError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"cannot write the report: {exc}") from None
    if json_out:
        import orjson

        data = {
            "path": str(summary.path),
            "size_bytes": summary.size_bytes,
            "samples": summary.lines,
            "embedded": summary.embedded,
            "left_out_for_size": summary.left_out_for_size,
        }
        typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())
        return
    cut = f", {summary.left_out_for_size} left out for size" if summary.left_out_for_size else ""
    typer.echo(
        f"wrote {summary.path} ({summary.size_bytes / 2**20:.1f} MiB): {summary.lines} samples, "
        f"{summary.embedded} trajectories embedded{cut}"
    )


def register(app: typer.Typer) -> None:
    app.command("report", cls=renamed({"--out": "--output"}))(report)
