"""``trajforge model``: build the embedded tiny policy and measure a policy on held-out tasks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from trajforge.cli.errors import fail
from trajforge.cli.vocab import renamed
from trajforge.extras import missing_ml

model_app = typer.Typer(
    help="Build and evaluate the embedded tiny tool-calling policy.", no_args_is_help=True
)


@model_app.command("build-tiny", cls=renamed({"--out": "--model-path"}))
def build_tiny_cmd(
    out: Path = typer.Option(
        ..., "--model-path", help="Directory to write the model into (created if missing)."
    ),
    steps: int | None = typer.Option(None, "--steps", min=1, help="SFT steps (default: the recipe's)."),
    quick: bool = typer.Option(False, "--quick", help="A seconds-long smoke build (tiny model, few steps)."),
    examples: int | None = typer.Option(None, "--examples", min=1, help="Synthetic trajectories to build."),
    sandbox: str = typer.Option("bwrap", "--sandbox", help="Sandbox backend that runs the tool calls."),
    eval_n: int = typer.Option(0, "--eval", min=0, help="Evaluate on this many held-out tasks afterwards."),
    json_out: bool = typer.Option(False, "--json", help="Print the build (and evaluation) report as JSON."),
) -> None:
    """Train the tiny policy from scratch: real-tool synthetic data, BPE tokenizer, TRL SFT."""
    _require_ml("`trajforge model build-tiny`")
    from dataclasses import replace

    from trajforge.cli.run import sandbox_kind
    from trajforge.models.tiny.build import BuildConfig, build_tiny, write_model_card

    kind = sandbox_kind(sandbox)
    if out.exists() and not out.is_dir():
        raise fail(f"--model-path {out} exists and is not a directory; pick a directory path")
    cfg = (BuildConfig.quick() if quick else BuildConfig()).with_steps(steps)
    cfg = replace(cfg, sandbox_kind=kind, examples=examples or cfg.examples)
    report = build_tiny(out, cfg)
    quality = None
    if eval_n:
        from trajforge.models.tiny.evaluate import evaluate

        quality = asyncio.run(evaluate(out, eval_n, sandbox_kind=kind))
    write_model_card(out, report, quality)
    if json_out:
        data: dict[str, Any] = {"model_path": str(out), "build": report.model_dump(mode="json")}
        data["quality"] = quality.model_dump(mode="json") if quality is not None else None
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(
        f"wrote {out}: {report.parameters:,} parameters, {report.weights_bytes / 1e6:.1f} MB, "
        f"{report.conversations} trajectories ({len(report.rejected)} rejected), "
        f"loss {report.first_loss:.3f} -> {report.last_loss:.3f}, {report.seconds['total']:.0f} s"
    )
    if quality is not None:
        _print_quality(quality)


@model_app.command("eval", cls=renamed({"--model": "--model-path", "--n": "--max-samples"}))
def eval_cmd(
    model: Path | None = typer.Option(
        None, "--model-path", help="Model directory (default: the embedded policy)."
    ),
    n: int = typer.Option(100, "--max-samples", min=1, help="Held-out tasks to run."),
    seed: int | None = typer.Option(None, "--seed", help="Task seed (default: the held-out seed)."),
    temperature: float = typer.Option(0.0, "--temperature", min=0.0, help="0 = greedy decoding."),
    sandbox: str = typer.Option("bwrap", "--sandbox", help="Sandbox backend for the tool calls."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Run a policy on held-out generated tasks through the agent loop; print format and success rates."""
    _require_ml("`trajforge model eval`")
    from trajforge.cli.run import sandbox_kind
    from trajforge.models.tiny import weights_path
    from trajforge.models.tiny.evaluate import EVAL_SEED, evaluate

    kind = sandbox_kind(sandbox)

    if model is None:
        try:
            model = weights_path()
        except FileNotFoundError as exc:
            raise fail(str(exc)) from None
    if not (model / "config.json").is_file():
        raise fail(f"{model} is not a model directory (no config.json); pass --model-path DIR")
    report = asyncio.run(
        evaluate(
            model, n, seed=EVAL_SEED if seed is None else seed, temperature=temperature, sandbox_kind=kind
        )
    )
    if json_out:
        typer.echo(report.model_dump_json(indent=2))
        return
    _print_quality(report)


def _require_ml(what: str) -> None:
    problem = missing_ml(what)
    if problem:
        raise fail(problem)
    from trajforge.cli.live import silence_library_bars

    silence_library_bars("transformers", "datasets")


def _print_quality(report: object) -> None:
    from trajforge.models.tiny.evaluate import QualityReport

    assert isinstance(report, QualityReport)
    table = Table(title=f"{report.model_dir} on {report.n_tasks} held-out tasks ({report.decoding})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row(
        "well-formed assistant turns",
        f"{report.well_formed_rate:.1%} ({report.well_formed_turns}/{report.assistant_turns})",
    )
    table.add_row("task success", f"{report.success_rate:.1%}")
    for fam, rate in report.success_by_family.items():
        table.add_row(f"  {fam}", f"{rate:.1%}")
    table.add_row("terminations", ", ".join(f"{k}={v}" for k, v in report.terminations.items()))
    table.add_row("wall time", f"{report.wall_s:.0f} s")
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
