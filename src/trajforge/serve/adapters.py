"""LoRA adapters as weights to serve: ``/v1/load_weights`` of an adapter directory.

A LoRA trainer (``rl train`` with ``lora``) writes, after each step, only the adapters
(``adapter_config.json`` + ``adapter_model.safetensors``: megabytes, where a full checkpoint of
an 8B model is 16 GB). The server merges them onto the base it was started from (``--model-path``)
-- a fresh copy of the base each time, never onto the weights it serves now, which already hold
the previous step's merge -- and swaps the merged model in like any checkpoint.

Refused, with the reason: an adapter whose config names another base than the server's (merged
onto the wrong weights it would serve a model nobody trained), a PEFT method other than LoRA,
and an adapter without ``adapter_model.safetensors`` (a pickled ``.bin`` would run code on load).
Blocking (disk reads, the merge): callers run it in a worker thread. ``peft`` is imported here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from trajforge.serve.loading import load_model

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def is_adapter_dir(path: Path) -> bool:
    """A directory of LoRA adapters (and not a full model directory)."""
    return path.is_dir() and (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def check_adapter(adapter: Path, base: Path) -> dict[str, Any]:
    """The adapter's config, if the server may merge it onto ``base``; ``ValueError`` saying why not."""
    try:
        config = json.loads((adapter / ADAPTER_CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"adapter {str(adapter)!r}: unreadable {ADAPTER_CONFIG}: {exc}") from None
    if not isinstance(config, dict) or str(config.get("peft_type", "")).upper() != "LORA":
        raise ValueError(
            f"adapter {str(adapter)!r} is not a LoRA adapter (peft_type {config.get('peft_type')!r})"
        )
    if not (adapter / ADAPTER_WEIGHTS).is_file():
        raise ValueError(
            f"adapter {str(adapter)!r} has no {ADAPTER_WEIGHTS}; save adapters as safetensors "
            "(a pickled adapter_model.bin is not loaded)"
        )
    named = config.get("base_model_name_or_path")
    if named and Path(named).exists() and Path(named).resolve() != base.resolve():
        raise ValueError(
            f"adapter {str(adapter)!r} was trained on {named!r}, but this server's base is "
            f"{str(base)!r}; start the server on that base to load its adapters"
        )
    return config


def load_merged_adapter(
    adapter: Path, base: Path, device: torch.device, dtype: torch.dtype
) -> torch.nn.Module:
    """``base``'s weights with ``adapter`` merged in, as a plain transformers model in eval mode."""
    check_adapter(adapter, base)
    try:
        from peft import PeftModel
    except ImportError:
        raise ValueError(
            "loading LoRA adapters needs the peft package: pip install 'trajforge[ml]'"
        ) from None
    model = load_model(base, device, dtype)
    merged: Any = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.eval()
    return merged  # type: ignore[no-any-return]
