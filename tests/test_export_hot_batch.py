"""A batch at high temperature, every export format, every row through the real consumers.

The embedded tiny policy, sampled hot, writes malformed tool calls the way real models do (broken
JSON, markup the server could not parse, calls cut off by ``max_tokens``), next to calls that ran
and answers that solve the task. Every format is exported from that run and every row goes
through its trainer's own data code (tests/export_consumers.py): ``datasets``, TRL's templates
and its SFT and DPO data paths, LLaMA-Factory's converter and formatters, Axolotl's strategy.
Zero rows may fail, and no export may hold a call the agent did not run: the calls of every row
are checked against the tool results the run recorded for that sample.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from export_consumers import LlamaFactoryQwen, axolotl_strategy, chat_tokenizer, load, render
from trajforge.export.formats import FORMATS, EmptyExportError, ExportOptions, export
from trajforge.trajectory.calls import PARSE_ERROR_PREFIX

# the embedded model generates ~20k tokens on the CPU: a minute on a quiet 2-core machine, more on a busy one
pytestmark = [pytest.mark.slow, pytest.mark.bwrap, pytest.mark.timeout(2400)]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "tasks.jsonl"
FILES = ("trajectories.jsonl", "filtered.jsonl", "failed.jsonl")
TEMPLATES = ("qwen2_5", "llama3_1")
_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


@pytest.fixture(scope="module")
def hot_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 samples of examples/tasks.jsonl (2 per row) at temperature 1.6, graded by tiny_tasks."""
    from trajforge.batch.config import load_config
    from trajforge.batch.runner import run_batch

    root = tmp_path_factory.mktemp("hot")
    cfg = load_config(
        None,
        {
            "dataset": EXAMPLES,
            "run_name": "hot",
            "output_dir": root,
            "toolsets": ["terminal", "file"],
            "env": "tiny_tasks",
            "samples_per_prompt": 2,
            "temperature": 1.6,
            "max_tokens": 160,
            "max_turns": 4,
            "sample_timeout": 1800,  # a busy machine must not turn the samples into timeouts
            "progress": "none",
            "require_reasoning": False,
        },
    )
    return asyncio.run(run_batch(cfg)).run_dir


def _lines(run_dir: Path) -> dict[str, dict[str, Any]]:
    return {
        line["key"]: line
        for name in FILES
        for raw in (run_dir / name).read_bytes().splitlines()
        if raw.strip()
        for line in [orjson.loads(raw)]
    }


def _answered_calls(line: dict[str, Any]) -> list[str]:
    """The names of the calls the run answered, in order (the tool results it recorded)."""
    return [
        json.loads(body)["name"]
        for turn in line["conversations"]
        if turn["from"] == "tool"
        for body in _RESPONSE.findall(turn["value"])
    ]


def _calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for m in messages for c in m.get("tool_calls") or ()]


def _check_calls(messages: list[dict[str, Any]], line: dict[str, Any], *, exact: bool) -> list[str]:
    """What is wrong with the calls of one exported conversation (empty: nothing)."""
    problems = []
    calls = _calls(messages)
    answered = _answered_calls(line)
    names = [c["function"]["name"] for c in calls]
    for call in calls:
        args = call["function"]["arguments"]
        args = json.loads(args) if isinstance(args, str) else args
        if not call["function"]["name"] or not isinstance(args, dict):
            problems.append(f"{line['key']}: invented call {call}")
    replied = {m.get("tool_call_id") for m in messages if m["role"] == "tool"}
    trailing = {c["id"] for c in messages[-1].get("tool_calls") or ()} if messages else set()
    if any(c["id"] not in replied and c["id"] not in trailing for c in calls):
        problems.append(f"{line['key']}: a call without its result")  # only a cut-off last turn may
    if exact and (names != answered or len(names) != sum(s["count"] for s in line["tool_stats"].values())):
        problems.append(f"{line['key']}: calls {names} but the run answered {answered}")
    answered_names = [c["function"]["name"] for c in calls if c["id"] in replied]
    if not exact and Counter(answered_names) - Counter(answered):
        problems.append(f"{line['key']}: calls {names} not all answered ({answered})")
    return problems


def _llamafactory_calls(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A LLaMA-Factory row's calls (the JSON after a call turn's thought) and their observations,
    as messages, for :func:`_check_calls`."""
    messages: list[dict[str, Any]] = []
    for k, turn in enumerate(row["conversations"]):
        if turn["from"] == "function_call":
            parsed = json.loads(turn["value"].rpartition("\n</think>\n\n")[2])
            calls = [
                {"id": f"{k}-{j}", "function": c}
                for j, c in enumerate(parsed if isinstance(parsed, list) else [parsed])
            ]
            messages.append({"role": "assistant", "tool_calls": calls})
        elif turn["from"] == "observation" and messages and messages[-1].get("tool_calls"):
            messages += [{"role": "tool", "tool_call_id": c["id"]} for c in messages[-1]["tool_calls"]]
    return messages


def _consume(
    fmt: str, path: Path, tmp: Path, lines: dict[str, dict[str, Any]], *, exact: bool
) -> Iterator[str]:
    """Every problem a consumer has with the export at ``path`` (yielded, not raised)."""
    ds = load(path, tmp / "hf")
    rows = [ds[i] for i in range(ds.num_rows)]
    if fmt in ("messages", "parquet"):
        toks = [chat_tokenizer(tmp, t) for t in TEMPLATES]
        for row in rows:
            line = lines[row["key"]]
            yield from _check_calls(row["messages"], line, exact=exact)
            for template, tok in zip(TEMPLATES, toks, strict=True):
                try:
                    assert render(tok, row["messages"], row["tools"])
                except Exception as exc:  # noqa: BLE001 - every failure is reported, with its row
                    yield f"{fmt}/{template} {row['key']}: {type(exc).__name__}: {exc}"
    elif fmt == "axolotl":
        strategy, _ = axolotl_strategy(tmp)
        for row in rows:
            yield from _check_calls(row["messages"], lines[row["key"]], exact=exact)
            try:
                out = strategy.tokenize_prompt(dict(row))
                assert out["input_ids"] and any(label != -100 for label in out["labels"])
            except Exception as exc:  # noqa: BLE001
                yield f"axolotl {row['key']}: {type(exc).__name__}: {exc}"
    elif fmt == "llamafactory":
        lf = LlamaFactoryQwen()
        tok = chat_tokenizer(tmp, "qwen2_5")
        for row in rows:
            try:
                assert tok(lf.text(row))["input_ids"]
            except Exception as exc:  # noqa: BLE001
                yield f"llamafactory {row['key']}: {type(exc).__name__}: {exc}"
                continue
            yield from _check_calls(_llamafactory_calls(row), lines[row["key"]], exact=exact)
    else:  # sharegpt, hermes: text as the reference writes it; loaded whole above
        assert all(row["conversations"] for row in rows)


def _samples_with_malformed_calls(lines: dict[str, dict[str, Any]]) -> int:
    return sum(
        any(t["from"] == "human" and t["value"].startswith(PARSE_ERROR_PREFIX) for t in line["conversations"])
        for line in lines.values()
    )


def test_every_format_of_a_hot_run_loads_and_tokenizes_with_no_invented_call(
    hot_run: Path, tmp_path: Path
) -> None:
    lines = _lines(hot_run)
    assert len(lines) == 40
    malformed = _samples_with_malformed_calls(lines)
    assert malformed > 0, "the hot run wrote no malformed call: nothing was tested"
    for fmt in FORMATS:
        if fmt == "dpo":
            continue
        report = export(hot_run, fmt, tmp_path / fmt / f"out.{'parquet' if fmt == 'parquet' else 'jsonl'}")
        kept = sum(line["status"] == "completed" for line in lines.values())
        assert report.read == kept and report.rows + sum(report.left_out.values()) == kept, fmt
        assert report.rows > 0, (fmt, report.left_out)
        problems = list(_consume(fmt, report.path, tmp_path / fmt, lines, exact=True))
        assert problems == [], problems[:5]
    # every sample whose reply the loop could not parse was left out (and counted), not rendered
    messages = export(hot_run, "messages", tmp_path / "m.jsonl")
    exported = {orjson.loads(x)["key"] for x in messages.path.read_bytes().splitlines()}
    assert not any(
        any(
            t["value"].startswith(PARSE_ERROR_PREFIX)
            for t in lines[k]["conversations"]
            if t["from"] == "human"
        )
        for k in exported
    )


def test_every_sample_with_malformed_calls_as_text_still_loads_everywhere(
    hot_run: Path, tmp_path: Path
) -> None:
    lines = _lines(hot_run)
    opts = ExportOptions(include=FILES, malformed_calls="text")
    for fmt in FORMATS:
        if fmt == "dpo":
            continue
        report = export(
            hot_run, fmt, tmp_path / fmt / f"out.{'parquet' if fmt == 'parquet' else 'jsonl'}", options=opts
        )
        assert report.read == len(lines), fmt
        # only samples with no model answer, or rows LLaMA-Factory cannot read, are left out
        assert set(report.left_out) <= {"no model answer", "empty final answer"} | {
            w for w in report.left_out if w.startswith("llamafactory cannot read it")
        }, (fmt, report.left_out)
        problems = list(_consume(fmt, report.path, tmp_path / fmt, lines, exact=False))
        assert problems == [], problems[:5]


def test_dpo_pairs_of_a_hot_run_tokenize_in_trls_dpo_data_path_with_their_tools(
    hot_run: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig, DPOTrainer

    from trajforge.testing.tiny import build_tiny_model

    lines = _lines(hot_run)
    rewards = {
        p: {ln["reward"]["value"] for ln in lines.values() if ln["prompt_index"] == p} for p in range(20)
    }
    try:
        report = export(hot_run, "dpo", tmp_path / "dpo.jsonl")
    except EmptyExportError:  # a few runs in a hundred: no prompt that one sample solved and one did not
        stats = orjson.loads((tmp_path / "dpo.stats.json").read_bytes())
        differing = sum(len(r) > 1 for r in rewards.values())
        assert stats["pairs"] == 0 and (differing == 0 or stats["pairs_left_out"]), stats
        assert not (tmp_path / "dpo.jsonl").exists()
        return  # the TRL DPO data path with tools is also tests/test_export_dpo.py, on a scripted run
    assert report.rows > 0 and report.pairing is not None and report.pairing.ground == "reward"
    ds = load(report.path, tmp_path / "hf")
    for row in ds:
        chosen, rejected = lines[row["chosen_key"]], lines[row["rejected_key"]]
        assert row["chosen_reward"] > row["rejected_reward"] or report.pairing.ties_broken
        assert not _check_calls(row["prompt"] + row["chosen"], chosen, exact=True)
        assert not _check_calls(row["prompt"] + row["rejected"], rejected, exact=False)
    tok = chat_tokenizer(tmp_path, "qwen2_5")
    build_tiny_model(tmp_path / "model", tok)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"))
    args = DPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        report_to=[],
        use_cpu=True,
        dataset_num_proc=None,
        max_length=16384,  # the prompt holds the tool schemas: a tiny byte-level tokenizer makes it long
    )
    trainer = DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)  # tools kept
    assert len(trainer.train_dataset) == report.rows
    for row in trainer.train_dataset:
        prompt = tok.decode(row["prompt_ids"])
        assert '"name": "terminal"' in prompt  # the tools column was rendered into the prompt
        assert row["chosen_ids"] and row["rejected_ids"]


def test_a_hot_run_exports_no_call_markup_and_parquet_gives_trl_the_messages_tokens(
    hot_run: Path, tmp_path: Path
) -> None:
    """Issue 43's "must show", as a test: no row of an SFT format holds call markup (answers ending in
    a dangling ``</tool_call>``, reasoning with an unclosed ``<tool_call>{...``), and TRL's SFT
    trainer makes the same tokens of every Parquet row as of its ``messages`` row."""
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    from trajforge.llm.parsers.markup import call_tags
    from trajforge.testing.tiny import build_tiny_model

    tags = call_tags()

    def marked(text: Any) -> bool:
        return isinstance(text, str) and any(tag in text for tag in tags)

    paths = {
        fmt: export(hot_run, fmt, tmp_path / f"{fmt}.{'parquet' if fmt == 'parquet' else 'jsonl'}").path
        for fmt in ("messages", "axolotl", "parquet", "llamafactory")
    }
    for fmt in ("messages", "axolotl", "parquet"):
        ds = load(paths[fmt], tmp_path / "hf")
        bad = [
            row["key"]
            for row in ds
            if any(
                marked(m.get("content")) or marked(m.get("reasoning_content"))
                for m in row["messages"]
                if m["role"] == "assistant"
            )
        ]
        assert bad == [], (fmt, bad)
    for row in load(paths["llamafactory"], tmp_path / "hf"):
        texts = [t["value"] if t["from"] == "gpt" else t["value"].rpartition("\n</think>\n\n")[0]
                 for t in row["conversations"] if t["from"] in ("gpt", "function_call")]  # fmt: skip
        assert not any(marked(t) for t in texts), row["key"]
    tok = chat_tokenizer(tmp_path, "qwen2_5")
    build_tiny_model(tmp_path / "model", tok)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "model"))

    def trl_ids(path: Path, name: str) -> tuple[list[str], list[list[int]]]:
        ds = load(path, tmp_path / "hf")
        args = SFTConfig(
            output_dir=str(tmp_path / name),
            report_to=[],
            use_cpu=True,
            max_length=None,
            dataset_num_proc=None,
        )
        trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
        return ds["key"], [list(r["input_ids"]) for r in trainer.train_dataset]

    keys, messages = trl_ids(paths["messages"], "m")
    parquet_keys, parquet = trl_ids(paths["parquet"], "p")
    assert parquet_keys == keys and len(keys) > 0
    assert [k for k, a, b in zip(keys, messages, parquet, strict=True) if a != b] == []
