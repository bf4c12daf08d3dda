"""``trajforge batch``: run a dataset of prompts through the agent into training data.

The options are :class:`~trajforge.batch.config.BatchConfig` itself: one per field, named after
it, with the field's description as help and its default, so a new setting is one line in the
config and nothing here. Only the flags the user typed (click knows each value's source) override
the YAML file of ``--config``.
"""

from __future__ import annotations

import asyncio
import inspect
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from trajforge.batch.config import BatchConfig
from trajforge.cli import config_flags
from trajforge.cli.errors import fail
from trajforge.cli.vocab import renamed

if TYPE_CHECKING:
    from trajforge.batch.runner import RunSummary

_POSITIONAL, _KEYWORD = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
_CONTEXT = inspect.Parameter("ctx", _POSITIONAL, annotation=typer.Context)
_CONFIG = inspect.Parameter(
    "config",
    _KEYWORD,
    default=None,
    annotation=Annotated[
        Path | None, typer.Option("--config", help="YAML file with the same keys as the flags")
    ],
)


_TOOLS_CONFIG = inspect.Parameter(
    "tools_config",
    _KEYWORD,
    default=None,
    annotation=Annotated[
        Path | None,
        typer.Option(
            "--tools-config",
            help="YAML file with the tools section (backends of web/browser/vision/image_gen/moa); "
            "replaces the config file's tools section",
        ),
    ],
)
_NOT_FLAGS = frozenset({"dataset", "tools"})  # the positional argument; a nested section
_JSON = inspect.Parameter(
    "json_out",
    _KEYWORD,
    default=False,
    annotation=Annotated[bool, typer.Option("--json", help="Print the run's statistics as JSON (stdout)")],
)
_REQUIRED_DATASET = "DATASET"
# Old spellings, kept for one release (docs/cli.md).
RENAMES = {"--sandbox-network": "--network", "--samples-per-prompt": "--group-size"}


def batch(ctx: typer.Context, **given: Any) -> None:
    """Generate trajectories for every prompt of DATASET into OUTPUT_DIR/RUN_NAME (resumable)."""
    json_out = bool(given.pop("json_out", False))
    typed = {name: value for name, value in given.items() if config_flags.given_by_user(ctx, name)}
    tools_file = typed.pop("tools_config", None)
    if tools_file is not None:
        typed["tools"] = _tools(tools_file)
    config_file = typed.pop("config", None)
    if "dataset" not in typed and not _names_dataset(config_file):
        raise fail(
            "give the JSONL dataset: trajforge batch DATASET --run-name NAME (or `dataset:` in --config)"
        )
    cfg = _config(config_file, typed)
    summary = _run(cfg)
    if json_out:
        data = {"run_dir": str(summary.run_dir), "statistics": summary.statistics}
        typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2, default=str).decode())
    else:
        _print_summary(summary.run_dir, summary.statistics)


def _names_dataset(config_file: Path | None) -> bool:
    """Whether the YAML of ``--config`` gives ``dataset`` (an unreadable file: let the config
    loader say why)."""
    if config_file is None:
        return False
    import yaml

    try:
        data = yaml.safe_load(config_file.read_text())
    except (OSError, yaml.YAMLError):
        return True
    return not isinstance(data, dict) or data.get("dataset") is not None


def _dataset_argument() -> inspect.Parameter:
    """DATASET: required, unless ``--config`` names it (usage shows it required; leaving it out
    says how to give it, never a ``--dataset`` flag that does not exist)."""
    help_text = BatchConfig.model_fields["dataset"].description
    annotation = Annotated[Path | None, typer.Argument(help=help_text, metavar="DATASET", show_default=False)]
    return inspect.Parameter("dataset", _POSITIONAL, default=None, annotation=annotation)


def _parameters() -> list[inspect.Parameter]:
    options = config_flags.options(BatchConfig, skip=_NOT_FLAGS)
    return [_CONTEXT, _dataset_argument(), _CONFIG, _TOOLS_CONFIG, *options, _JSON]


def _tools(path: Path) -> Any:
    from trajforge.tools.config import ToolsConfigError, load_tools_config

    try:
        return load_tools_config(path)
    except ToolsConfigError as exc:
        raise fail(str(exc)) from None


def _config(config_file: Path | None, given: dict[str, Any]) -> BatchConfig:
    from trajforge.batch.config import ConfigError, load_config

    overrides = {
        name: value if name == "tools" else config_flags.from_text(BatchConfig, name, value)
        for name, value in given.items()
    }
    try:
        return load_config(config_file, overrides)
    except ConfigError as exc:
        raise fail(str(exc)) from None


def _run(cfg: BatchConfig) -> RunSummary:
    from trajforge.batch.progress import make_progress
    from trajforge.batch.runner import RunError, run_batch

    sink = None if cfg.progress == "none" else make_progress(cfg.progress, cfg.run_name, 0)
    try:
        # notes go through the live display (above the bar), never over it
        return asyncio.run(run_batch(cfg, progress=sink, announce=sink.note if sink is not None else _say))
    except RunError as exc:
        if sink is not None:
            sink.close(None)
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        typer.echo(
            f"interrupted; continue with: trajforge batch ... --run-name {cfg.run_name} --resume", err=True
        )
        raise typer.Exit(code=130) from None


def _say(message: str) -> None:
    typer.echo(message, err=True)


def _print_summary(run_dir: Path, stats: dict[str, Any]) -> None:
    """A short table of how the run went and where its files are."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"trajforge batch: {run_dir}", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for row in _summary_rows(run_dir, stats):
        table.add_row(*row)
    Console().print(table)


def _summary_rows(run_dir: Path, stats: dict[str, Any]) -> list[tuple[str, str]]:
    counts, tokens = stats["status_counts"], stats.get("tokens", {})
    rows = [("samples", f"{stats['total_done']}/{stats['total_prompts']} done")]
    rows += [
        (status, _status_text(stats, counts, status))
        for status in ("completed", "partial", "failed", "filtered")
    ]
    rewards = stats.get("rewards")
    if rewards:  # --env: how many tasks the model actually solved, not only "ended with an answer"
        errors = f", {rewards['reward_errors']} reward errors" if rewards["reward_errors"] else ""
        rows.append(
            (
                "solved",
                f"{rewards['solved']}/{rewards['graded']} ({rewards['solved_rate']:.0%}), "
                f"mean reward {rewards['mean']:.3f}{errors}",
            )
        )
    rows.append(
        ("tokens", f"{tokens.get('total_tokens', 0):,} total, {stats.get('api_calls', 0):,} model calls")
    )
    rows.append(("throughput", f"{stats['session']['throughput_per_s']} samples/s this session"))
    rows += _sandbox_rows(stats.get("sandboxes") or {})
    rows.append(("trajectories", str(run_dir / "trajectories.jsonl")))
    rows.append(("failed / filtered", f"{run_dir / 'failed.jsonl'}, {run_dir / 'filtered.jsonl'}"))
    rows.append(("statistics", str(run_dir / "statistics.json")))
    return rows


_REASONS = {"filtered": "filter_reasons", "failed": "failure_reasons", "partial": "partial_reasons"}


def _status_text(stats: dict[str, Any], counts: dict[str, int], status: str) -> str:
    """The count of a status and its three most common reasons."""
    reasons: dict[str, int] = stats.get(_REASONS.get(status, ""), {})
    top = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
    why = ", ".join(f"{k} {v}" for k, v in top)
    return f"{counts.get(status, 0)}" + (f"  ({why})" if why else "")


def _sandbox_rows(boxes: dict[str, Any]) -> list[tuple[str, str]]:
    if not (boxes.get("created") or boxes.get("reused")):
        return []
    dropped = sum(boxes.get("discarded", {}).values())
    text = f"{boxes.get('created', 0):,} built, {boxes.get('reused', 0):,} reused after reset"
    if dropped:
        text += f", {dropped:,} discarded at reset (reasons in statistics.json)"
    return [("sandboxes", text)]


class _BatchCommand(renamed(RENAMES)):  # type: ignore[misc]
    """Usage shows DATASET as the required argument it is; click's optional marks come from
    letting ``--config`` name it instead."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [_REQUIRED_DATASET if p == "[DATASET]" else p for p in super().collect_usage_pieces(ctx)]


def register(app: typer.Typer) -> None:
    typing.cast(Any, batch).__signature__ = inspect.Signature(_parameters())
    app.command("batch", cls=_BatchCommand)(batch)
