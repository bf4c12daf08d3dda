"""``--resume`` of a finished run says "nothing to do" without contacting (or starting) a model."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajforge.batch.runner import RunError, run_batch
from trajforge.testing.scripted_server import Reply, ScriptedServer


async def test_resume_of_a_finished_run_does_nothing_and_needs_no_endpoint(
    tmp_path: Path, scripted_batch_config
) -> None:
    rows = [{"prompt": "a"}, {"prompt": "b"}]
    async with ScriptedServer(lambda body: Reply(content="ok"), api_key="k") as srv:
        first = await run_batch(scripted_batch_config(rows, srv.base_url))
    assert first.output_counts["trajectories.jsonl"] == 2
    said: list[str] = []
    dead = "http://127.0.0.1:9/v1"  # nothing listens: a preflight here would fail the run
    again = await run_batch(scripted_batch_config(rows, dead, resume=True), announce=said.append)
    assert any("nothing to do" in line for line in said), said
    assert again.output_counts["trajectories.jsonl"] == 2
    rows.append({"prompt": "c"})  # a new row: there is work again, and the dead endpoint is found
    with pytest.raises(RunError, match="endpoint"):
        await run_batch(scripted_batch_config(rows, dead, resume=True), announce=said.append)
