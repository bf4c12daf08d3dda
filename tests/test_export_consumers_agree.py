"""Every export format, read by its consumer the way docs/formats.md says, gives that consumer the
conversation the ``messages`` export holds: token for token where the consumer renders it with the
same chat template, turn for turn where it has a template of its own.

The reference is what TRL makes of the ``messages`` export (its SFT trainer's own dataset
preparation: ChatML conversion, the template with the ``tools`` column, tokenized). Then:

* ``parquet`` into TRL, through the same trainer's preparation and through TRL's data functions
  (``maybe_convert_to_chatml``, ``apply_chat_template``), row by row: the same ids. (The file once
  also carried the ShareGPT ``conversations`` column, which ``maybe_convert_to_chatml`` renames to
  ``messages`` over the real ones: every row trained on the reference's text, with no assistant
  turn a template could see.)
* ``parquet`` and ``axolotl`` into Axolotl's ``chat_template`` strategy with the same template
  (``chat_template: tokenizer_default``): the same ids as TRL's.
* ``llamafactory`` into LLaMA-Factory's ``SharegptDatasetConverter`` (the ``dataset_info.json``
  entry of docs/formats.md): its ``_system``/``_tools``/``_prompt``/``_response`` read back as
  messages are the messages row (LLaMA-Factory renders with its own template, so turns, not ids).
* ``sharegpt`` and ``hermes``: the reference's text format, read the way the reference's own
  reader does (:func:`trajforge.trajectory.calls.to_messages`): the same messages.
* ``dpo``: prompt + chosen is where the chosen sample's messages row goes, and prompt + rejected the
  rejected one's; the completions hold the model's turns only.

The run mixes clean tool conversations with every kind of malformed call, exported both by
default and with ``--malformed-calls text`` (then the malformed calls are the assistant's text in
every format alike).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import pytest

from export_consumers import LlamaFactoryQwen, axolotl_strategy, chat_tokenizer, load
from export_runs import BROKEN, MALFORMED, SCRIPTS, SYSTEM, _mixed_policy, read_jsonl
from trajforge.export.formats import ExportOptions, export
from trajforge.testing.policies import conversation_key, count_assistant_turns
from trajforge.testing.scripted_server import Reply, ToolCallSpec
from trajforge.trajectory.calls import to_messages

TEMPLATE = "qwen2_5"
# Two samples of each prompt (--group-size 2): the first to ask answers, the other fails, its calls
# never parsing; "part later" runs the same command in both before they part.
LS = ToolCallSpec("terminal", {"command": "ls"})
FORKS: dict[str, tuple[list[Reply], list[Reply]]] = {
    "part at once": ([Reply(content="nothing here", reasoning="easy")], [Reply(content=BROKEN)] * 3),
    "part later": (
        [Reply(tool_calls=[LS]), Reply(content="the directory is empty", reasoning="ls said so")],
        [Reply(tool_calls=[LS]), *[Reply(content=BROKEN)] * 3],
    ),
}


class ForkPolicy:
    """The scripts of :data:`FORKS` (by the rollout's seed: the first seed seen of a prompt gets
    the good script) beside every clean and malformed conversation of tests/export_runs.py."""

    def __init__(self) -> None:
        self.first: dict[str, int] = {}

    def __call__(self, body: dict[str, Any]) -> Reply:
        prompt = conversation_key(body)
        if prompt not in FORKS:
            return _mixed_policy(body)
        good, bad = FORKS[prompt]
        first = self.first.setdefault(prompt, body["seed"])
        script = good if body["seed"] == first else bad
        return script[count_assistant_turns(body)]


OPTIONS = {"default": ExportOptions(), "text": ExportOptions(malformed_calls="text")}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One finished batch of every clean and every malformed scripted conversation (two samples
    of each prompt, so DPO has groups)."""
    from trajforge.batch.config import load_config
    from trajforge.batch.runner import run_batch
    from trajforge.testing.scripted_server import ScriptedServer

    root = tmp_path_factory.mktemp("agree")
    dataset = root / "d.jsonl"
    prompts = (*SCRIPTS, *MALFORMED, *FORKS)
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))

    async def go() -> Path:
        async with ScriptedServer(ForkPolicy(), api_key="k") as srv:
            cfg = load_config(
                None,
                {
                    "dataset": dataset,
                    "run_name": "run",
                    "output_dir": root / "data",
                    "model": "scripted",
                    "base_url": srv.base_url,
                    "api_key_env": "TRAJFORGE_AGREE_KEY",
                    "toolsets": ["terminal", "file"],
                    "system_prompt": SYSTEM,
                    "sandbox": "local",
                    "progress": "none",
                    "require_reasoning": False,
                    "retry_backoff": 0.01,
                    "samples_per_prompt": 2,
                    "max_turns": 6,
                },
            )
            await run_batch(cfg)
            return Path(cfg.run_dir)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAJFORGE_AGREE_KEY", "k")
        yield asyncio.run(go())


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return chat_tokenizer(tmp_path_factory.mktemp("tok"), TEMPLATE)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, tok: Any) -> Any:
    from transformers import AutoModelForCausalLM

    from trajforge.testing.tiny import build_tiny_model

    where = tmp_path_factory.mktemp("model")
    build_tiny_model(where, tok)
    return AutoModelForCausalLM.from_pretrained(str(where))


def _export(run_dir: Path, fmt: str, options: str, out: Path) -> Path:
    path = out / f"{fmt}-{options}.{'parquet' if fmt == 'parquet' else 'jsonl'}"
    return export(run_dir, fmt, path, options=OPTIONS[options]).path


def trl_sft_ids(ds: datasets.Dataset, tok: Any, model: Any, out: Path) -> list[list[int]]:
    """The input ids TRL's SFT trainer prepares from ``ds`` (its own ``_prepare_dataset``)."""
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=str(out / "sft"), report_to=[], use_cpu=True, max_length=None, dataset_num_proc=None
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    return [list(row["input_ids"]) for row in trainer.train_dataset]


def trl_function_ids(row: dict[str, Any], tok: Any) -> list[int]:
    """TRL's data functions on one row: ChatML conversion, then its ``apply_chat_template``."""
    from trl.data_utils import apply_chat_template, maybe_convert_to_chatml

    example = maybe_convert_to_chatml(dict(row))
    tools = example.pop("tools", None)
    tools = json.loads(tools) if isinstance(tools, str) else tools
    keep = {k: v for k, v in example.items() if k in ("messages", "prompt", "completion")}
    text = apply_chat_template(keep, tok, tools=tools)["text"]
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _plain(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages compared as a conversation: ids dropped, arguments decoded, empty fields equal."""
    out = []
    for m in messages:
        calls = [
            {
                "name": c["function"]["name"],
                "arguments": json.loads(c["function"]["arguments"])
                if isinstance(c["function"]["arguments"], str)
                else c["function"]["arguments"],
            }
            for c in m.get("tool_calls") or ()
        ]
        out.append(
            {
                "role": m["role"],
                "content": m.get("content") or "",
                "reasoning": m.get("reasoning_content") or "",
                "calls": calls,
            }
        )
    return out


@pytest.mark.parametrize("options", list(OPTIONS))
def test_parquet_gives_trl_the_messages_tokens_row_for_row(
    run_dir: Path, tok: Any, model: Any, tmp_path: Path, options: str
) -> None:
    messages = load(_export(run_dir, "messages", options, tmp_path), tmp_path / "hf")
    parquet = load(_export(run_dir, "parquet", options, tmp_path), tmp_path / "hf")
    assert parquet["key"] == messages["key"] and messages.num_rows >= 3
    reference = trl_sft_ids(messages, tok, model, tmp_path / "m")
    assert trl_sft_ids(parquet, tok, model, tmp_path / "p") == reference
    for i in range(parquet.num_rows):  # TRL's data functions, row by row
        assert trl_function_ids(parquet[i], tok) == trl_function_ids(messages[i], tok) == reference[i]
    # and what TRL trains on is the conversation: every assistant turn's text is in it
    for i, row in enumerate(messages):
        text = tok.decode(reference[i])
        assert all((m.get("content") or "") in text for m in row["messages"] if m["role"] == "assistant")


@pytest.mark.parametrize("fmt", ["axolotl", "parquet"])
def test_axolotl_tokenizes_the_export_as_trl_tokenizes_messages(
    run_dir: Path, tok: Any, model: Any, tmp_path: Path, fmt: str
) -> None:
    messages = load(_export(run_dir, "messages", "text", tmp_path), tmp_path / "hf")
    reference = trl_sft_ids(messages, tok, model, tmp_path / "m")
    rows = load(_export(run_dir, fmt, "text", tmp_path), tmp_path / "hf")
    assert rows["key"] == messages["key"]
    strategy, _ = axolotl_strategy(tmp_path, TEMPLATE)
    for i, row in enumerate(rows):
        out = strategy.tokenize_prompt(dict(row))
        assert list(out["input_ids"]) == reference[i], row["key"]
        assert any(label != -100 for label in out["labels"])  # an assistant turn to train


def _llamafactory_messages(out: dict[str, Any]) -> list[dict[str, Any]]:
    """LLaMA-Factory's aligned turns read back as messages: a ``function`` turn is the reasoning
    (its ``<think>`` block) and the calls (the JSON after it); an ``observation`` of several results
    is their JSON list."""
    messages: list[dict[str, Any]] = []
    for turn in out["_prompt"] + out["_response"]:
        role, content = turn["role"], turn["content"]
        if role == "function":
            thought, _, body = content.rpartition("\n</think>\n\n")
            calls = json.loads(body)
            calls = calls if isinstance(calls, list) else [calls]
            text = thought.removeprefix("<think>\n")
            messages.append(
                {"role": "assistant", "thought": text, "calls": [(c["name"], c["arguments"]) for c in calls]}
            )
        elif role == "observation":
            n = len(messages[-1].get("calls") or ()) if messages else 0
            results = json.loads(content) if n > 1 else [content]
            messages += [{"role": "tool", "content": r} for r in results]
        elif role == "assistant":
            messages.append({"role": "assistant", "text": content})
        else:
            messages.append({"role": role, "content": content})
    return messages


def _as_llamafactory_reads(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages row as LLaMA-Factory keeps each turn (docs/formats.md, ``llamafactory``)."""
    out: list[dict[str, Any]] = []
    for m in row["messages"]:
        if m["role"] == "system":
            continue
        if m["role"] == "assistant" and m.get("tool_calls"):
            thought = "\n\n".join(x for x in (m.get("reasoning_content"), m.get("content")) if x)
            calls = [(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]]
            out.append({"role": "assistant", "thought": thought, "calls": calls})
        elif m["role"] == "assistant":
            reasoning = m.get("reasoning_content")
            text = m.get("content") or ""
            out.append(
                {
                    "role": "assistant",
                    "text": f"<think>\n{reasoning}\n</think>\n\n{text}" if reasoning else text,
                }
            )
        elif m["role"] == "tool":
            out.append({"role": "tool", "content": m["content"]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def test_llamafactory_converter_reads_the_messages_conversation(run_dir: Path, tmp_path: Path) -> None:
    lf = LlamaFactoryQwen()
    messages = {r["key"]: r for r in read_jsonl(_export(run_dir, "messages", "text", tmp_path))}
    rows = load(_export(run_dir, "llamafactory", "text", tmp_path), tmp_path / "hf")
    assert rows.num_rows >= 3
    for row in rows:
        out = lf.converted(dict(row))
        source = messages[row["key"]]
        assert out["_system"].startswith(SYSTEM) and json.loads(out["_tools"]) == source["tools"]
        assert _llamafactory_messages(out) == _as_llamafactory_reads(source), row["key"]
        assert lf.text(dict(row))  # and its qwen template's formatters render it


@pytest.mark.parametrize("fmt", ["sharegpt", "hermes"])
def test_the_reference_formats_hold_the_messages_conversation(
    run_dir: Path, tmp_path: Path, fmt: str
) -> None:
    messages = read_jsonl(_export(run_dir, "messages", "text", tmp_path))
    rows = read_jsonl(_export(run_dir, fmt, "text", tmp_path))
    assert len(rows) == len(messages)
    for row, source in zip(rows, messages, strict=True):
        turns = row["conversations"]
        assert turns[0]["from"] == "system" and '"name": "terminal"' in turns[0]["value"]
        chat = to_messages(turns[1:], ended_on_answer=source["status"] == "completed")
        assert _plain(chat.messages) == _plain([m for m in source["messages"] if m["role"] != "system"])


def test_dpo_prompt_and_completions_are_the_samples_conversations(
    run_dir: Path, tok: Any, model: Any, tmp_path: Path
) -> None:
    from trl import DPOConfig, DPOTrainer

    everything = ExportOptions(
        include=("trajectories.jsonl", "filtered.jsonl", "failed.jsonl"), malformed_calls="text"
    )
    conversations = {
        r["key"]: r["messages"]
        for r in read_jsonl(export(run_dir, "messages", tmp_path / "all.jsonl", options=everything).path)
    }
    report = export(run_dir, "dpo", tmp_path / "dpo.jsonl")
    rows = read_jsonl(report.path)
    assert {r["shared_turns"] for r in rows} >= {1, 3}  # parted at the first turn, and after a shared call
    for row in rows:
        for side in ("chosen", "rejected"):
            whole = conversations[row[f"{side}_key"]]
            got = row["prompt"] + row[side]
            assert _plain(got) == _plain(whole[: len(got)]), (side, row[f"{side}_key"])
            assert row[side] and all(m["role"] == "assistant" for m in row[side]), row[side]
        assert _plain(row["chosen"]) != _plain(row["rejected"])
    ds = load(report.path, tmp_path / "hf")
    args = DPOConfig(
        output_dir=str(tmp_path / "dpo"), report_to=[], use_cpu=True, dataset_num_proc=None, max_length=None
    )
    trainer = DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    assert len(trainer.train_dataset) == len(rows)
    for prepared in trainer.train_dataset:
        for side in ("chosen", "rejected"):
            completion = tok.decode(prepared[f"{side}_ids"])
            assert "<tool_response>" not in completion and "could not be parsed" not in completion
