"""A line says what its sample was asked with: the run's system prompt and the row's other fields.

Before, ``--system-prompt`` text was in no record or export, and a row's ``expected``/ids were
dropped, so nothing could be graded afterwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import orjson
import pytest

from trajforge.batch.config import load_config
from trajforge.batch.export import export_run
from trajforge.batch.runner import run_batch
from trajforge.testing.scripted_server import Reply, ScriptedServer

KEY_ENV = "TF_CARRY_TEST_KEY"


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "k")


async def test_system_prompt_and_row_fields_reach_the_line_and_the_exports(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"prompt": "2+2?", "id": "q1", "expected": "4", "tags": ["math"]},
        {"prompt": "3+3?", "id": "q2", "expected": "6", "tags": []},
        {"prompt": "plain"},
    ]
    ds = tmp_path / "d.jsonl"
    ds.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    async with ScriptedServer(lambda body: Reply(content="ok"), api_key="k") as srv:
        await run_batch(_config(ds, tmp_path, srv.base_url))
        sent = srv.requests[0]["messages"][0]
    _check(tmp_path, sent)


def _config(ds: Path, tmp_path: Path, base_url: str) -> Any:
    return load_config(
        None,
        {
            "dataset": ds,
            "run_name": "run",
            "output_dir": tmp_path / "data",
            "model": "scripted",
            "base_url": base_url,
            "api_key_env": KEY_ENV,
            "toolsets": ["terminal"],
            "sandbox": "local",
            "progress": "none",
            "require_reasoning": False,
            "system_prompt": "You are terse.",
        },
    )


def _check(tmp_path: Path, sent: dict[str, Any]) -> None:
    assert sent == {"role": "system", "content": "You are terse."}
    run_dir = tmp_path / "data" / "run"
    lines = [orjson.loads(x) for x in (run_dir / "trajectories.jsonl").read_bytes().splitlines()]
    assert [line["metadata"].get("row") for line in lines] == [
        {"id": "q1", "expected": "4", "tags": ["math"]},
        {"id": "q2", "expected": "6", "tags": []},
        None,
    ]
    assert {line["metadata"]["system_prompt"] for line in lines} == {"You are terse."}
    loaded = datasets.load_dataset("json", data_files=str(run_dir / "trajectories.jsonl"), split="train")
    assert loaded[0]["metadata"]["row"]["expected"] == "4"
    out, n = export_run(run_dir, "messages")
    exported = datasets.load_dataset("json", data_files=str(out), split="train")
    assert n == 3 and exported[0]["messages"][0] == {"role": "system", "content": "You are terse."}
    assert exported[0]["messages"][1]["role"] == "user"
