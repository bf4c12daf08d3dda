"""Shard files (append-only, one per worker and session) and the merged outputs built from them.

Write path (group commit): finished samples queue up; one task appends them to the worker's
shard in a single ``write``, fsyncs, and only then commits them to the ledger in one
transaction. A crash between the two leaves bytes past the shard's committed end, which
:func:`repair_shards` truncates on resume. Nothing else ever writes a shard, and the merged
``trajectories.jsonl`` / ``failed.jsonl`` / ``filtered.jsonl`` are rebuilt from the ledger's
line locations and swapped in atomically, so every output file is always whole JSON lines.
:class:`OutputMerger` does that now and then while a run goes (so a long run's trajectories can
be read, and a killed run's files are at most one interval old) and once at the end.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from trajforge.batch.ledger import LEDGER_FILE, Commit, Ledger
from trajforge.batch.stats import Aggregate, SampleSummary

log = logging.getLogger(__name__)

SHARDS_DIR = "shards"
OUTPUT_FILES = {
    "completed": "trajectories.jsonl",
    "partial": "failed.jsonl",
    "failed": "failed.jsonl",
    "filtered": "filtered.jsonl",
}


class OutputError(RuntimeError):
    """The run directory cannot be written: not a directory, no permission, or a full disk.

    Its message is one line that names the path and says what to do. The ledger stays exact
    (a line is committed only after it is durable), so a run stopped by one resumes cleanly.
    """


# SQLite's primary result codes for the same conditions (``sqlite3.Error.sqlite_errorcode``).
_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_FULL, _SQLITE_CANTOPEN = 3, 8, 13, 14
_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}


def output_error(path: Path, exc: BaseException, *, resume: bool = True) -> OutputError:
    """A one-line :class:`OutputError` for ``exc`` (an ``OSError`` or a SQLite error) at ``path``.

    ``resume``: the run directory already holds this run's state, so the advice is to fix the
    problem and continue with ``--resume``."""
    if isinstance(exc, OutputError):
        return exc
    code = getattr(exc, "errno", None)
    lite = getattr(exc, "sqlite_errorcode", None)
    lite = lite & 0xFF if isinstance(lite, int) else None  # extended code -> primary code
    where = Path(getattr(exc, "filename", None) or path)
    then = ", then continue with --resume (finished samples are kept)" if resume else ""
    if code in _FULL or lite == _SQLITE_FULL:
        what = f"no space left on the device holding {where}"
        todo = f"free some space or choose another --output-dir{then}"
    elif code == errno.EROFS:
        what = f"cannot write to {where}: read-only file system"
        todo = f"choose another --output-dir{then}"
    elif code in _DENIED or lite in (_SQLITE_PERM, _SQLITE_READONLY):
        what = f"cannot write to {where}: permission denied"
        todo = f"make it writable for this user or choose another --output-dir{then}"
    elif code in (errno.ENOTDIR, errno.EEXIST):
        blocker = _file_in_the_way(where)
        what = f"{blocker} is not a directory"
        todo = "remove or rename that file, or choose another --output-dir"
    else:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        what = f"cannot write to {where}: {reason}"
        todo = f"check the output directory or choose another --output-dir{then}"
    return OutputError(f"{what}; {todo}".replace("\n", " "))


def _file_in_the_way(path: Path) -> Path:
    """The path itself or the first ancestor that exists but is not a directory."""
    for candidate in (path, *path.parents):
        try:
            if not candidate.is_dir() and candidate.exists():
                return candidate
        except OSError:
            continue
    return path


@contextmanager
def writing(path: Path, *, resume: bool = True) -> Iterator[None]:
    """Turn an ``OSError``/SQLite error raised while writing under ``path`` into an
    :class:`OutputError`."""
    try:
        yield
    except (OSError, sqlite3.OperationalError) as exc:
        raise output_error(path, exc, resume=resume) from exc


def open_ledger(run_dir: Path) -> Ledger:
    """The run directory's ledger; a directory that cannot hold it raises :class:`OutputError`."""
    with writing(run_dir / LEDGER_FILE):
        return Ledger(run_dir / LEDGER_FILE)


def find_output_error(exc: BaseException) -> OutputError | None:
    """The first :class:`OutputError` in ``exc``, looking inside (nested) exception groups."""
    if isinstance(exc, OutputError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = find_output_error(inner)
            if found is not None:
                return found
    return None


# Temp files of atomic rewrites in a run directory (``write_atomic``, ``merge_outputs``, the
# dataset index, the start-up probe): a crash can leave them; the next start removes them.
TEMP_PATTERNS = (".*.jsonl.tmp", ".*.json.tmp", ".dataset.index.*.tmp", ".trajforge-probe-*.tmp")


def remove_temp_files(run_dir: Path) -> list[Path]:
    """Remove temp files a crashed or failed run left in ``run_dir``. Call it only while holding
    the run lock (another run's temp files are in use). Returns what it removed."""
    removed = []
    for pattern in TEMP_PATTERNS:
        for path in run_dir.glob(pattern):
            with writing(path):
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


@dataclass(slots=True)
class Finished:
    """A sample's final line, ready to be made durable."""

    key: str
    status: str
    reason: str
    line: bytes
    summary: SampleSummary


class ShardWriter:
    """Makes finished samples durable: shard append + fsync, then one ledger transaction."""

    def __init__(
        self, ledger: Ledger, shard_path: Path, owner: str, *, fsync: bool = True, interval_s: float = 0.05
    ) -> None:
        self._ledger = ledger
        self._path = shard_path
        self._shard = shard_path.name
        with writing(shard_path):
            self._fd = os.open(shard_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        # Set when a flush failed: nothing more is written (the shard is back at its committed
        # end, or will be cut there by the next start's repair); pending samples run on resume.
        self._failed: OutputError | None = None
        self._end = os.fstat(self._fd).st_size
        self._owner = owner
        self._fsync = fsync
        self._interval = interval_s
        self._finished: list[Finished] = []
        self._starts: list[str] = []
        self._wake = asyncio.Event()
        self._closing = False
        self.aggregate = Aggregate()
        self.committed = 0
        # Set by the worker: its sandbox factory's counters (None: it keeps none), stored with
        # every commit.
        self.sandbox_counts: Callable[[], dict[str, int] | None] | None = None
        # A flush cancelled mid-way keeps running in its thread; the final flush waits for it.
        self._lock = threading.Lock()

    def started(self, key: str) -> None:
        """Record (lazily, in the next transaction) that a sample is running."""
        self._starts.append(key)
        self._wake.set()

    def submit(self, item: Finished) -> None:
        self._finished.append(item)
        self._wake.set()

    async def run(self) -> None:
        """The commit loop; returns after :meth:`close` once everything queued is durable."""
        try:
            while True:
                await self._wake.wait()
                if not self._closing:
                    await asyncio.sleep(self._interval)  # let more samples join this commit
                self._wake.clear()
                starts, self._starts = self._starts, []
                batch, self._finished = self._finished, []
                # The closing pass always commits: it also stores the final statistics (the
                # sandbox counters move after the last sample, while its sandbox is reset).
                if starts or batch or self._closing:
                    await asyncio.to_thread(self._flush, starts, batch)
                if self._closing and not self._starts and not self._finished:
                    return
        finally:
            # Cancelled mid-way: what is queued is still complete data; make it durable.
            if (self._starts or self._finished) and self._failed is None:
                starts, self._starts = self._starts, []
                batch, self._finished = self._finished, []
                self._flush(starts, batch)
            with self._lock:
                os.close(self._fd)

    def close(self) -> None:
        self._closing = True
        self._wake.set()

    def finish_sync(self) -> None:
        """Make everything queued durable and close the shard, without an event loop (for
        callers that commit before any worker runs)."""
        starts, self._starts = self._starts, []
        batch, self._finished = self._finished, []
        self._flush(starts, batch)
        with self._lock:
            os.close(self._fd)

    def _flush(self, starts: list[str], batch: list[Finished]) -> None:
        with self._lock:
            self._flush_locked(starts, batch)

    def _flush_locked(self, starts: list[str], batch: list[Finished]) -> None:
        if self._failed is not None:
            raise self._failed
        committed_end = self._end
        try:
            self._write_and_commit(starts, batch)
        except (OSError, sqlite3.OperationalError) as exc:
            # Lines past the committed end belong to no sample: cut them now so the shard stays
            # exact (if this fails too, the next start's repair_shards cuts them).
            self._end = committed_end
            with suppress(OSError):
                os.ftruncate(self._fd, committed_end)
            failed_at = self._ledger.path if isinstance(exc, sqlite3.Error) else self._path
            self._failed = output_error(failed_at, exc)
            raise self._failed from exc

    def _write_and_commit(self, starts: list[str], batch: list[Finished]) -> None:
        commits: list[Commit] = []
        if batch:
            self._append(b"".join(item.line for item in batch))
            commits = self._commits(batch)
        counts = self.sandbox_counts() if self.sandbox_counts is not None else None
        if counts is not None:
            self.aggregate.sandboxes = Counter(counts)
        self._ledger.commit(self._shard, self._end, commits, starts, self._owner, self.aggregate.to_bytes())
        self.committed += len(commits)

    def _append(self, buf: bytes) -> None:
        """Write ``buf`` at the shard's end (and fsync it, unless told not to)."""
        view = memoryview(buf)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        if self._fsync:
            os.fsync(self._fd)

    def _commits(self, batch: list[Finished]) -> list[Commit]:
        """The ledger rows of the lines just appended at the committed end; moves that end (the
        ledger makes it durable) and adds the samples to the statistics."""
        commits, off = [], self._end
        for item in batch:
            s = item.summary
            timings = orjson.dumps({"wall_s": s.wall_s, "model_s": s.model_s, "tool_s": s.tool_s})
            line = len(item.line)
            commits.append(
                Commit(
                    item.key,
                    item.status,
                    item.reason,
                    off,
                    line,
                    s.finished_at,
                    orjson.dumps(s.usage),
                    timings,
                )
            )
            off += line
            self.aggregate.add(s)
        self._end = off
        return commits


def repair_shards(run_dir: Path, ledger: Ledger) -> dict[str, int]:
    """Make shards agree with the ledger after a crash. Returns {shard: bytes truncated}.

    Bytes past a shard's committed end belong to samples the ledger does not show as done (a
    torn last line, or lines written just before a kill): they are cut, and those samples run
    again. A shard shorter than its committed end (only possible after a power cut with fsync
    off) sends the samples it lost back to pending.
    """
    shard_dir = run_dir / SHARDS_DIR
    ends = ledger.committed_ends()
    cut: dict[str, int] = {}
    for path in sorted(shard_dir.glob("*.jsonl")) if shard_dir.exists() else []:
        end = ends.get(path.name, 0)
        size = path.stat().st_size
        if size > end:
            with open(path, "r+b") as fh:
                fh.truncate(end)
                fh.flush()
                os.fsync(fh.fileno())
            cut[path.name] = size - end
        elif size < end:
            ledger.reset_beyond(path.name, size)
    for name in ends:
        if not (shard_dir / name).exists():
            ledger.reset_beyond(name, 0)
    return cut


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file + rename, so readers never see half a file.

    A failure (disk full, ...) removes the temp file and raises :class:`OutputError`."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        _discard(tmp)
        raise output_error(path, exc) from exc


def _discard(path: Path) -> None:
    with suppress(OSError):  # else the next start removes it (remove_temp_files)
        path.unlink(missing_ok=True)


def merge_outputs(run_dir: Path, ledger: Ledger) -> dict[str, int]:
    """Rebuild the merged output files from the ledger, in dataset order. Returns line counts."""
    names = sorted(set(OUTPUT_FILES.values()))
    tmps = {name: run_dir / f".{name}.tmp" for name in names}
    try:
        counts = _write_merged(run_dir, ledger, tmps)
        for name in names:
            os.replace(tmps[name], run_dir / name)
    except (OSError, sqlite3.OperationalError) as exc:
        for tmp in tmps.values():
            _discard(tmp)
        raise output_error(run_dir, exc) from exc
    except BaseException:
        for tmp in tmps.values():
            _discard(tmp)
        raise
    return counts


def _write_merged(run_dir: Path, ledger: Ledger, tmps: dict[str, Path]) -> dict[str, int]:
    shard_dir = run_dir / SHARDS_DIR
    names = list(tmps)
    outs: dict[str, Any] = {}
    fds: dict[str, int] = {}
    counts = dict.fromkeys(names, 0)
    try:
        for name in names:
            outs[name] = open(tmps[name], "wb", buffering=1 << 20)  # noqa: SIM115
        for loc in ledger.stored_lines():
            fd = fds.get(loc.shard)
            if fd is None:
                fd = fds[loc.shard] = os.open(shard_dir / loc.shard, os.O_RDONLY)
            data = os.pread(fd, loc.length, loc.off)
            if len(data) != loc.length or not data.endswith(b"\n"):
                raise RuntimeError(
                    f"shard {loc.shard} is damaged at byte {loc.off}; run with --resume to repair it"
                )
            name = OUTPUT_FILES[loc.state]
            outs[name].write(data)
            counts[name] += 1
        for fh in outs.values():
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        for fh in outs.values():
            with suppress(OSError):  # after an error only: on success all was fsynced above
                fh.close()
        for fd in fds.values():
            os.close(fd)
    return counts


class OutputMerger:
    """Rebuilds the merged output files of one run directory, while it runs and at its end.

    Why periodic rather than appending each line as it commits: the files are in dataset order
    (the reference's order, and what a resumed run must reproduce), which completion order is not.
    A rebuild rewrites every committed line (~3 s for a million short ones), so the pause between
    rebuilds grows with their cost -- busy at most ``duty`` of the time, CPU and disk alike -- and
    nothing is rewritten when nothing was committed since. (The shards under ``shards/`` are the
    live, append-only view in completion order.) Rebuilds never overlap (a lock), so the final one
    waits for a periodic one still running in its thread.
    """

    def __init__(
        self, run_dir: Path, ledger_path: Path, *, min_interval_s: float, duty: float = 0.05
    ) -> None:
        self.run_dir = run_dir
        self.ledger_path = ledger_path
        self.min_interval_s = min_interval_s
        self.duty = duty
        self.rebuilds = 0
        self._lock = threading.Lock()
        self._version: dict[str, int] | None = None

    def merge(self) -> dict[str, int]:
        """One rebuild (blocking); returns the line count of each file."""
        counts = self._merge(only_if_changed=False)
        assert counts is not None
        return counts

    def refresh(self) -> bool:
        """Rebuild unless no line was committed since the last rebuild; True if it rebuilt."""
        return self._merge(only_if_changed=True) is not None

    def _merge(self, *, only_if_changed: bool) -> dict[str, int] | None:
        with self._lock:
            ledger = Ledger(self.ledger_path)
            try:
                version = ledger.committed_ends()  # moves with every commit of a line
                if only_if_changed and version == self._version:
                    return None
                counts = merge_outputs(self.run_dir, ledger)
            finally:
                ledger.close()
            self._version = version
            self.rebuilds += 1
            return counts

    async def keep_current(self) -> None:
        """Rebuild every ``min_interval_s`` (or longer, see ``duty``) until cancelled. A failed
        periodic rebuild is logged and retried later; the final :meth:`merge` reports errors."""
        interval = self.min_interval_s
        while True:
            await asyncio.sleep(interval)
            started = time.monotonic()
            try:
                await asyncio.to_thread(self.refresh)
            except (OSError, RuntimeError) as exc:
                log.warning("could not refresh the merged output files in %s: %s", self.run_dir, exc)
            interval = max(self.min_interval_s, (time.monotonic() - started) / self.duty)
