"""End-to-end batch runs against a real scripted HTTP endpoint on 127.0.0.1 and real sandboxes."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from trajforge.batch import runner
from trajforge.batch.backends import share_count, share_rate
from trajforge.batch.config import BatchConfig, load_config
from trajforge.batch.dataset import load_dataset
from trajforge.batch.ledger import Ledger
from trajforge.batch.lock import run_lock
from trajforge.batch.processes import WorkerPool
from trajforge.batch.runner import RunError, run_batch
from trajforge.export.formats import export_run
from trajforge.rollout.gc_policy import ROLLOUT_GEN0_THRESHOLD, rollout_gc
from trajforge.sandbox import SandboxUnavailableError, create_sandbox_factory, native_agent
from trajforge.sandbox.types import SandboxConfig
from trajforge.testing.scripted_server import Reply, ScriptedServer, echo_policy, tool_then_answer
from trajforge.tools.toolsets import TOOLSETS

KEY_ENV = "TF_BATCH_TEST_KEY"


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "test-key")


def _dataset(path: Path, prompts: list[str], extra: list[bytes] = ()) -> Path:
    lines = [orjson.dumps({"prompt": p}) for p in prompts] + list(extra)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _cfg(tmp_path: Path, srv: ScriptedServer, **kw: Any) -> BatchConfig:
    base = {
        "dataset": tmp_path / "prompts.jsonl",
        "run_name": "run",
        "output_dir": tmp_path / "data",
        "model": "scripted",
        "base_url": srv.base_url,
        "api_key_env": KEY_ENV,
        "toolsets": ["terminal"],
        "sandbox": "local",
        "concurrency": 8,
        "progress": "none",
        "retry_backoff": 0.01,
    }
    base.update(kw)
    return load_config(None, base)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def _all_records(run_dir: Path) -> list[dict[str, Any]]:
    return [
        r for name in ("trajectories.jsonl", "failed.jsonl", "filtered.jsonl") for r in _lines(run_dir / name)
    ]


async def test_run_resume_refuse_and_load_with_datasets(tmp_path: Path, scripted_server: Callable) -> None:
    srv = await scripted_server(tool_then_answer(calls_per_sample=2))
    prompts = [f"task {i}" for i in range(10)] + ["task 3"]  # a duplicate prompt is two samples
    _dataset(tmp_path / "prompts.jsonl", prompts)
    cfg = _cfg(tmp_path, srv)
    summary = await run_batch(cfg)
    run_dir = cfg.run_dir
    lines = _lines(run_dir / "trajectories.jsonl")
    assert len(lines) == 11 and len({line["key"] for line in lines}) == 11
    assert [line["prompt_index"] for line in lines] == list(range(11))
    first = lines[0]
    assert first["status"] == "completed" and first["completed"] is True and first["partial"] is False
    assert first["api_calls"] == 3 and first["tool_stats"]["terminal"] == {
        "count": 2,
        "success": 2,
        "failure": 0,
    }
    assert set(first["tool_stats"]) == set(TOOLSETS["terminal"])  # padded over this run's tools only
    assert [t["from"] for t in first["conversations"]] == [
        "system",
        "human",
        "gpt",
        "tool",
        "gpt",
        "tool",
        "gpt",
    ]
    assert len(orjson.dumps(first)) < 8000  # only the offered tools, not every known schema
    assert {t["function"]["name"] for t in orjson.loads((run_dir / "run.json").read_bytes())["tools"]} >= {
        "terminal"
    }
    stats = orjson.loads((run_dir / "statistics.json").read_bytes())
    assert stats["status_counts"] == {"completed": 11} and stats["finished"] is True
    assert stats["tool_statistics"]["terminal"]["count"] == 22
    assert stats["reasoning_coverage"]["turns_with_reasoning"] == 33
    assert stats["latency_s"]["p50"] is not None and summary.output_counts["trajectories.jsonl"] == 11

    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset(
        "json", data_files=str(run_dir / "trajectories.jsonl"), split="train", cache_dir=str(tmp_path / "hf")
    )
    assert ds.num_rows == 11 and ds[0]["conversations"][1]["from"] == "human"

    calls = srv.counters["requests"] if "requests" in srv.counters else len(srv.requests)
    await run_batch(cfg.model_copy(update={"resume": True}))  # nothing left: no request is made
    assert (srv.counters["requests"] if "requests" in srv.counters else len(srv.requests)) == calls
    assert len(_lines(run_dir / "trajectories.jsonl")) == 11

    with pytest.raises(RunError, match="already holds a run; pass --resume"):
        await run_batch(cfg)
    with pytest.raises(RunError, match="different sampling settings.*--toolsets"):
        await run_batch(cfg.model_copy(update={"resume": True, "toolsets": ["terminal", "file"]}))


async def test_extended_dataset_resumes_by_content_key(tmp_path: Path, scripted_server: Callable) -> None:
    srv = await scripted_server(echo_policy)
    _dataset(tmp_path / "prompts.jsonl", ["a", "b"])
    cfg = _cfg(tmp_path, srv, require_reasoning=False)
    await run_batch(cfg)
    before = len(srv.requests)
    _dataset(tmp_path / "prompts.jsonl", ["c", "b", "a", "a"])  # reordered, extended, a duplicate
    await run_batch(cfg.model_copy(update={"resume": True}))
    assert len(srv.requests) - before == 2  # only "c" and the second "a" ran
    recs = _lines(cfg.run_dir / "trajectories.jsonl")
    # merged outputs follow the current dataset order; each line keeps the index it ran with
    assert [r["conversations"][1]["value"] for r in recs] == ["c", "b", "a", "a"]


async def test_filters_keep_records_with_reasons(tmp_path: Path, scripted_server: Callable) -> None:
    srv = await scripted_server(tool_then_answer(calls_per_sample=1, reasoning=None))
    _dataset(tmp_path / "prompts.jsonl", ["x", "y"])
    cfg = _cfg(tmp_path, srv)
    await run_batch(cfg)
    filtered = _lines(cfg.run_dir / "filtered.jsonl")
    assert len(filtered) == 2 and all(r["reason"].startswith("no_reasoning:") for r in filtered)
    stats = orjson.loads((cfg.run_dir / "statistics.json").read_bytes())
    assert stats["filter_reasons"] == {"no_reasoning": 2}
    # --no-require-reasoning keeps them
    cfg2 = cfg.model_copy(update={"run_name": "run2", "require_reasoning": False})
    await run_batch(cfg2)
    assert len(_lines(cfg2.run_dir / "trajectories.jsonl")) == 2


async def test_tool_not_offered_is_filtered(tmp_path: Path, scripted_server: Callable) -> None:
    srv = await scripted_server(
        tool_then_answer(calls_per_sample=1, tool="web_search", arguments={"query": "q"})
    )
    _dataset(tmp_path / "prompts.jsonl", ["x"])
    cfg = _cfg(tmp_path, srv)
    await run_batch(cfg)
    (rec,) = _lines(cfg.run_dir / "filtered.jsonl")
    assert (
        rec["status"] == "filtered" and "hallucinated_tool" in rec["reason"] and "web_search" in rec["reason"]
    )


async def test_distribution_toolsets_are_seeded_and_offered(
    tmp_path: Path, scripted_server: Callable
) -> None:
    srv = await scripted_server(echo_policy)
    _dataset(tmp_path / "prompts.jsonl", [f"p{i}" for i in range(12)])
    common = {"toolsets": None, "distribution": "development", "require_reasoning": False}
    cfg_a = _cfg(tmp_path, srv, run_name="a", seed=7, **common)
    cfg_b = _cfg(tmp_path, srv, run_name="b", seed=7, **common)
    cfg_c = _cfg(tmp_path, srv, run_name="c", seed=8, **common)
    for cfg in (cfg_a, cfg_b, cfg_c):
        await run_batch(cfg)

    TOOLSETS_FLAT = [n for names in TOOLSETS.values() for n in names]

    def by_key(cfg: BatchConfig) -> dict[str, list[str]]:
        return {r["key"]: r["toolsets_used"] for r in _lines(cfg.run_dir / "trajectories.jsonl")}

    assert by_key(cfg_a) == by_key(cfg_b)
    assert by_key(cfg_a) != by_key(cfg_c)
    offered = {
        req["messages"][-1]["content"]: sorted(t["function"]["name"] for t in req.get("tools") or [])
        for req in srv.requests[:12]
    }
    for rec in _lines(cfg_a.run_dir / "trajectories.jsonl"):
        expected = sorted(n for ts in rec["toolsets_used"] for n in TOOLSETS[ts])
        assert set(offered[rec["conversations"][1]["value"]]) <= set(expected)
        # the line's system turn lists exactly the tools this sample was offered
        system = rec["conversations"][0]["value"]
        listed = sorted(n for n in TOOLSETS_FLAT if f'"name": "{n}"' in system)
        assert listed == sorted(offered[rec["conversations"][1]["value"]])


async def test_fail_fast_before_any_sample(tmp_path: Path, scripted_server: Callable) -> None:
    _dataset(tmp_path / "prompts.jsonl", ["x"])
    srv = await scripted_server(echo_policy, api_key="the-right-key")
    with pytest.raises(RunError, match="endpoint check failed"):
        await run_batch(_cfg(tmp_path, srv))  # the env var holds a wrong key
    assert not srv.requests
    dead = _cfg(tmp_path, srv, base_url="http://127.0.0.1:9/v1")
    with pytest.raises(RunError, match="endpoint check failed"):
        await run_batch(dead)
    with pytest.raises(RunError, match="unknown distribution 'nope'"):
        await run_batch(_cfg(tmp_path, srv, toolsets=None, distribution="nope"))
    with pytest.raises(RunError, match="unknown toolset 'nope'"):
        await run_batch(_cfg(tmp_path, srv, toolsets=["nope"]))
    assert not (tmp_path / "data" / "run").exists()  # nothing started, nothing left behind


async def test_second_run_on_locked_dir_is_refused(tmp_path: Path, scripted_server: Callable) -> None:
    srv = await scripted_server(echo_policy)
    _dataset(tmp_path / "prompts.jsonl", ["x"])
    cfg = _cfg(tmp_path, srv, resume=True)
    cfg.run_dir.mkdir(parents=True)
    with run_lock(cfg.run_dir), pytest.raises(RunError, match="another trajforge batch"):
        await run_batch(cfg)


async def test_bad_rows_become_failed_samples(tmp_path: Path, scripted_server: Callable) -> None:
    srv = await scripted_server(echo_policy)
    _dataset(tmp_path / "prompts.jsonl", ["x"], extra=[b'{"prompt": ', b'{"no": "prompt"}'])
    cfg = _cfg(tmp_path, srv, skip_bad_rows=True, require_reasoning=False)
    await run_batch(cfg)
    failed = _lines(cfg.run_dir / "failed.jsonl")
    assert [r["reason"][:18] for r in failed] == ["bad_row: line 2: m", "bad_row: line 3: r"]
    assert len(_lines(cfg.run_dir / "trajectories.jsonl")) == 1
    await run_batch(cfg.model_copy(update={"resume": True}))  # bad rows are not recorded twice
    assert len(_lines(cfg.run_dir / "failed.jsonl")) == 2
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset(
        "json", data_files=str(cfg.run_dir / "failed.jsonl"), split="train", cache_dir=str(tmp_path / "hf")
    )
    assert ds.num_rows == 2 and ds[0]["status"] == "failed"


class _FlakyFactory:
    """A real local sandbox factory whose first create for each task fails (infra failure)."""

    def __init__(self) -> None:
        self.inner = create_sandbox_factory(SandboxConfig(kind="local"))
        self.seen: collections.Counter[str] = collections.Counter()

    async def create(self, task_id: str, *, image: str | None = None, cwd: str | None = None) -> Any:
        base = task_id.rsplit("-", 1)[0]
        self.seen[base] += 1
        if self.seen[base] == 1 and task_id != "trajforge-preflight":
            raise SandboxUnavailableError("scripted start failure")
        return await self.inner.create(task_id, image=image, cwd=cwd)


async def test_sandbox_start_failure_is_retried(tmp_path: Path, scripted_server: Callable) -> None:
    srv = await scripted_server(tool_then_answer(calls_per_sample=1))
    _dataset(tmp_path / "prompts.jsonl", ["x", "y"])
    cfg = _cfg(tmp_path, srv)
    await run_batch(cfg, sandbox_factory=_FlakyFactory())
    recs = _lines(cfg.run_dir / "trajectories.jsonl")
    assert [r["attempts"] for r in recs] == [2, 2]
    ledger = Ledger(cfg.run_dir / "ledger.sqlite")
    assert {ledger.sample(r["key"])["attempts"] for r in recs} == {1}  # one ledger start per sample
    ledger.close()


class _RecordingFactory:
    """A real local sandbox factory that remembers what each sample asked for."""

    def __init__(self) -> None:
        self.inner = create_sandbox_factory(SandboxConfig(kind="local"))
        self.calls: list[tuple[str | None, str | None]] = []

    async def create(self, task_id: str, *, image: str | None = None, cwd: str | None = None) -> Any:
        if task_id != "trajforge-preflight":
            self.calls.append((image, cwd))
        return await self.inner.create(task_id)


async def test_per_row_image_and_cwd_reach_the_sandbox(tmp_path: Path, scripted_server: Callable) -> None:
    srv = await scripted_server(echo_policy)
    rows = [
        orjson.dumps({"prompt": "a", "image": "img:1", "cwd": "src"}),
        orjson.dumps({"prompt": "b", "docker_image": "img:2"}),
    ]
    (tmp_path / "prompts.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    factory = _RecordingFactory()
    # eager: the scripted answers call no tool, and a lazy start would build no sandbox at all
    cfg = _cfg(tmp_path, srv, require_reasoning=False, concurrency=1, sandbox_start="eager")
    await run_batch(cfg, sandbox_factory=factory)
    # the cwd is resolved under the data root (the dataset's directory): ROOT/./REL for the copy-in
    (image, cwd), second = factory.calls
    assert image == "img:1" and cwd.endswith(f"/{tmp_path.name}/./src") and second == ("img:2", None)


async def test_by_default_a_sample_that_calls_no_tool_builds_no_sandbox(
    tmp_path: Path, scripted_server: Callable
) -> None:
    """``batch``'s sandbox start is lazy by default: the sandbox comes with the first tool call."""
    srv = await scripted_server(echo_policy)
    (tmp_path / "prompts.jsonl").write_bytes(orjson.dumps({"prompt": "a"}) + b"\n")
    factory = _RecordingFactory()
    summary = await run_batch(_cfg(tmp_path, srv, require_reasoning=False), sandbox_factory=factory)
    assert summary.statistics["status_counts"] == {"completed": 1}
    assert factory.calls == []  # the preflight's sandbox only


async def test_one_model_and_one_sandbox_factory_per_run(
    tmp_path: Path, scripted_server: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preflight checks the very model and factory the (in-process) worker then uses."""
    from trajforge.batch import backends

    built: collections.Counter[str] = collections.Counter()

    def counted(name: str, build: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def wrapper(config: Any) -> Any:
            built[name] += 1
            return build(config)

        return wrapper

    monkeypatch.setattr(backends, "build_chat_model", counted("model", backends.build_chat_model))
    monkeypatch.setattr(
        backends, "create_sandbox_factory", counted("factory", backends.create_sandbox_factory)
    )
    srv = await scripted_server(echo_policy)
    _dataset(tmp_path / "prompts.jsonl", ["a", "b", "c"])
    await run_batch(_cfg(tmp_path, srv, require_reasoning=False))
    assert built == {"model": 1, "factory": 1}
    assert srv.requests  # the one model served the samples


async def test_preflight_is_an_optional_capability(tmp_path: Path) -> None:
    """A model with ``check()`` is checked once before any sample; one without is not asked."""
    from trajforge.protocols import SupportsPreflight
    from trajforge.testing.scripted_model import ScriptedModel

    class Checked(ScriptedModel):
        checks = 0

        async def check(self) -> None:
            self.checks += 1

    plain, checked = ScriptedModel(["ok"]), Checked(["ok"])
    assert not isinstance(plain, SupportsPreflight) and isinstance(checked, SupportsPreflight)
    _dataset(tmp_path / "prompts.jsonl", ["x"])
    fake = "http://127.0.0.1:9/v1"
    for name, model in (("plain", plain), ("checked", checked)):
        cfg = load_config(
            None,
            dict(
                dataset=tmp_path / "prompts.jsonl",
                run_name=name,
                output_dir=tmp_path / "data",
                model="m",
                base_url=fake,
                toolsets=["terminal"],
                sandbox="local",
                progress="none",
                require_reasoning=False,
            ),
        )
        summary = await run_batch(cfg, model=model)
        assert summary.statistics["status_counts"] == {"completed": 1}
    assert checked.checks == 1


def test_endpoint_budget_is_split_across_workers() -> None:
    assert share_count(None, 4) is None and share_rate(None, 4) is None
    assert share_rate(10.0, 4) == 2.5
    assert share_count(10, 4) == 2
    assert share_count(3, 4) == 1  # never zero: a worker must make progress


async def test_sample_deadline_gives_partial_with_reason(tmp_path: Path, scripted_server: Callable) -> None:
    srv = await scripted_server(tool_then_answer(calls_per_sample=50, command="sleep 0.2"))
    _dataset(tmp_path / "prompts.jsonl", ["slow"])
    cfg = _cfg(tmp_path, srv, sample_timeout=1.0)
    await run_batch(cfg)
    (rec,) = _lines(cfg.run_dir / "failed.jsonl")
    assert rec["status"] == "partial" and rec["reason"].startswith("timeout") and rec["partial"] is True


async def test_max_turns_is_partial(tmp_path: Path, scripted_server: Callable) -> None:
    srv = await scripted_server(tool_then_answer(calls_per_sample=5))
    _dataset(tmp_path / "prompts.jsonl", ["x"])
    cfg = _cfg(tmp_path, srv, max_turns=2)
    await run_batch(cfg)
    (rec,) = _lines(cfg.run_dir / "failed.jsonl")
    assert rec["status"] == "partial" and rec["reason"].startswith("max_turns")


@pytest.mark.bwrap
async def test_two_worker_processes_with_bwrap(tmp_path: Path, scripted_server: Callable) -> None:
    srv = await scripted_server(tool_then_answer(calls_per_sample=1))
    _dataset(tmp_path / "prompts.jsonl", [f"p{i}" for i in range(8)])
    cfg = _cfg(tmp_path, srv, workers=2, sandbox="bwrap", concurrency=4)
    await run_batch(cfg)
    recs = _lines(cfg.run_dir / "trajectories.jsonl")
    assert len(recs) == 8 and {r["metadata"]["batch_num"] for r in recs} == {0, 1}
    assert sorted(p.name for p in (cfg.run_dir / "shards").iterdir()) == [
        "s0001-w000.jsonl",
        "s0001-w001.jsonl",
    ]
    expected = {s.key for s in load_dataset(cfg.dataset).samples}
    assert {r["key"] for r in recs} == expected


def _trajforge_workers() -> list[str]:
    return sorted(p.name for p in multiprocessing.active_children() if p.name.startswith("trajforge-w"))


@pytest.mark.bwrap
async def test_worker_processes_run_the_agent_the_preflight_built(
    tmp_path: Path, scripted_server: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker processes are spawned before the checks (they import meanwhile) and get the
    exec agent the parent's preflight built, instead of compiling one each."""
    srv = await scripted_server(tool_then_answer(calls_per_sample=1))
    _dataset(tmp_path / "prompts.jsonl", [f"p{i}" for i in range(6)])
    cfg = _cfg(tmp_path, srv, workers=2, sandbox="bwrap", concurrency=3)
    seen: dict[str, Any] = {}
    real_check, real_hand = runner.check_backend, WorkerPool._hand
    seen["agents"] = []

    async def check(c: BatchConfig) -> None:
        seen["at_check"] = _trajforge_workers()
        await real_check(c)

    def hand(pool: WorkerPool, i: int, spec: Any) -> None:  # what crosses into process i
        seen["agents"].append(spec.sandbox_agent)
        real_hand(pool, i, spec)

    monkeypatch.setattr(runner, "check_backend", check)
    monkeypatch.setattr(WorkerPool, "_hand", hand)
    await run_batch(cfg)
    assert seen["at_check"] == ["trajforge-w0", "trajforge-w1"]
    agents = seen["agents"]
    assert len(agents) == 2 and agents[0] is not None and agents[0] == agents[1]
    assert agents[0] == native_agent.build_native_agent()  # the one the parent built
    assert len(_lines(cfg.run_dir / "trajectories.jsonl")) == 6
    assert _trajforge_workers() == []


async def test_worker_processes_end_with_a_run_that_stops_before_them(
    tmp_path: Path, scripted_server: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spawned before the checks, the processes exit (none left behind) when a check fails."""
    srv = await scripted_server(tool_then_answer(calls_per_sample=1))
    _dataset(tmp_path / "prompts.jsonl", ["a", "b"])
    cfg = _cfg(tmp_path, srv, workers=2)

    async def refuse(_: BatchConfig) -> None:
        assert _trajforge_workers() == ["trajforge-w0", "trajforge-w1"]
        raise RunError("sandbox backend 'local' cannot start: (test)")

    monkeypatch.setattr(runner, "check_backend", refuse)
    with pytest.raises(RunError, match="cannot start"):
        await run_batch(cfg)
    assert _trajforge_workers() == []


async def test_a_worker_process_without_a_share_exits(tmp_path: Path, scripted_server: Callable) -> None:
    srv = await scripted_server(tool_then_answer(calls_per_sample=1))
    _dataset(tmp_path / "prompts.jsonl", ["only"])
    cfg = _cfg(tmp_path, srv, workers=3)
    await run_batch(cfg)
    assert [r["key"] for r in _lines(cfg.run_dir / "trajectories.jsonl")] == [
        s.key for s in load_dataset(cfg.dataset).samples
    ]
    assert sorted(p.name for p in (cfg.run_dir / "shards").iterdir()) == ["s0001-w000.jsonl"]
    assert _trajforge_workers() == []


async def test_rollouts_run_under_the_rollout_gc_policy(tmp_path: Path, scripted_server: Callable) -> None:
    """While a worker's rollouts run, the collector's first threshold is the rollout one (the
    scripted endpoint runs in this process, so its policy sees it); after the run it is back."""
    seen: list[int] = []

    def policy(body: dict[str, Any]) -> Reply:
        seen.append(gc.get_threshold()[0])
        return Reply(content="done")

    srv = await scripted_server(policy)
    _dataset(tmp_path / "prompts.jsonl", ["a", "b", "c"])
    before = gc.get_threshold()
    await run_batch(_cfg(tmp_path, srv))
    assert seen == [ROLLOUT_GEN0_THRESHOLD] * 3
    assert gc.get_threshold() == before


def test_the_rollout_gc_policy_keeps_a_higher_threshold_and_restores() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with rollout_gc():
            assert gc.get_threshold() == (ROLLOUT_GEN0_THRESHOLD, 10, 10)
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(ROLLOUT_GEN0_THRESHOLD * 2, 5, 5)  # an embedder's own, higher: kept
        with rollout_gc():
            assert gc.get_threshold() == (ROLLOUT_GEN0_THRESHOLD * 2, 5, 5)
    finally:
        gc.set_threshold(*before)


def test_ctrl_c_ends_a_waiting_worker_process_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C during the preflight reaches the worker processes waiting for their share: each
    exits with 130 and no traceback. (The worker starts with SIGINT handled as in a terminal: a
    suite started in the background or under nohup ignores it, and children inherit that.)"""
    was = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        pool = WorkerPool(1)
    finally:
        signal.signal(signal.SIGINT, was)
    (proc,) = [p for p in multiprocessing.active_children() if p.name == "trajforge-w0"]
    try:
        for _ in range(400):  # until it blocks reading its pipe (system call 0, read)
            with contextlib.suppress(OSError):
                if Path(f"/proc/{proc.pid}/syscall").read_text().split()[0] == "0":
                    break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGINT)
        proc.join(20)
        assert proc.exitcode == 130
        assert "Traceback" not in capfd.readouterr().err
    finally:
        asyncio.run(pool.aclose())


def _reasoning_once_per_prompt() -> Callable[[dict[str, Any]], Reply]:
    """The first conversation of each prompt reasons, the next does not (one turn each)."""
    seen: collections.Counter[str] = collections.Counter()

    def policy(body: dict[str, Any]) -> Reply:
        prompt = body["messages"][-1]["content"]
        seen[prompt] += 1
        return Reply(content=f"answer to {prompt}", reasoning="thinking" if seen[prompt] == 1 else None)

    return policy


async def test_exports(tmp_path: Path, scripted_server: Callable) -> None:
    srv = await scripted_server(_reasoning_once_per_prompt())
    _dataset(tmp_path / "prompts.jsonl", ["q1", "q1", "q2"])
    cfg = _cfg(tmp_path, srv, concurrency=1)
    await run_batch(cfg)
    run_dir = cfg.run_dir

    path, n = export_run(run_dir, "dpo")
    (pair,) = _lines(path)
    assert n == 1 and pair["prompt"] == [{"role": "user", "content": "q1"}]
    assert (
        pair["chosen"][0]["reasoning_content"] == "thinking"
        and "reasoning_content" not in pair["rejected"][0]
    )
    assert pair["rejected_status"] == "filtered"

    srv2 = await scripted_server(tool_then_answer(calls_per_sample=1))
    cfg2 = _cfg(tmp_path, srv2, run_name="tools")
    await run_batch(cfg2)
    path, n = export_run(cfg2.run_dir, "messages")
    rows = _lines(path)
    assert n == 3
    roles = [m["role"] for m in rows[0]["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    call = rows[0]["messages"][1]["tool_calls"][0]
    assert call["function"]["name"] == "terminal" and call["function"]["arguments"] == {"command": "echo hi"}
    assert rows[0]["messages"][2]["tool_call_id"] == call["id"]
    assert {t["function"]["name"] for t in rows[0]["tools"]} == {"terminal", "process"}

    path, _ = export_run(cfg2.run_dir, "hermes")
    line = _lines(path)[0]
    assert list(line) == [
        "prompt_index",
        "conversations",
        "metadata",
        "completed",
        "partial",
        "api_calls",
        "toolsets_used",
        "tool_stats",
        "tool_error_counts",
    ]
    assert (
        line["conversations"][0]["from"] == "system"
        and '"name": "terminal"' in line["conversations"][0]["value"]
    )
    assert len(line["tool_stats"]) == sum(len(v) for v in TOOLSETS.values())

    path, _ = export_run(cfg2.run_dir, "sharegpt")
    assert _lines(path)[0]["conversations"][0]["value"].startswith("You are a function calling AI model")

    import pyarrow.parquet as pq

    path, n = export_run(cfg2.run_dir, "parquet")
    assert pq.read_table(path).num_rows == 3 == n

    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset(
        "json",
        data_files=str(cfg2.run_dir / "export" / "messages.jsonl"),
        split="train",
        cache_dir=str(tmp_path / "hf"),
    )
    assert ds.num_rows == 3


@pytest.mark.bwrap
async def test_reused_sandboxes_leak_nothing_between_samples(
    tmp_path: Path, scripted_server: Callable
) -> None:
    """With sandbox reuse on (the batch default), every sample still starts in a fresh sandbox:
    a marker file, a scratch file and a background process left by one sample are gone for the next."""
    command = (
        "echo leftover-sleeps=$(pgrep -c -x sleep); cat marker /tmp/scratch 2>/dev/null || echo FRESH-START; "
        "echo used > marker; echo used > /tmp/scratch; (sleep 1041 &); sleep 0.1"
    )
    srv = await scripted_server(tool_then_answer(calls_per_sample=1, command=command))
    _dataset(tmp_path / "prompts.jsonl", [f"p{i}" for i in range(12)])
    cfg = _cfg(tmp_path, srv, sandbox="bwrap", concurrency=3)
    assert cfg.sandbox_reuse and cfg.sandbox_config().reuse
    factory = create_sandbox_factory(cfg.sandbox_config())
    try:
        summary = await run_batch(cfg, sandbox_factory=factory)
    finally:
        await factory.aclose()
    recs = _lines(cfg.run_dir / "trajectories.jsonl")
    assert len(recs) == 12
    counted = summary.statistics["sandboxes"]  # statistics.json says how sandboxes were obtained
    assert counted == {"created": factory.stats.created, "reused": factory.stats.reused, "discarded": {}}
    for rec in recs:
        tool_turn = next(t["value"] for t in rec["conversations"] if t["from"] == "tool")
        assert "leftover-sleeps=0" in tool_turn and "FRESH-START" in tool_turn, tool_turn
        assert "used" not in tool_turn, tool_turn
    assert factory.stats.reused >= 8, factory.stats  # 12 samples on at most 3 (+1 preflight) sandboxes
    assert factory.stats.discarded == {}


async def test_merged_files_are_kept_current_while_the_run_goes(
    tmp_path: Path, scripted_server: Callable
) -> None:
    """A long run's trajectories.jsonl can be read before it ends: the merged files are rebuilt
    (atomically, in dataset order) every merge_interval while the run goes."""
    srv = await scripted_server(tool_then_answer(calls_per_sample=1), latency_s=0.15)
    _dataset(tmp_path / "prompts.jsonl", [f"p{i}" for i in range(16)])
    cfg = _cfg(tmp_path, srv, concurrency=2, merge_interval=0.1)
    run = asyncio.create_task(run_batch(cfg))
    seen_during_run: list[int] = []
    while not run.done():
        lines = _lines(cfg.run_dir / "trajectories.jsonl")  # always whole lines: atomic swaps
        if lines and not run.done():
            seen_during_run.append(len(lines))
            assert [line["prompt_index"] for line in lines] == sorted(line["prompt_index"] for line in lines)
        await asyncio.sleep(0.05)
    summary = await run
    assert seen_during_run and min(seen_during_run) < 16, seen_during_run
    assert summary.output_counts["trajectories.jsonl"] == 16
