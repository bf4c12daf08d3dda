"""Bad dataset rows are samples too: recorded failed with their reason, never silently skipped."""

from __future__ import annotations

import time

from trajforge.batch.config import BatchConfig
from trajforge.batch.dataset import BadRow
from trajforge.batch.ledger import Ledger
from trajforge.batch.records import Outcome, SampleFacts, build_line, not_judged
from trajforge.batch.writer import SHARDS_DIR, Finished, ShardWriter


def commit_bad_rows(
    cfg: BatchConfig, ledger: Ledger, rows: list[BadRow], session: int, run_tools: list[str]
) -> None:
    """Commit each bad row as a failed sample (reason ``bad_row: ...``) in this session's shard."""
    if not rows:
        return
    owner = f"s{session:04d}-bad"
    writer = ShardWriter(ledger, cfg.run_dir / SHARDS_DIR / f"{owner}.jsonl", owner, fsync=cfg.fsync)
    now = time.time()
    for row in rows:
        outcome = Outcome("failed", f"bad_row: {row.reason}", "bad_row")
        facts = SampleFacts([], 0, now, now, -1, 0, cfg.samples_per_prompt)
        line, summary = build_line(
            row, outcome, None, facts, model=cfg.model, run_tools=run_tools, grading=not_judged(cfg, outcome)
        )
        writer.submit(Finished(row.key, "failed", outcome.reason, line, summary))
    writer.finish_sync()
