"""Training a model that is not tiny: LoRA through ``peft``, bf16 autocast, gradient checkpointing.

One place for what the builtin trainer, the warm start and the demo's RFT control do to the
policy before and around an update, so the three train the same way (the TRL path maps the same
:class:`~trajforge.rl.config.TrainConfig` fields onto ``GRPOConfig``/``peft_config``:
:mod:`trajforge.rl.trl_trainer`).

- **LoRA** (``TrainConfig.lora``): the policy is wrapped by ``peft.get_peft_model``; only the
  adapters train and the optimizer holds only them. A checkpoint keeps the adapters
  (``adapter/``: ``adapter_model.safetensors`` + ``adapter_config.json``, naming the base it was
  trained on) and, where a full model is needed (resumable and final checkpoints), the merged
  weights as a plain transformers checkpoint (the base's own tensor names, ``model.safetensors``):
  what ``trajforge serve``, vLLM's loader or ``from_pretrained`` read with no ``peft`` at all.
  The merge is computed beside the live model (:func:`merged_state_dict`: base weight plus each
  adapter's delta), never by merging into it: merging and unmerging in place would drift the
  base weights by rounding at every save.
- **bf16** (``TrainConfig.precision``): autocast around the forward pass (:func:`autocast`);
  the weights, their gradients and the optimizer state stay float32 (mixed precision, not a
  bf16 model), and the loss's log-softmax runs in float32 (:func:`trajforge.rl.grpo.token_logprobs`
  upcasts the logits). ``auto`` is bf16 on a CUDA device that has it and float32 elsewhere: on a
  CPU the ratio against the float32 server's logprobs would move by bf16's rounding.
- **Gradient checkpointing** (``TrainConfig.gradient_checkpointing``): transformers checkpoints
  a decoder layer only while that layer is in training mode, while RL updates run with dropout
  off (``model.eval()``: the ratio against the sampler is exactly 1 on-policy). :func:`update_mode`
  puts the model in eval mode and then marks only the checkpointed layers as training, so the
  layers recompute their activations in the backward pass while every dropout below them stays
  off (a test checks the gradients equal those without checkpointing).
- **Gradient accumulation** is the update's micro-batches (``TrainConfig.micro_batch``): a
  step's batch is split into micro-batches whose token-mean losses share one denominator, so
  their summed gradients are exactly the whole batch's (tested).

torch, transformers and peft are imported when a function here runs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trajforge.rl.config import LoraSettings, TrainConfig, TrainConfigError

ADAPTER_DIR = "adapter"
"""A LoRA checkpoint's adapters, beside (or instead of) its merged weights."""


# ----------------------------------------------------------------------------- precision


def bf16_available(device: str) -> bool:
    """Whether ``device`` computes in bf16 natively: a CUDA device that says so, or a CPU with
    AVX512-BF16 or AMX (elsewhere torch emulates it, slower than float32)."""
    import torch

    if device.startswith("cuda"):
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    cpu = getattr(torch, "cpu", None)
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name)()) for name in probes if cpu is not None and hasattr(cpu, name))


def resolve_precision(precision: str, device: str) -> str:
    """``fp32`` or ``bf16``: ``auto`` is bf16 on a CUDA device that has it, else fp32; ``bf16``
    asked on a device without it is refused (it would be emulated, slower than float32)."""
    if precision == "auto":
        return "bf16" if device.startswith("cuda") and bf16_available(device) else "fp32"
    if precision == "bf16" and not bf16_available(device):
        raise TrainConfigError(
            f"precision bf16: device {device!r} has no native bf16 (a CUDA device of compute capability "
            ">= 8.0, or a CPU with AVX512-BF16/AMX); use --precision fp32"
        )
    return precision


@contextlib.contextmanager
def autocast(device: str, precision: str) -> Iterator[None]:
    """bf16 autocast around a forward pass when ``precision`` is ``bf16`` (resolved), else nothing."""
    if precision != "bf16":
        yield
        return
    import torch

    with torch.autocast(device_type="cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16):
        yield


# ----------------------------------------------------------------------------- the policy


def load_policy(config: TrainConfig, source: Path, device: str, *, adapter: Path | None = None) -> Any:
    """The policy to train, float32 on ``device``: ``source``'s weights, with gradient
    checkpointing when asked, and LoRA adapters (fresh, or ``adapter``'s to resume) when
    ``config.lora`` is set. Blocking."""
    import torch
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    model = model.to(device)
    return prepare_policy(model, config, adapter=adapter)


def prepare_policy(model: Any, config: TrainConfig, *, adapter: Path | None = None) -> Any:
    """``model`` made ready to train as ``config`` says (see :func:`load_policy`)."""
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.lora is not None:
        model = wrap_lora(model, config.lora, adapter=adapter)
    update_mode(model)
    return model


def lora_config(settings: LoraSettings) -> Any:
    """``peft.LoraConfig`` of the settings (a causal LM)."""
    from peft import LoraConfig

    target: Any = settings.target_modules
    return LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=target,
        bias="none",
        task_type="CAUSAL_LM",
    )


def wrap_lora(model: Any, settings: LoraSettings, *, adapter: Path | None = None) -> Any:
    """``model`` with LoRA adapters: fresh ones (B = 0: the wrapped model computes exactly what
    ``model`` did), or the trainable adapters saved at ``adapter``."""
    try:
        from peft import PeftModel, get_peft_model
    except ImportError:  # pragma: no cover - the ml extra installs it
        raise TrainConfigError("lora needs the peft package: pip install 'trajforge[ml]'") from None
    if adapter is not None:
        return PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
    return get_peft_model(model, lora_config(settings))


def is_lora(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def trainable_parameters(model: Any) -> list[Any]:
    return [p for p in model.parameters() if p.requires_grad]


def update_mode(model: Any) -> None:
    """Dropout off for an update (eval mode), with the gradient-checkpointed layers marked as
    training so transformers still checkpoints them (it does so only in training mode); their
    submodules -- attention and MLP, where dropout lives -- stay in eval mode."""
    model.eval()
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) is True and hasattr(
            module, "_gradient_checkpointing_func"
        ):
            module.training = True


class AdapterDisabled:
    """The LoRA policy with its adapters switched off: the base model, as a KL reference without
    a second copy of the weights. Called like a model (``token_logprobs`` calls it)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, **kwargs: Any) -> Any:
        with self.model.disable_adapter():
            return self.model(**kwargs)


# ----------------------------------------------------------------------------- checkpoints


def merged_state_dict(model: Any) -> dict[str, Any]:
    """The weights a LoRA policy computes with, under the base model's own tensor names: each
    adapted layer's base weight plus its adapters' delta (``B @ A * alpha / r``), every other
    tensor as it is. The live model is not touched."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, Any] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            for adapter in module.active_adapters:
                if adapter not in module.lora_A:
                    continue
                delta = module.get_delta_weight(adapter).detach()  # type: ignore[attr-defined]
                key = f"{name}.weight"
                deltas[key] = deltas[key] + delta if key in deltas else delta
    out: dict[str, Any] = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        clean = key.replace(".base_layer.", ".")
        tensor = value.detach()
        if clean in deltas:
            tensor = tensor + deltas[clean].to(tensor.dtype)
        out[clean] = tensor.to("cpu").contiguous()
    return out


def save_merged(model: Any, out: Path) -> None:
    """The merged weights of a LoRA policy as a plain transformers checkpoint in ``out``
    (config + ``model.safetensors`` with the base's tensor names; no peft file)."""
    base = model.get_base_model()
    state = merged_state_dict(model)
    base.config.save_pretrained(str(out))
    generation = getattr(base, "generation_config", None)
    if generation is not None:
        with contextlib.suppress(Exception):  # a config transformers cannot validate is left out
            generation.save_pretrained(str(out))
    tied = getattr(base.config, "tie_word_embeddings", False)
    if tied:
        # the tied output head is the input embedding: saved once, as transformers saves it
        head = [k for k in state if k.endswith("lm_head.weight")]
        for k in head:
            del state[k]
    from safetensors.torch import save_file

    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})


def save_adapter(model: Any, out: Path) -> None:
    """The LoRA adapters alone (``adapter_model.safetensors`` + ``adapter_config.json``), their
    config naming the base they were trained on by its resolved local path."""
    model.save_pretrained(str(out))
    config_path = out / "adapter_config.json"
    data = json.loads(config_path.read_text())
    base = data.get("base_model_name_or_path")
    if base and Path(base).exists():
        data["base_model_name_or_path"] = str(Path(base).resolve())
        config_path.write_text(json.dumps(data, indent=2))


def save_policy(model: Any, out: Path, *, merged: bool = True) -> None:
    """Write the policy's weights into ``out``: a plain model's ``save_pretrained``; for a LoRA
    policy its adapters in ``out/adapter/`` and, when ``merged``, the merged weights."""
    if not is_lora(model):
        model.save_pretrained(str(out))
        return
    save_adapter(model, out / ADAPTER_DIR)
    if merged:
        save_merged(model, out)


def adapter_dir(checkpoint: Path) -> Path | None:
    """A checkpoint's LoRA adapters, when it has them."""
    path = checkpoint / ADAPTER_DIR
    return path if (path / "adapter_config.json").is_file() else None


def supervised_update(
    model: Any,
    optimizer: Any,
    batch: list[Any],
    *,
    tokens: float,
    micro_batch: int,
    pad_id: int,
    device: str,
    precision: str,
    focal: float = 0.0,
) -> float:
    """One supervised update on ``batch`` (``rl.grpo.Sample``s): the negative log-likelihood of
    their trained tokens per ``tokens``, in forward passes of ``micro_batch`` samples at most,
    gradients clipped to norm 1. ``focal`` > 0 weights each token by ``(1 - p)^focal`` (no gradient
    through the weight: warm start's rule). Returns the loss before any weight. The caller sets the
    learning rate and the model's mode. Blocking."""
    import torch

    from trajforge.rl.grpo import collate, token_logprobs
    from trajforge.rl.samples import chunks

    optimizer.zero_grad(set_to_none=True)
    loss = 0.0
    for micro in chunks(batch, -(-len(batch) // micro_batch)):
        b = collate(micro, pad_id, device)
        with autocast(device, precision):
            lp, _ = token_logprobs(model, b)
        nll = -(lp * b.loss_mask)
        weight = (1.0 - lp.detach().exp()).clamp_min(0.0) ** focal if focal else 1.0
        (nll * weight).sum().div(tokens).backward()  # type: ignore[no-untyped-call]
        loss += float(nll.detach().sum()) / tokens
    torch.nn.utils.clip_grad_norm_(trainable_parameters(model), 1.0)
    optimizer.step()
    return loss
