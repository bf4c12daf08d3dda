"""The messages export renders right in real chat templates and in TRL's SFT data path.

Tool-call arguments used to be JSON strings in the export, so templates that ``tojson`` them
(Qwen2.5, Llama 3.1, gpt-oss) rendered ``"arguments": "{\\"command\\": ...}"`` and SFT trained the
model to emit that. The templates here are the real ones TRL ships (``trl/chat_templates``),
put into a tiny tokenizer built in the test; nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pytest
import trl

from export_runs import SYSTEM, read_jsonl, tool_run
from trajforge.export.formats import export_run
from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer

TEMPLATES = Path(trl.__file__).parent / "chat_templates"
ONCE = (
    '{"command": "echo hi"}',
    '{"path": "notes.txt", "content": "hi"}',
    '{"command": "ls", "timeout": 5}',
)


def _load(path: Path, tmp_path: Path) -> datasets.Dataset:
    return datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))


async def test_messages_export_has_object_arguments_and_round_trips_through_datasets(
    tmp_path: Path, scripted_batch_config: Any
) -> None:
    run_dir = await tool_run(tmp_path, scripted_batch_config)
    path, n = export_run(run_dir, "messages")
    rows = read_jsonl(path)
    assert n == 2
    first = rows[0]["messages"]
    assert [m["role"] for m in first] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert first[0]["content"] == SYSTEM
    assert first[2]["tool_calls"][0]["function"]["arguments"] == {"command": "echo hi"}
    assert first[2]["content"] == "" and first[2]["reasoning_content"] == "check the directory"
    assert first[4]["tool_calls"][0]["function"]["arguments"] == {"path": "notes.txt", "content": "hi"}
    assert rows[1]["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"command": "ls", "timeout": 5}
    # the raw line keeps the exact call text
    line = read_jsonl(run_dir / "trajectories.jsonl")[0]
    assert '{"name": "terminal", "arguments": {"command": "echo hi"}}' in line["conversations"][2]["value"]

    ds = _load(path, tmp_path)
    assert [ds[i] for i in range(n)] == rows  # no union structs padded with nulls
    assert "None" not in json.dumps([ds[i] for i in range(n)])


def _tokenizer(tmp_path: Path, template: str) -> Any:
    tok = build_tiny_tokenizer(tmp_path / f"tok-{template}")
    tok.chat_template = (TEMPLATES / f"{template}.jinja").read_text()
    return tok


@pytest.mark.parametrize(
    ("template", "marker"),
    [
        ("qwen2_5", '<tool_call>\n{"name": "terminal", "arguments": {"command": "echo hi"}}\n</tool_call>'),
        ("llama3_1", '{"name": "terminal", "parameters": {"command": "echo hi"}}'),
        ("gptoss", 'to=functions.terminal<|channel|>commentary json<|message|>{"command": "echo hi"}'),
    ],
)
async def test_real_chat_templates_render_arguments_once_encoded(
    tmp_path: Path, scripted_batch_config: Any, template: str, marker: str
) -> None:
    run_dir = await tool_run(tmp_path, scripted_batch_config)
    path, _ = export_run(run_dir, "messages")
    ds = _load(path, tmp_path)
    tok = _tokenizer(tmp_path, template)
    texts = [tok.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False) for row in ds]
    joined = "\n".join(texts)
    assert marker in texts[0]
    for args in ONCE:
        assert args in joined, (template, args)
    for args in ONCE:
        assert json.dumps(args) not in joined, (template, args)  # nothing double-encoded
    assert '"arguments": "' not in joined and '"parameters": "' not in joined
    assert "null" not in joined  # no union-struct padding reached a template
    assert "echo hi" in texts[0] and "done: notes.txt written" in texts[0]


@pytest.mark.parametrize("template", ["qwen2_5", "llama3_1", "gptoss"])
async def test_trl_sft_data_path_tokenizes_the_export(
    tmp_path: Path, scripted_batch_config: Any, template: str
) -> None:
    """TRL's own dataset preparation (SFTTrainer: apply_chat_template with the ``tools`` column)."""
    from trl import SFTConfig, SFTTrainer

    run_dir = await tool_run(tmp_path, scripted_batch_config)
    path, _ = export_run(run_dir, "messages")
    ds = _load(path, tmp_path)
    tok = _tokenizer(tmp_path, template)
    model = build_tiny_model(tmp_path / "model", tok)
    args = SFTConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        per_device_train_batch_size=2,
        report_to=[],
        use_cpu=True,
        max_length=4096,
        dataset_num_proc=None,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    decoded = [tok.decode(row["input_ids"]) for row in trainer.train_dataset]
    assert len(decoded) == 2
    joined = "\n".join(decoded)
    for once in ONCE:
        assert once in joined, (template, once)
    assert not any(json.dumps(args) in joined for args in ONCE) and "null" not in joined
    assert '"name": "terminal"' in joined or "functions.terminal" in joined  # the tools were rendered
    trainer.train()
    assert trainer.state.global_step == 1
