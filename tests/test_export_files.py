"""Every file a run and its exports write loads in datasets 5.2, the empty ones included.

datasets 5.2 refuses to build a zero-row split with map-style ``load_dataset`` from any file,
JSON or Parquet ("corresponds to no data"); so no JSONL export writes a zero-row file (it exits
non-zero and says why), and the README recommends, for a set that may be empty, the Parquet
export (which carries its schema) read with ``streaming=True``: this test holds both to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import orjson
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from export_runs import read_jsonl, tool_run
from trajforge.cli.main import app
from trajforge.export.formats import FORMATS, EmptyExportError, ExportOptions, export, export_run
from trajforge.trajectory.selection import Selection


async def test_parquet_export_is_named_after_the_run_with_typed_messages_and_tools(
    tmp_path: Path, scripted_batch_config: Any
) -> None:
    run_dir = await tool_run(tmp_path, scripted_batch_config)
    path, n = export_run(run_dir, "parquet")
    assert path == run_dir / "export" / f"{run_dir.name}.parquet" and n == 2
    ds = datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    assert isinstance(ds.features["messages"].feature, datasets.Json)
    assert ds.features["prompt_index"] == datasets.Value("int64") and ds.features["status"] == datasets.Value(
        "string"
    )
    messages = read_jsonl(export_run(run_dir, "messages")[0])
    assert [ds[i]["messages"] for i in range(n)] == [r["messages"] for r in messages]
    assert [ds[i]["tools"] for i in range(n)] == [r["tools"] for r in messages]
    assert ds[0]["metadata"]["system_prompt"] == "You are careful." and ds[0]["status"] == "completed"


async def test_every_file_loads_and_empty_ones_load_as_the_readme_says(
    tmp_path: Path, scripted_batch_config: Any
) -> None:
    run_dir = await tool_run(tmp_path, scripted_batch_config)
    cache = str(tmp_path / "hf")
    for name in ("trajectories.jsonl",):
        assert (
            datasets.load_dataset(
                "json", data_files=str(run_dir / name), split="train", cache_dir=cache
            ).num_rows
            == 2
        )
    assert (run_dir / "failed.jsonl").read_bytes() == b""  # nothing failed: an empty file
    for fmt in FORMATS:
        out = tmp_path / "out" / f"{fmt}.{'parquet' if fmt == 'parquet' else 'jsonl'}"
        if fmt == "dpo":  # two prompts, one sample each: nothing to pair, and no empty file written
            with pytest.raises(EmptyExportError, match="0 pairs by completion_status"):
                export(run_dir, fmt, out)
            assert not out.exists()
            continue
        report = export(run_dir, fmt, out)
        assert report.rows == 2, fmt
        kind = "parquet" if fmt == "parquet" else "json"
        loaded = datasets.load_dataset(kind, data_files=str(report.path), split="train", cache_dir=cache)
        assert loaded.num_rows == report.rows, fmt
    # a selection that keeps nothing: every JSONL format refuses to write, parquet writes its schema
    nothing = ExportOptions(select=Selection(min_reward=1.0))
    for fmt in FORMATS:
        out = tmp_path / "none" / f"{fmt}.jsonl"
        if fmt == "parquet":
            assert export(run_dir, fmt, out, options=nothing).rows == 0
            continue
        with pytest.raises(EmptyExportError, match="nothing to export"):
            export(run_dir, fmt, out, options=nothing)
        assert not out.exists() and not list(out.parent.glob(f".{out.name}*")), fmt
    result = CliRunner().invoke(
        app, ["export", str(run_dir), "--min-reward", "1", "-o", str(tmp_path / "x.jsonl")]
    )
    assert result.exit_code == 2 and "2 ungraded (no reward) with --min-reward" in result.output
    # the empty failed.jsonl, exported to Parquet, loads with its columns (README recipe)
    empty = export(run_dir, "parquet", tmp_path / "failed.parquet", include=["failed.jsonl"])
    assert empty.rows == 0
    streamed = datasets.load_dataset("parquet", data_files=str(empty.path), split="train", streaming=True)
    assert list(streamed) == [] and isinstance(streamed.features["messages"].feature, datasets.Json)
    table = datasets.Dataset(pq.read_table(empty.path))
    assert table.num_rows == 0 and "tools" in table.column_names


async def test_the_parquet_export_draws_no_progress_bar(
    tmp_path: Path, scripted_batch_config: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """Before, datasets' ``to_parquet`` wrote "Creating parquet from Arrow format: 100%|..." to
    the terminal of whoever ran ``trajforge export``."""
    run_dir = await tool_run(tmp_path, scripted_batch_config)
    capfd.readouterr()
    result = CliRunner().invoke(app, ["export", str(run_dir), "-f", "parquet"])
    out, err = capfd.readouterr()
    assert result.exit_code == 0 and result.output.startswith("wrote 2 rows")
    assert "Creating parquet" not in result.output + out + err and "%|" not in result.output + out + err


def test_an_env_run_exports_and_a_line_that_is_no_record_is_named(tmp_path: Path) -> None:
    """An env run's records export like a batch run's (every status in ``episodes.jsonl``); a line
    that is no record of any version stops the export with its file and line number."""
    import shutil

    run_dir = tmp_path / "env"
    shutil.copytree(Path(__file__).parent / "fixtures" / "runs_v1" / "env" / "run", run_dir)
    result = CliRunner().invoke(app, ["export", str(run_dir), "-f", "sharegpt"])
    assert result.exit_code == 0 and result.output.startswith("wrote 4 rows"), result.output
    rows = [orjson.loads(x) for x in (run_dir / "export" / "sharegpt.jsonl").read_bytes().splitlines()]
    assert all(r["conversations"][0]["from"] == "system" for r in rows)
    assert all(any(turn["from"] == "tool" for turn in r["conversations"]) for r in rows)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "run.json").write_text('{"env": "tiny_tasks", "n": 1}')
    (tmp_path / "bad" / "episodes.jsonl").write_text('{"messages": []}\n')
    result = CliRunner().invoke(app, ["export", str(tmp_path / "bad")])
    assert result.exit_code == 2 and "episodes.jsonl:1: neither a record" in result.output
    assert not (tmp_path / "bad" / "export" / "messages.jsonl").exists()  # nothing written
