"""A line says what its sample was asked with: the run's system prompt and the row's other fields.

Before, ``--system-prompt`` text was in no record or export, and a row's ``expected``/ids were
dropped, so nothing could be graded afterwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import orjson

from trajforge.batch.runner import run_batch
from trajforge.export.formats import export_run
from trajforge.testing.scripted_server import Reply, ScriptedServer


async def test_system_prompt_and_row_fields_reach_the_line_and_the_exports(
    tmp_path: Path, scripted_batch_config
) -> None:
    rows: list[dict[str, Any]] = [
        {"prompt": "2+2?", "id": "q1", "expected": "4", "tags": ["math"]},
        {"prompt": "3+3?", "id": "q2", "expected": "6", "tags": []},
        {"prompt": "plain"},
    ]
    async with ScriptedServer(lambda body: Reply(content="ok"), api_key="k") as srv:
        await run_batch(scripted_batch_config(rows, srv.base_url, system_prompt="You are terse."))
        sent = srv.requests[0]["messages"][0]
    _check(tmp_path, sent)


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
