"""DPO pairs by reward inside a prompt_index group, the fallback that says so, and TRL DPO on them.

The lines are written by hand in the shape ``batch`` gives them (top-level ``reward``,
``metadata.sample_index``, several lines per ``prompt_index`` with ``--samples-per-prompt``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import datasets
import orjson
import trl
from typer.testing import CliRunner

from export_runs import read_jsonl
from trajforge.batch.export import export
from trajforge.cli.main import app
from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer


def _line(
    index: int, k: int, prompt: str, answer: str, reward: Any, status: str = "completed"
) -> dict[str, Any]:
    line = {
        "prompt_index": index,
        "key": f"key-{index}-{k}",
        "status": status,
        "reason": None if status == "completed" else "scripted",
        "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": answer}],
        "metadata": {"sample_index": k, "system_prompt": "Answer with a number."},
        "completed": status == "completed",
        "partial": False,
        "toolsets_used": [],
    }
    if reward != "absent":
        line["reward"] = reward
    return line


def _run(tmp_path: Path, lines: list[dict[str, Any]]) -> Path:
    run_dir = tmp_path / "graded"
    run_dir.mkdir()
    (run_dir / "run.json").write_bytes(orjson.dumps({"tools": []}))
    for name, keep in (("trajectories.jsonl", "completed"), ("failed.jsonl", "failed")):
        (run_dir / name).write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines if x["status"] == keep))
    return run_dir


GRADED = [
    _line(0, 0, "2+2?", "4", 1.0),
    _line(0, 1, "2+2?", "5", 0.0),
    _line(0, 2, "2+2?", "6", 0.0, status="failed"),  # a failed sample can be graded too
    _line(1, 0, "3+3?", "6", None),  # ungraded
    _line(1, 1, "3+3?", "7", "absent"),  # ungraded
    _line(2, 0, "1+1?", "2", 0.5),
    _line(2, 1, "1+1?", "3", 0.5),  # tie
    _line(3, 0, "5+5?", "10", 1.0),
    _line(3, 1, "5+5?", "11", -1.0),
]


def test_pairs_follow_rewards_within_prompt_index(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, GRADED)
    report = export(run_dir, "dpo")
    rows = read_jsonl(report.path)
    got = {(r["prompt_index"], r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in rows}
    assert got == {(0, "4", "5"), (0, "4", "6"), (3, "10", "11")}
    assert all(r["chosen_reward"] > r["rejected_reward"] for r in rows)
    assert rows[0]["prompt"] == [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "2+2?"},
    ]
    assert report.pairing is not None and report.sidecar is not None
    stats = orjson.loads(report.sidecar.read_bytes())
    assert stats["ground"] == "reward" and stats["pairs"] == 3
    assert stats["tied_pairs_skipped"] == 2 and stats["ungraded_lines"] == 2 and stats["groups"] == 4
    # --include works for dpo too: only trajectories.jsonl -> the failed "6" is not there
    only = read_jsonl(export(run_dir, "dpo", tmp_path / "o.jsonl", include=["trajectories.jsonl"]).path)
    assert {(r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in only} == {
        ("4", "5"),
        ("10", "11"),
    }


def test_without_rewards_the_export_says_it_paired_by_completion(tmp_path: Path) -> None:
    lines = [_line(0, 0, "2+2?", "4", "absent"), _line(0, 1, "2+2?", "5", "absent", status="failed")]
    run_dir = _run(tmp_path, lines)
    result = CliRunner().invoke(app, ["export", str(run_dir), "--format", "dpo"])
    assert result.exit_code == 0, result.output
    assert (
        "pairs by completion_status: 1 pairs" in result.output
        and "no line of the run has a reward" in result.output
    )
    (row,) = read_jsonl(run_dir / "export" / "dpo.jsonl")
    assert row["chosen"][0]["content"] == "4" and row["rejected_status"] == "failed"
    stats = orjson.loads((run_dir / "export" / "dpo.stats.json").read_bytes())
    assert stats["ground"] == "completion_status" and stats["notes"]


def test_trl_dpo_trains_on_reward_pairs(tmp_path: Path) -> None:
    from trl import DPOConfig, DPOTrainer

    report = export(_run(tmp_path, GRADED), "dpo")
    ds = datasets.load_dataset(
        "json", data_files=str(report.path), split="train", cache_dir=str(tmp_path / "hf")
    )
    ds = ds.select_columns(["prompt", "chosen", "rejected"])
    tok = build_tiny_tokenizer(tmp_path / "tok")
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    build_tiny_model(tmp_path / "model", tok)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"))  # the reference model reloads it
    args = DPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        dataset_num_proc=None,
        logging_steps=1,
    )
    trainer = DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    first = trainer.train_dataset[0]
    assert "2+2?" in tok.decode(first["prompt_ids"])
    assert tok.decode(first["chosen_ids"]).startswith("4") and tok.decode(first["rejected_ids"]).startswith(
        "5"
    )
    out = trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(out.training_loss)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert losses and all(math.isfinite(x) for x in losses)
