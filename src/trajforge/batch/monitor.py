"""While a run goes: durable progress read from the ledger, ``statistics.json``, the display."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import orjson

from trajforge.batch.config import BatchConfig
from trajforge.batch.progress import ProgressSink, Snapshot
from trajforge.batch.stats import Aggregate, RunLabel, build_statistics, merge_all
from trajforge.batch.writer import open_ledger, write_atomic

STATS_FILE = "statistics.json"


class Monitor:
    """Reads durable progress from the ledger; writes statistics.json; feeds the display."""

    def __init__(
        self, cfg: BatchConfig, total: int, session: int, progress: ProgressSink, activity: Any = None
    ) -> None:
        self.stats_path = cfg.run_dir / STATS_FILE
        self.label = RunLabel(cfg.run_name, cfg.model, cfg.distribution_name, cfg.toolsets)
        self.total = total
        self.prefix = f"s{session:04d}-"
        self.progress = progress
        self.started = time.monotonic()
        self.ledger = open_ledger(cfg.run_dir)
        self.last: Snapshot | None = None
        self.activity = activity  # scheduler.Activity of an in-process worker, else None
        # A refresh cancelled mid-way keeps running in its thread; the final one waits for it.
        self._lock = threading.Lock()

    def refresh(self, finished: bool = False) -> dict[str, Any]:
        with self._lock:
            return self._refresh(finished)

    def _refresh(self, finished: bool) -> dict[str, Any]:
        raws = self.ledger.aggregates()
        agg = merge_all(raws)
        session = merge_all(raws, self.prefix)
        elapsed = time.monotonic() - self.started
        stats = build_statistics(
            agg, session, self.label, total_samples=self.total, session_elapsed_s=elapsed, finished=finished
        )
        write_atomic(self.stats_path, orjson.dumps(stats, option=orjson.OPT_INDENT_2))
        self.last = _snapshot(agg, session, self.total, elapsed)
        self.last.activity = self.activity.text() if self.activity is not None else ""
        self.progress.update(self.last)
        return stats

    async def watch(self, interval_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await asyncio.to_thread(self.refresh)

    def close(self) -> None:
        """Close the ledger and the display (showing the last snapshot)."""
        try:
            self.ledger.close()
        finally:
            self.progress.close(self.last)


def _snapshot(agg: Aggregate, session: Aggregate, total: int, elapsed: float) -> Snapshot:
    s = agg.status
    return Snapshot(
        total=total,
        completed=s.get("completed", 0),
        failed=s.get("failed", 0),
        partial=s.get("partial", 0),
        filtered=s.get("filtered", 0),
        session_done=session.done,
        elapsed_s=elapsed,
        tokens=agg.tokens.get("total_tokens", 0),
    )
