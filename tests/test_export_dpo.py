"""DPO pairs by reward inside a prompt_index group, the fallback that says so, and TRL DPO on them.

Most lines are written by hand in the shape ``batch`` gives them (top-level ``reward``,
``metadata.sample_index``, several lines per ``prompt_index`` with ``--samples-per-prompt``); the
grounding test runs a real graded batch (scripted endpoint, tiny_tasks in bwrap). The TRL run on
pairs that carry tools is tests/test_export_hot_batch.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import datasets
import orjson
import pytest
import trl
from typer.testing import CliRunner

from export_runs import read_jsonl
from trajforge.cli.main import app
from trajforge.export.formats import ExportOptions, export
from trajforge.tasks import generate, terminal_output
from trajforge.testing.policies import count_assistant_turns
from trajforge.testing.replies import Reply, ToolCallSpec
from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer
from trajforge.trajectory.selection import Selection


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
    for name, keep in (("trajectories.jsonl", ("completed",)), ("failed.jsonl", ("failed", "partial"))):
        (run_dir / name).write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines if x["status"] in keep))
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
    assert "tools" in ds.column_names  # kept: TRL renders the tools column (docs/formats.md)
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


def _three_kinds_of_answer() -> Any:
    """Arithmetic in the terminal, three ways per prompt (the n-th sample of a prompt, mod 3):
    v0 computes and answers what it printed; v1 computes a wrong sum but answers the right number
    anyway (its answer contradicts its own tool output, and the env still pays 1: it reads only
    the final answer); v2 computes the wrong sum and answers it."""
    started: dict[str, int] = {}

    def policy(body: dict[str, Any]) -> Reply:
        prompt = next(str(m["content"]) for m in body["messages"] if m["role"] == "user")
        expr = (
            prompt.removeprefix("Compute ").split(" using")[0].removeprefix("Use the terminal to calculate ")
        )
        expr = expr.rstrip(".")
        if count_assistant_turns(body) == 0:
            n = started[prompt] = started.get(prompt, -1) + 1
            wrong = " + 1" if n % 3 else ""
            command = f"python3 -c 'print({expr}{wrong})' # v{n % 3}"
            return Reply(tool_calls=[ToolCallSpec("terminal", {"command": command})])
        call = next(m for m in body["messages"] if m.get("tool_calls"))["tool_calls"][0]
        variant = json.loads(call["function"]["arguments"])["command"].rsplit("# v", 1)[1]
        printed = terminal_output(str(next(m["content"] for m in body["messages"] if m["role"] == "tool")))
        answer = str(eval(expr)) if variant == "1" else printed  # noqa: S307 - the test's own arithmetic
        return Reply(content=f"The answer is {answer}.")

    return policy


@pytest.mark.timeout(900)  # a graded bwrap run, four exports and a DPO trainer on a busy machine
async def test_grounding_breaks_ties_and_keeps_contradicting_answers_from_being_chosen(
    scripted_server: Any, scripted_batch_config: Any, tmp_path: Path
) -> None:
    from trajforge.batch.runner import run_batch

    rows = [t.to_row() for t in generate("arithmetic", 2, seed=9)]
    srv = await scripted_server(_three_kinds_of_answer())
    cfg = scripted_batch_config(rows, srv.base_url, env="tiny_tasks", samples_per_prompt=3, sandbox="bwrap")
    run_dir = (await run_batch(cfg)).run_dir
    lines = {line["key"]: line for line in read_jsonl(run_dir / "trajectories.jsonl")}
    variant = {k: line["conversations"][2]["value"].split("# v")[1][0] for k, line in lines.items()}
    # the env pays the answer that contradicts its own tool output: the reward cannot tell
    assert sorted((variant[k], line["reward"]["value"]) for k, line in lines.items()) == [
        ("0", 1.0),
        ("0", 1.0),
        ("1", 1.0),
        ("1", 1.0),
        ("2", 0.0),
        ("2", 0.0),
    ]
    plain = read_jsonl(export(run_dir, "dpo", tmp_path / "plain.jsonl").path)
    assert sorted((variant[r["chosen_key"]], variant[r["rejected_key"]]) for r in plain) == [
        ("0", "2"),
        ("0", "2"),
        ("1", "2"),
        ("1", "2"),
    ]  # the contradicting answer is chosen twice; the two right answers tie and make no pair
    grounded = ExportOptions(select=Selection(grounded=True))
    report = export(run_dir, "dpo", tmp_path / "grounded.jsonl", options=grounded)
    rows_g = read_jsonl(report.path)
    assert sorted((variant[r["chosen_key"]], variant[r["rejected_key"]]) for r in rows_g) == [
        ("0", "1"),
        ("0", "1"),
        ("0", "2"),
        ("0", "2"),
    ]  # the tie goes to the grounded answer; the contradicting one is never chosen
    assert report.pairing is not None and report.pairing.ties_broken == 2
    assert report.pairing.pairs_left_out == {"answer not grounded in its tool outputs": 2}
    sft = export(run_dir, "messages", tmp_path / "sft.jsonl", options=grounded)
    assert sft.rows == 4 and sft.left_out == {"answer not grounded in its tool outputs": 2}
    _tokenizes_in_trl_dpo_with_its_tools(report.path, tmp_path)
    result = CliRunner().invoke(
        app, ["export", str(run_dir), "-f", "dpo", "--grounded", "-o", str(tmp_path / "c.jsonl")]
    )
    assert result.exit_code == 0, result.output
    assert (
        "2 ties broken by grounding" in result.output
        and "may not be chosen: answer not grounded" in result.output
    )


def test_zero_pairs_exit_non_zero_and_write_no_file(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, [_line(0, 0, "2+2?", "4", 1.0), _line(0, 1, "2+2?", "four", 1.0)])
    result = CliRunner().invoke(app, ["export", str(run_dir), "--format", "dpo"])
    assert result.exit_code == 2, result.output
    assert "0 pairs by reward from 2 lines in 1 groups (1 tied pairs skipped" in result.output
    assert not (run_dir / "export" / "dpo.jsonl").exists()
    stats = orjson.loads((run_dir / "export" / "dpo.stats.json").read_bytes())  # the why, kept
    assert stats["pairs"] == 0 and stats["tied_pairs_skipped"] == 1


def test_rejection_sampling_by_status_reward_and_best_per_prompt(tmp_path: Path) -> None:
    lines = [
        _line(0, 0, "2+2?", "4", 1.0),
        _line(0, 1, "2+2?", "4.0", 0.9),
        _line(0, 2, "2+2?", "5", 0.0),
        _line(0, 3, "2+2?", "four", 0.95, status="partial"),
        _line(1, 0, "3+3?", "6", "absent"),
        _line(1, 1, "3+3?", "7", 0.2, status="failed"),
    ]
    run_dir = _run(tmp_path, lines)

    def keys(**select: Any) -> list[str]:
        opts = ExportOptions(select=Selection(**select))
        rows = read_jsonl(export(run_dir, "messages", tmp_path / "m.jsonl", options=opts).path)
        return [r["key"] for r in rows]

    assert keys(min_reward=0.9) == ["key-0-0", "key-0-1"]  # trajectories.jsonl only, by default
    assert keys(statuses=frozenset({"partial"})) == ["key-0-3"]  # --status reads failed.jsonl
    assert keys(statuses=frozenset({"completed", "partial"}), max_per_prompt=1) == ["key-0-0", "key-1-0"]
    report = export(
        run_dir, "messages", tmp_path / "m.jsonl", options=ExportOptions(select=Selection(min_reward=0.5))
    )
    assert report.left_out == {"reward below 0.5": 1, "ungraded (no reward) with --min-reward": 1}
    row = read_jsonl(report.path)[0]
    assert (row["key"], row["prompt_index"], row["status"], row["reward"]) == ("key-0-0", 0, "completed", 1.0)
    # dpo: the selection says what may be chosen; --max-per-prompt keeps the widest margins
    dpo = ExportOptions(select=Selection(statuses=frozenset({"completed"}), max_per_prompt=2))
    pairs = read_jsonl(export(run_dir, "dpo", tmp_path / "d.jsonl", options=dpo).path)
    got = [(r["chosen_key"], r["rejected_key"]) for r in pairs]
    assert got == [("key-0-0", "key-0-2"), ("key-0-1", "key-0-2")]  # partial 0.95 may not be chosen
    stats = orjson.loads((tmp_path / "d.stats.json").read_bytes())
    assert stats["pairs_left_out"] == {"status partial not selected": 2, "over --max-per-prompt": 2}


def _tokenizes_in_trl_dpo_with_its_tools(path: Path, tmp_path: Path) -> None:
    """TRL's DPO data path on the whole export (no column dropped): the tools column is rendered
    into every prompt by a real chat template (Qwen2.5's tool system prompt)."""
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    ds = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    tok = build_tiny_tokenizer(tmp_path / "dpo-tok")
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    build_tiny_model(tmp_path / "dpo-model", tok)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "dpo-model"))
    args = DPOConfig(
        output_dir=str(tmp_path / "dpo-out"),
        max_steps=1,
        report_to=[],
        use_cpu=True,
        dataset_num_proc=None,
        max_length=16384,  # the prompt holds the tool schemas: a tiny byte-level tokenizer makes it long
    )
    trainer = DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    assert len(trainer.train_dataset) == ds.num_rows > 0
    for row in trainer.train_dataset:
        prompt = tok.decode(row["prompt_ids"])
        assert "<tools>" in prompt and '"name": "terminal"' in prompt  # the tools, rendered
        assert "python3 -c" in tok.decode(row["chosen_ids"]) and row["rejected_ids"]
