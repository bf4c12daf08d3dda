"""Checks of the run directory before anything starts: not someone else's run, and writable.

Neither leaves anything behind: a run that fails them has created no file.
"""

from __future__ import annotations

import os
from pathlib import Path

from trajforge.batch.config import BatchConfig
from trajforge.batch.errors import RunError
from trajforge.batch.ledger import LEDGER_FILE
from trajforge.batch.writer import output_error
from trajforge.record.runs import kind_problem, run_kind


def check_run_dir(cfg: BatchConfig) -> None:
    """A new run needs a new (or empty) directory; an existing run continues only with --resume."""
    run_dir = cfg.run_dir
    if not run_dir.exists():
        return
    kind = run_kind(run_dir)
    if kind is not None and kind != "batch":  # never write a batch's files into another run
        raise RunError(kind_problem(run_dir, ("batch",), "choose another --run-name / --output-dir") or "")
    if cfg.resume:
        return
    if (run_dir / LEDGER_FILE).exists():
        raise RunError(
            f"{run_dir} already holds a run; pass --resume to continue it, "
            "or choose another --run-name / --output-dir"
        )
    if any(run_dir.iterdir()):
        raise RunError(f"{run_dir} exists and is not empty; choose another --run-name or empty it")


def check_output_dir(cfg: BatchConfig) -> None:
    """Fail fast, before any endpoint or sandbox starts, on an output directory that cannot be
    written: a file in the way, no permission, a read-only or full file system. Creates nothing
    that stays: a probe file goes into the run directory or, while that does not exist yet, into
    its nearest existing ancestor, and is removed at once."""
    target = _nearest_existing(cfg.run_dir)
    if not target.is_dir():
        raise RunError(
            f"{target} is not a directory; remove or rename that file, or choose another --output-dir"
        )
    try:
        _write_probe(target / f".trajforge-probe-{os.getpid()}.tmp")
    except OSError as exc:  # named after the directory, not the probe
        bare = OSError(exc.errno, exc.strerror)
        raise RunError(str(output_error(target, bare, resume=False))) from None


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (whatever it is)."""
    while True:
        try:
            os.stat(path)
            return path
        except (FileNotFoundError, NotADirectoryError):
            if path.parent == path:
                return path
            path = path.parent
        except OSError as exc:
            raise RunError(str(output_error(path, exc, resume=False))) from None


def _write_probe(probe: Path) -> None:
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, b"trajforge\n")
        os.fsync(fd)
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
