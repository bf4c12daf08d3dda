"""One sequence's life in the engine, from both sides: the engine's state and the submitter's handle.

The engine's worker thread appends sampled tokens to a :class:`SequenceState` and posts events
to the event loop that owns it; a request handler holds the :class:`SequenceHandle` and reads
them: :class:`TokenEvent`\\ s as they come, then one :class:`SequenceResult`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from trajforge.serve.errors import EngineError
from trajforge.serve.sampling import SamplingSpec


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
    prompt_logprobs: list[float | None] | None = None  # log p(prompt[i] | prompt[:i]); None at 0


@dataclass(frozen=True, slots=True)
class Done:
    """The last event of a sequence: its result."""

    result: SequenceResult


@dataclass(frozen=True, slots=True)
class Failed:
    """The last event of a sequence the engine could not finish: why."""

    message: str


Event = TokenEvent | Done | Failed


@dataclass(eq=False)
class SequenceState:
    """Engine-side state of one sequence; touched by the worker thread while its batch runs."""

    prompt_ids: list[int]
    spec: SamplingSpec
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    finished: bool = False
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    finish_reason: str = "abort"
    stop_reason: str | int | None = None
    prompt_logprobs: list[float | None] | None = None

    def post(self, item: Event) -> None:
        """Hand an event to the event loop that owns this sequence (safe from any thread)."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def result(self, version: int, text: str = "") -> SequenceResult:
        """What the sequence is now, as produced by model ``version``."""
        return SequenceResult(
            prompt_ids=self.prompt_ids,
            token_ids=list(self.out_ids),
            logprobs=list(self.logprobs),
            top_logprobs=list(self.tops),
            text=text,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            model_version=version,
            prompt_logprobs=self.prompt_logprobs,
        )


class SequenceHandle:
    """What a submitter holds: stream the tokens, or wait for the result; cancel to stop early."""

    def __init__(self, seq: SequenceState) -> None:
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
        if isinstance(item, Done):
            self._result = item.result
            return item.result
        if isinstance(item, Failed):
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
