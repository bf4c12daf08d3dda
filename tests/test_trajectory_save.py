"""Saving trajectories: reference file names and fields, lossless messages, no torn lines."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from datetime import datetime
from pathlib import Path

import pytest

from trajforge.trajectory import COMPLETED_FILE, FAILED_FILE, asave_trajectory, save_trajectory, to_sharegpt

MESSAGES = [
    {"role": "system", "content": "runtime prompt"},
    {"role": "user", "content": "héllo"},
    {"role": "assistant", "content": "hi", "reasoning": "greet"},
]


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_completed_and_failed_go_to_their_files(tmp_path: Path) -> None:
    conv = to_sharegpt(MESSAGES, [])
    done = save_trajectory(tmp_path, conv, "m-1", True, messages=MESSAGES)
    failed = save_trajectory(tmp_path, conv, "m-1", False)
    assert done == tmp_path / COMPLETED_FILE and failed == tmp_path / FAILED_FILE
    [line] = _lines(done)
    assert list(line)[:4] == ["conversations", "timestamp", "model", "completed"]
    assert line["conversations"] == conv and line["model"] == "m-1" and line["completed"] is True
    assert line["messages"] == MESSAGES  # the lossless record, runtime prompt and reasoning included
    assert datetime.fromisoformat(line["timestamp"]).tzinfo is not None
    [fline] = _lines(failed)
    assert fline["completed"] is False and "messages" not in fline


def test_appends_and_creates_directory(tmp_path: Path) -> None:
    target = tmp_path / "new" / "dir"
    for k in range(3):
        save_trajectory(target, [{"from": "human", "value": str(k)}], "m", True, extra={"prompt_index": k})
    lines = _lines(target / COMPLETED_FILE)
    assert [ln["prompt_index"] for ln in lines] == [0, 1, 2]
    assert (target / COMPLETED_FILE).read_bytes().count(b"\n") == 3


def test_utf8_is_written_unescaped(tmp_path: Path) -> None:
    save_trajectory(tmp_path, to_sharegpt(MESSAGES, []), "m", True)
    assert "héllo".encode() in (tmp_path / COMPLETED_FILE).read_bytes()


def test_extra_may_not_overwrite_core_fields(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="overwrite"):
        save_trajectory(tmp_path, [], "m", True, extra={"completed": False})
    assert not (tmp_path / COMPLETED_FILE).exists()


def _writer(path: str, worker: int, count: int) -> None:
    big = "x" * 200_000  # far above PIPE_BUF: a torn or interleaved write would corrupt lines
    for k in range(count):
        save_trajectory(path, [{"from": "human", "value": big}], f"w{worker}", True, extra={"k": k})


def test_concurrent_processes_never_tear_lines(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 10)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = _lines(tmp_path / COMPLETED_FILE)
    assert len(lines) == 30
    assert sorted((ln["model"], ln["k"]) for ln in lines) == sorted(
        (f"w{w}", k) for w in range(3) for k in range(10)
    )


async def test_async_save_from_many_tasks(tmp_path: Path) -> None:
    async with asyncio.TaskGroup() as tg:
        for k in range(20):
            tg.create_task(
                asave_trajectory(tmp_path, [{"from": "human", "value": "v" * 50_000}], "m", k % 2 == 0)
            )
    assert len(_lines(tmp_path / COMPLETED_FILE)) == 10
    assert len(_lines(tmp_path / FAILED_FILE)) == 10
