"""``trajforge env eval --backend ray`` on a real Ray cluster on loopback (a head and two worker
nodes, each its own ``ray start``), against a scripted endpoint, with bwrap sandboxes: one worker
node is SIGKILLed mid-run and the run still ends with every (item, rollout) once in
``episodes.jsonl``, the episodes that were in flight on the lost node counted as ``requeued`` (in
``status.json`` and ``summary.json``), and every reward equal to the same items run on this
machine. A resume on the cluster with two rollout actors per node runs only what the file lacks,
spread over all four actors, and its summary keeps the first invocation's count."""

from __future__ import annotations

import asyncio
import re
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from conftest import SCRIPTED_KEY_ENV
from ray_cluster import Cluster, local_ray_cluster
from trajforge.cli.main import app
from trajforge.endpoint import EndpointConfig
from trajforge.envs import load_env, run_eval
from trajforge.envs.running.backends import open_rollout_backends
from trajforge.testing.policies import count_assistant_turns
from trajforge.testing.replies import Reply, ToolCallSpec
from trajforge.testing.scripted_server import ScriptedServer

pytest.importorskip("ray", reason="the ray extra: pip install 'trajforge[ray]'")

TRAJFORGE = str(Path(sys.executable).with_name("trajforge"))
N, GROUP = 16, 2


@pytest.fixture
def ray_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    """The cluster, started after the endpoint's key variable is set (the nodes inherit it, as
    ``ray start`` on a real host would: the key never travels through Ray)."""
    monkeypatch.setenv(SCRIPTED_KEY_ENV, "k")
    with local_ray_cluster() as cluster:
        yield cluster


def _first_user(body: dict[str, Any]) -> str:
    return next(str(m["content"]) for m in body["messages"] if m["role"] == "user")


def solver(body: dict[str, Any]) -> Reply:
    """A deterministic model for terminal_test: solves two kinds of item, botches one, gives up on
    the rest; a tool call, then ``done``. Rewards 1.0, 0.5 (right lines, trailing spaces) and 0.0
    whichever node runs it."""
    if count_assistant_turns(body) > 0:
        return Reply(content="done")
    prompt = _first_user(body)
    if m := re.match(r"Create a file named (\S+) containing exactly this line: (.*)$", prompt):
        return Reply(tool_calls=[ToolCallSpec("write_file", {"path": m[1], "content": m[2] + "\n"})])
    if "sorted.txt" in prompt:
        return Reply(tool_calls=[ToolCallSpec("terminal", {"command": "sort -n numbers.txt > sorted.txt"})])
    if m := re.search(r"contains the word (\S+) into matches.txt", prompt):
        command = f"grep -w {m[1]} log.txt | sed 's/$/ /' > matches.txt"
        return Reply(tool_calls=[ToolCallSpec("terminal", {"command": command})])
    return Reply(content="done")


def _episodes(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "episodes.jsonl"
    return [orjson.loads(x) for x in path.read_bytes().splitlines()] if path.exists() else []


def _common(srv: ScriptedServer, tmp_path: Path) -> list[str]:
    return [
        "--model",
        "scripted",
        "--api-key-env",
        SCRIPTED_KEY_ENV,
        "--base-url",
        srv.base_url,
        "--max-samples",
        str(N),
        "--group-size",
        str(GROUP),
        "--sandbox",
        "bwrap",
        "--concurrency",
        "6",
        "--output-dir",
        str(tmp_path),
    ]


async def _env_eval(args: list[str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        TRAJFORGE,
        "env",
        "eval",
        "terminal_test",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.slow
async def test_env_eval_on_ray_loses_a_node_mid_run_and_every_episode_lands_once(
    ray_cluster: Cluster, tmp_path: Path
) -> None:
    run_dir = tmp_path / "ray"
    async with ScriptedServer(solver, latency_s=0.3, api_key="k") as srv:
        args = [*_common(srv, tmp_path), "--run-name", "ray", "--backend", "ray"]
        run = asyncio.create_task(_env_eval([*args, "--ray-address", ray_cluster.address, "--json"]))
        while len(_episodes(run_dir)) < 8:  # mid-run: every actor busy, most episodes to go
            assert not run.done(), run.result()
            await asyncio.sleep(0.1)
        ray_cluster.kill(ray_cluster.workers[0])
        code, out, err = await run
        assert code == 0, err
        placed = re.search(r"ray: 3 rollout actor\(s\) .*", err)
        assert placed and all(f"on {node} " in placed[0] for node in ("head", "node-b", "node-c")), err
        assert re.search(r"rollout actor w\d+ on node-b .* lost", err), err

        episodes = _episodes(run_dir)
        keys = Counter(f"{e['item_id']}#{e['rollout']}" for e in episodes)
        assert len(keys) == N * GROUP and set(keys.values()) == {1}, keys.most_common(3)
        assert {e["status"] for e in episodes} == {"completed"}
        status = orjson.loads((run_dir / "status.json").read_bytes())
        assert status["backend"] == "ray" and status["finished"] == N * GROUP
        assert status["actors"]["lost"] == 1 and status["actors"]["alive"] == 2, status
        assert status["requeued"] >= 1, status  # the lost node's in-flight episodes, run again
        summary = orjson.loads(out[out.index("{") :])
        assert summary["episodes"] == N * GROUP and summary["failed"] == 0
        # summary.json says it too, from the events the driver appended as they happened.
        assert orjson.loads((run_dir / "summary.json").read_bytes()) == summary
        assert summary["requeued"] == status["requeued"] and summary["actors_lost"] == 1, summary
        events = [orjson.loads(x) for x in (run_dir / "cluster_events.jsonl").read_bytes().splitlines()]
        lost_actors = [e for e in events if e["event"] == "actor_lost"]
        assert len(lost_actors) == 1 and lost_actors[0]["node"].startswith("node-b "), events
        requeued = [e["episode"] for e in events if e["event"] == "requeued"]
        assert len(requeued) == status["requeued"], events
        assert set(requeued) <= {e["key"] for e in episodes}, events  # named as their records are

        # The same items on this machine (in-process, same endpoint and sandboxes): same rewards.
        env = load_env("terminal_test", {"sandbox": "bwrap", "max_concurrent_rollouts": 6})
        endpoint = EndpointConfig(model="scripted", base_url=srv.base_url, api_key_env=SCRIPTED_KEY_ENV)
        async with open_rollout_backends(env, endpoint) as backends:
            local = await run_eval(env, backends, tmp_path / "local", n=N, group_size=GROUP)
        ray_rewards = {f"{e['item_id']}#{e['rollout']}": e["reward"]["value"] for e in episodes}
        local_rewards = {
            f"{e['item_id']}#{e['rollout']}": e["reward"]["value"] for e in _episodes(tmp_path / "local")
        }
        assert ray_rewards == local_rewards
        assert set(ray_rewards.values()) == {1.0, 0.5, 0.0}
        assert local.summary.mean_reward.value == summary["mean_reward"]["value"]
        local_summary = orjson.loads((tmp_path / "local" / "summary.json").read_bytes())
        assert local_summary["requeued"] == 0 and local_summary["actors_lost"] == 0

    # Resume on the cluster (two nodes left), two actors per node this time (not part of the run's
    # identity): the driver "died" before writing the last 5 episodes; only those run again (one
    # model call each, or two), and the file ends with each key once.
    # The events file was torn too (the driver killed mid-write): the summary skips that line.
    lines = (run_dir / "episodes.jsonl").read_bytes().splitlines(keepends=True)
    (run_dir / "episodes.jsonl").write_bytes(b"".join(lines[:-5]) + lines[-5][:20])  # a torn last line
    with (run_dir / "cluster_events.jsonl").open("ab") as f:
        f.write(b'{"event": "requeued", "epis')
    lost = [orjson.loads(x) for x in lines[-5:]]
    async with ScriptedServer(solver, api_key="k") as srv:
        args = [*_common(srv, tmp_path), "--run-name", "ray", "--backend", "ray"]
        code, out, err = await _env_eval(
            [*args, "--ray-address", ray_cluster.address, "--actors-per-node", "2", "--json"]
        )
        assert code == 0, err
    assert "ray: 4 rollout actor(s) sharing 6 rollouts on 2 node(s)" in err, err
    # The driver's record: two actors on each live node, the endpoint budget split four ways, and
    # every actor given one of the 5 episodes (least busy first, 6 at once) before any got two.
    actors = orjson.loads((run_dir / "status.json").read_bytes())["actors"]
    assert actors["alive"] == 4 and actors["per_node"] == 2 and actors["endpoint_shares"] == 4, actors
    assert Counter(where.split(" ")[0] for where in actors["nodes"].values()) == {"head": 2, "node-c": 2}
    assert sorted(actors["episodes"].values()) == [1, 1, 1, 2], actors["episodes"]
    # This invocation requeued nothing; the run's summary still counts the first one's.
    assert orjson.loads((run_dir / "status.json").read_bytes())["requeued"] == 0
    resumed = orjson.loads(out[out.index("{") :])
    assert resumed == orjson.loads((run_dir / "summary.json").read_bytes())
    assert (resumed["requeued"], resumed["actors_lost"]) == (summary["requeued"], 1), resumed
    assert {_first_user(body) for body in srv.requests} == {e["item"]["prompt"] for e in lost}
    assert len(srv.requests) == sum(e["turns"] for e in lost)
    again = _episodes(run_dir)
    assert Counter(f"{e['item_id']}#{e['rollout']}" for e in again) == Counter(list(ray_rewards))
    assert {f"{e['item_id']}#{e['rollout']}": e["reward"]["value"] for e in again} == ray_rewards


def test_cluster_events_add_up_over_invocations(tmp_path: Path) -> None:
    """The first invocation lost an actor with 2 episodes in flight and was killed mid-line; the
    resume lost another with 1: ``summary.json`` (and a rescore's rewrite of it) says 3 and 2."""
    from trajforge.engine.books import CLUSTER_EVENTS_FILE, write_summary
    from trajforge.engine.ray import ClusterEventLog

    path = tmp_path / CLUSTER_EVENTS_FILE
    first = ClusterEventLog(path)
    first.claim()
    for event in ("actor_lost", "requeued", "requeued"):
        first.add({"event": event, "actor": "w0", "node": "node-b (x)"})
    first.close()
    with path.open("ab") as f:
        f.write(b'{"event": "requeued", "epi')  # the driver killed mid-write
    second = ClusterEventLog(path)
    second.add({"event": "actor_lost", "actor": "w2", "node": "node-c (y)"})  # while starting
    assert path.read_bytes().endswith(b'"epi')  # nothing written before run_episodes claims the dir
    second.claim()
    second.add({"event": "requeued", "actor": "w2", "node": "node-c (y)"})
    second.close()
    lines = [orjson.loads(x) for x in path.read_bytes().splitlines()]  # the torn line was cut off
    assert [e["event"] for e in lines] == ["actor_lost", "requeued", "requeued", "actor_lost", "requeued"]
    summary = write_summary(tmp_path, "terminal_test")
    assert (summary.requeued, summary.actors_lost) == (3, 2)
    on_disk = orjson.loads((tmp_path / "summary.json").read_bytes())
    assert (on_disk["requeued"], on_disk["actors_lost"]) == (3, 2)


def test_env_eval_backend_flags_are_checked() -> None:
    runner = CliRunner()
    out = runner.invoke(app, ["env", "eval", "terminal_test", "--ray-address", "127.0.0.2:6379"])
    assert out.exit_code == 2 and "--ray-address needs --backend ray" in out.output
    out = runner.invoke(app, ["env", "eval", "terminal_test", "--backend", "spark"])
    assert out.exit_code == 2 and "spark" in out.output
    out = runner.invoke(app, ["env", "eval", "terminal_test", "--backend", "ray", "--ray-address", " "])
    assert out.exit_code == 2 and "--ray-address is empty" in out.output
    out = runner.invoke(app, ["env", "eval", "terminal_test", "--backend", "ray", "--actors-per-node", "0"])
    assert out.exit_code == 2, out.output
    assert "--actors-per-node must be at least 1, not 0" in out.output and "on each node" in out.output
    out = runner.invoke(app, ["env", "eval", "terminal_test", "--actors-per-node", "2"])
    assert out.exit_code == 2 and "--actors-per-node needs --backend ray" in out.output


def test_the_clusters_reason_is_read_from_inside_task_groups() -> None:
    """An episode task that finds every actor lost raises inside the runner's task group; the
    command must say the cluster's reason, not 'unhandled errors in a TaskGroup'."""
    from trajforge.raycluster import ClusterError, cluster_error

    reason = ClusterError("every rollout actor was lost")
    wrapped = BaseExceptionGroup("tasks", [ExceptionGroup("inner", [reason]), asyncio.CancelledError()])
    assert cluster_error(wrapped) is reason
    assert cluster_error(ExceptionGroup("other", [ValueError("x")])) is None
