"""The GRPO objective in torch, on exact token traces.

Why each piece:

- **Group-normalised advantages** (:func:`group_advantages`): the baseline of a rollout is its
  own group's mean reward (same item, same policy), so no value model is needed; dividing by the
  group's std (``scale``) keeps the step size independent of the reward scale.
- **The ratio against the sampler's own logprobs**: ``old_logprobs`` are what the server
  reported when it sampled each token (``Episode.trace.logprobs``), not a recomputation. A
  rollout sampled one or two updates ago (bounded staleness) is therefore importance-corrected
  against the weights that really produced it, and clipping (``clip_low``/``clip_high``,
  asymmetric as in DAPO) bounds how far one step moves on it.
- **Loss only on sampled tokens**: the trace's mask is the token id where the model sampled and
  -100 elsewhere (prompt, tool results, template text between turns); those are the only
  positions with a loss. Tokens are averaged over the whole (mini)batch (token-mean), so a long
  episode weighs by its tokens and micro-batches add up to exactly the batch's gradient.
- **Optional KL to a reference** (k3 estimator, ``exp(ref - lp) - (ref - lp) - 1``: unbiased,
  never negative) keeps the policy near the model it started from when ``kl_coef > 0``.
- **Per-token advantages when the env gives them** (``Sample.token_advantages``, e.g. ``opd``'s
  teacher-minus-student logprobs): they replace the episode's one group advantage on its sampled
  tokens, as Atropos' ``advantages`` field does -- the env scored each token, so the trainer
  does not smear one number over all of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


def group_advantages(rewards: Sequence[float], *, scale: bool = True, eps: float = 1e-6) -> list[float]:
    """``(r - mean) / std`` within one group (``std`` the population std; ``scale=False``: no division)."""
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    centred = [r - mean for r in rewards]
    if not scale:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / n)
    return [c / (std + eps) for c in centred]


@dataclass
class Sample:
    """One episode ready to train on: the full token sequence and, per position, whether the
    policy sampled it and with which logprob."""

    tokens: list[int]
    sampled: list[bool]
    old_logprobs: list[float]
    advantage: float
    version: int = 0
    """Server weight version that sampled it (the oldest of its spans' when they are known)."""
    token_advantages: list[float] | None = None
    """One advantage per position (0 where not sampled) in place of ``advantage``, when the env
    scores tokens (``opd``)."""
    span_versions: list[tuple[int, int, int]] = field(default_factory=list)
    """``(start, end, version)`` of each sampled turn, when the server said which weights sampled
    it: a multi-turn episode can straddle a weight reload, so staleness is per span."""

    def __post_init__(self) -> None:
        if not len(self.tokens) == len(self.sampled) == len(self.old_logprobs):
            raise ValueError(
                f"tokens ({len(self.tokens)}), sampled ({len(self.sampled)}) and old_logprobs "
                f"({len(self.old_logprobs)}) must have one entry per position"
            )
        if self.token_advantages is not None and len(self.token_advantages) != len(self.tokens):
            raise ValueError(
                f"token_advantages ({len(self.token_advantages)}) must have one entry per position "
                f"({len(self.tokens)})"
            )

    @property
    def num_sampled(self) -> int:
        return sum(self.sampled)


@dataclass
class Batch:
    """Right-padded tensors of a list of samples; targets are shifted by one (position t predicts t+1)."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T-1] float: 1 where tokens[t+1] was sampled
    old_logprobs: torch.Tensor  # [B, T-1]
    advantages: torch.Tensor  # [B, 1], or [B, T-1] when a sample has per-token advantages


def collate(samples: Sequence[Sample], pad_id: int, device: torch.device | str = "cpu") -> Batch:
    width = max(len(s.tokens) for s in samples)
    ids = torch.full((len(samples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    mask = torch.zeros((len(samples), width), dtype=torch.float32)
    old = torch.zeros((len(samples), width), dtype=torch.float32)
    for i, s in enumerate(samples):
        n = len(s.tokens)
        ids[i, :n] = torch.tensor(s.tokens, dtype=torch.long)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(s.sampled, dtype=torch.float32)
        old[i, :n] = torch.tensor([lp if m else 0.0 for lp, m in zip(s.old_logprobs, s.sampled, strict=True)])
    if any(s.token_advantages is not None for s in samples):
        per_token = torch.zeros((len(samples), width), dtype=torch.float32)
        for i, s in enumerate(samples):
            values = s.token_advantages if s.token_advantages is not None else [s.advantage] * len(s.tokens)
            per_token[i, : len(s.tokens)] = torch.tensor(values, dtype=torch.float32)
        adv = per_token[:, 1:]
    else:
        adv = torch.tensor([[s.advantage] for s in samples], dtype=torch.float32)
    return Batch(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        loss_mask=mask[:, 1:].to(device),
        old_logprobs=old[:, 1:].to(device),
        advantages=adv.to(device),
    )


def token_logprobs(
    model: torch.nn.Module, batch: Batch, *, temperature: float = 1.0, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each next token under ``model`` at ``temperature`` ([B, T-1]) and, if asked,
    the entropy of each next-token distribution (no gradient)."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    logits = out.logits[:, :-1, :].float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = F.log_softmax(logits, dim=-1)
    targets = batch.input_ids[:, 1:].unsqueeze(-1)
    lp = logp.gather(-1, targets).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp.exp() * logp).sum(-1)
    return lp, entropy


@dataclass
class LossParts:
    """Sums over the sampled tokens of one micro-batch (divide by the token count for means)."""

    tokens: float = 0.0
    pg: float = 0.0
    kl_ref: float = 0.0
    kl_sampler: float = 0.0
    entropy: float = 0.0
    clipped: float = 0.0
    ratio: float = 0.0
    ratio_max: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    def add(self, other: LossParts) -> None:
        self.tokens += other.tokens
        self.pg += other.pg
        self.kl_ref += other.kl_ref
        self.kl_sampler += other.kl_sampler
        self.entropy += other.entropy
        self.clipped += other.clipped
        self.ratio += other.ratio
        self.ratio_max = max(self.ratio_max, other.ratio_max)

    def means(self) -> dict[str, float]:
        n = max(self.tokens, 1.0)
        return {
            "loss_pg": self.pg / n,
            "kl_ref": self.kl_ref / n,
            "kl_sampler": self.kl_sampler / n,
            "entropy": self.entropy / n,
            "clip_fraction": self.clipped / n,
            "ratio_mean": self.ratio / n,
            "ratio_max": self.ratio_max,
            "trained_tokens": self.tokens,
        }


def grpo_loss(
    logprobs: torch.Tensor,
    batch: Batch,
    *,
    clip_low: float,
    clip_high: float,
    denominator: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossParts]:
    """The clipped surrogate (+ ``kl_coef`` x KL to the reference) summed over sampled tokens and
    divided by ``denominator`` (the sampled-token count of the whole update, so micro-batches
    accumulate to the update's token-mean)."""
    mask = batch.loss_mask
    log_ratio = (logprobs - batch.old_logprobs) * mask
    ratio = torch.exp(log_ratio)
    adv = batch.advantages
    surr1 = ratio * adv
    surr2 = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    pg = -torch.minimum(surr1, surr2)
    per_token = pg
    kl_ref_t = None
    if ref_logprobs is not None:
        d = (ref_logprobs - logprobs) * mask
        kl_ref_t = torch.exp(d) - d - 1.0
        if kl_coef:
            per_token = per_token + kl_coef * kl_ref_t
    loss = (per_token * mask).sum() / denominator
    with torch.no_grad():
        parts = LossParts(tokens=float(mask.sum()))
        parts.pg = float((pg * mask).sum())
        if kl_ref_t is not None:
            parts.kl_ref = float((kl_ref_t * mask).sum())
        # KL(sampler || policy) on the sampler's own samples (k3: ratio - 1 - log ratio >= 0)
        parts.kl_sampler = float(((ratio - 1.0 - log_ratio) * mask).sum())
        if entropy is not None:
            parts.entropy = float((entropy * mask).sum())
        clipped = ((ratio < 1.0 - clip_low) & (adv < 0)) | ((ratio > 1.0 + clip_high) & (adv > 0))
        parts.clipped = float((clipped.float() * mask).sum())
        parts.ratio = float((ratio * mask).sum())
        parts.ratio_max = float((ratio * mask).max()) if mask.any() else 0.0
    return loss, parts
