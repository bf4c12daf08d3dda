"""Loading a local transformers model and tokenizer onto the right device.

Everything here is blocking (disk reads, weight copies): callers run it in a worker thread.
Only local files are read (``local_files_only``): a missing directory must be an error, never a
silent download attempt from the hub.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from trajforge.serve.config import check_model_dir

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    """``auto`` -> the first CUDA device when torch sees one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but torch sees no CUDA device; use --device cpu")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` -> float32 on CPU (logprobs exact to 1e-6), bfloat16 on a GPU that supports it."""
    if dtype != "auto":
        return _DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved beside the model; it must carry a chat template for chat completions."""
    return AutoTokenizer.from_pretrained(str(check_model_dir(path)), local_files_only=True)


def load_model(path: Path, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """A causal LM in eval mode on ``device``; raises ``ValueError`` with what to fix."""
    path = check_model_dir(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"could not load a causal LM from {str(path)!r}: {exc}") from exc
    model.to(device)  # type: ignore[arg-type]  # transformers types .to() by its decorator
    model.eval()  # type: ignore[no-untyped-call]
    return model


def cache_kwarg(model: torch.nn.Module) -> str:
    """The name ``forward`` takes the KV cache under (``cache`` in transformers 5.x, else the old name)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def context_length(model: torch.nn.Module) -> int:
    """Longest sequence (prompt + completion) the model was configured for."""
    config: Any = model.config
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


def vocab_size(model: torch.nn.Module) -> int:
    """Rows of the output embedding: how many token ids the model can produce."""
    transformers_model: Any = model  # get_output_embeddings is a PreTrainedModel method
    return int(transformers_model.get_output_embeddings().weight.shape[0])


def eos_token_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Token ids that end a sequence: the generation config's EOS ids plus the tokenizer's."""
    ids: set[int] = set()
    gen_config = getattr(model, "generation_config", None)
    eos = getattr(gen_config, "eos_token_id", None) if gen_config is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, list | tuple):
        ids.update(int(i) for i in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def generation_defaults(model: torch.nn.Module) -> dict[str, float | int]:
    """Sampling defaults the model's authors saved (generation_config.json), used when a request omits them."""
    gen_config = getattr(model, "generation_config", None)
    if gen_config is None:
        return {}
    # Only what was saved explicitly: transformers' built-in defaults (top_k=50) are not the authors'.
    saved = gen_config.to_diff_dict()
    return {k: saved[k] for k in ("temperature", "top_p", "top_k") if isinstance(saved.get(k), int | float)}
