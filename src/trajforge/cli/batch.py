"""``trajforge batch``: run a dataset of prompts through the agent into training data.

Every option defaults to ``None`` here so that only flags the user actually typed override the
YAML config file; real defaults live in :class:`trajforge.batch.config.BatchConfig`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import orjson
import typer

_LIST_HELP = "comma-separated"


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def batch(
    dataset: Annotated[
        Path | None, typer.Argument(help="JSONL dataset, one {'prompt': ...} per line")
    ] = None,
    run_name: Annotated[str | None, typer.Option(help="run directory name under --output-dir")] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML file with the same keys as the flags")
    ] = None,
    output_dir: Annotated[Path | None, typer.Option(help="parent of run directories [data]")] = None,
    model: Annotated[str | None, typer.Option(help="model name")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint URL")] = None,
    api_key_env: Annotated[
        str | None, typer.Option(help="NAME of the env var holding the API key [the endpoint's usual one]")
    ] = None,
    distribution: Annotated[str | None, typer.Option(help="toolset distribution [default]")] = None,
    toolsets: Annotated[str | None, typer.Option(help=f"fixed toolsets, {_LIST_HELP}")] = None,
    concurrency: Annotated[int | None, typer.Option(help="rollouts at once per worker [64]")] = None,
    workers: Annotated[int | None, typer.Option(help="worker processes [1]")] = None,
    max_turns: Annotated[int | None, typer.Option(help="assistant turns per sample [30]")] = None,
    max_samples: Annotated[int | None, typer.Option(help="only the first N rows")] = None,
    resume: Annotated[bool | None, typer.Option("--resume", help="continue an existing run")] = None,
    seed: Annotated[int | None, typer.Option(help="base seed for per-sample toolsets [0]")] = None,
    sandbox: Annotated[str | None, typer.Option(help="sandbox backend: bwrap|local|docker [bwrap]")] = None,
    sandbox_reuse: Annotated[
        bool | None,
        typer.Option(
            "--sandbox-reuse/--no-sandbox-reuse",
            help="reset (verified) and reuse a finished sample's sandbox instead of building a new one [on]",
        ),
    ] = None,
    max_tokens: Annotated[int | None, typer.Option(help="max tokens per model call")] = None,
    temperature: Annotated[float | None, typer.Option(help="sampling temperature")] = None,
    reasoning_effort: Annotated[str | None, typer.Option(help="low|medium|high")] = None,
    no_reasoning: Annotated[
        bool | None, typer.Option("--no-reasoning", help="ask the model not to reason")
    ] = None,
    system_prompt: Annotated[str | None, typer.Option(help="system prompt (kept in records)")] = None,
    ephemeral_system_prompt: Annotated[
        str | None, typer.Option(help="system prompt sent, never saved")
    ] = None,
    prefill_messages: Annotated[
        Path | None, typer.Option(help="JSON file of messages sent after the system prompt, never saved")
    ] = None,
    provider_allow: Annotated[str | None, typer.Option(help=f"providers to use, {_LIST_HELP}")] = None,
    provider_ignore: Annotated[str | None, typer.Option(help=f"providers to avoid, {_LIST_HELP}")] = None,
    provider_order: Annotated[str | None, typer.Option(help=f"provider preference, {_LIST_HELP}")] = None,
    provider_sort: Annotated[str | None, typer.Option(help="price|throughput|latency")] = None,
    extra_body: Annotated[str | None, typer.Option(help="JSON object merged into each request")] = None,
    require_reasoning: Annotated[
        bool | None,
        typer.Option(
            "--require-reasoning/--no-require-reasoning", help="filter samples without reasoning [on]"
        ),
    ] = None,
    sample_timeout: Annotated[float | None, typer.Option(help="deadline per sample attempt, s [600]")] = None,
    max_command_timeout: Annotated[
        float | None,
        typer.Option(help="longest timeout the model may give one command, s (longer is clamped) [600]"),
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option(help="attempts per sample on infra failures [3]")
    ] = None,
    rate_limit: Annotated[float | None, typer.Option(help="endpoint requests/s across all workers")] = None,
    max_concurrent_requests: Annotated[
        int | None, typer.Option(help="endpoint requests in flight, all workers")
    ] = None,
    request_timeout: Annotated[
        float | None, typer.Option(help="timeout of one model request, s [120]")
    ] = None,
    skip_bad_rows: Annotated[
        bool | None, typer.Option("--skip-bad-rows", help="record bad dataset rows as failed samples")
    ] = None,
    fsync: Annotated[
        bool | None, typer.Option("--fsync/--no-fsync", help="fsync shards before commit [on]")
    ] = None,
    progress: Annotated[str | None, typer.Option(help="auto|rich|plain|none [auto]")] = None,
    merge_interval: Annotated[
        float | None,
        typer.Option(help="seconds between rebuilds of the merged .jsonl files while the run goes [30]"),
    ] = None,
) -> None:
    """Generate trajectories for every prompt of DATASET into OUTPUT_DIR/RUN_NAME (resumable)."""
    from trajforge.batch.config import ConfigError, load_config
    from trajforge.batch.progress import make_progress
    from trajforge.batch.runner import RunError, run_batch

    try:
        body = orjson.loads(extra_body) if extra_body is not None else None
    except orjson.JSONDecodeError as exc:
        raise _fail(f"--extra-body is not valid JSON: {exc}") from None
    overrides = dict(
        dataset=dataset,
        run_name=run_name,
        output_dir=output_dir,
        model=model,
        base_url=base_url,
        api_key_env=api_key_env,
        distribution=distribution,
        toolsets=_split(toolsets),
        concurrency=concurrency,
        workers=workers,
        max_turns=max_turns,
        max_samples=max_samples,
        resume=resume,
        seed=seed,
        sandbox=sandbox,
        sandbox_reuse=sandbox_reuse,
        max_tokens=max_tokens,
        temperature=temperature,
        reasoning_effort=reasoning_effort,
        no_reasoning=no_reasoning,
        system_prompt=system_prompt,
        ephemeral_system_prompt=ephemeral_system_prompt,
        prefill_messages=prefill_messages,
        provider_allow=_split(provider_allow),
        provider_ignore=_split(provider_ignore),
        provider_order=_split(provider_order),
        provider_sort=provider_sort,
        extra_body=body,
        require_reasoning=require_reasoning,
        sample_timeout=sample_timeout,
        max_command_timeout=max_command_timeout,
        max_attempts=max_attempts,
        rate_limit=rate_limit,
        max_concurrent_requests=max_concurrent_requests,
        request_timeout=request_timeout,
        skip_bad_rows=skip_bad_rows,
        fsync=fsync,
        merge_interval=merge_interval,
        progress=progress,
    )
    try:
        cfg = load_config(config, overrides)
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    try:
        sink = None
        if cfg.progress != "none":
            sink = make_progress(cfg.progress, cfg.run_name, 0)
        summary = asyncio.run(run_batch(cfg, progress=sink, announce=lambda m: typer.echo(m, err=True)))
    except RunError as exc:
        if sink is not None:
            sink.close(None)
        raise _fail(str(exc)) from None
    except KeyboardInterrupt:
        typer.echo(
            f"interrupted; continue with: trajforge batch ... --run-name {cfg.run_name} --resume", err=True
        )
        raise typer.Exit(code=130) from None
    _print_summary(summary.run_dir, summary.statistics)


def _print_summary(run_dir: Path, stats: dict) -> None:
    """A short table of how the run went and where its files are."""
    from rich.console import Console
    from rich.table import Table

    counts = stats["status_counts"]
    table = Table(title=f"trajforge batch: {run_dir}", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    table.add_row("samples", f"{stats['total_done']}/{stats['total_prompts']} done")
    for status in ("completed", "partial", "failed", "filtered"):
        reasons = stats.get(f"{status}_reasons") or stats.get(
            {"filtered": "filter_reasons", "failed": "failure_reasons"}.get(status, ""), {}
        )
        why = ", ".join(f"{k} {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])[:3])
        table.add_row(status, f"{counts.get(status, 0)}" + (f"  ({why})" if why else ""))
    tokens = stats.get("tokens", {})
    table.add_row(
        "tokens", f"{tokens.get('total_tokens', 0):,} total, {stats.get('api_calls', 0):,} model calls"
    )
    table.add_row("throughput", f"{stats['session']['throughput_per_s']} samples/s this session")
    boxes = stats.get("sandboxes") or {}
    if boxes.get("created") or boxes.get("reused"):
        dropped = sum(boxes.get("discarded", {}).values())
        table.add_row(
            "sandboxes",
            f"{boxes.get('created', 0):,} built, {boxes.get('reused', 0):,} reused after reset"
            + (f", {dropped:,} discarded at reset (reasons in statistics.json)" if dropped else ""),
        )
    table.add_row("trajectories", str(run_dir / "trajectories.jsonl"))
    table.add_row("failed / filtered", f"{run_dir / 'failed.jsonl'}, {run_dir / 'filtered.jsonl'}")
    table.add_row("statistics", str(run_dir / "statistics.json"))
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("batch")(batch)
