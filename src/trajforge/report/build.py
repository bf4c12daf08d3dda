"""``build_report``: one pass over the run's lines, a sample for the browser, one HTML file.

Pass one parses every line once for the statistics and keeps, per status, a reservoir of where
lines are; pass two reads only the sampled lines back. Memory is a few floats per sample plus
the embedded records, so a run of any size renders; the file is cut to ``max_bytes`` by leaving
out trajectories (never statistics), and the page says how many it holds and why.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajforge import __version__
from trajforge.record import Record, RecordError, load
from trajforge.report import charts
from trajforge.report.facts import RunFacts, as_dict, percentiles
from trajforge.report.options import ReportOptions
from trajforge.report.page import embed_json, render
from trajforge.report.sample import StatusSampler
from trajforge.report.source import (
    ENV_STATUS_FILE,
    OUTPUT_FILES,
    RUN_FILE,
    STATISTICS_FILE,
    SUMMARY_FILE,
    LineRef,
    iter_lines,
    output_paths,
    read_json,
    read_lines,
)
from trajforge.report.turns import RecordBuilder

_STATUS_ORDER = {"completed": 0, "filtered": 1, "partial": 2, "failed": 3}
_THROUGHPUT_BINS = 60


@dataclass(frozen=True, slots=True)
class ReportSummary:
    """What was written: where, how big, how many lines it covers and how many it shows."""

    path: Path
    size_bytes: int
    lines: int
    embedded: int
    sampled: int
    left_out_for_size: int
    seconds: float


Progress = Callable[[str, int, int], None]
"""(phase, done, total; 0 when not known yet): what a long report is doing, for a live display."""

_EVERY = 500  # lines between two progress calls


def _quiet(phase: str, done: int, total: int) -> None:
    pass


def build_report(
    run_dir: Path,
    out: Path | None = None,
    options: ReportOptions | None = None,
    progress: Progress | None = None,
) -> ReportSummary:
    """Write the report of ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``)."""
    started = time.monotonic()
    tell = progress or _quiet
    opts = options or ReportOptions()
    run_dir = Path(run_dir)
    out = Path(out) if out is not None else run_dir / "report.html"
    paths = output_paths(run_dir)
    facts = RunFacts()
    sampler = StatusSampler(opts.max_trajectories, opts.seed)
    tell("reading the run's lines", 0, 0)
    for ref, raw in iter_lines(paths):
        record = _record(raw)
        facts.add(record)
        if record is not None:
            sampler.offer(record.status, ref)
        if facts.lines % _EVERY == 0:
            tell("reading the run's lines", facts.lines, 0)
    refs = sampler.chosen()
    builder = RecordBuilder(opts.max_text_chars)
    built: dict[LineRef, dict[str, Any]] = {}
    tell("building the trajectory browser", 0, len(refs))
    for ref, line in read_lines(paths, refs):
        record = _record(line)
        assert record is not None  # it was read as one in the first pass
        built[ref] = builder.record(record)
        if len(built) % 50 == 0:
            tell("building the trajectory browser", len(built), len(refs))
    tell("writing the page", len(refs), len(refs))
    stats = read_json(run_dir / STATISTICS_FILE) or {}
    run = read_json(run_dir / RUN_FILE) or {}
    if "env" in run and not stats:  # an env run: its own status and summary files
        stats = _env_stats(run, read_json(run_dir / ENV_STATUS_FILE) or {}, read_json(run_dir / SUMMARY_FILE))
    files = [name for name, path in zip(OUTPUT_FILES, paths, strict=True) if path is not None]
    context = _context(facts, stats, run, run_dir, files)

    # The page without trajectories tells how much room they have.
    context["sampling"] = _sampling_note(facts.lines, len(refs), len(refs), 0, opts, 0)
    overhead = len(render(context, embed_json({"records": [], "systems": builder.systems})))
    budget = opts.max_bytes - overhead - 2048
    kept: list[dict[str, Any]] = []
    used = 0
    for ref in refs:  # a seeded random order: a size cut leaves out a random few
        size = len(embed_json(built[ref])) + 1
        if used + size > budget:
            continue
        kept.append(built[ref])
        used += size
    kept.sort(
        key=lambda r: (_STATUS_ORDER.get(r["s"], 9), r["i"] if isinstance(r["i"], int) else 0, r["key"])
    )
    left_out = len(refs) - len(kept)
    context["sampling"] = _sampling_note(facts.lines, len(refs), len(kept), left_out, opts, used)
    html = render(context, embed_json({"records": kept, "systems": builder.systems}))
    _write_atomic(out, html)
    return ReportSummary(
        out, len(html), facts.lines, len(kept), len(refs), left_out, time.monotonic() - started
    )


def _record(line: dict[str, Any] | None) -> Record | None:
    """The line as the one record (an older line upgraded); None when it is no record."""
    if line is None:
        return None
    try:
        return load(line)
    except RecordError:
        return None


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _sampling_note(lines: int, sampled: int, kept: int, left_out: int, opts: ReportOptions, used: int) -> str:
    if lines == 0:
        return "the run has no samples yet"
    head = f"The browser holds {kept:,} of {lines:,} trajectories"
    if sampled < lines:
        head += (
            f" (a uniform sample within each status, every status given an equal share of "
            f"--max-trajectories {opts.max_trajectories:,}; rare statuses are shown whole)"
        )
    else:
        head += " (all of them)"
    if left_out:
        head += f"; {left_out:,} more were sampled but left out to keep the file under {_mib(opts.max_bytes)}"
    return (
        f"{head}. Embedded trajectories: {_mib(used)}; texts longer than {opts.max_text_chars:,} characters "
        "are cut (head and tail kept). Statistics and charts cover every sample."
    )


def _cell(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value == int(value) and abs(value) >= 100 else f"{value:,.{digits}f}"


def _context(
    facts: RunFacts, stats: dict[str, Any], run: dict[str, Any], run_dir: Path, files: list[str]
) -> dict[str, Any]:
    cfg = as_dict(run.get("config"))
    title = str(stats.get("run_name") or cfg.get("run_name") or run_dir.name)
    status_items = sorted(facts.status.items(), key=lambda kv: (_STATUS_ORDER.get(kv[0], 9), kv[0]))
    tool_items = sorted(facts.tools.items(), key=lambda kv: -kv[1].calls)
    rates = [f"({t.failure / t.calls:.1%} failed)" if t.calls else "" for _, t in tool_items]
    wall = percentiles(facts.wall_s)
    throughput, bin_note, legend = _throughput(facts)
    chart_set: dict[str, Any] = {
        "status": charts.bars(
            [(s, float(n)) for s, n in status_items], "samples by status", colours=charts.STATUS_COLOURS
        ),
        "reasons": [
            (status, charts.bars([(k, float(n)) for k, n in counter.most_common(15)], f"{status} reasons"))
            for status, counter in sorted(facts.reasons.items(), key=lambda kv: _STATUS_ORDER.get(kv[0], 9))
        ],
        "tools": charts.bars([(n, float(t.calls)) for n, t in tool_items], "tool calls", note=rates),
        "toolsets": charts.bars([(n, float(c)) for n, c in facts.toolsets.most_common()], "toolsets"),
        "turns": charts.histogram(facts.turns, "model turns per sample", integer=True),
        "tokens": charts.histogram(
            facts.total_tokens,
            "total tokens per sample",
            integer=True,
            markers=_marks(percentiles(facts.total_tokens)),
        ),
        "latency": charts.histogram(facts.wall_s, "wall time per sample", " s", markers=_marks(wall)),
        "throughput": charts.lines(
            throughput, "samples finished per second", " s", "samples/s", legend=legend
        ),
        "rewards": charts.histogram(
            facts.rewards, "reward per sample", markers=_marks(percentiles(facts.rewards)), discrete_max=12
        )
        if facts.rewards
        else None,
    }
    series = (
        ("wall s", facts.wall_s),
        ("model s", facts.model_s),
        ("tool s", facts.tool_s),
        ("model turns", facts.turns),
        ("total tokens", facts.total_tokens),
        ("completion tokens", facts.completion_tokens),
    )
    pct_names = ["mean", "p50", "p90", "p99", "max"]
    return {
        "version": __version__,
        "title": title,
        "lines": f"{facts.lines:,}",
        "unreadable": facts.unreadable,
        "files": files,
        "finished": bool(stats.get("finished", True)),
        "run_rows": _run_rows(stats, run, cfg, facts),
        "charts": chart_set,
        "tool_rows": [
            (
                n,
                f"{t.calls:,}",
                f"{t.success:,}",
                f"{t.failure:,}",
                f"{t.failure / t.calls:.1%}" if t.calls else "-",
                f"{t.samples:,}",
            )
            for n, t in tool_items
        ],
        "pct_names": pct_names,
        "pct_rows": [(label, [_cell(percentiles(v)[k]) for k in pct_names]) for label, v in series],
        "bin_note": bin_note,
        "reward_note": f"{len(facts.rewards):,} samples carry a reward, {facts.no_reward:,} do not",
        "reward_rows": _reward_rows(facts),
    }


def _marks(pct: dict[str, float | None]) -> dict[str, float | None]:
    return {k: pct[k] for k in ("p50", "p90", "p99")}


def _throughput(
    facts: RunFacts,
) -> tuple[dict[str, list[tuple[float, float]]], str, dict[str, str]]:
    """Samples finished per second in bins over the run, per status; the legend says how many
    samples each series holds and their mean rate."""
    if not facts.finished_at:
        return {}, "no finish times", {}
    start, end = min(facts.finished_at), max(facts.finished_at)
    span = max(end - start, 1e-3)
    bins = min(_THROUGHPUT_BINS, max(1, len(facts.finished_at) // 2))
    width = span / bins
    counts: dict[str, list[int]] = {"all": [0] * bins}
    for stamp, status in zip(facts.finished_at, facts.finished_status, strict=True):
        k = min(int((stamp - start) / width), bins - 1)
        counts["all"][k] += 1
        counts.setdefault(status, [0] * bins)[k] += 1
    ordered = sorted(counts, key=lambda s: (s != "all", _STATUS_ORDER.get(s, 9), s))
    series = {s: [((k + 0.5) * width, counts[s][k] / width) for k in range(bins)] for s in ordered}
    legend = {
        s: f"{sum(counts[s]):,} sample{'s' * (sum(counts[s]) != 1)}, {sum(counts[s]) / span:.3g} samples/s"
        for s in ordered
    }
    return series, f"{bins} bins of {width:.3g} s from the first finish", legend


def _reward_rows(facts: RunFacts) -> list[tuple[str, str, str, str, str]]:
    def row(label: str, values: list[float]) -> tuple[str, str, str, str, str]:
        p = percentiles(values)
        return (label, f"{len(values):,}", _cell(p["mean"]), _cell(p["p50"]), _cell(p["max"]))

    rows = [row("all", facts.rewards)]
    rows += [row(f"status {s}", v) for s, v in sorted(facts.reward_by_status.items())]
    rows += [row(f"breakdown: {name}", v) for name, v in sorted(facts.reward_parts.items())]
    return rows


def _joined(value: Any) -> str | None:
    if isinstance(value, list):
        return ", ".join(map(str, value)) or None
    return str(value) if value else None


def _interval(value: Any) -> str | None:
    if not isinstance(value, dict) or not isinstance(value.get("value"), int | float):
        return None
    low, high = value.get("low"), value.get("high")
    bounds = (
        f" [{low:.3f}, {high:.3f}]" if isinstance(low, int | float) and isinstance(high, int | float) else ""
    )
    return f"{value['value']:.3f}{bounds}"


def _env_stats(run: dict[str, Any], status: dict[str, Any], summary: dict[str, Any] | None) -> dict[str, Any]:
    """An env run's run.json, status.json and summary.json in the shape the run table reads."""
    cfg = as_dict(run.get("config"))
    stats: dict[str, Any] = {
        "env": run.get("env"),
        "model": run.get("model"),
        "agent": run.get("agent"),
        "items × group": f"{run.get('n')} × {run.get('group_size')}" if "n" in run else None,
        "toolsets": ", ".join(map(str, cfg.get("enabled_toolsets") or [])) or None,
        "temperature": cfg.get("agent_temperature"),
        "max turns": cfg.get("max_agent_turns"),
        "finished": summary is not None,
    }
    if "total" in status:
        stats["total_done"], stats["total_prompts"] = status.get("finished"), status.get("total")
    if isinstance(status.get("elapsed_s"), int | float):
        stats["duration_s"] = status["elapsed_s"]
    if summary:
        stats["mean reward [95% CI]"] = _interval(summary.get("mean_reward"))
        stats["pass@1 [95% CI]"] = _interval(summary.get("pass_at_1"))
        pass_k = summary.get("pass_at_k")
        found = summary.get("pass_at_k_interval")
        ci: dict[str, Any] = found if isinstance(found, dict) else {}
        if isinstance(pass_k, dict) and pass_k:  # each with its interval (summaries before it: none)
            stats["pass@k [95% CI]" if ci else "pass@k"] = ", ".join(
                f"pass@{k} {_interval(ci[k]) if k in ci else f'{v:.3f}'}"
                for k, v in pass_k.items()
                if isinstance(v, int | float)
            )
    return stats


def _run_rows(
    stats: dict[str, Any], run: dict[str, Any], cfg: dict[str, Any], facts: RunFacts
) -> list[tuple[str, str]]:
    env_rows = [
        (key, stats.get(key))
        for key in ("env", "agent", "items × group", "temperature", "max turns")
        if stats.get(key) is not None
    ]
    rows: list[tuple[str, Any]] = [
        *env_rows[:1],
        ("model", stats.get("model") or cfg.get("model")),
        *env_rows[1:],
        ("toolsets", _joined(cfg.get("toolsets") or stats.get("toolsets"))),
        ("distribution", cfg.get("distribution")),
        ("dataset", cfg.get("dataset")),
        ("sandbox", cfg.get("sandbox")),
        (
            "workers × concurrency",
            f"{cfg['workers']} × {cfg['concurrency']}" if "workers" in cfg and "concurrency" in cfg else None,
        ),
        ("created", run.get("created")),
        ("trajforge", run.get("trajforge_version")),
        ("finished", stats.get("finished")),
        (
            "samples done / total",
            f"{stats.get('total_done')} / {stats.get('total_prompts')}" if "total_done" in stats else None,
        ),
        ("duration", f"{stats['duration_s']} s" if "duration_s" in stats else None),
        ("status", ", ".join(f"{s}: {n:,}" for s, n in facts.status.most_common())),
    ]
    rows += [
        (key, stats.get(key))
        for key in ("mean reward [95% CI]", "pass@1 [95% CI]", "pass@k [95% CI]", "pass@k")
    ]
    coverage = stats.get("reasoning_coverage")
    if isinstance(coverage, dict) and "coverage" in coverage:
        rows.append(("assistant turns with reasoning", f"{coverage['coverage']:.1%}"))
    tokens = stats.get("tokens")
    if isinstance(tokens, dict) and tokens:
        rows.append(("tokens", ", ".join(f"{k}: {v:,}" for k, v in tokens.items() if isinstance(v, int))))
    sandboxes = stats.get("sandboxes")
    if isinstance(sandboxes, dict) and (sandboxes.get("created") or sandboxes.get("reused")):
        rows.append(("sandboxes", f"created {sandboxes.get('created')}, reused {sandboxes.get('reused')}"))
    rows.append(("report made", dt.datetime.now(dt.UTC).isoformat(timespec="seconds")))
    return [(k, str(v)) for k, v in rows if v not in (None, "")]
