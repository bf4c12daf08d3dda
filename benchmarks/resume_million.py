"""How long does ``--resume`` take to start when the ledger already holds 1,000,000 done samples?

Builds a run directory whose ledger and shard say 1,000,000 samples are completed, appends
``--new`` fresh prompts to the dataset, then resumes with a real endpoint (scripted, loopback)
and a real sandbox. Prints the time from calling ``run_batch`` until the first new sample's
sandbox is created (the resume start-up: dataset parse + keys, ledger scan, shard repair), and
the total time including the final merge of the million lines into trajectories.jsonl.

    .venv/bin/python benchmarks/resume_million.py [--samples 1000000] [--new 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from trajforge.batch.config import load_config
from trajforge.batch.dataset import load_dataset
from trajforge.batch.ledger import Commit, Ledger
from trajforge.batch.runner import run_batch
from trajforge.batch.stats import Aggregate
from trajforge.sandbox import create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.testing.scripted_server import ScriptedServer, echo_policy


class _FirstCreate:
    """A real local sandbox factory that notes when the first sample's sandbox is created."""

    def __init__(self) -> None:
        self.inner = create_sandbox_factory(SandboxConfig(kind="local"))
        self.first: float | None = None

    async def create(self, task_id: str, **kw: Any) -> Any:
        if task_id != "trajforge-preflight" and self.first is None:
            self.first = time.perf_counter()
        return await self.inner.create(task_id, **kw)


def _build(tmp: Path, n: int, new: int) -> tuple[Path, Path]:
    dataset = tmp / "prompts.jsonl"
    with open(dataset, "wb") as fh:
        for i in range(n + new):
            fh.write(orjson.dumps({"prompt": f"task number {i}"}) + b"\n")
    done = load_dataset(dataset).samples[:n]
    run_dir = tmp / "data" / "million"
    (run_dir / "shards").mkdir(parents=True)
    ledger = Ledger(run_dir / "ledger.sqlite")
    ledger.next_session()
    ledger.add_pending((s.key, s.index) for s in done)
    shard = run_dir / "shards" / "s0001-w000.jsonl"
    commits, off = [], 0
    with open(shard, "wb") as fh:
        for s in done:
            line = orjson.dumps({"prompt_index": s.index, "key": s.key, "status": "completed"}) + b"\n"
            fh.write(line)
            commits.append(Commit(s.key, "completed", "final_answer", off, len(line), 0.0, b"{}", b"{}"))
            off += len(line)
    agg = Aggregate()
    agg.status["completed"] = n
    ledger.commit(shard.name, off, commits, [], "s0001-w000", agg.to_bytes())
    ledger.close()
    return dataset, run_dir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--new", type=int, default=20)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tf-million-"))
    try:
        t0 = time.perf_counter()
        dataset, run_dir = _build(tmp, args.samples, args.new)
        print(f"built a run with {args.samples:,} completed samples in {time.perf_counter() - t0:.1f}s")
        os.environ.setdefault("BENCH_KEY", "unused")
        with ScriptedServer(echo_policy).in_thread() as srv:
            cfg = load_config(
                None,
                {
                    "dataset": dataset,
                    "run_name": "million",
                    "output_dir": tmp / "data",
                    "model": "scripted",
                    "base_url": srv.base_url,
                    "api_key_env": "BENCH_KEY",
                    "toolsets": ["terminal"],
                    "sandbox": "local",
                    "resume": True,
                    "require_reasoning": False,
                    "progress": "none",
                },
            )
            factory = _FirstCreate()
            start = time.perf_counter()
            summary = asyncio.run(run_batch(cfg, sandbox_factory=factory))
            total = time.perf_counter() - start
        assert factory.first is not None
        stats = summary.statistics
        print(
            orjson.dumps(
                {
                    "completed_in_ledger": args.samples,
                    "new_samples": args.new,
                    "resume_start_s": round(factory.first - start, 2),
                    "total_with_merge_s": round(total, 2),
                    "status_counts": stats["status_counts"],
                    "trajectories_lines": summary.output_counts["trajectories.jsonl"],
                },
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
