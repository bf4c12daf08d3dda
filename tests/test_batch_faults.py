"""A faulty endpoint (500s, 429 + Retry-After, timeouts, malformed bodies): the run completes and
every sample ends with a status and a reason."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from trajforge.batch.config import load_config
from trajforge.batch.dataset import load_dataset
from trajforge.batch.runner import run_batch
from trajforge.testing.scripted_server import FaultConfig, tool_then_answer

pytestmark = pytest.mark.slow

N = 40


async def test_faulty_endpoint_every_sample_ends_with_status_and_reason(
    tmp_path: Path, scripted_server: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_FAULT_KEY", "k")
    faults = FaultConfig(
        p_500=0.10,
        p_429=0.05,
        retry_after_s=0.1,
        p_timeout=0.05,
        timeout_hang_s=1.5,
        p_malformed=0.02,
        seed=3,
    )
    srv = await scripted_server(tool_then_answer(calls_per_sample=2), faults=faults)
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_bytes(b"".join(orjson.dumps({"prompt": f"task {i}"}) + b"\n" for i in range(N)))
    cfg = load_config(
        None,
        {
            "dataset": dataset,
            "run_name": "faults",
            "output_dir": tmp_path / "data",
            "model": "scripted",
            "base_url": srv.base_url,
            "api_key_env": "TF_FAULT_KEY",
            "toolsets": ["terminal"],
            "sandbox": "local",
            "concurrency": 16,
            "progress": "none",
            "request_timeout": 0.5,
            "request_retries": 1,  # few client retries, so some samples need (or exhaust) batch retries
            "retry_backoff": 0.05,
            "max_attempts": 2,
        },
    )
    await run_batch(cfg)
    run_dir = cfg.run_dir
    records = [
        orjson.loads(line)
        for name in ("trajectories.jsonl", "failed.jsonl", "filtered.jsonl")
        for line in (run_dir / name).read_bytes().splitlines()
    ]
    assert sorted(r["key"] for r in records) == sorted(s.key for s in load_dataset(dataset).samples)
    assert all(r["status"] in {"completed", "failed", "partial", "filtered"} and r["reason"] for r in records)
    injected = {k.removeprefix("fault_") for k, v in srv.counters.items() if k.startswith("fault_") and v}
    assert injected == {"500", "429", "timeout", "malformed"}, injected
    statuses = {r["status"] for r in records}
    assert "completed" in statuses
    for r in records:
        if r["status"] == "failed":
            assert (
                r["reason"].startswith("model_error(transient)") and "gave up after 2 attempts" in r["reason"]
            )
    assert any(r["attempts"] > 1 for r in records), "no sample was retried at the batch level"
    stats = orjson.loads((run_dir / "statistics.json").read_bytes())
    assert stats["total_done"] == N
    datasets = pytest.importorskip("datasets")
    for name in ("trajectories.jsonl", "failed.jsonl", "filtered.jsonl"):
        lines = (run_dir / name).read_bytes().count(b"\n")
        if lines:  # every output loads into a trainer's dataset without schema errors
            ds = datasets.load_dataset(
                "json", data_files=str(run_dir / name), split="train", cache_dir=str(tmp_path / "hf")
            )
            assert ds.num_rows == lines
