"""One episode's exact token sequence, with training masks, logprobs and a drift report.

Built from the per-turn :class:`~trajforge.llm.types.TokenTrace` s of a token-exact backend
(:class:`~trajforge.llm.completion_model.CompletionChatModel`), never from text: turn k+1's
prompt must *extend* turn k's prompt + sampled ids, and whatever it adds (tool results, user
turns, the next generation prompt) is the only non-sampled material between turns. So:

``tokens = prompt_0 + sampled_0 + segment_1 + sampled_1 + ...`` with ``segment_k =
prompt_k[len(tokens so far):]``.

``masks`` follow the Atropos convention: -100 where the model did not sample (not trained),
the token id where it did. ``logprobs`` are the sampler's logprobs on sampled positions and
1.0 elsewhere (``ScoredDataGroup.inference_logprobs``).

The drift report re-renders the final conversation with the chat template and compares ids.
It tells whether training on re-rendered text would have been the same as training on what the
model saw. Templates that strip earlier ``<think>`` blocks (Qwen3) do not reproduce; the trace
is exact anyway, because it never depended on re-rendering.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from trajforge.llm.types import TokenTrace

if TYPE_CHECKING:
    from trajforge.llm.chat_template import ChatTemplate

MASKED = -100
"""Mask value of tokens the model did not sample (Atropos / HF ``ignore_index``)."""
MASKED_LOGPROB = 1.0
"""Logprob placed on masked positions (Atropos ``inference_logprobs`` convention)."""


class TraceError(ValueError):
    """Per-turn traces that do not form one exact token sequence (says which turn and where)."""


class TurnSpan(BaseModel):
    """Sampled tokens of one assistant turn: ``tokens[start:end]``."""

    turn: int
    start: int
    end: int
    finish_reason: str | None = None
    model_version: int | None = None
    """The weights that sampled this turn, when the server said (see ``TokenTrace``)."""


class DriftReport(BaseModel):
    """Does re-rendering the final messages give the trace's ids?"""

    reproduces: bool
    first_diff_index: int | None = Field(default=None, description="first token index that differs")
    trace_length: int
    rendered_length: int
    trace_context: str = Field(default="", description="decoded trace tokens around the difference")
    rendered_context: str = Field(default="", description="decoded re-rendered tokens there")


class EpisodeTrace(BaseModel):
    """Aligned ``tokens`` / ``masks`` / ``logprobs`` of one episode, plus per-turn spans."""

    tokens: list[int]
    masks: list[int]
    logprobs: list[float]
    spans: list[TurnSpan]
    drift: DriftReport | None = None

    @property
    def num_sampled(self) -> int:
        return sum(s.end - s.start for s in self.spans)


def build_episode_trace(
    traces: Sequence[TokenTrace],
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    template: ChatTemplate | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> EpisodeTrace:
    """Concatenate per-turn traces; with ``messages`` and ``template``, also report drift.

    ``tools`` must be the tool schemas the model was offered (they are part of the rendered
    prompt). Raises :class:`TraceError` when a turn's prompt does not extend the tokens so far:
    the backend was not token-exact for this conversation (history edited between turns, another
    model instance, or its prefix memory evicted).
    """
    if not traces:
        raise TraceError("no token traces: the episode used a backend that is not token-exact")
    tokens: list[int] = []
    masks: list[int] = []
    logprobs: list[float] = []
    spans: list[TurnSpan] = []
    for k, trace in enumerate(traces):
        if len(trace.completion_logprobs) != len(trace.completion_ids):
            raise TraceError(
                f"turn {k}: {len(trace.completion_ids)} sampled ids but "
                f"{len(trace.completion_logprobs)} logprobs"
            )
        prompt = trace.prompt_ids
        if prompt[: len(tokens)] != tokens:
            at = _first_diff(prompt, tokens)
            raise TraceError(
                f"turn {k}: its prompt does not extend the episode's tokens (first difference at "
                f"index {at} of {len(tokens)}); the conversation was re-rendered instead of extended"
            )
        segment = prompt[len(tokens) :]
        tokens += segment
        masks += [MASKED] * len(segment)
        logprobs += [MASKED_LOGPROB] * len(segment)
        start = len(tokens)
        tokens += trace.completion_ids
        masks += trace.completion_ids
        logprobs += trace.completion_logprobs
        spans.append(
            TurnSpan(
                turn=k,
                start=start,
                end=len(tokens),
                finish_reason=trace.finish_reason,
                model_version=trace.model_version,
            )
        )
    episode = EpisodeTrace(tokens=tokens, masks=masks, logprobs=logprobs, spans=spans)
    if messages is not None and template is not None:
        episode.drift = drift_report(tokens, messages, template, tools)
    return episode


def drift_report(
    tokens: Sequence[int],
    messages: Sequence[Mapping[str, Any]],
    template: ChatTemplate,
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    context_tokens: int = 8,
) -> DriftReport:
    """Compare ``tokens`` with the template's rendering of ``messages`` up to the last assistant turn.

    Only the part of the conversation the model produced tokens for is compared (tool results
    after the last sampled turn were never in a prompt). Text after the last end-of-turn that
    the template adds and the model never samples (ChatML's trailing newline) does not count as
    drift.
    """
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    rendered_text = template.render(messages[: last + 1], tools, add_generation_prompt=last < 0)
    rendered = template.encode(rendered_text)
    n = min(len(tokens), len(rendered))
    diff = _first_diff(tokens, rendered)
    tail = template.decode(rendered[len(tokens) :]) if diff >= n and len(rendered) >= len(tokens) else ""
    reproduces = diff >= n and len(rendered) >= len(tokens) and not tail.strip()
    if reproduces:
        return DriftReport(
            reproduces=True, trace_length=len(tokens), rendered_length=len(rendered), first_diff_index=None
        )
    lo = max(0, diff - context_tokens)
    return DriftReport(
        reproduces=False,
        first_diff_index=diff,
        trace_length=len(tokens),
        rendered_length=len(rendered),
        trace_context=template.decode(tokens[lo : diff + context_tokens]),
        rendered_context=template.decode(rendered[lo : diff + context_tokens]),
    )


def _first_diff(a: Sequence[int], b: Sequence[int]) -> int:
    """Index of the first difference (the shorter length when one is a prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))
