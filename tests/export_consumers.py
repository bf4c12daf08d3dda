"""The trainers' own data code, wired for the export tests: what each consumer does with one row.

Nothing here re-implements a trainer's rules; each function runs the consumer's code on a row and
raises when the consumer would refuse it:

* ``datasets``: ``load_dataset("json"|"parquet", ...)`` on the whole file;
* TRL's chat templates (``trl/chat_templates``, put into a tiny tokenizer built here) through
  ``apply_chat_template`` with the ``tools`` column, tokenized;
* LLaMA-Factory (0.9.5): ``SharegptDatasetConverter`` on the ``dataset_info.json`` entry
  docs/formats.md gives, then the ``qwen`` template's formatters -- built by evaluating
  LLaMA-Factory's own ``register_template(name="qwen", ...)`` call in ``data/template.py``, with
  its own formatter classes and ``register_template``'s own defaults -- applied in the order
  ``Template._encode`` applies them, tokenized;
* Axolotl (0.19): the ``chat_template`` prompt strategy's ``tokenize_prompt``.

LLaMA-Factory and Axolotl pin library versions this project cannot install next to TRL 1.16 and
datasets 5.2, so their wheels are installed without dependencies (Makefile), and what the tests
import of them are their data converters. Axolotl's ``prompt_strategies/chat_template.py``
imports the normal way (it needs only colorama and addict besides our stack, both in the ``dev``
extra). LLaMA-Factory's top-level package and ``llamafactory.extras`` import the normal way too;
``llamafactory/data/__init__.py`` cannot: it imports every data module, among them the
multimodal plugin (``mm_plugin.py``), which imports ``torchaudio`` at module level, and no
``torchaudio`` exists for torch 2.13 (the newest, 2.11.1, pins torch 2.11 and its native library
does not load against 2.13). No small pure-Python package fixes that (``omegaconf``, the other
import a user meets, is only ``llamafactory.hparams``'s, which the converter does not use). So the
``llamafactory.data`` package is entered at its directory without running its ``__init__``
(:func:`llamafactory`), and ``converter.py``, ``formatter.py``, ``data_utils.py`` and
``tool_utils.py`` are imported as LLaMA-Factory ships them: nothing of theirs, and no third-party
module, is stubbed or copied.
"""

from __future__ import annotations

import ast
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
    """LLaMA-Factory's converter and formatter modules (skips when it is not installed). The
    package ``llamafactory.data`` is entered at its directory, its ``__init__`` not run (module
    docstring: it imports torchaudio, which torch 2.13 has none of)."""
    spec = importlib.util.find_spec("llamafactory")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(
            "llamafactory is not installed: pip install --no-deps llamafactory==0.9.5 (make test does)"
        )
    importlib.import_module("llamafactory")  # its own __init__: light, imported as it ships
    importlib.import_module("llamafactory.extras")
    if "llamafactory.data" not in sys.modules:
        data = types.ModuleType("llamafactory.data")
        data.__path__ = [str(Path(spec.submodule_search_locations[0]) / "data")]
        data.__package__ = "llamafactory.data"
        sys.modules["llamafactory.data"] = data
    return (
        importlib.import_module("llamafactory.data.converter"),
        importlib.import_module("llamafactory.data.formatter"),
    )


def llamafactory_template(name: str = "qwen") -> dict[str, Any]:
    """The formatters and words LLaMA-Factory registers for template ``name``: its own
    ``register_template(name=..., ...)`` call in ``data/template.py``, evaluated with its own
    formatter classes, and ``register_template``'s own defaults for what the call leaves out."""
    _, fmt = llamafactory()
    source = Path(fmt.__file__).with_name("template.py").read_text()
    tree = ast.parse(source)
    classes = {
        c: getattr(fmt, c)
        for c in ("StringFormatter", "FunctionFormatter", "ToolFormatter", "EmptyFormatter")
    }

    def value(node: ast.expr) -> Any:
        return eval(compile(ast.Expression(node), "llamafactory/data/template.py", "eval"), classes)  # noqa: S307

    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "register_template"
        and any(
            k.arg == "name" and isinstance(k.value, ast.Constant) and k.value.value == name
            for k in node.keywords
        )
    ]
    assert len(calls) == 1, f"LLaMA-Factory registers template {name!r} {len(calls)} times"
    found = {k.arg: value(k.value) for k in calls[0].keywords if k.arg and k.arg != "name"}
    register = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "register_template")
    defaults = {  # `thought_words or (...)`: the tuple after `or` in the Template it builds
        k.arg: value(k.value.values[1])
        for node in ast.walk(register)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "template_class"
        for k in node.keywords
        if k.arg in ("thought_words", "tool_call_words") and isinstance(k.value, ast.BoolOp)
    }
    return {**defaults, **found}


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
    """LLaMA-Factory's converter and its ``qwen`` template's formatters (:func:`llamafactory_template`),
    in ``Template._encode``'s order."""

    def __init__(self) -> None:
        converter, _ = llamafactory()
        self.convert = converter.SharegptDatasetConverter(
            llamafactory_dataset_attr(), types.SimpleNamespace(media_dir="")
        )
        template = llamafactory_template("qwen")
        self.user = template["format_user"]
        self.assistant = template["format_assistant"]
        self.system = template["format_system"]
        self.function = template["format_function"]
        self.observation = template["format_observation"]
        self.tools = template["format_tools"]
        self.THOUGHT = template["thought_words"]
        self.TOOL_CALL = template["tool_call_words"]

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
