"""Training that fits a real model, checked by its numbers on a tiny one (``rl/fit.py``, ``rl/update.py``).

Every check runs the trainer's own update (``grpo_update``) with plain SGD (lr 1, no clipping), so
a weight's change is exactly minus its gradient and two ways of computing an update can be
compared tensor by tensor:

- LoRA's update is the full update restricted to its subspace: with B = 0 at the start only B
  moves, by ``-s * G @ A^T``, so the merged weight moves by ``-s^2 * G @ A^T @ A`` where ``G`` is the
  full model's gradient (``s = alpha / r``); nothing else moves.
- The merged LoRA weights are a plain transformers checkpoint: the base's tensor names, loadable
  without peft, computing what the adapted model computes.
- Gradient accumulation: one update over k micro-batches equals one over a single batch of k.
- Gradient checkpointing: the layers really recompute (their forward runs twice) and the update
  is the one without it.
- bf16 autocast (where the CPU has bf16): the forward runs in bf16, the weights stay float32, and
  the update points where the float32 one does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from trajforge.rl import fit
from trajforge.rl.config import TrainConfig
from trajforge.rl.grpo import Sample
from trajforge.rl.update import grpo_update
from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer

TARGETS = ["q_proj", "v_proj", "up_proj"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fit")
    tok = build_tiny_tokenizer(root / "tok", "chatml")
    build_tiny_model(root / "model", tok, hidden=32, layers=2, seed=0)
    return root / "model"


def _samples(n: int = 6, seed: int = 0) -> list[Sample]:
    """Sequences of different lengths with sampled tails, advantages of both signs, and sampler
    logprobs near the policy's (ratio ~1, inside the clip range)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = 6 + i
        tokens = torch.randint(5, 200, (length,), generator=gen).tolist()
        prompt = 3 + i % 2
        sampled = [False] * prompt + [True] * (length - prompt)
        out.append(
            Sample(tokens, sampled, [0.0] * prompt + [-5.3] * (length - prompt), (-1.0) ** i * (0.5 + i / 10))
        )
    return out


def _config(model: Path, **fields: Any) -> TrainConfig:
    fields = {"precision": "fp32", **fields}
    return TrainConfig(
        env="x", model=model, lr=1.0, max_grad_norm=1e9, clip_low=0.99, clip_high=1e6, **fields
    )


def _load(path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)


def _sgd_update(model: Any, cfg: TrainConfig, samples: list[Sample]) -> dict[str, Any]:
    optimizer = torch.optim.SGD(fit.trainable_parameters(model), lr=1.0)
    # log_ratio is against the sampler's logprobs; make them the model's own so the ratio is 1
    # and no token is clipped (the surrogate's gradient is then advantage x grad logprob)
    from trajforge.rl.grpo import collate, token_logprobs

    with torch.no_grad():
        fit.update_mode(model)
        for s in samples:
            lp, _ = token_logprobs(model, collate([s], 0))
            s.old_logprobs = [0.0] + [
                float(x) if m else 0.0 for x, m in zip(lp[0].tolist(), s.sampled[1:], strict=True)
            ]
    return grpo_update(model, optimizer, samples, cfg, step=1, temperature=1.0, pad_id=0, device="cpu")


def _weights(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_lora_update_is_the_full_update_restricted_to_its_subspace(base: Path) -> None:
    samples = _samples()
    full = _load(base)
    w0 = _weights(full)
    _sgd_update(full, _config(base), [Sample(**vars(s)) for s in samples])
    w_full = _weights(full)

    settings = {"r": 4, "alpha": 8.0, "target_modules": TARGETS}
    cfg = _config(base, lora=settings)
    lora = fit.prepare_policy(_load(base), cfg)
    assert fit.is_lora(lora)
    a_before = {n: p.detach().clone() for n, p in lora.named_parameters() if "lora_A" in n}
    stats = _sgd_update(lora, cfg, [Sample(**vars(s)) for s in samples])
    assert stats["updates"] == 1 and stats["trained_tokens"] > 0
    merged = fit.merged_state_dict(lora)
    assert merged.keys() == w0.keys() - {"lm_head.weight"} or merged.keys() == w0.keys()

    scale = 8.0 / 4
    adapted = 0
    for name, module in lora.get_base_model().named_modules():
        if not hasattr(module, "lora_A") or "default" not in getattr(module, "lora_A", {}):
            continue
        key = f"{name}.weight"
        a = module.lora_A["default"].weight.detach()
        assert torch.equal(
            a, a_before[f"base_model.model.{name}.lora_A.default.weight"]
        )  # A has no gradient at B=0
        grad = -(w_full[key] - w0[key])  # SGD at lr 1: the full model's gradient
        expected = -(scale**2) * grad @ a.T @ a
        assert torch.allclose(merged[key] - w0[key], expected, atol=1e-6, rtol=1e-4), key
        assert (merged[key] - w0[key]).abs().max() > 1e-6, key  # it did move
        adapted += 1
    assert adapted == 2 * len(TARGETS)  # 2 layers x the targeted projections
    # everything LoRA does not adapt is exactly where it was
    adapted_keys = {k for k in merged if any(f".{t}." in k for t in TARGETS)}
    for key in merged.keys() - adapted_keys:
        assert torch.equal(merged[key], w0[key]), key


def test_merged_lora_weights_are_a_plain_checkpoint_that_computes_what_the_adapter_does(
    base: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    cfg = _config(base, lora={"r": 4, "alpha": 16.0})
    lora = fit.prepare_policy(_load(base), cfg)
    _sgd_update(lora, cfg, _samples())
    out = tmp_path / "ckpt"
    out.mkdir()
    fit.save_policy(lora, out)
    # the merged weights: the base's own file layout and tensor names, no peft in sight
    assert (
        load_file(str(out / "model.safetensors")).keys() == load_file(str(base / "model.safetensors")).keys()
    )
    assert not (out / "adapter_config.json").exists()
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"
    # the adapters beside them, naming the base they were trained on
    adapter = fit.adapter_dir(out)
    assert adapter is not None and (adapter / "adapter_model.safetensors").is_file()
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        base.resolve()
    )
    ids = torch.tensor([[1, 7, 9, 30, 41, 5, 2]])
    fit.update_mode(lora)
    with torch.no_grad():
        expected = lora(input_ids=ids).logits
        got = _load(out).eval()(input_ids=ids).logits
        start = _load(base).eval()(input_ids=ids).logits
    assert torch.allclose(got, expected, atol=1e-5)
    assert not torch.allclose(got, start, atol=1e-4)  # the update is in it


def test_accumulating_k_micro_batches_equals_one_batch_of_k(base: Path) -> None:
    samples = _samples(8)
    one = _load(base)
    w0 = _weights(one)
    _sgd_update(one, _config(base, micro_batch=8), [Sample(**vars(s)) for s in samples])
    accumulated = _load(base)
    _sgd_update(accumulated, _config(base, micro_batch=1), [Sample(**vars(s)) for s in samples])
    a, b = _weights(one), _weights(accumulated)
    moved = 0
    for key in w0:
        assert torch.allclose(a[key], b[key], atol=1e-6, rtol=1e-5), key
        moved += not torch.equal(a[key], w0[key])
    assert moved > 5


def test_gradient_checkpointing_recomputes_and_changes_nothing(base: Path) -> None:
    samples = _samples()
    plain = _load(base)
    w0 = _weights(plain)
    _sgd_update(plain, _config(base), [Sample(**vars(s)) for s in samples])

    cfg = _config(base, gradient_checkpointing=True)
    ckpt = fit.prepare_policy(_load(base), cfg)
    calls: list[int] = []
    ckpt.model.layers[0].mlp.act_fn.register_forward_hook(lambda *_: calls.append(1))
    _sgd_update(ckpt, cfg, [Sample(**vars(s)) for s in samples])
    # one forward per sample to set the sampler logprobs (no grad: no recompute), then the update's
    # one micro-batch forward and its recomputation in the backward pass
    assert len(calls) == len(samples) + 2
    assert not ckpt.model.layers[0].mlp.training and not ckpt.training  # dropout stayed off
    a, b = _weights(plain), _weights(ckpt)
    for key in w0:
        assert torch.allclose(a[key], b[key], atol=1e-6, rtol=1e-5), key


@pytest.mark.skipif(not fit.bf16_available("cpu"), reason="this CPU has no native bf16 (AVX512-BF16/AMX)")
def test_bf16_autocast_computes_in_bf16_and_keeps_float32_weights(base: Path) -> None:
    samples = _samples()
    ref = _load(base)
    w0 = _weights(ref)
    _sgd_update(ref, _config(base), [Sample(**vars(s)) for s in samples])

    mixed = _load(base)
    dtypes: list[torch.dtype] = []
    mixed.model.layers[0].self_attn.q_proj.register_forward_hook(lambda _m, _i, out: dtypes.append(out.dtype))
    stats = _sgd_update(mixed, _config(base, precision="bf16"), [Sample(**vars(s)) for s in samples])
    assert stats["precision"] == "bf16"
    assert torch.bfloat16 in dtypes  # the update's forward ran under autocast
    assert all(p.dtype == torch.float32 for p in mixed.parameters())
    full = torch.cat([(_weights(ref)[k] - w0[k]).flatten() for k in w0])
    half = torch.cat([(_weights(mixed)[k] - w0[k]).flatten() for k in w0])
    cosine = float(torch.nn.functional.cosine_similarity(full, half, dim=0))
    assert cosine > 0.98, cosine
    assert float(half.norm() / full.norm()) == pytest.approx(1.0, abs=0.1)


def test_precision_auto_is_fp32_on_cpu_and_bf16_is_refused_where_absent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trajforge.rl.config import TrainConfigError

    assert fit.resolve_precision("auto", "cpu") == "fp32"
    assert fit.resolve_precision("fp32", "cpu") == "fp32"
    monkeypatch.setattr(fit, "bf16_available", lambda device: False)
    with pytest.raises(TrainConfigError, match="no native bf16"):
        fit.resolve_precision("bf16", "cpu")
