"""``trajforge batch``: run a dataset of prompts through the agent into training data.

The options are :class:`~trajforge.batch.config.BatchConfig` itself: one per field, named after
it, with the field's description as help and its default, so a new setting is one line in the
config and nothing here. Only the flags the user typed (click knows each value's source) override
the YAML file of ``--config``.
"""

from __future__ import annotations

import asyncio
import inspect
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Union

import orjson
import typer
from pydantic.fields import FieldInfo

from trajforge.batch.config import BatchConfig
from trajforge.cli.errors import fail

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


def batch(ctx: typer.Context, **given: Any) -> None:
    """Generate trajectories for every prompt of DATASET into OUTPUT_DIR/RUN_NAME (resumable)."""
    typed = {name: value for name, value in given.items() if _typed(ctx, name)}
    tools_file = typed.pop("tools_config", None)
    if tools_file is not None:
        typed["tools"] = _tools(tools_file)
    cfg = _config(typed.pop("config", None), typed)
    summary = _run(cfg)
    _print_summary(summary.run_dir, summary.statistics)


def _typed(ctx: typer.Context, name: str) -> bool:
    """Whether the user gave ``name`` (not its default). By the source's name: typer carries its
    own copy of click, whose ParameterSource is not ``click``'s."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _value_type(field: FieldInfo) -> type:
    """The field's type without ``None``: what a flag's text becomes (list, dict and Literal: str)."""
    annotation = field.annotation
    if typing.get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    origin = typing.get_origin(annotation)
    if origin is not None:
        return origin if origin in (list, dict) else str
    return annotation if isinstance(annotation, type) else str


def _default(field: FieldInfo, kind: type) -> Any:
    """The default ``--help`` shows (a list or JSON object flag shows none: it has no text form)."""
    if field.is_required() or kind in (list, dict):
        return None
    return field.get_default(call_default_factory=True)


def _option(name: str, field: FieldInfo) -> inspect.Parameter:
    """The ``--flag`` of one config field: a switch for a bool (``--x/--no-x`` when on by
    default), text for a list (comma-separated) or a JSON object, else the field's own type."""
    kind = _value_type(field)
    flag = "--" + name.replace("_", "-")
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    aliases = [str(a) for a in extra.get("flag_aliases") or ()]  # type: ignore[union-attr]
    decls = (f"{flag}/--no-{flag[2:]}" if field.default is True else flag,) if kind is bool else ()
    if aliases:
        decls = (decls or (flag,)) + tuple(aliases)
    text = (field.description or "") + (", comma-separated" if kind is list else "")
    cli_type = kind if kind in (bool, int, float, Path) else str
    switch = {"metavar": ""} if kind is bool else {}  # a switch takes no value: show none
    annotation = Annotated[cli_type | None, typer.Option(*decls, help=text, **switch)]
    return inspect.Parameter(name, _KEYWORD, default=_default(field, kind), annotation=annotation)


def _dataset_argument() -> inspect.Parameter:
    help_text = BatchConfig.model_fields["dataset"].description
    annotation = Annotated[Path | None, typer.Argument(help=help_text)]
    return inspect.Parameter("dataset", _POSITIONAL, default=None, annotation=annotation)


def _parameters() -> list[inspect.Parameter]:
    fields = BatchConfig.model_fields.items()
    options = (_option(n, f) for n, f in fields if n not in _NOT_FLAGS)
    return [_CONTEXT, _dataset_argument(), _CONFIG, _TOOLS_CONFIG, *options]


def _tools(path: Path) -> Any:
    from trajforge.tools.config import ToolsConfigError, load_tools_config

    try:
        return load_tools_config(path)
    except ToolsConfigError as exc:
        raise fail(str(exc)) from None


def _from_text(name: str, value: Any) -> Any:
    """A flag's value as the config takes it: lists split at commas, JSON objects parsed."""
    if name == "tools":  # already a ToolsConfig (from --tools-config)
        return value
    kind = _value_type(BatchConfig.model_fields[name])
    if value is None or kind not in (list, dict):
        return value
    if kind is list:
        return [v.strip() for v in value.split(",") if v.strip()]
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise fail(f"--{name.replace('_', '-')} is not valid JSON: {exc}") from None


def _config(config_file: Path | None, given: dict[str, Any]) -> BatchConfig:
    from trajforge.batch.config import ConfigError, load_config

    overrides = {name: _from_text(name, value) for name, value in given.items()}
    try:
        return load_config(config_file, overrides)
    except ConfigError as exc:
        raise fail(str(exc)) from None


def _run(cfg: BatchConfig) -> RunSummary:
    from trajforge.batch.progress import make_progress
    from trajforge.batch.runner import RunError, run_batch

    sink = None if cfg.progress == "none" else make_progress(cfg.progress, cfg.run_name, 0)
    try:
        return asyncio.run(run_batch(cfg, progress=sink, announce=_say))
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


def register(app: typer.Typer) -> None:
    typing.cast(Any, batch).__signature__ = inspect.Signature(_parameters())
    app.command("batch")(batch)
