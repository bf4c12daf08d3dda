"""One batch, start to finish, in the engine's worker thread: prefill, then one token per step.

Prompts are left-padded with an attention mask and explicit position ids, so every row sees
exactly what it would see alone: greedy results do not depend on what else is in the batch.
Each row stops on its own (EOS, stop token ids, stop strings, ``max_tokens``, a client that went
away); a finished row keeps feeding a pad token until the whole batch is done.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase

from trajforge.serve.config import LogprobsMode
from trajforge.serve.detok import IncrementalText, StopText
from trajforge.serve.loading import cache_kwarg
from trajforge.serve.sampling import Choice, choose, make_generator
from trajforge.serve.sequences import Done, SequenceState, TokenEvent


class LogitsHook(Protocol):
    """Rewrites next-token logits before sampling (tests script outputs with it).

    Called in the worker thread with each row's generated ids so far and the float32 logits
    ``[rows, vocab]``; what it returns *is* the model's distribution, logprobs included.
    """

    def __call__(self, generated: Sequence[Sequence[int]], logits: torch.Tensor) -> torch.Tensor: ...


class DecodeHost(Protocol):
    """What a batch reads from its engine, at each step (a hook set mid-batch applies from the next)."""

    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    pad_id: int
    eos_ids: frozenset[int]
    logprobs_mode: LogprobsMode
    logits_hook: LogitsHook | None


class BatchRun:
    """One batch of sequences decoded together by model ``version``."""

    def __init__(
        self, host: DecodeHost, model: torch.nn.Module, version: int, seqs: list[SequenceState]
    ) -> None:
        self.host = host
        self.model = model
        self.version = version
        self.seqs = seqs
        self.device = host.device
        self.detoks = [IncrementalText(host.tokenizer, s.spec.skip_special_tokens) for s in seqs]
        self.stops = [StopText(s.spec.stop, s.spec.include_stop_str_in_output) for s in seqs]
        self.generators = [make_generator(s.spec.seed, self.device) for s in seqs]
        self.forward_kwargs: dict[str, Any] = {"use_cache": True}
        if "logits_to_keep" in _forward_params(model):
            self.forward_kwargs["logits_to_keep"] = 1
        self.cache_name = cache_kwarg(model)

    def run(self) -> None:
        ids, mask = self._prompts()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self._forward(ids, mask, positions, cache, prompt=True)
        rows = len(self.seqs)
        while True:
            next_ids = self._step(logits)
            if all(s.finished for s in self.seqs):
                return
            mask = torch.cat([mask, torch.ones((rows, 1), dtype=torch.long, device=self.device)], dim=1)
            positions = positions[:, -1:] + 1
            step_ids = torch.tensor(next_ids, dtype=torch.long, device=self.device)[:, None]
            logits = self._forward(step_ids, mask, positions, cache)

    def _prompts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompts left-padded to one width, and their attention mask, on the device."""
        width = max(len(s.prompt_ids) for s in self.seqs)
        ids = torch.full((len(self.seqs), width), self.host.pad_id, dtype=torch.long)
        mask = torch.zeros((len(self.seqs), width), dtype=torch.long)
        for i, s in enumerate(self.seqs):
            ids[i, width - len(s.prompt_ids) :] = torch.tensor(s.prompt_ids)
            mask[i, width - len(s.prompt_ids) :] = 1
        return ids.to(self.device), mask.to(self.device)

    def _forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: DynamicCache,
        *,
        prompt: bool = False,
    ) -> torch.Tensor:
        # Prompt logprobs (a row asked for them) need the logits of every prompt position.
        score_prompt = prompt and any(s.spec.prompt_logprobs for s in self.seqs)
        kwargs = dict(self.forward_kwargs)
        if score_prompt:
            kwargs.pop("logits_to_keep", None)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            **{self.cache_name: cache},
            **kwargs,
        )
        if score_prompt:
            self._score_prompts(ids, out.logits)
        logits: torch.Tensor = out.logits[:, -1, :].float()
        return logits

    def _score_prompts(self, ids: torch.Tensor, all_logits: torch.Tensor) -> None:
        """log p(prompt[i] | prompt[:i]) under the raw logits, for the rows that asked (left-padded)."""
        width = ids.shape[1]
        for i, seq in enumerate(self.seqs):
            n = len(seq.prompt_ids)
            if not seq.spec.prompt_logprobs or n < 2:
                seq.prompt_logprobs = [None] * n if seq.spec.prompt_logprobs else None
                continue
            start = width - n
            lp = torch.log_softmax(all_logits[i, start : width - 1].float(), dim=-1)
            picked = lp.gather(1, ids[i, start + 1 : width, None]).squeeze(1)
            seq.prompt_logprobs = [None, *map(float, picked.tolist())]

    def _step(self, logits: torch.Tensor) -> list[int]:
        """Sample every live row, post its event, and return the ids fed back next step."""
        hook = self.host.logits_hook
        if hook is not None:
            logits = hook([s.out_ids for s in self.seqs], logits)
        return [self._advance(i, logits[i]) for i in range(len(self.seqs))]

    def _advance(self, i: int, logits: torch.Tensor) -> int:
        """Row ``i``'s next input: its sampled token, or a pad once it has finished."""
        seq = self.seqs[i]
        if seq.finished:
            return self.host.pad_id
        if seq.cancelled:
            seq.finish_reason = "abort"
            self._finish(i)
            return self.host.pad_id
        choice = choose(logits, seq.spec, self.generators[i], self.host.logprobs_mode)
        self._accept(i, choice)
        return choice.token_id

    def _accept(self, i: int, choice: Choice) -> None:
        seq, stop = self.seqs[i], self.stops[i]
        seq.out_ids.append(choice.token_id)
        seq.logprobs.append(choice.logprob)
        seq.tops.append(choice.top)
        shown = stop.add(self.detoks[i].push(choice.token_id))
        reason = self._end_reason(seq, choice.token_id, stop)
        if reason is not None:
            seq.finish_reason = reason
            if stop.matched is None:
                shown += stop.add(self.detoks[i].flush())
                shown += stop.finish()
        seq.post(TokenEvent(choice.token_id, choice.logprob, choice.top, shown))
        if reason is not None:
            self._finish(i)

    def _end_reason(self, seq: SequenceState, token_id: int, stop: StopText) -> str | None:
        """``stop`` or ``length`` when this token ends the sequence (setting its stop_reason)."""
        spec = seq.spec
        if stop.matched is not None:
            seq.stop_reason = stop.matched
            return "stop"
        if token_id in spec.stop_token_ids:
            seq.stop_reason = token_id
            return "stop"
        if not spec.ignore_eos and token_id in self.host.eos_ids:
            return "stop"
        if len(seq.out_ids) >= spec.max_tokens:
            return "length"
        return None

    def _finish(self, i: int) -> None:
        seq = self.seqs[i]
        seq.finished = True
        seq.post(Done(seq.result(self.version, self.stops[i].text)))


def _forward_params(model: torch.nn.Module) -> Sequence[str]:
    return list(inspect.signature(model.forward).parameters)
