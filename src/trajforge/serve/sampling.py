"""Choosing the next token of one sequence, and the logprob reported for it.

Kept apart from the batching loop so the rules are readable in one place:

- ``temperature == 0`` is greedy decoding (argmax).
- Otherwise logits are divided by the temperature, then top-k and top-p (nucleus) filtering
  remove tokens, and the token is drawn with the sequence's own ``torch.Generator`` (seeded from
  the request's ``seed``), so a seeded request gives the same tokens batched or alone.
- The reported logprob follows vLLM's default (``raw``): the log-softmax of the model's raw
  logits at the sampled token, *before* temperature and filtering. ``processed`` reports the
  logprob under the distribution actually sampled from instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from trajforge.serve.config import LogprobsMode

GREEDY_EPS = 1e-5


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    """Per-sequence generation settings, already validated and defaulted by the HTTP layer."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or negative: no top-k filtering
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    top_logprobs: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    prompt_logprobs: bool = False  # also score the prompt (SGLang's logprob_start_len; teacher scoring)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPS


@dataclass(frozen=True, slots=True)
class Choice:
    """The token picked for one sequence at one step, with its logprob and (optionally) the top-k."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = field(default=())


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A private random stream for one sequence; unseeded sequences get a fresh random seed."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


def _filter(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set the logits of tokens outside top-k / the top-p nucleus to -inf (always keeps one)."""
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly better tokens
        drop_sorted = before > top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        scaled = scaled.masked_fill(drop, -math.inf)
    return scaled


def choose(
    logits: torch.Tensor, spec: SamplingSpec, generator: torch.Generator, mode: LogprobsMode
) -> Choice:
    """Pick the next token from one row of float32 logits; see the module docstring for the rules."""
    raw = torch.log_softmax(logits, dim=-1)
    if spec.greedy:
        token = int(torch.argmax(logits))
        processed_lp = 0.0
    else:
        filtered = _filter(logits / spec.temperature, spec.top_k, spec.top_p)
        probs = torch.softmax(filtered, dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator))
        processed_lp = float(torch.log(probs[token]))
    logprob = float(raw[token]) if mode == "raw" else processed_lp
    top: tuple[tuple[int, float], ...] = ()
    if spec.top_logprobs > 0:
        values, ids = torch.topk(raw, min(spec.top_logprobs, raw.shape[-1]))
        top = tuple((int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True))
    return Choice(token, logprob, top)
