"""How long does ``--resume`` take to start when the ledger already holds 1,000,000 done samples?

Builds a run directory the way a finished run leaves it (planned by the runner's own planner,
dataset index saved, ledger and shard saying 1,000,000 samples are completed), appends ``--new``
fresh prompts to the dataset, then resumes with a real endpoint (scripted, loopback) and a real
sandbox. Prints the time from calling ``run_batch`` until the first new sample's sandbox is
created (the resume start-up: dataset keys, ledger comparison, shard repair), and the total time
including the final merge of the million lines into trajectories.jsonl.

``--cold`` deletes the saved dataset index and the ledger's plan mark first: the start-up of a
run made by an older trajforge, or whose dataset was edited near the top (full parse and full
comparison).

    .venv/bin/python benchmarks/resume_million.py [--samples 1000000] [--new 20] [--cold]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).parent))
from _endpoint import KEY_VAR, scripted_endpoint  # noqa: E402

from trajforge.batch.config import load_config  # noqa: E402
from trajforge.batch.dataset import INDEX_FILE, index_dataset, save_index
from trajforge.batch.ledger import Commit, Ledger
from trajforge.batch.plan import plan_run
from trajforge.batch.runner import run_batch
from trajforge.batch.stats import Aggregate
from trajforge.sandbox import create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig


class _FirstCreate:
    """A real local sandbox factory that notes when the first sample's sandbox is created."""

    def __init__(self) -> None:
        self.inner = create_sandbox_factory(SandboxConfig(kind="local"))
        self.first: float | None = None

    async def create(self, task_id: str, **kw: Any) -> Any:
        if task_id != "trajforge-preflight" and self.first is None:
            self.first = time.perf_counter()
        return await self.inner.create(task_id, **kw)


def _prompts(start: int, stop: int) -> bytes:
    return b"".join(orjson.dumps({"prompt": f"task number {i}"}) + b"\n" for i in range(start, stop))


def _build(tmp: Path, n: int, new: int, cold: bool) -> tuple[Path, Path]:
    dataset = tmp / "prompts.jsonl"
    dataset.write_bytes(_prompts(0, n))
    run_dir = tmp / "data" / "million"
    (run_dir / "shards").mkdir(parents=True)
    ledger = Ledger(run_dir / "ledger.sqlite")
    ledger.next_session()
    index = index_dataset(dataset)
    plan = plan_run(ledger, index)  # what the first session of the run did
    ledger.add_pending(plan.upserts, plan.mark)
    save_index(index, run_dir / INDEX_FILE)
    shard = run_dir / "shards" / "s0001-w000.jsonl"
    commits, off = [], 0
    with open(shard, "wb") as fh:
        for s in plan.todo:
            line = orjson.dumps({"prompt_index": s.index, "key": s.key, "status": "completed"}) + b"\n"
            fh.write(line)
            commits.append(Commit(s.key, "completed", "final_answer", off, len(line), 0.0, b"{}", b"{}"))
            off += len(line)
    agg = Aggregate()
    agg.status["completed"] = n
    ledger.commit(shard.name, off, commits, [], "s0001-w000", agg.to_bytes())
    if cold:
        ledger.set_meta("plan", "")
        (run_dir / INDEX_FILE).unlink()
    ledger.close()
    with open(dataset, "ab") as fh:  # the user extends the dataset, then resumes
        fh.write(_prompts(n, n + new))
    return dataset, run_dir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=1_000_000)
    p.add_argument("--new", type=int, default=20)
    p.add_argument("--cold", action="store_true", help="no saved dataset index, no plan mark")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tf-million-"))
    try:
        t0 = time.perf_counter()
        dataset, run_dir = _build(tmp, args.samples, args.new, args.cold)
        print(f"built a run with {args.samples:,} completed samples in {time.perf_counter() - t0:.1f}s")
        with scripted_endpoint(0.0, prefix="tf-million-endpoint-", tool_calls=0) as endpoint:
            cfg = load_config(
                None,
                {
                    "dataset": dataset,
                    "run_name": "million",
                    "output_dir": tmp / "data",
                    "model": "scripted",
                    "base_url": endpoint.base_url,
                    "api_key_env": KEY_VAR,
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
                    "cold": args.cold,
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
