"""``run.json``: what a run directory holds a run of (config, tools, rows), written once.

A resume must draw the same toolsets and pad the same tool columns as the run it continues;
otherwise old and new lines would disagree (and one file hold two schemas).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import orjson

import trajforge
from trajforge.batch.config import BatchConfig
from trajforge.batch.errors import RunError
from trajforge.batch.prepare import Prepared
from trajforge.batch.writer import write_atomic

RUN_FILE = "run.json"
# What a line is: which toolsets it draws, which samples exist, and how it is graded (a resume
# with another --env would leave one file graded two ways).
_SAMPLE_DEFINING = ("distribution", "toolsets", "seed", "samples_per_prompt", "env")


def check_same_run(cfg: BatchConfig, run_dir: Path) -> None:
    """Refuse to resume with settings that change which toolsets a sample draws, which samples
    there are, or how lines are graded."""
    path = run_dir / RUN_FILE
    if not path.exists():
        return
    saved = orjson.loads(path.read_bytes()).get("config", {})
    now = cfg.public_dict()
    changed = [k for k in _SAMPLE_DEFINING if saved.get(k) != now.get(k)]
    if changed:
        diffs = ", ".join(f"--{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise RunError(
            f"cannot resume {run_dir} with different sampling settings ({diffs}); use the original "
            "values or start a new --run-name"
        )


def write_run_file(cfg: BatchConfig, prep: Prepared, run_dir: Path) -> None:
    """Write ``run.json`` unless the directory already has one (a resume keeps the first)."""
    if (run_dir / RUN_FILE).exists():
        return
    info = {
        "trajforge_version": trajforge.__version__,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "config": cfg.public_dict(),
        "run_tools": prep.run_tools,
        "tools": prep.tool_schemas,
        "total_rows": prep.rows.total_rows,
        "total_samples": prep.dataset.total_rows,
    }
    write_atomic(run_dir / RUN_FILE, orjson.dumps(info, option=orjson.OPT_INDENT_2))


def recorded_model(run_dir: Path) -> str | None:
    """The model a run's samples came from, as its statistics (else its ``run.json``) name it: what a
    resume that starts no model server (nothing left to run) keeps saying."""
    for name in ("statistics.json", RUN_FILE):
        try:
            data = orjson.loads((run_dir / name).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if not isinstance(data, dict):
            continue
        model = data.get("model") if name != RUN_FILE else (data.get("config") or {}).get("model")
        if isinstance(model, str) and model:
            return model
    return None
