"""The durable ledger: one SQLite database per run directory (WAL mode).

It is the single source of truth for "is this sample done". A record line is appended (and
fsynced) to a shard file *before* the transaction that marks its sample done; that transaction
also moves the shard's committed end and the writer's statistics, so after a ``kill -9`` the
ledger, the shards and the statistics agree: bytes past a shard's committed end are uncommitted
and are truncated on resume, and their samples (still pending/running) run again.

A sample's key and dataset index change only in :meth:`Ledger.add_pending`, which also stores the
:class:`PlanMark` of the dataset rows it registered; :mod:`trajforge.batch.plan` relies on that to
resume without reading back every done sample.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

LEDGER_FILE = "ledger.sqlite"  # in the run directory
DONE_STATES = frozenset({"completed", "partial", "failed", "filtered"})
ALL_STATES = ("pending", "running", *sorted(DONE_STATES))
# Samples still to do. Spelled out literally: SQLite uses the partial index below only for a
# query whose WHERE clause is this very expression.
_OPEN = "state IN ('pending', 'running')"
_LOOKUP_CHUNK = 500
_BULK_CACHE_KIB = -65536  # negative: KiB, not pages (64 MiB)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    key TEXT PRIMARY KEY,
    idx INTEGER NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    reason TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    shard TEXT,
    off INTEGER,
    len INTEGER,
    started REAL,
    finished REAL,
    usage TEXT,
    timings TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS samples_open ON samples(idx) WHERE state IN ('pending', 'running');
CREATE TABLE IF NOT EXISTS shards (name TEXT PRIMARY KEY, committed_end INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS aggregates (owner TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
"""


@dataclass(slots=True, frozen=True)
class PlanMark:
    """The dataset rows the last plan registered: ``rows`` rows whose keys, in order, have the
    fingerprint ``keys`` (see :meth:`trajforge.batch.dataset.DatasetIndex.fingerprint`)."""

    rows: int
    keys: str


@dataclass(slots=True)
class Commit:
    """A finished sample whose line sits at ``shard[off:off+len]``."""

    key: str
    state: str
    reason: str
    off: int
    length: int
    finished: float
    usage: bytes
    timings: bytes


@dataclass(slots=True)
class StoredLine:
    index: int
    state: str
    shard: str
    off: int
    length: int


class Ledger:
    """A connection to a run's ledger. One per process; not shared between threads at once."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._db = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL is crash-safe against process death (kill -9) in WAL mode; shard lines are
        # fsynced before commit, so a power cut can only lose commits, never committed lines.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    # -- meta -------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT v FROM meta WHERE k=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta(k, v) VALUES (?, ?)", (key, value))

    def next_session(self) -> int:
        """A new session number (one per start or resume); shards are named after it."""
        session = int(self.get_meta("sessions") or "0") + 1
        self.set_meta("sessions", str(session))
        return session

    # -- samples ----------------------------------------------------------------------------
    def states(self) -> dict[str, str]:
        """key -> state for every sample known to the ledger."""
        return dict(self._db.execute("SELECT key, state FROM samples"))

    def done_samples(self) -> tuple[list[str], list[int]]:
        """(keys, indexes) of every sample in a done state, as two aligned lists: SQLite joins
        them into two strings, so a million rows cost no per-row Python objects but the keys."""
        marks = ",".join("?" * len(DONE_STATES))
        keys, idxs = self._db.execute(
            f"SELECT group_concat(key, char(10)), group_concat(idx) FROM samples WHERE state IN ({marks})",
            tuple(DONE_STATES),
        ).fetchone()
        if keys is None:
            return [], []
        return keys.split("\n"), [int(i) for i in idxs.split(",")]

    def open_samples(self) -> list[tuple[str, int]]:
        """(key, index) of every pending or running sample (read through a partial index, so a
        ledger of a million done samples is not scanned)."""
        return self._db.execute(f"SELECT key, idx FROM samples WHERE {_OPEN}").fetchall()

    def find(self, keys: Sequence[str]) -> dict[str, tuple[int, bool]]:
        """key -> (index, done) for those of ``keys`` the ledger knows."""
        found: dict[str, tuple[int, bool]] = {}
        for i in range(0, len(keys), _LOOKUP_CHUNK):
            chunk = keys[i : i + _LOOKUP_CHUNK]
            marks = ",".join("?" * len(chunk))
            for key, idx, state in self._db.execute(
                f"SELECT key, idx, state FROM samples WHERE key IN ({marks})", tuple(chunk)
            ):
                found[key] = (idx, state in DONE_STATES)
        return found

    def plan_mark(self) -> PlanMark | None:
        raw = self.get_meta("plan")
        try:
            data = orjson.loads(raw) if raw else None
            return PlanMark(int(data["rows"]), str(data["keys"])) if isinstance(data, dict) else None
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None  # unreadable: the planner falls back to the full comparison

    def add_pending(self, rows: Iterable[tuple[str, int]], mark: PlanMark | None = None) -> None:
        """Register (key, index) samples as pending (already-known keys get their new index).

        ``mark`` describes the dataset rows these upserts leave the ledger agreeing with; it is
        stored in the same transaction, so it never describes rows that were not registered."""
        # Keys arrive in dataset order, i.e. at random places in the key-ordered table: with the
        # default 2 MiB page cache a million inserts thrash it (twice as slow). Pages are only
        # allocated as needed, and the cache shrinks back afterwards.
        (default,) = self._db.execute("PRAGMA cache_size").fetchone()
        self._db.execute(f"PRAGMA cache_size={_BULK_CACHE_KIB}")
        try:
            with self._tx():
                self._db.executemany(
                    "INSERT INTO samples(key, idx) VALUES (?, ?) "
                    "ON CONFLICT(key) DO UPDATE SET idx=excluded.idx",
                    rows,
                )
                if mark is not None:
                    self.set_meta("plan", orjson.dumps({"rows": mark.rows, "keys": mark.keys}).decode())
        finally:
            self._db.execute(f"PRAGMA cache_size={int(default)}")

    def mark_running(self, keys: Iterable[str], now: float | None = None) -> None:
        now = time.time() if now is None else now
        self._db.executemany(
            "UPDATE samples SET state='running', attempts=attempts+1, started=? WHERE key=?",
            ((now, k) for k in keys),
        )

    def commit(
        self, shard: str, end: int, commits: list[Commit], starts: list[str], owner: str, aggregate: bytes
    ) -> None:
        """Atomically: mark ``starts`` running, ``commits`` done at their shard offsets, move the
        shard's committed end, and store the writer's statistics."""
        now = time.time()
        with self._tx():
            if starts:
                self.mark_running(starts, now)
            if commits:
                self._db.executemany(
                    "UPDATE samples SET state=?, reason=?, shard=?, off=?, len=?, finished=?, usage=?, "
                    "timings=? WHERE key=?",
                    (
                        (c.state, c.reason, shard, c.off, c.length, c.finished, c.usage, c.timings, c.key)
                        for c in commits
                    ),
                )
                self._db.execute(
                    "INSERT OR REPLACE INTO shards(name, committed_end) VALUES (?, ?)", (shard, end)
                )
            self._db.execute(
                "INSERT OR REPLACE INTO aggregates(owner, data) VALUES (?, ?)", (owner, aggregate)
            )

    def committed_ends(self) -> dict[str, int]:
        return dict(self._db.execute("SELECT name, committed_end FROM shards"))

    def reset_beyond(self, shard: str, size: int) -> int:
        """Samples whose line lies past ``size`` in ``shard`` (lost in a power cut) go back to
        pending. Returns how many."""
        with self._tx():
            cur = self._db.execute(
                "UPDATE samples SET state='pending', shard=NULL, off=NULL, len=NULL "
                "WHERE shard=? AND off+len>?",
                (shard, size),
            )
            self._db.execute("UPDATE shards SET committed_end=? WHERE name=?", (size, shard))
        return cur.rowcount

    def stored_lines(self) -> Iterator[StoredLine]:
        """Every done sample's line location, in dataset order."""
        cur = self._db.execute(
            "SELECT idx, state, shard, off, len FROM samples WHERE shard IS NOT NULL ORDER BY idx, key"
        )
        for idx, state, shard, off, length in cur:
            yield StoredLine(idx, state, shard, off, length)

    def aggregates(self) -> dict[str, bytes]:
        return dict(self._db.execute("SELECT owner, data FROM aggregates"))

    def sample(self, key: str) -> dict[str, object] | None:
        cur = self._db.execute("SELECT * FROM samples WHERE key=?", (key,))
        row = cur.fetchone()
        if row is None:
            return None
        out = dict(zip([d[0] for d in cur.description], row, strict=True))
        for field in ("usage", "timings"):
            if out.get(field):
                out[field] = orjson.loads(out[field])
        return out

    # -- helpers ----------------------------------------------------------------------------
    def _tx(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (rollback on error): takes the write lock up front so
    concurrent worker processes queue on busy_timeout instead of failing mid-transaction."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
