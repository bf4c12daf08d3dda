"""The trainers' own data code, wired for the export tests: what each consumer does with one row.

Nothing here re-implements a trainer's rules; each function runs the consumer's code on a row and
raises when the consumer would refuse it:

* ``datasets``: ``load_dataset("json"|"parquet", ...)`` on the whole file;
* TRL's chat templates (``trl/chat_templates``, put into a tiny tokenizer built here) through
  ``apply_chat_template`` with the ``tools`` column, tokenized;
* LLaMA-Factory (0.9.5): ``SharegptDatasetConverter`` on the ``dataset_info.json`` entry
  docs/formats.md gives, then its ``qwen`` template's formatters (built as ``template.py``
  registers them: its template registry imports torchaudio, which this project does not install)
  applied in the order ``Template._encode`` applies them, tokenized;
* Axolotl (0.19): the ``chat_template`` prompt strategy's ``tokenize_prompt``.

LLaMA-Factory and Axolotl pin library versions this project cannot install next to TRL 1.16 and
datasets 5.2, so their wheels are installed without dependencies (Makefile) and only the
converter code is imported: LLaMA-Factory's ``data/converter.py`` and ``data/formatter.py``
(loaded without ``llamafactory/data/__init__.py``, which pulls torchaudio and gradio), Axolotl's
``prompt_strategies/chat_template.py`` (needs only colorama and addict besides our stack).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import datasets
import pytest
import trl

from trajforge.testing.tiny import build_tiny_tokenizer

TEMPLATES = Path(trl.__file__).parent / "chat_templates"


def load(path: Path, cache: Path) -> datasets.Dataset:
    kind = "parquet" if path.suffix == ".parquet" else "json"
    return datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=str(cache))


def chat_tokenizer(root: Path, template: str) -> Any:
    """A tiny byte-level tokenizer carrying one of TRL's real chat templates."""
    tok = build_tiny_tokenizer(root / f"tok-{template}")
    tok.chat_template = (TEMPLATES / f"{template}.jinja").read_text()
    return tok


def render(tok: Any, messages: list[dict[str, Any]], tools: Any) -> list[int]:
    """What TRL's SFT data path does with a messages row: the template with the tools, tokenized."""
    ids = tok.apply_chat_template(messages, tools=tools or None, tokenize=True, return_dict=False)
    return list(ids["input_ids"] if isinstance(ids, dict) else ids)


def llamafactory() -> tuple[Any, Any]:
    """LLaMA-Factory's converter and formatter modules (skips when it is not installed)."""
    loaded = sys.modules.get("llamafactory")
    if loaded is not None:  # already stubbed (below) by an earlier call
        root = list(loaded.__path__)[0]
    else:
        spec = importlib.util.find_spec("llamafactory")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(
                "llamafactory is not installed: pip install --no-deps llamafactory==0.9.5 (make test does)"
            )
        root = spec.submodule_search_locations[0]
    for name, sub in (
        ("llamafactory", ""),
        ("llamafactory.data", "/data"),
        ("llamafactory.extras", "/extras"),
    ):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [root + sub]
            sys.modules[name] = module
    return (
        importlib.import_module("llamafactory.data.converter"),
        importlib.import_module("llamafactory.data.formatter"),
    )


def llamafactory_dataset_attr() -> Any:
    """What LLaMA-Factory's parser makes of the dataset_info.json entry docs/formats.md gives."""
    return types.SimpleNamespace(
        messages="conversations",
        system="system",
        tools="tools",
        images=None,
        videos=None,
        audios=None,
        ranking=False,
        kto_tag=None,
        role_tag="from",
        content_tag="value",
        user_tag="human",
        assistant_tag="gpt",
        observation_tag="observation",
        function_tag="function_call",
        system_tag="system",
        load_from="file",
    )


class LlamaFactoryQwen:
    """LLaMA-Factory's converter and its ``qwen`` template's formatters, in ``Template._encode``'s order."""

    THOUGHT = ("<think>\n", "\n</think>\n\n")
    TOOL_CALL = ("<tool_call>", "</tool_call>")

    def __init__(self) -> None:
        converter, fmt = llamafactory()
        self.convert = converter.SharegptDatasetConverter(
            llamafactory_dataset_attr(), types.SimpleNamespace(media_dir="")
        )
        self.user = fmt.StringFormatter(
            slots=["<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n"]
        )
        self.assistant = fmt.StringFormatter(slots=["{{content}}<|im_end|>\n"])
        self.system = fmt.StringFormatter(slots=["<|im_start|>system\n{{content}}<|im_end|>\n"])
        self.function = fmt.FunctionFormatter(slots=["{{content}}<|im_end|>\n"], tool_format="qwen")
        self.observation = fmt.StringFormatter(
            slots=[
                "<|im_start|>user\n<tool_response>\n{{content}}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
            ]
        )
        self.tools = fmt.ToolFormatter(tool_format="qwen")

    def converted(self, row: dict[str, Any]) -> dict[str, Any]:
        """The converter's output; raises when it would skip the row as "abnormal"."""
        out = self.convert(dict(row))
        if not out["_prompt"] or not out["_response"]:
            raise AssertionError(f"LLaMA-Factory's converter skips this row: {row}")
        return out

    def text(self, row: dict[str, Any]) -> str:
        """The training text of a row (raises where the formatters raise)."""
        out = self.converted(row)
        parts: list[str] = []
        system, tools = out["_system"], out["_tools"]
        if system or tools:
            tool_text = self.tools.apply(content=tools)[0] if tools else ""
            parts += self.system.apply(content=system + tool_text)
        for msg in out["_prompt"] + out["_response"]:
            role, content = msg["role"], msg["content"]
            if role == "user":
                parts += self.user.apply(content=content)
            elif role == "assistant":
                parts += self.assistant.apply(content=content)
            elif role == "observation":
                parts += self.observation.apply(content=content)
            elif role == "function":
                parts += self.function.apply(
                    content=content, thought_words=self.THOUGHT, tool_call_words=self.TOOL_CALL
                )
            else:
                raise AssertionError(f"unexpected role {role!r}")
        return "".join(p for p in parts if isinstance(p, str))


def axolotl_strategy(root: Path, template: str = "qwen2_5") -> tuple[Any, Any]:
    """Axolotl's ``chat_template`` strategy over a tiny tokenizer with ``template`` (as the docs'
    config: ``field_messages: messages``, ``field_tools: tools``, assistant turns trained)."""
    pytest.importorskip("axolotl", reason="pip install --no-deps axolotl==0.19.0 (make test does)")
    from axolotl.prompt_strategies.chat_template import StrategyLoader
    from axolotl.utils.dict import DictDefault

    tok = chat_tokenizer(root, template)
    cfg = DictDefault(
        {
            "chat_template": "tokenizer_default",
            "sequence_len": 16384,
            "train_on_inputs": False,
            "special_tokens": {},
        }
    )
    ds_cfg = {"type": "chat_template", "field_messages": "messages", "field_tools": "tools"}
    return StrategyLoader()(tok, cfg, ds_cfg), tok
