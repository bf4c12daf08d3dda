"""``--backend ray`` on a real Ray cluster on loopback: a head and two worker nodes, each started by
the test as its own ``ray start`` (own raylet, own process group), a batch spread over all three,
one worker node killed mid-run (its whole process group, SIGKILL). The run still ends with every
sample exactly once: one line per key in the outputs and in the shard, every ledger row done, and
the samples that were in flight on the lost node counted as requeued and run again elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from trajforge.batch.config import ConfigError, load_config
from trajforge.batch.ledger import LEDGER_FILE, Ledger
from trajforge.batch.runner import run_batch
from trajforge.testing.policies import tool_then_answer
from trajforge.testing.scripted_server import ScriptedServer

pytest.importorskip("ray", reason="the ray extra: pip install 'trajforge[ray]'")

RAY = str(Path(sys.executable).with_name("ray"))
# Loopback, but not 127.0.0.1: `ray start` rewrites exactly that one to the machine's outward
# address (so that other hosts could join); any other 127/8 address stays on loopback.
LOOPBACK = "127.0.0.2"
# Node death is noticed by the head's health checks; tight ones keep the test short.
_FAST_HEALTH = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
}
_SMALL = ["--num-cpus", "1", "--object-store-memory", str(80 * 2**20), "--disable-usage-stats"]


@dataclass
class Node:
    name: str
    pgid: int  # every process of the node (raylet, its workers, the actor) is in this group


@dataclass
class Cluster:
    address: str
    head: Node
    workers: list[Node]

    def kill(self, node: Node) -> None:
        os.killpg(node.pgid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _spawn(name: str, args: list[str], temp_dir: str) -> tuple[str, subprocess.Popen[str]]:
    env = {**os.environ, **_FAST_HEALTH}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [RAY, "start", "--node-ip-address", LOOPBACK, "--node-name", name, *_SMALL, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # leads its own process group, which the node's daemons keep
        cwd=temp_dir,
    )
    return name, proc


def _started(name: str, proc: subprocess.Popen[str]) -> Node:
    """Wait for ``ray start`` to return (its daemons keep running in its process group)."""
    out, _ = proc.communicate(timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"ray start of {name} failed: {out}")
    return Node(name, proc.pid)


@pytest.fixture
def ray_cluster(scripted_batch_config) -> Iterator[Cluster]:  # noqa: ARG001 - key env set first
    """A head and two worker nodes on loopback, started here (after the scripted key variable is
    set: the nodes inherit it, as ``ray start`` would on a real host), all killed at teardown."""
    temp_dir = tempfile.mkdtemp(prefix="tfray", dir="/tmp")  # short: Ray's socket paths
    port = _free_port()
    groups: list[int] = []  # every node's process group, killed at teardown whatever happened

    def spawn(name: str, args: list[str]) -> tuple[str, subprocess.Popen[str]]:
        started = _spawn(name, args, temp_dir)
        groups.append(started[1].pid)
        return started

    try:
        head = _started(
            *spawn(
                "head", ["--head", "--port", str(port), "--include-dashboard=false", "--temp-dir", temp_dir]
            )
        )
        # One at a time: `ray start` finds its own raylet by address, the same for every node here.
        workers = [
            _started(*spawn(name, ["--address", f"{LOOPBACK}:{port}"])) for name in ("node-b", "node-c")
        ]
        yield Cluster(f"{LOOPBACK}:{port}", head, workers)
    finally:
        for pgid in reversed(groups):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)


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
