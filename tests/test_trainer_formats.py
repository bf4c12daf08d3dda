"""The llamafactory and axolotl presets read right in those trainers' own converters
(wired in tests/export_consumers.py, which says how they are installed and imported)."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import datasets

from export_consumers import axolotl_strategy, llamafactory, llamafactory_dataset_attr
from export_runs import SYSTEM, read_jsonl, tool_run
from trajforge.export.formats import export_run

PROMPTS = ("make notes", "list files", "explain then act")


async def test_llamafactory_converter_keeps_every_turn(tmp_path: Path, scripted_batch_config: Any) -> None:
    converter_mod, formatter_mod = llamafactory()
    run_dir = await tool_run(tmp_path, scripted_batch_config, PROMPTS)
    path, n = export_run(run_dir, "llamafactory")
    messages_rows = read_jsonl(export_run(run_dir, "messages")[0])
    ds = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    assert n == 3 and [ds[i] for i in range(n)] == read_jsonl(path)
    convert = converter_mod.SharegptDatasetConverter(
        llamafactory_dataset_attr(), types.SimpleNamespace(media_dir="")
    )
    function = formatter_mod.FunctionFormatter(slots=["{{content}}<|im_end|>\n"], tool_format="qwen")
    observation = formatter_mod.StringFormatter(
        slots=[
            "<|im_start|>user\n<tool_response>\n{{content}}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        ]
    )
    for row, source in zip(ds, messages_rows, strict=True):
        out = convert(row)
        turns = out["_prompt"] + out["_response"]
        chat = [m for m in source["messages"] if m["role"] != "system"]
        # every turn survives (consecutive tool results are one observation) and none was skipped
        assert len(turns) == len(chat) and out["_response"], row
        assert out["_system"] == SYSTEM and json.loads(out["_tools"]) == source["tools"]
        assert [t["role"] for t in turns] == [
            {
                "user": "user",
                "assistant": "function" if m.get("tool_calls") else "assistant",
                "tool": "observation",
            }[m["role"]]
            for m in chat
        ]
        for turn, msg in zip(turns, chat, strict=True):
            if turn["role"] == "function":
                rendered = "".join(
                    function.apply(content=turn["content"], thought_words=("<think>", "</think>"))
                )
                call = msg["tool_calls"][0]["function"]
                once = json.dumps({"name": call["name"], "arguments": call["arguments"]}, ensure_ascii=False)
                assert f"<tool_call>\n{once}\n</tool_call>" in rendered
                if msg.get("content"):  # prose next to a call is kept, inside the thought block
                    assert msg["content"] in rendered and msg["reasoning_content"] in rendered
            elif turn["role"] == "observation":
                rendered = "".join(observation.apply(content=turn["content"]))
                assert rendered.count("<tool_response>") == 1 and msg["content"] in rendered
            else:
                assert msg["content"] in turn["content"]


async def test_axolotl_chat_template_strategy_keeps_every_turn(
    tmp_path: Path, scripted_batch_config: Any
) -> None:
    strategy, tok = axolotl_strategy(tmp_path)
    run_dir = await tool_run(tmp_path, scripted_batch_config, PROMPTS)
    path, n = export_run(run_dir, "axolotl")
    messages_rows = read_jsonl(export_run(run_dir, "messages")[0])
    ds = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    assert n == 3 and [ds[i] for i in range(n)] == read_jsonl(path)  # strings: one Arrow schema
    for row, source in zip(ds, messages_rows, strict=True):
        out = strategy.tokenize_prompt(dict(row))
        text = tok.decode(out["input_ids"])
        trained = tok.decode(
            [t for t, label in zip(out["input_ids"], out["labels"], strict=True) if label != -100]
        )
        assert SYSTEM in text and '"name": "terminal"' in text  # system prompt and tools rendered
        for msg in source["messages"]:
            for call in msg.get("tool_calls") or ():
                args = call["function"]["arguments"]
                once = json.dumps(args, ensure_ascii=False)
                assert f'"arguments": {once}' in trained and json.dumps(once) not in text
            if msg["role"] == "tool":
                assert msg["content"] in text
            elif msg["role"] == "assistant" and msg["content"]:
                assert msg["content"] in trained
            elif msg["role"] == "user":
                assert msg["content"] in text and msg["content"] not in trained
