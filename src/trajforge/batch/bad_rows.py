"""Bad dataset rows are samples too: recorded failed with their reason, never silently skipped."""

from __future__ import annotations

from trajforge.batch.config import BatchConfig
from trajforge.batch.dataset import BadRow
from trajforge.batch.ledger import Ledger
from trajforge.batch.records import bad_row_line
from trajforge.batch.writer import SHARDS_DIR, Finished, ShardWriter


def commit_bad_rows(
    cfg: BatchConfig, ledger: Ledger, rows: list[BadRow], session: int, run_tools: list[str]
) -> None:
    """Commit each bad row as a failed sample (reason ``bad_row: ...``) in this session's shard."""
    if not rows:
        return
    owner = f"s{session:04d}-bad"
    writer = ShardWriter(ledger, cfg.run_dir / SHARDS_DIR / f"{owner}.jsonl", owner, fsync=cfg.fsync)
    for row in rows:
        line, summary = bad_row_line(
            row, model=cfg.model, env=cfg.env, run_tools=run_tools, samples_per_prompt=cfg.samples_per_prompt
        )
        writer.submit(Finished(row.key, "failed", f"bad_row: {row.reason}", line, summary))
    writer.finish_sync()
