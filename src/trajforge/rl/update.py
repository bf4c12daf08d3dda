"""The optimizer updates of one GRPO step: the builtin trainer's update path, as a function.

Apart from :class:`~trajforge.rl.builtin.BuiltinTrainer` (which adds rollouts, checkpoints and the
server) so that what learns can be tested on its own: ``tests/test_rl_learning.py`` drives this
function on a bandit through a tiny model and checks that expected reward rises, and that it
falls with the advantages' sign flipped.

Dropout is off during the update (``model.eval()``; gradients flow all the same), as in TRL: the
ratio compares the policy with the sampler's logprobs, which came from a model without dropout,
so a dropout mask would make an on-policy ratio differ from 1 by noise alone.
"""

from __future__ import annotations

import random
import time
from typing import Any

from trajforge.distributions import derive_seed
from trajforge.rl.config import TrainConfig, step_lr
from trajforge.rl.fit import autocast, resolve_precision, trainable_parameters, update_mode
from trajforge.rl.grpo import LossParts, Sample, collate, grpo_loss, token_logprobs
from trajforge.rl.samples import chunks


def grpo_update(
    model: Any,
    optimizer: Any,
    samples: list[Sample],
    config: TrainConfig,
    *,
    step: int,
    temperature: float,
    pad_id: int,
    device: str,
    ref: Any = None,
) -> dict[str, Any]:
    """``config.epochs`` passes over ``samples`` in ``config.minibatches`` updates each (blocking:
    run it in a worker thread). Returns the step's loss figures (token means), lr, update count,
    the largest gradient norm and the training throughput."""
    import torch

    total = LossParts()
    if not samples:
        return {**total.means(), "updates": 0, "grad_norm": 0.0, "train_tokens_per_s": 0.0}
    began = time.monotonic()
    update_mode(model)  # dropout off (checkpointed layers still recompute); autograd is unaffected
    precision = resolve_precision(config.precision, device)
    params = trainable_parameters(model)
    lr = step_lr(config, step)
    for group in optimizer.param_groups:
        group["lr"] = lr
    passes: list[list[Sample]] = []
    for epoch in range(config.epochs):
        order = list(samples)
        random.Random(derive_seed(config.seed, f"shuffle#{step}#{epoch}")).shuffle(order)
        passes.extend(chunks(order, config.minibatches))
    grad_norms: list[float] = []
    seen_tokens = 0
    for minibatch in passes:
        denominator = float(sum(s.num_sampled for s in minibatch)) or 1.0
        optimizer.zero_grad(set_to_none=True)
        for micro in chunks(minibatch, -(-len(minibatch) // config.micro_batch)):
            batch = collate(micro, pad_id, device)
            seen_tokens += int(batch.attention_mask.sum())
            with autocast(device, precision):
                lp, entropy = token_logprobs(model, batch, temperature=temperature, with_entropy=True)
                ref_lp = None
                if ref is not None:
                    with torch.no_grad():
                        ref_lp, _ = token_logprobs(ref, batch, temperature=temperature)
            loss, parts = grpo_loss(
                lp,
                batch,
                clip_low=config.clip_low,
                clip_high=config.clip_high,
                denominator=denominator,
                ref_logprobs=ref_lp,
                kl_coef=config.kl_coef,
                entropy=entropy,
            )
            loss.backward()  # type: ignore[no-untyped-call]
            total.add(parts)
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)))
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds = time.monotonic() - began
    return {
        **total.means(),
        "lr": lr,
        "updates": len(passes),
        "grad_norm": max(grad_norms),
        "train_tokens_per_s": round(seen_tokens / seconds, 2) if seconds > 0 else 0.0,
        "precision": precision,
    }
