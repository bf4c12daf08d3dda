"""The run directory as the report sees it: which files, and their lines one at a time.

The names are the batch factory's (``batch.writer.OUTPUT_FILES``, ``statistics.json``,
``run.json``) and an env run's (``engine.books.EPISODES_FILE``); they are repeated here rather than imported so that the report stays on the
ground floor, and ``tests/test_report_units.py`` checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from trajforge.record.runs import kind_problem

OUTPUT_FILES = ("trajectories.jsonl", "filtered.jsonl", "failed.jsonl", "episodes.jsonl")
STATISTICS_FILE = "statistics.json"
RUN_FILE = "run.json"
ENV_STATUS_FILE = "status.json"  # an env run's progress (engine.books.STATUS_FILE)
SUMMARY_FILE = "summary.json"  # an env run's results (engine.books.SUMMARY_FILE)


class ReportError(RuntimeError):
    """The directory is not a run directory (or cannot be read); the message says which path."""


@dataclass(frozen=True, slots=True)
class LineRef:
    """Where one line lives, so a sampled line is read again without keeping it in memory."""

    file: int  # index into OUTPUT_FILES
    offset: int
    length: int


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when absent or not an object (a report still renders)."""
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def output_paths(run_dir: Path) -> list[Path | None]:
    """Each of OUTPUT_FILES under ``run_dir`` (None where absent); raises when none exists."""
    problem = kind_problem(run_dir, ("batch", "env eval"), "report reads the samples of")
    if problem is not None:
        raise ReportError(problem)
    paths = [run_dir / name if (run_dir / name).is_file() else None for name in OUTPUT_FILES]
    if not any(paths):
        raise ReportError(
            f"{run_dir} holds none of {', '.join(OUTPUT_FILES)}; pass a run directory written by "
            "`trajforge batch` or an env run (a running batch writes them every merge interval)"
        )
    return paths


def iter_lines(paths: list[Path | None]) -> Iterator[tuple[LineRef, dict[str, Any] | None]]:
    """(where, parsed line) for every non-blank line; a line that is not a JSON object gives None."""
    for file_index, path in enumerate(paths):
        if path is None:
            continue
        offset = 0
        with path.open("rb") as fh:
            for raw in fh:
                ref = LineRef(file_index, offset, len(raw))
                offset += len(raw)
                if not raw.strip():
                    continue
                try:
                    line = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    yield ref, None
                    continue
                yield ref, line if isinstance(line, dict) else None


def read_lines(paths: list[Path | None], refs: list[LineRef]) -> Iterator[tuple[LineRef, dict[str, Any]]]:
    """The lines at ``refs`` (read in file order, one seek each)."""
    by_file: dict[int, list[LineRef]] = {}
    for ref in refs:
        by_file.setdefault(ref.file, []).append(ref)
    for file_index, chosen in sorted(by_file.items()):
        path = paths[file_index]
        assert path is not None
        with path.open("rb") as fh:
            for ref in sorted(chosen, key=lambda r: r.offset):
                fh.seek(ref.offset)
                line = orjson.loads(fh.read(ref.length))
                yield ref, line
