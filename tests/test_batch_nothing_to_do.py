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


async def test_a_resume_with_changed_settings_is_refused_before_it_says_nothing_to_do(
    tmp_path: Path, scripted_batch_config
) -> None:
    """It once said "nothing to do" and then failed with the error (issue 43): one or the other."""
    rows = [{"prompt": "a"}]
    async with ScriptedServer(lambda body: Reply(content="ok"), api_key="k") as srv:
        await run_batch(scripted_batch_config(rows, srv.base_url))
        said: list[str] = []
        with pytest.raises(RunError, match="different sampling settings"):
            await run_batch(
                scripted_batch_config(rows, srv.base_url, resume=True, seed=4), announce=said.append
            )
    assert not any("nothing to do" in line for line in said), said


async def test_a_resume_with_nothing_to_do_keeps_the_model_in_the_statistics(
    tmp_path: Path, scripted_batch_config
) -> None:
    """No model server starts on a finished run's resume; statistics.json was rewritten then with
    "model": null (issue 43, with the embedded model: no --model given)."""
    import orjson

    rows = [{"prompt": "a"}]
    async with ScriptedServer(lambda body: Reply(content="ok"), api_key="k") as srv:
        await run_batch(scripted_batch_config(rows, srv.base_url))
    stats = tmp_path / "data" / "run" / "statistics.json"
    assert orjson.loads(stats.read_bytes())["model"] == "scripted"
    # as an embedded run resumes: no --model, no --base-url (nothing is started, nothing is needed)
    await run_batch(scripted_batch_config(rows, None, model=None, api_key_env=None, resume=True))
    assert orjson.loads(stats.read_bytes())["model"] == "scripted"
