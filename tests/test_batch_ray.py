"""``--backend ray`` on a real Ray cluster on loopback: a head and two worker nodes, each started by
the test as its own ``ray start`` (own raylet, own process group), a batch spread over all three,
one worker node killed mid-run (its whole process group, SIGKILL). The run still ends with every
sample exactly once: one line per key in the outputs and in the shard, every ledger row done, and
the samples that were in flight on the lost node counted as requeued and run again elsewhere."""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from ray_cluster import Cluster, local_ray_cluster
from trajforge.batch.config import ConfigError, load_config
from trajforge.batch.ledger import LEDGER_FILE, Ledger
from trajforge.batch.runner import run_batch
from trajforge.testing.policies import tool_then_answer
from trajforge.testing.scripted_server import ScriptedServer

pytest.importorskip("ray", reason="the ray extra: pip install 'trajforge[ray]'")


@pytest.fixture
def ray_cluster(scripted_batch_config) -> Iterator[Cluster]:  # noqa: ARG001 - key env set first
    """A head and two worker nodes on loopback (after the scripted key variable is set: the nodes
    inherit it, as ``ray start`` would on a real host), all killed at teardown."""
    with local_ray_cluster() as cluster:
        yield cluster


def _lines(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def _done_count(run_dir: Path) -> int:
    if not (run_dir / LEDGER_FILE).exists():
        return 0
    ledger = Ledger(run_dir / LEDGER_FILE)
    try:
        return len(ledger.done_samples()[0])
    finally:
        ledger.close()


@pytest.mark.slow
async def test_ray_cluster_loses_a_node_mid_run_and_every_sample_lands_once(
    ray_cluster: Cluster, scripted_batch_config, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trajforge.batch.ray_backend")
    rows = [{"prompt": f"task {i}"} for i in range(90)]
    # 3 model calls of 0.15 s and 2 commands per sample; 3 actors x 4 rollouts: ~8 rounds.
    async with ScriptedServer(tool_then_answer(2), latency_s=0.15, api_key="k") as srv:
        cfg = scripted_batch_config(
            rows, srv.base_url, backend="ray", ray_address=ray_cluster.address, concurrency=4
        )
        run = asyncio.create_task(run_batch(cfg))
        victim = ray_cluster.workers[0]
        while _done_count(cfg.run_dir) < 25:  # mid-run: every actor busy, plenty queued
            assert not run.done(), run.exception()
            await asyncio.sleep(0.1)
        ray_cluster.kill(victim)
        summary = await asyncio.wait_for(run, 300)

    # Where the actors ran, as the driver announced it; the victim's actor ran samples before.
    placed = next(r.getMessage() for r in caplog.records if "rollout actor(s)" in r.getMessage())
    on = dict(re.findall(r"w(\d+) on (\S+) ", placed))
    assert sorted(on.values()) == ["head", "node-b", "node-c"], placed
    victim_worker = next(int(w) for w, node in on.items() if node == victim.name)
    assert any(
        f"w{victim_worker} on {victim.name}" in r.getMessage() and "lost" in r.getMessage()
        for r in caplog.records
    )

    out = _lines(cfg.run_dir / "trajectories.jsonl") + _lines(cfg.run_dir / "failed.jsonl")
    out += _lines(cfg.run_dir / "filtered.jsonl")
    assert len(out) == len(rows)
    assert all(line["status"] == "completed" for line in out), Counter(str(x["status"]) for x in out)
    assert sorted(int(line["prompt_index"]) for line in out) == list(range(len(rows)))
    # The shard (the only file the driver appends to) holds each sample once: no duplicate work landed.
    shard_lines = [
        orjson.loads(x) for p in (cfg.run_dir / "shards").glob("*.jsonl") for x in p.read_bytes().splitlines()
    ]
    assert len(shard_lines) == len(rows)
    by_worker = Counter(int(line["metadata"]["batch_num"]) for line in out)  # type: ignore[index]
    assert set(by_worker) == {0, 1, 2} and by_worker[victim_worker] > 0, by_worker

    ledger = Ledger(cfg.run_dir / LEDGER_FILE)
    try:
        states = ledger.states()
        assert Counter(states.values()) == {"completed": len(rows)}
        attempts = {k: ledger.sample(k)["attempts"] for k in states}  # type: ignore[index]
    finally:
        ledger.close()
    requeued = summary.statistics["requeued"]
    assert requeued.get("node lost", 0) >= 1, summary.statistics
    # Each requeued sample was started twice (once on the lost node); nothing else was.
    assert sum(a - 1 for a in attempts.values()) == requeued["node lost"]
    assert summary.statistics["total_done"] == len(rows)

    # A resume on the cluster (two nodes left) runs only the rows added since, once each.
    more = rows + [{"prompt": f"task {i}"} for i in range(len(rows), len(rows) + 10)]
    async with ScriptedServer(tool_then_answer(2), api_key="k") as srv:
        again = scripted_batch_config(
            more, srv.base_url, backend="ray", ray_address=ray_cluster.address, concurrency=4, resume=True
        )
        resumed = await run_batch(again)
    assert resumed.session == 2
    out = _lines(cfg.run_dir / "trajectories.jsonl")
    assert sorted(int(line["prompt_index"]) for line in out) == list(range(len(more)))  # type: ignore[call-overload]
    assert len(srv.requests) == 10 * 3  # only the new rows ran (3 model calls each)


def test_ray_address_needs_the_ray_backend(tmp_path: Path) -> None:
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"prompt": "a"}\n')
    with pytest.raises(ConfigError, match="--ray-address needs --backend ray"):
        load_config(None, {"dataset": dataset, "run_name": "r", "ray_address": "10.0.0.1:6379"})
    assert load_config(None, {"dataset": dataset, "run_name": "r", "backend": "ray"}).ray_address is None
