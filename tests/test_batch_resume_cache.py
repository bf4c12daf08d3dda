"""The saved dataset index and the resume planner: a resume that skips work must give exactly
the keys, indexes and to-do list that a fresh full parse and a full comparison give."""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from trajforge.batch import ledger as ledger_module
from trajforge.batch import plan as plan_module
from trajforge.batch.config import load_config
from trajforge.batch.dataset import INDEX_FILE, DatasetError, DatasetIndex, index_dataset, save_index
from trajforge.batch.ledger import Commit, Ledger
from trajforge.batch.plan import plan_run
from trajforge.batch.runner import run_batch
from trajforge.testing.scripted_server import echo_policy

KEY_ENV = "TF_RESUME_CACHE_TEST_KEY"


def _rows(n: int, start: int = 0) -> list[bytes]:
    out = []
    for i in range(start, start + n):
        if i % 7 == 3:
            out.append(orjson.dumps({"cwd": "w", "prompt": f"p{i % 5}"}))  # extra field, repeats
        else:
            out.append(orjson.dumps({"prompt": f"p{i % 5}"}))  # every prompt appears several times
    return out


def _write(path: Path, lines: list[bytes], *, trailing_newline: bool = True) -> Path:
    path.write_bytes(b"\n".join(lines) + (b"\n" if trailing_newline else b""))
    return path


def _view(index: DatasetIndex) -> tuple[list[str], list[int], dict[int, str]]:
    return list(index.keys), list(index.offsets), dict(index.bad)


def _full(path: Path, **kw: Any) -> DatasetIndex:
    return index_dataset(path, **kw)


def _cached(path: Path, cache: Path, **kw: Any) -> DatasetIndex:
    return index_dataset(path, cache=cache, **kw)


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    lines = _rows(40)
    lines.insert(10, b"")  # a blank line is skipped, but still counts for line numbers
    lines.insert(20, b'{"prompt": ')  # a bad row
    lines.insert(30, b'{"prompt": ')  # the same bad row again: its own key
    return _write(tmp_path / "d.jsonl", lines)


def _saved(dataset: Path, tmp_path: Path, **kw: Any) -> Path:
    cache = tmp_path / INDEX_FILE
    assert save_index(_full(dataset, skip_bad_rows=True, **kw), cache)
    return cache


# -- the saved index ------------------------------------------------------------------------------
def test_cache_hit_gives_the_full_parse(dataset: Path, tmp_path: Path) -> None:
    cache = _saved(dataset, tmp_path)
    full, hit = _full(dataset, skip_bad_rows=True), _cached(dataset, cache, skip_bad_rows=True)
    assert hit.cached_rows == full.total_rows == 42  # nothing parsed again
    assert _view(hit) == _view(full)
    assert hit.to_loaded() == full.to_loaded()  # samples and bad rows (reason, line) materialize alike
    assert hit.fingerprint(42) == full.fingerprint(42) and hit.fingerprint(41) == full.fingerprint(41)
    assert [b.reason[:8] for b in hit.to_loaded().bad_rows] == ["line 21:", "line 31:"]
    assert not save_index(hit, cache)  # nothing new to save


def _edit_middle(lines: list[bytes]) -> list[bytes]:
    lines[25] = lines[25].replace(b"p", b"q")  # same length: only the content tells
    return lines


def _reorder(lines: list[bytes]) -> list[bytes]:
    random.Random(1).shuffle(lines)
    return lines


@pytest.mark.parametrize(
    ("change", "reuses_prefix"),
    [
        (_edit_middle, False),
        (_reorder, False),
        (lambda lines: lines[:30], False),  # truncated
        (lambda lines: [lines[5], *lines], False),  # a duplicate inserted at the top
        (lambda lines: lines + _rows(12, 40) + [b'{"prompt": ', b"[1]"], True),  # appended
        (lambda lines: lines[:-1] + [lines[-1].replace(b"}", b', "cwd": "x"}')], False),  # last row
    ],
)
def test_changed_dataset_with_a_saved_index_gives_the_full_parse(
    dataset: Path, tmp_path: Path, change: Callable[[list[bytes]], list[bytes]], reuses_prefix: bool
) -> None:
    cache = _saved(dataset, tmp_path)
    _write(dataset, change(dataset.read_bytes().split(b"\n")[:-1]))
    hit = _cached(dataset, cache, skip_bad_rows=True)
    assert _view(hit) == _view(_full(dataset, skip_bad_rows=True))
    assert hit.to_loaded() == _full(dataset, skip_bad_rows=True).to_loaded()
    assert (hit.cached_rows > 0) is reuses_prefix


def test_appended_rows_continue_occurrence_numbers_and_line_numbers(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.jsonl", [b'{"prompt": "a"}', b'{"prompt": "b"}'], trailing_newline=False)
    cache = tmp_path / INDEX_FILE
    assert save_index(_full(path), cache)  # covers only the first, newline-terminated row
    with open(path, "ab") as fh:  # the unterminated row is completed, then more rows follow
        fh.write(b'\n{"prompt": "a"}\n\n{"prompt": ')
    hit = _cached(path, cache, skip_bad_rows=True)
    assert hit.cached_rows == 1
    assert _view(hit) == _view(_full(path, skip_bad_rows=True))
    assert hit.keys[2].endswith("-1") and hit.keys[0][:-2] == hit.keys[2][:-2]  # second "a"
    assert hit.bad[3].startswith("line 5: malformed JSON")
    assert save_index(hit, cache)  # the longer prefix is saved for the next start
    again = _cached(path, cache, skip_bad_rows=True)
    assert again.cached_rows == 3 and _view(again) == _view(hit)


def test_max_samples_with_a_saved_index(dataset: Path, tmp_path: Path) -> None:
    cache = _saved(dataset, tmp_path, max_samples=15)
    assert _view(_cached(dataset, cache, max_samples=5)) == _view(_full(dataset, max_samples=5))
    more = _cached(dataset, cache, skip_bad_rows=True, max_samples=35)  # continues past the 15
    assert more.cached_rows == 15
    assert _view(more) == _view(_full(dataset, skip_bad_rows=True, max_samples=35))
    assert more.fingerprint(35) == _full(dataset, skip_bad_rows=True, max_samples=35).fingerprint(35)


def test_saved_bad_rows_still_fail_or_come_out(dataset: Path, tmp_path: Path) -> None:
    cache = _saved(dataset, tmp_path)
    with pytest.raises(DatasetError, match=r"line 21: malformed JSON.*--skip-bad-rows"):
        _cached(dataset, cache)  # without skip_bad_rows the saved bad row still stops the run
    rows = _cached(dataset, cache, skip_bad_rows=True).to_loaded().bad_rows
    assert [(b.index, b.raw) for b in rows] == [(19, '{"prompt": '), (29, '{"prompt": ')]
    assert rows[0].key != rows[1].key and all(b.key.startswith("bad-") for b in rows)


def _tamper_payload(blob: bytes) -> bytes:
    return blob[:-20] + bytes([blob[-20] ^ 1]) + blob[-19:]


def _tamper_header(blob: bytes) -> bytes:
    return blob.replace(b'"rows":42', b'"rows":41', 1)


@pytest.mark.parametrize(
    "spoil",
    [
        lambda blob: b"garbage" * 10,
        lambda blob: blob[: len(blob) // 2],
        _tamper_payload,
        _tamper_header,
        lambda blob: b"",
    ],
)
def test_corrupt_index_is_ignored(dataset: Path, tmp_path: Path, spoil: Callable[[bytes], bytes]) -> None:
    cache = _saved(dataset, tmp_path)
    cache.write_bytes(spoil(cache.read_bytes()))
    hit = _cached(dataset, cache, skip_bad_rows=True)
    assert hit.cached_rows == 0 and _view(hit) == _view(_full(dataset, skip_bad_rows=True))


def test_foreign_index_is_ignored(dataset: Path, tmp_path: Path) -> None:
    other = _write(tmp_path / "other.jsonl", [orjson.dumps({"prompt": f"o{i}"}) for i in range(60)])
    cache = tmp_path / INDEX_FILE
    save_index(_full(other), cache)
    hit = _cached(dataset, cache, skip_bad_rows=True)
    assert hit.cached_rows == 0 and _view(hit) == _view(_full(dataset, skip_bad_rows=True))


# -- the planner ----------------------------------------------------------------------------------
def _finish(ledger: Ledger, keys: list[str], state: str = "completed") -> None:
    commits = [Commit(k, state, "final_answer", i, 1, 0.0, b"{}", b"{}") for i, k in enumerate(keys)]
    ledger.commit("s.jsonl", len(keys), commits, [], "w", b"{}")


def _table(ledger: Ledger) -> list[tuple[Any, ...]]:
    return sorted(ledger._db.execute("SELECT key, idx, state FROM samples"))


def _outcome(path: Path, tmp_path: Path, name: str, index: DatasetIndex, *, forget_mark: bool) -> Any:
    copy = tmp_path / name
    shutil.copy(path, copy)
    ledger = Ledger(copy)
    try:
        if forget_mark:
            ledger.set_meta("plan", "")
        plan = plan_run(ledger, index)
        ledger.add_pending(plan.upserts, plan.mark)
        todo = [(s.key, s.index) for s in plan.todo]
        return plan.full, todo, [(b.key, b.index) for b in plan.bad], _table(ledger), plan.mark
    finally:
        ledger.close()


@pytest.mark.parametrize(
    ("change", "shortcut"),
    [
        (lambda lines: lines + _rows(9, 40) + [b"[2]"], True),  # appended, repeats, a bad row
        (lambda lines: lines, True),  # unchanged: only the still-open samples
        (lambda lines: lines[::-1], False),  # reordered
        (lambda lines: lines[:20], False),  # truncated
        (_edit_middle, False),
    ],
)
def test_planner_shortcut_agrees_with_the_full_comparison(
    tmp_path: Path, change: Callable[[list[bytes]], list[bytes]], shortcut: bool
) -> None:
    lines = [*_rows(30), b"{bad", *_rows(10, 30)]
    path = _write(tmp_path / "d.jsonl", lines)
    first = _full(path, skip_bad_rows=True)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    plan = plan_run(ledger, first)
    assert plan.full and len(plan.todo) == 40 and len(plan.bad) == 1
    ledger.add_pending(plan.upserts, plan.mark)
    done = random.Random(2).sample(first.keys, 25)
    _finish(ledger, done)
    ledger.mark_running([k for k in first.keys if k not in done][:3])  # left running by a crash
    ledger.close()

    cache = tmp_path / INDEX_FILE
    save_index(first, cache)
    _write(path, change(lines))
    now = _cached(path, cache, skip_bad_rows=True)
    fast = _outcome(tmp_path / "ledger.sqlite", tmp_path, "a.sqlite", now, forget_mark=False)
    slow = _outcome(tmp_path / "ledger.sqlite", tmp_path, "b.sqlite", now, forget_mark=True)
    assert slow[0] is True and fast[0] is not shortcut
    assert fast[1:] == slow[1:]  # same to-do, bad rows, ledger afterwards and mark
    expected = [(k, i) for i, k in enumerate(now.keys) if k not in done and i not in now.bad]
    assert fast[1] == expected


def test_long_tail_takes_the_full_comparison(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "d.jsonl", _rows(10))
    ledger = Ledger(tmp_path / "ledger.sqlite")
    first = plan_run(ledger, _full(path))
    ledger.add_pending(first.upserts, first.mark)
    _finish(ledger, _full(path).keys[:6])
    _write(path, _rows(16))
    monkeypatch.setattr(plan_module, "_MAX_TAIL_LOOKUPS", 5)
    long_tail = plan_run(ledger, _full(path))
    monkeypatch.setattr(plan_module, "_MAX_TAIL_LOOKUPS", 100)
    short_tail = plan_run(ledger, _full(path))
    assert long_tail.full and not short_tail.full
    assert [s.index for s in long_tail.todo] == [s.index for s in short_tail.todo] == list(range(6, 16))
    assert long_tail.mark == short_tail.mark
    ledger.close()


def test_open_samples_are_read_through_the_partial_index(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    query = ledger._db.execute("EXPLAIN QUERY PLAN SELECT key, idx FROM samples WHERE " + ledger_module._OPEN)
    assert "samples_open" in " ".join(str(row) for row in query)  # no scan of a million done rows
    ledger.add_pending([("a-0", 0), ("b-0", 1)])
    _finish(ledger, ["a-0"])
    assert ledger.open_samples() == [("b-0", 1)]
    ledger.close()


def test_planner_shortcut_is_used_and_ignores_stale_open_samples(tmp_path: Path) -> None:
    lines = [orjson.dumps({"prompt": f"u{i}"}) for i in range(10)]
    path = _write(tmp_path / "d.jsonl", lines)
    v1 = _full(path)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    first = plan_run(ledger, v1)
    ledger.add_pending(first.upserts, first.mark)
    lines[2] = b'{"prompt": "edited"}'  # row 2's old sample stays pending in the ledger, at index 2
    lines.pop()  # and the last row's at index 9
    v2 = _full(_write(path, lines))
    plan = plan_run(ledger, v2)  # full comparison, leaves a mark for these 9 rows
    assert plan.full
    ledger.add_pending(plan.upserts, plan.mark)
    _finish(ledger, [v2.keys[i] for i in (0, 1, 3, 4)])
    assert {(v1.keys[2], 2), (v1.keys[9], 9)} <= set(ledger.open_samples())
    plan = plan_run(ledger, v2)
    assert not plan.full  # the mark matched: only open samples were read
    assert [(s.key, s.index) for s in plan.todo] == [(v2.keys[i], i) for i in (2, 5, 6, 7, 8)]
    assert plan.todo[0].prompt == "edited"  # not the stale sample of the old row 2
    ledger.close()


# -- end to end -----------------------------------------------------------------------------------
async def test_resume_uses_the_saved_index(
    tmp_path: Path, scripted_server: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, "k")
    srv = await scripted_server(echo_policy)
    path = _write(tmp_path / "prompts.jsonl", [orjson.dumps({"prompt": p}) for p in ["a", "b", "a"]])
    cfg = load_config(
        None,
        {
            "dataset": path,
            "run_name": "run",
            "output_dir": tmp_path / "data",
            "model": "scripted",
            "base_url": srv.base_url,
            "api_key_env": KEY_ENV,
            "toolsets": ["terminal"],
            "sandbox": "local",
            "progress": "none",
            "require_reasoning": False,
        },
    )
    await run_batch(cfg)
    assert (cfg.run_dir / INDEX_FILE).exists()
    before = len(srv.requests)
    path.write_bytes(path.read_bytes() + b'{"prompt": "a"}\n{"prompt": "c"}\n')
    summary = await run_batch(cfg.model_copy(update={"resume": True}))
    assert len(srv.requests) - before == 2  # only the third "a" and "c" ran
    assert summary.statistics["status_counts"] == {"completed": 5}
    saved = index_dataset(path, cache=cfg.run_dir / INDEX_FILE)
    assert saved.cached_rows == 5 and saved.keys == _full(path).keys
