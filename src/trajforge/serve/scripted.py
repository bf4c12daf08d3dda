"""A logits hook that makes a real model say scripted text: deterministic outputs, real forward pass.

Tests of tool-call parsing, streaming and stop strings need a known output, but a random tiny
model says noise. :class:`ScriptedLogits` adds a large bias to the next scripted token of each
row, so everything else -- template, batching, KV cache, sampling, detokenization, logprobs --
runs for real::

    hook = ScriptedLogits(tokenizer.encode(text, add_special_tokens=False) + [eos_id])
    engine.logits_hook = hook           # or run_server(config, logits_hook=hook)

The returned logits *are* the distribution the server reports logprobs from (near 0.0 for the
scripted tokens). Rows past the end of the script are left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

BIAS = 1000.0


@dataclass
class ScriptedLogits:
    """Bias every row towards ``script[len(generated)]``."""

    script: Sequence[int]
    bias: float = BIAS

    def __call__(self, generated: Sequence[Sequence[int]], logits: torch.Tensor) -> torch.Tensor:
        out = logits.clone()
        for row, ids in enumerate(generated):
            step = len(ids)
            if step < len(self.script):
                out[row, self.script[step]] += self.bias
        return out
