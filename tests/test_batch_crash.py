"""kill -9 a running `trajforge batch` at random moments, resume, and check exactly-once delivery."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from trajforge.batch.dataset import load_dataset
from trajforge.batch.ledger import Ledger
from trajforge.testing.scripted_server import ScriptedServer, tool_then_answer

pytestmark = pytest.mark.slow

N = 160


def _batch_cmd(dataset: Path, out: Path, base_url: str, resume: bool) -> list[str]:
    cmd = [
        sys.executable,
        "-c",
        "from trajforge.cli.main import app; app()",
        "batch",
        str(dataset),
        "--run-name",
        "crash",
        "--output-dir",
        str(out),
        "--model",
        "scripted",
        "--base-url",
        base_url,
        "--api-key-env",
        "TF_CRASH_KEY",
        "--toolsets",
        "terminal",
        "--sandbox",
        "local",
        "--concurrency",
        "12",
        "--progress",
        "none",
    ]
    return [*cmd, "--resume"] if resume else cmd


def _shard_bytes(run_dir: Path) -> int:
    shards = run_dir / "shards"
    return sum(p.stat().st_size for p in shards.glob("*.jsonl")) if shards.exists() else 0


def _json_lines(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"{path} ends in a torn line"
    return [orjson.loads(line) for line in data.splitlines()]


def test_sigkill_at_random_moments_then_resume_is_exactly_once(tmp_path: Path) -> None:
    rng = random.Random(1234)
    prompts = [f"task {i % 150}" for i in range(N)]  # 10 duplicates: distinct samples
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_bytes(b"".join(orjson.dumps({"prompt": p}) + b"\n" for p in prompts))
    out = tmp_path / "data"
    run_dir = out / "crash"
    env = {**os.environ, "TF_CRASH_KEY": "k"}
    kills = 0
    with ScriptedServer(tool_then_answer(calls_per_sample=2), latency_s=0.03).in_thread() as srv:
        for round_no in range(6):
            proc = subprocess.Popen(
                _batch_cmd(dataset, out, srv.base_url, resume=round_no > 0), env=env, stderr=subprocess.PIPE
            )
            # Wait for durable progress (observable state, not a fixed time), then kill at a
            # random moment shortly after, while writes and commits are in flight.
            start_size = _shard_bytes(run_dir)
            while proc.poll() is None and _shard_bytes(run_dir) == start_size:
                time.sleep(0.01)
            if round_no % 2:
                time.sleep(rng.uniform(0.0, 0.4))
            else:  # aim at the dangerous window: lines appended, ledger not yet committed
                grown = _shard_bytes(run_dir)
                while proc.poll() is None and _shard_bytes(run_dir) == grown:
                    time.sleep(0.0002)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.wait()
            proc.stderr.close()
            if (run_dir / "statistics.json").exists():  # rewritten atomically: never half a file
                orjson.loads((run_dir / "statistics.json").read_bytes())
        final = subprocess.run(
            _batch_cmd(dataset, out, srv.base_url, resume=True), env=env, capture_output=True, timeout=120
        )
    assert final.returncode == 0, final.stderr.decode()[-2000:]
    assert kills >= 3

    expected = {s.key for s in load_dataset(dataset).samples}
    records = []
    for name in ("trajectories.jsonl", "failed.jsonl", "filtered.jsonl"):
        records += _json_lines(run_dir / name)
    keys = [r["key"] for r in records]
    assert len(keys) == len(set(keys)) == N, "a sample was lost or duplicated"
    assert set(keys) == expected
    assert all(r["status"] == "completed" for r in records)

    shard_lines = []
    for shard in (run_dir / "shards").glob("*.jsonl"):
        shard_lines += _json_lines(shard)  # repaired shards hold whole lines only
    assert sorted(r["key"] for r in shard_lines) == sorted(keys)  # no orphan or duplicate line

    stats = orjson.loads((run_dir / "statistics.json").read_bytes())
    assert stats["total_done"] == N and stats["status_counts"] == {"completed": N}
    orjson.loads((run_dir / "run.json").read_bytes())
    ledger = Ledger(run_dir / "ledger.sqlite")
    assert set(ledger.states().values()) == {"completed"}
    ledger.close()
