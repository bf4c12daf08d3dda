"""Batch building blocks: config, dataset keys and bad input, ledger + shards, statistics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from trajforge.batch.config import ConfigError, load_config
from trajforge.batch.dataset import DatasetError, load_dataset
from trajforge.batch.ledger import Commit, Ledger
from trajforge.batch.stats import Aggregate, SampleSummary, merge_all
from trajforge.batch.writer import Finished, OutputMerger, ShardWriter, merge_outputs, repair_shards


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


BASE = {"dataset": "d.jsonl", "run_name": "r", "model": "m", "base_url": "http://127.0.0.1:9/v1"}


# -- config -------------------------------------------------------------------------------------
def test_config_rejects_distribution_with_toolsets() -> None:
    with pytest.raises(ConfigError, match="either --distribution or --toolsets"):
        load_config(None, {**BASE, "distribution": "default", "toolsets": ["terminal"]})


def test_config_rejects_contradicting_reasoning_flags() -> None:
    with pytest.raises(ConfigError, match="contradict"):
        load_config(None, {**BASE, "no_reasoning": True, "reasoning_effort": "high"})


def test_config_yaml_with_flags_winning(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(
        "dataset: d.jsonl\nrun-name: fromfile\nmodel: m\nbase-url: http://127.0.0.1:9/v1\nconcurrency: 8\nworkers: 2\n"
    )
    cfg = load_config(cfg_file, {"concurrency": 16, "workers": None})
    assert (cfg.run_name, cfg.concurrency, cfg.workers) == ("fromfile", 16, 2)


def test_config_file_with_api_key_is_refused(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("dataset: d.jsonl\nrun_name: r\nmodel: m\napi_key: sk-secret\n")
    with pytest.raises(ConfigError, match="environment variable") as info:
        load_config(cfg_file, {})
    assert "sk-secret" not in str(info.value)


def test_config_unknown_key_named(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("dataset: d.jsonl\nrun_name: r\nmodel: m\nconcurency: 3\n")
    with pytest.raises(ConfigError, match="concurency"):
        load_config(cfg_file, {})


def test_provider_routing_goes_to_extra_body() -> None:
    cfg = load_config(
        None, {**BASE, "provider_allow": ["a"], "provider_sort": "price", "extra_body": {"x": 1}}
    )
    body = cfg.sampling().extra_body
    assert body == {"x": 1, "provider": {"only": ["a"], "sort": "price"}}


# -- dataset ------------------------------------------------------------------------------------
def test_keys_are_content_based_and_count_duplicates(tmp_path: Path) -> None:
    a = load_dataset(
        _write(
            tmp_path / "a.jsonl",
            [b'{"prompt": "x", "cwd": "w"}', b'{"prompt": "y"}', b'{"prompt": "x", "cwd": "w"}'],
        )
    )
    b = load_dataset(
        _write(
            tmp_path / "b.jsonl",
            [
                b'{"prompt":"y"}',
                b'{"cwd": "w", "prompt": "x"}',
                b'{"prompt": "z"}',
                b'{"cwd":"w","prompt":"x"}',
            ],
        )
    )
    keys_a = {s.key for s in a.samples}
    keys_b = {s.key for s in b.samples}
    assert len(keys_a) == 3  # the duplicate is a second sample
    assert keys_a <= keys_b  # reordered + extended dataset maps back to the same keys
    assert a.samples[0].cwd == f"{tmp_path.resolve()}/./w"  # under the data root (the dataset's dir)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"prompt": "ok"', "line 2: malformed JSON"),
        (b'{"text": "no prompt"}', "line 2: row has no non-empty string 'prompt'"),
        (b'{"prompt": "caf\xe9"}', "line 2: not valid UTF-8"),
        (b'["prompt"]', "line 2: expected a JSON object"),
    ],
)
def test_bad_rows_name_the_line(tmp_path: Path, line: bytes, message: str) -> None:
    path = _write(tmp_path / "d.jsonl", [b'{"prompt": "fine"}', line])
    with pytest.raises(DatasetError, match=message) as info:
        load_dataset(path)
    assert "--skip-bad-rows" in str(info.value)
    loaded = load_dataset(path, skip_bad_rows=True)
    assert len(loaded.samples) == 1 and len(loaded.bad_rows) == 1
    assert loaded.bad_rows[0].reason.startswith("line 2:")


def test_empty_dataset_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(b"\n  \n")
    with pytest.raises(DatasetError, match="empty"):
        load_dataset(path)


def test_max_samples_counts_rows(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.jsonl", [orjson.dumps({"prompt": f"p{i}"}) for i in range(10)])
    assert [s.index for s in load_dataset(path, max_samples=3).samples] == [0, 1, 2]


# -- ledger, shards, statistics -------------------------------------------------------------------
def _summary(status: str, wall: float = 1.0) -> SampleSummary:
    return SampleSummary(
        status=status,
        reason_kind="no_reasoning" if status == "filtered" else "final_answer",
        tool_stats={"terminal": (2, 1, 1)},
        tool_errors={},
        toolsets=["terminal"],
        turns_with_reasoning=2,
        turns_without_reasoning=1,
        usage={"total_tokens": 10},
        api_calls=3,
        attempts=1,
        wall_s=wall,
        model_s=0.5,
        tool_s=0.1,
        started_at=100.0,
        finished_at=100.0 + wall,
    )


async def test_writer_commits_then_repair_truncates_uncommitted(tmp_path: Path) -> None:
    (tmp_path / "shards").mkdir()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.add_pending([("k1", 0), ("k2", 1), ("k3", 2)])
    shard = tmp_path / "shards" / "s0001-w000.jsonl"
    writer = ShardWriter(ledger, shard, "s0001-w000", interval_s=0)
    task = asyncio.create_task(writer.run())
    writer.started("k1")
    writer.submit(Finished("k1", "completed", "final_answer", b'{"a":1}\n', _summary("completed")))
    writer.submit(Finished("k2", "filtered", "no_reasoning", b'{"b":2}\n', _summary("filtered", 3.0)))
    writer.close()
    await task
    assert ledger.states() == {"k1": "completed", "k2": "filtered", "k3": "pending"}
    # A kill between append and commit: an uncommitted line plus a torn one.
    shard.write_bytes(shard.read_bytes() + b'{"c":3}\n{"d":')
    cut = repair_shards(tmp_path, ledger)
    assert cut == {shard.name: len(b'{"c":3}\n{"d":')}
    assert shard.read_bytes() == b'{"a":1}\n{"b":2}\n'
    counts = merge_outputs(tmp_path, ledger)
    assert counts == {"failed.jsonl": 0, "filtered.jsonl": 1, "trajectories.jsonl": 1}
    assert (tmp_path / "trajectories.jsonl").read_bytes() == b'{"a":1}\n'
    agg = merge_all(ledger.aggregates())
    assert agg.status == {"completed": 1, "filtered": 1}
    assert agg.tools == {"terminal": [4, 2, 2]}
    ledger.close()


def test_shard_shorter_than_ledger_sends_samples_back_to_pending(tmp_path: Path) -> None:
    (tmp_path / "shards").mkdir()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.add_pending([("k1", 0), ("k2", 1)])
    (tmp_path / "shards" / "s.jsonl").write_bytes(b"1234\n")
    commits = [
        Commit("k1", "completed", "", 0, 5, 1.0, b"{}", b"{}"),
        Commit("k2", "completed", "", 5, 5, 1.0, b"{}", b"{}"),
    ]
    ledger.commit("s.jsonl", 10, commits, [], "o", Aggregate().to_bytes())
    repair_shards(tmp_path, ledger)
    assert ledger.states() == {"k1": "completed", "k2": "pending"}
    ledger.close()


def test_aggregate_roundtrip_and_percentiles() -> None:
    agg = Aggregate()
    for wall in (0.1, 0.2, 0.3, 10.0):
        agg.add(_summary("completed", wall))
    again = Aggregate.from_bytes(agg.to_bytes())
    assert again.status == agg.status and again.latency == agg.latency
    p50 = again.percentile(0.5)
    assert p50 is not None and 0.2 <= p50 <= 0.25
    assert again.percentile(0.99) >= 10.0
    total = Aggregate()
    total.merge(again)
    total.merge(again)
    assert total.done == 8 and total.api_calls == 24


def test_progress_displays() -> None:
    import io

    from rich.console import Console

    from trajforge.batch.progress import PlainProgress, RichProgress, Snapshot

    snap = Snapshot(
        total=10, completed=4, failed=1, partial=0, filtered=1, session_done=6, elapsed_s=2.0, tokens=99
    )
    assert snap.done == 6 and snap.rate == 3.0 and snap.eta_s == pytest.approx(4 / 3)
    out = io.StringIO()
    plain = PlainProgress("run", stream=out, every_s=0)
    plain.update(snap)
    plain.close(snap)
    assert out.getvalue().count("[run] 6/10 completed=4 failed=1") == 2
    buf = io.StringIO()
    rich_bar = RichProgress("run", 0, console=Console(file=buf, force_terminal=True, width=200))
    rich_bar.update(snap)
    rich_bar.close(snap)
    assert "6/10" in buf.getvalue() and "ok 4 fail 1" in buf.getvalue() and "tok 99" in buf.getvalue()


def test_setup_files_rows_are_validated(tmp_path):
    from trajforge.batch.dataset import DatasetError, load_dataset

    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "count", "setup_files": {"data/a.txt": "x\\ny\\n"}}\n')
    data = load_dataset(good)
    assert data.samples[0].setup_files == {"data/a.txt": "x\ny\n"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": "escape", "setup_files": {"../x": "boom"}}\n')
    with pytest.raises(DatasetError, match="line 2.*goes up with '..'"):
        load_dataset(bad)


def test_output_merger_rebuilds_only_when_something_was_committed(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.next_session()
    ledger.add_pending([("k0", 0), ("k1", 1)])
    (tmp_path / "shards").mkdir()
    shard = tmp_path / "shards" / "s0001-w000.jsonl"
    line = b'{"prompt_index": 0}\n'
    shard.write_bytes(line)
    ledger.commit(
        shard.name,
        len(line),
        [Commit("k0", "completed", "ok", 0, len(line), 0.0, b"{}", b"{}")],
        [],
        "o",
        b"{}",
    )
    merger = OutputMerger(tmp_path, tmp_path / "ledger.sqlite", min_interval_s=1.0)
    assert merger.refresh() is True and merger.refresh() is False  # nothing new: no rewrite
    assert (tmp_path / "trajectories.jsonl").read_bytes() == line
    more = b'{"prompt_index": 1}\n'
    with open(shard, "ab") as fh:
        fh.write(more)
    ledger.commit(
        shard.name,
        len(line) + len(more),
        [Commit("k1", "filtered", "x", len(line), len(more), 0.0, b"{}", b"{}")],
        [],
        "o",
        b"{}",
    )
    assert merger.refresh() is True and merger.rebuilds == 2
    assert (tmp_path / "filtered.jsonl").read_bytes() == more
    assert merger.merge() == {"trajectories.jsonl": 1, "failed.jsonl": 0, "filtered.jsonl": 1}
    ledger.close()
