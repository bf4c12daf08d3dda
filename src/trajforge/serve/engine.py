"""Batched generation for ``trajforge serve``: one engine task, one worker thread, many requests.

Why this shape:

- HTTP handlers only *submit* sequences and read their events; a single engine task owns the
  model. It takes what is pending (up to ``max_batch`` sequences, waiting ``batch_wait_s`` for
  more), and runs the whole batch in a dedicated worker thread -- torch releases the GIL, so the
  event loop keeps serving ``/health`` and streams while the model computes.
- Prompts are left-padded with an attention mask and explicit position ids, so every row sees
  exactly what it would see alone: greedy results do not depend on what else is in the batch.
- Each row stops on its own (EOS, stop token ids, stop strings, ``max_tokens``, a client that
  went away); a finished row keeps a pad token in the batch until the batch is done (static
  batching: a request arriving mid-batch waits for the next one).
- Weights are swapped between batches (``load_weights``): the batch loop holds a lock for the
  duration of a batch and the loader takes it only to replace the model reference, so no batch
  ever mixes two versions and every result says which version produced it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase

from trajforge.serve.config import LogprobsMode, ServeConfig, check_model_dir
from trajforge.serve.detok import IncrementalText, StopText
from trajforge.serve.loading import (
    cache_kwarg,
    context_length,
    eos_token_ids,
    generation_defaults,
    load_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
)
from trajforge.serve.sampling import Choice, SamplingSpec, choose, make_generator

log = logging.getLogger(__name__)


class RequestError(ValueError):
    """The request cannot be served as asked (too long, bad token ids, bad path): a 400."""


class EngineError(RuntimeError):
    """Generation failed inside the engine (a 500); the message says why."""


class LogitsHook(Protocol):
    """Rewrites next-token logits before sampling (tests script outputs with it).

    Called in the worker thread with each row's generated ids so far and the float32 logits
    ``[rows, vocab]``; what it returns *is* the model's distribution, logprobs included.
    """

    def __call__(self, generated: Sequence[Sequence[int]], logits: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One sampled token of one sequence; ``text`` is the newly settled text (may be empty)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]
    text: str


@dataclass(frozen=True, slots=True)
class SequenceResult:
    """A finished sequence. ``finish_reason``: ``stop`` | ``length`` | ``abort``.

    ``stop_reason`` follows vLLM: the matched stop string or stop token id, ``None`` for EOS.
    ``token_ids`` include the token that ended the sequence (EOS too): what was sampled.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[tuple[tuple[int, float], ...]]
    text: str
    finish_reason: str
    stop_reason: str | int | None
    model_version: int


@dataclass(frozen=True, slots=True)
class _Done:
    result: SequenceResult


@dataclass(frozen=True, slots=True)
class _Failed:
    message: str


@dataclass
class EngineStats:
    """Counters for /health and for tests that must see batching happen (not time it)."""

    batches: int = 0
    sequences: int = 0
    largest_batch: int = 0
    last_batch: int = 0

    def record(self, size: int) -> None:
        self.batches += 1
        self.sequences += size
        self.last_batch = size
        self.largest_batch = max(self.largest_batch, size)


@dataclass(eq=False)
class _Sequence:
    """Engine-side state of one sequence; touched by the worker thread while its batch runs."""

    prompt_ids: list[int]
    spec: SamplingSpec
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[TokenEvent | _Done | _Failed] = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    finished: bool = False
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    finish_reason: str = "abort"
    stop_reason: str | int | None = None

    def post(self, item: TokenEvent | _Done | _Failed) -> None:
        """Hand an event to the event loop that owns this sequence (safe from any thread)."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


class SequenceHandle:
    """What a submitter holds: stream the tokens, or wait for the result; cancel to stop early."""

    def __init__(self, seq: _Sequence) -> None:
        self._seq = seq
        self._result: SequenceResult | None = None

    @property
    def prompt_ids(self) -> list[int]:
        return self._seq.prompt_ids

    def cancel(self) -> None:
        """Stop generating this sequence at the next step (a client went away)."""
        self._seq.cancelled = True

    async def next_event(self) -> TokenEvent | SequenceResult:
        """The next token event, or the result once the sequence has ended (then always it)."""
        if self._result is not None:
            return self._result
        item = await self._seq.queue.get()
        if isinstance(item, _Done):
            self._result = item.result
            return item.result
        if isinstance(item, _Failed):
            raise EngineError(item.message)
        return item

    async def stream(self) -> AsyncIterator[TokenEvent]:
        """Yield token events until the sequence ends; then :meth:`result` is available."""
        while True:
            item = await self.next_event()
            if isinstance(item, SequenceResult):
                return
            yield item

    async def result(self) -> SequenceResult:
        async for _ in self.stream():
            pass
        assert self._result is not None
        return self._result


class Engine:
    """Owns the model, the tokenizer used for decoding, and the batching task."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        weights_path: Path | None = None,
        dtype: torch.dtype | None = None,
        max_batch: int = 8,
        batch_wait_s: float = 0.005,
        default_max_tokens: int = 1024,
        logprobs_mode: LogprobsMode = "raw",
        logits_hook: LogitsHook | None = None,
    ) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.dtype = dtype or next(model.parameters()).dtype
        self.weights_path = weights_path
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.default_max_tokens = default_max_tokens
        self.logprobs_mode: LogprobsMode = logprobs_mode
        self.logits_hook = logits_hook
        self.version = 0
        self.context_length = context_length(model)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.sampling_defaults = generation_defaults(model)
        self._pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids, default=0)
        )
        self._pending: asyncio.Queue[_Sequence | None] = asyncio.Queue()
        self._swap_lock = asyncio.Lock()
        self._load_lock = asyncio.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._in_flight: list[_Sequence] = []
        self._thread_lock = threading.Lock()
        self.stats = EngineStats()
        self._closing = False

    @classmethod
    async def from_config(cls, config: ServeConfig, *, logits_hook: LogitsHook | None = None) -> Engine:
        """Load the model named by ``config`` (in a thread) and build an engine around it."""
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        model = await asyncio.to_thread(load_model, config.model_path, device, dtype)
        tokenizer = await asyncio.to_thread(load_tokenizer, config.model_path)
        return cls(
            model,
            tokenizer,
            weights_path=config.model_path,
            dtype=dtype,
            max_batch=config.max_batch,
            batch_wait_s=config.batch_wait_ms / 1000.0,
            default_max_tokens=config.default_max_tokens,
            logprobs_mode=config.logprobs_mode,
            logits_hook=logits_hook,
        )

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trajforge-engine")
            self._task = asyncio.create_task(self._loop(), name="trajforge-engine")

    @property
    def running(self) -> bool:
        """Whether requests can be submitted (started, not closed, batching task alive)."""
        return self._task is not None and not self._task.done() and not self._closing

    async def close(self) -> None:
        """Refuse what is queued, abort what is running, wait for the worker, release the thread."""
        if self._task is None:
            return
        self._closing = True
        self._fail_pending("the server is shutting down")
        with self._thread_lock:
            for seq in self._in_flight:
                seq.cancelled = True
        self._pending.put_nowait(None)
        with contextlib.suppress(asyncio.CancelledError, Exception):  # a failure was logged by _loop
            await self._task
        self._task = None
        self._fail_pending("the server is shutting down")
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- requests --------------------------------------------------------------------------

    def resolve_max_tokens(self, prompt_len: int, max_tokens: int | None) -> int:
        """``max_tokens`` checked against the context length (defaulted when ``None``)."""
        room = self.context_length - prompt_len
        if room < 1:
            raise RequestError(
                f"the prompt is {prompt_len} tokens but this model's context length is "
                f"{self.context_length}; shorten the conversation"
            )
        if max_tokens is None:
            return min(self.default_max_tokens, room)
        if max_tokens > room:
            raise RequestError(
                f"this model's maximum context length is {self.context_length} tokens, but "
                f"{prompt_len + max_tokens} were requested ({prompt_len} in the prompt, {max_tokens} "
                "in the completion); reduce max_tokens or the prompt"
            )
        return max_tokens

    def check_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        if not prompt_ids:
            raise RequestError("the prompt is empty; give at least one token")
        bad = [t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"prompt token ids must be integers in [0, {self.vocab_size}); got {bad[:5]}")
        return list(prompt_ids)

    def submit(self, prompt_ids: Sequence[int], spec: SamplingSpec) -> SequenceHandle:
        """Queue one sequence; raises :class:`RequestError` for prompts the model cannot take."""
        if not self.running:
            raise EngineError("the engine is not running (shut down, or it failed: see the server log)")
        prompt = self.check_prompt(prompt_ids)
        if len(prompt) + spec.max_tokens > self.context_length:
            self.resolve_max_tokens(len(prompt), spec.max_tokens)
        seq = _Sequence(prompt, spec, asyncio.get_running_loop())
        self._pending.put_nowait(seq)
        return SequenceHandle(seq)

    async def generate(self, prompt_ids: Sequence[int], spec: SamplingSpec) -> SequenceResult:
        return await self.submit(prompt_ids, spec).result()

    # -- weights ---------------------------------------------------------------------------

    async def load_weights(self, path: str | Path) -> int:
        """Load a checkpoint directory and swap it in between batches; returns the new version."""
        async with self._load_lock:
            try:
                checked = check_model_dir(Path(path))
                new = await asyncio.to_thread(load_model, checked, self.device, self.dtype)
            except ValueError as exc:
                raise RequestError(str(exc)) from exc
            new_vocab = int(new.get_output_embeddings().weight.shape[0])
            if new_vocab != self.vocab_size:
                raise RequestError(
                    f"checkpoint {str(checked)!r} has a vocabulary of {new_vocab} tokens but the served "
                    f"tokenizer/model has {self.vocab_size}; load a checkpoint of the same model"
                )
            async with self._swap_lock:
                self._model = new
                self.version += 1
                self.weights_path = checked
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            log.info("loaded weights version %d from %s", self.version, checked)
            return self.version

    # -- the batching loop -------------------------------------------------------------------

    async def _collect(self) -> list[_Sequence] | None:
        """Wait for one sequence, then take more for up to ``batch_wait_s``; ``None`` = shut down."""
        first = await self._pending.get()
        if first is None:
            return None
        batch = [first]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.batch_wait_s
        while len(batch) < self.max_batch:
            try:
                item = self._pending.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._pending.get(), remaining)
                except TimeoutError:
                    break
            if item is None:
                self._pending.put_nowait(None)  # see it again after this batch
                break
            batch.append(item)
        return batch

    def _fail_pending(self, message: str) -> None:
        while not self._pending.empty():
            seq = self._pending.get_nowait()
            if seq is not None:
                seq.post(_Failed(message))

    async def _loop(self) -> None:
        try:
            await self._batches()
        except Exception:  # a bug here must not leave requests waiting forever
            log.exception("the engine's batching task failed")
            self._fail_pending("the engine failed; see the server log")
            raise

    async def _batches(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            if batch is None:
                return
            if self._closing:
                for s in batch:
                    s.post(_Failed("the server is shutting down"))
                return
            live = [s for s in batch if not s.cancelled]
            for s in batch:
                if s.cancelled:
                    s.post(_Done(self._result(s, self.version)))
            if not live:
                continue
            async with self._swap_lock:
                model, version = self._model, self.version
                with self._thread_lock:
                    self._in_flight = live
                self.stats.record(len(live))
                try:
                    await loop.run_in_executor(self._executor, self._run_batch, model, version, live)
                except Exception as exc:  # the whole batch failed: every request hears why
                    log.exception("generation failed")
                    for s in live:
                        if not s.finished:
                            s.post(_Failed(f"generation failed: {type(exc).__name__}: {exc}"))
                finally:
                    with self._thread_lock:
                        self._in_flight = []

    # -- worker thread -------------------------------------------------------------------------

    def _result(self, seq: _Sequence, version: int, text: str = "") -> SequenceResult:
        return SequenceResult(
            prompt_ids=seq.prompt_ids,
            token_ids=list(seq.out_ids),
            logprobs=list(seq.logprobs),
            top_logprobs=list(seq.tops),
            text=text,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
            model_version=version,
        )

    def _run_batch(self, model: torch.nn.Module, version: int, seqs: list[_Sequence]) -> None:
        with torch.inference_mode():
            _BatchRun(self, model, version, seqs).run()


class _BatchRun:
    """One batch, start to finish, in the worker thread."""

    def __init__(self, engine: Engine, model: torch.nn.Module, version: int, seqs: list[_Sequence]) -> None:
        self.engine = engine
        self.model = model
        self.version = version
        self.seqs = seqs
        self.device = engine.device
        tok = engine._tokenizer
        self.detoks = [IncrementalText(tok, s.spec.skip_special_tokens) for s in seqs]
        self.stops = [StopText(s.spec.stop, s.spec.include_stop_str_in_output) for s in seqs]
        self.generators = [make_generator(s.spec.seed, self.device) for s in seqs]
        self.forward_kwargs: dict[str, Any] = {"use_cache": True}
        params = set(_forward_params(model))
        if "logits_to_keep" in params:
            self.forward_kwargs["logits_to_keep"] = 1
        self.cache_name = cache_kwarg(model)

    def run(self) -> None:
        seqs, pad = self.seqs, self.engine._pad_id
        width = max(len(s.prompt_ids) for s in seqs)
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - len(s.prompt_ids) :] = torch.tensor(s.prompt_ids)
            mask[i, width - len(s.prompt_ids) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self._forward(ids, mask, positions, cache)
        while True:
            next_ids = self._step(logits)
            if all(s.finished for s in seqs):
                return
            mask = torch.cat([mask, torch.ones((len(seqs), 1), dtype=torch.long, device=self.device)], dim=1)
            positions = positions[:, -1:] + 1
            step_ids = torch.tensor(next_ids, dtype=torch.long, device=self.device)[:, None]
            logits = self._forward(step_ids, mask, positions, cache)

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: DynamicCache
    ) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            **{self.cache_name: cache},
            **self.forward_kwargs,
        )
        return out.logits[:, -1, :].float()

    def _step(self, logits: torch.Tensor) -> list[int]:
        """Sample every live row, post its event, and return the ids fed back next step."""
        hook = self.engine.logits_hook
        if hook is not None:
            logits = hook([s.out_ids for s in self.seqs], logits)
        next_ids: list[int] = []
        for i, seq in enumerate(self.seqs):
            if seq.finished:
                next_ids.append(self.engine._pad_id)
                continue
            if seq.cancelled:
                seq.finish_reason = "abort"
                self._finish(i)
                next_ids.append(self.engine._pad_id)
                continue
            choice = choose(logits[i], seq.spec, self.generators[i], self.engine.logprobs_mode)
            self._accept(i, choice)
            next_ids.append(choice.token_id)
        return next_ids

    def _accept(self, i: int, choice: Choice) -> None:
        seq, spec, stop = self.seqs[i], self.seqs[i].spec, self.stops[i]
        seq.out_ids.append(choice.token_id)
        seq.logprobs.append(choice.logprob)
        seq.tops.append(choice.top)
        shown = stop.add(self.detoks[i].push(choice.token_id))
        reason: str | None = None
        if stop.matched is not None:
            reason, seq.stop_reason = "stop", stop.matched
        elif choice.token_id in spec.stop_token_ids:
            reason, seq.stop_reason = "stop", choice.token_id
        elif not spec.ignore_eos and choice.token_id in self.engine.eos_ids:
            reason = "stop"
        elif len(seq.out_ids) >= spec.max_tokens:
            reason = "length"
        if reason is None:
            seq.post(TokenEvent(choice.token_id, choice.logprob, choice.top, shown))
            return
        seq.finish_reason = reason
        if stop.matched is None:
            shown += stop.add(self.detoks[i].flush())
            shown += stop.finish()
        seq.post(TokenEvent(choice.token_id, choice.logprob, choice.top, shown))
        self._finish(i)

    def _finish(self, i: int) -> None:
        seq = self.seqs[i]
        seq.finished = True
        seq.post(_Done(self.engine._result(seq, self.version, self.stops[i].text)))


def _forward_params(model: torch.nn.Module) -> Sequence[str]:
    return list(inspect.signature(model.forward).parameters)


__all__ = [
    "Engine",
    "EngineError",
    "EngineStats",
    "LogitsHook",
    "RequestError",
    "SamplingSpec",
    "SequenceHandle",
    "SequenceResult",
    "TokenEvent",
]
