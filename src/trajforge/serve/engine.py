"""Batched generation for ``trajforge serve``: one engine task, one worker thread, many requests.

Why this shape:

- HTTP handlers only *submit* sequences and read their events (:mod:`trajforge.serve.sequences`);
  a single engine task owns the model. It takes what is pending (up to ``max_batch`` sequences,
  waiting ``batch_wait_s`` for more), and runs the whole batch in a dedicated worker thread
  (:mod:`trajforge.serve.decode`) -- torch releases the GIL, so the event loop keeps serving
  ``/health`` and streams while the model computes.
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
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from trajforge.serve.adapters import is_adapter_dir, load_merged_adapter
from trajforge.serve.config import LogprobsMode, ServeConfig, check_model_dir
from trajforge.serve.decode import BatchRun, LogitsHook
from trajforge.serve.errors import EngineError, RequestError
from trajforge.serve.loading import (
    context_length,
    eos_token_ids,
    generation_defaults,
    load_model,
    load_tokenizer,
    resolve_device,
    resolve_dtype,
    vocab_size,
)
from trajforge.serve.sampling import SamplingSpec
from trajforge.serve.sequences import Done, Failed, SequenceHandle, SequenceResult, SequenceState, TokenEvent

log = logging.getLogger(__name__)

_SHUTTING_DOWN = "the server is shutting down"


class _TimedOut:
    """What :meth:`Engine._take_until` returns when nothing came in time."""


_TIMED_OUT = _TimedOut()


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
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.dtype = dtype or next(model.parameters()).dtype
        self.weights_path = weights_path
        self.base_path = weights_path
        """The weights the server started from: LoRA adapters are merged onto these (serve/adapters.py)."""
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.default_max_tokens = default_max_tokens
        self.logprobs_mode: LogprobsMode = logprobs_mode
        self.logits_hook = logits_hook
        self.version = 0
        self.context_length = context_length(model)
        self.vocab_size = vocab_size(model)
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.sampling_defaults = generation_defaults(model)
        self.pad_id: int = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids, default=0)
        )
        self.stats = EngineStats()
        self._init_batching()

    def _init_batching(self) -> None:
        self._pending: asyncio.Queue[SequenceState | None] = asyncio.Queue()
        self._swap_lock = asyncio.Lock()
        self._load_lock = asyncio.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._in_flight: list[SequenceState] = []
        self._thread_lock = threading.Lock()
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
        self._fail_pending(_SHUTTING_DOWN)
        with self._thread_lock:
            for seq in self._in_flight:
                seq.cancelled = True
        self._pending.put_nowait(None)
        with contextlib.suppress(asyncio.CancelledError, Exception):  # a failure was logged by _loop
            await self._task
        self._task = None
        self._fail_pending(_SHUTTING_DOWN)
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
        seq = SequenceState(prompt, spec, asyncio.get_running_loop())
        self._pending.put_nowait(seq)
        return SequenceHandle(seq)

    async def generate(self, prompt_ids: Sequence[int], spec: SamplingSpec) -> SequenceResult:
        return await self.submit(prompt_ids, spec).result()

    # -- weights ---------------------------------------------------------------------------

    async def load_weights(self, path: str | Path) -> int:
        """Load a checkpoint directory -- or a LoRA adapter directory, merged onto the weights the
        server started from -- and swap it in between batches; returns the new version."""
        async with self._load_lock:
            checked, new = await self._load_checkpoint(path)
            async with self._swap_lock:
                self._model = new
                self.version += 1
                self.weights_path = checked
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            log.info("loaded weights version %d from %s", self.version, checked)
            return self.version

    async def _load_checkpoint(self, path: str | Path) -> tuple[Path, torch.nn.Module]:
        """The checked directory and its model; :class:`RequestError` when it cannot be served."""
        try:
            checked, new = await asyncio.to_thread(self._read_weights, Path(path))
        except ValueError as exc:
            raise RequestError(str(exc)) from exc
        new_vocab = vocab_size(new)
        if new_vocab != self.vocab_size:
            raise RequestError(
                f"checkpoint {str(checked)!r} has a vocabulary of {new_vocab} tokens but the served "
                f"tokenizer/model has {self.vocab_size}; load a checkpoint of the same model"
            )
        return checked, new

    def _read_weights(self, path: Path) -> tuple[Path, torch.nn.Module]:
        """A model directory's weights, or a LoRA adapter directory merged onto the base the
        engine started from (serve/adapters.py). Blocking."""
        if is_adapter_dir(path):
            if self.base_path is None:
                raise ValueError("this engine has no base weights on disk to merge LoRA adapters onto")
            return path.resolve(), load_merged_adapter(
                path.resolve(), self.base_path, self.device, self.dtype
            )
        checked = check_model_dir(path)
        return checked, load_model(checked, self.device, self.dtype)

    # -- the batching loop -------------------------------------------------------------------

    async def _collect(self) -> list[SequenceState] | None:
        """Wait for one sequence, then take more for up to ``batch_wait_s``; ``None`` = shut down."""
        first = await self._pending.get()
        if first is None:
            return None
        batch = [first]
        deadline = asyncio.get_running_loop().time() + self.batch_wait_s
        while len(batch) < self.max_batch:
            item = await self._take_until(deadline)
            if isinstance(item, _TimedOut):
                break
            if item is None:
                self._pending.put_nowait(None)  # see it again after this batch
                break
            batch.append(item)
        return batch

    async def _take_until(self, deadline: float) -> SequenceState | None | _TimedOut:
        """The next pending item, waiting until the loop's clock reads ``deadline`` at most."""
        try:
            return self._pending.get_nowait()
        except asyncio.QueueEmpty:
            pass
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0:
            return _TIMED_OUT
        try:
            return await asyncio.wait_for(self._pending.get(), remaining)
        except TimeoutError:
            return _TIMED_OUT

    def _fail_pending(self, message: str) -> None:
        while not self._pending.empty():
            seq = self._pending.get_nowait()
            if seq is not None:
                seq.post(Failed(message))

    async def _loop(self) -> None:
        try:
            await self._batches()
        except Exception:  # a bug here must not leave requests waiting forever
            log.exception("the engine's batching task failed")
            self._fail_pending("the engine failed; see the server log")
            raise

    async def _batches(self) -> None:
        while (batch := await self._collect()) is not None:
            if self._closing:
                for s in batch:
                    s.post(Failed(_SHUTTING_DOWN))
                return
            live = [s for s in batch if not s.cancelled]
            for s in batch:
                if s.cancelled:
                    s.post(Done(s.result(self.version)))
            if live:
                await self._run(live)

    async def _run(self, live: list[SequenceState]) -> None:
        """Decode one batch in the worker thread with the current weights, which stay for all of it."""
        loop = asyncio.get_running_loop()
        async with self._swap_lock:
            model, version = self._model, self.version
            with self._thread_lock:
                self._in_flight = live
            self.stats.record(len(live))
            try:
                await loop.run_in_executor(self._executor, self._run_batch, model, version, live)
            except Exception as exc:  # the whole batch failed: every request hears why
                log.exception("generation failed")
                _fail_unfinished(live, f"generation failed: {type(exc).__name__}: {exc}")
            finally:
                with self._thread_lock:
                    self._in_flight = []

    def _run_batch(self, model: torch.nn.Module, version: int, seqs: list[SequenceState]) -> None:
        with torch.inference_mode():
            BatchRun(self, model, version, seqs).run()


def _fail_unfinished(seqs: list[SequenceState], message: str) -> None:
    for s in seqs:
        if not s.finished:
            s.post(Failed(message))


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
