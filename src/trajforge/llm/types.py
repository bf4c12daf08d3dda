"""Value types shared by every model backend.

They are the vocabulary of the ``ChatModel`` boundary (see :mod:`trajforge.protocols`): the
agent loop only ever sees an :class:`AssistantTurn`, whatever produced it (an OpenAI-compatible
endpoint, a token-exact completion endpoint or an in-process model).
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ToolCall(BaseModel):
    """One function call requested by the model.

    ``arguments`` stays the raw JSON text the model produced: the agent loop decides whether it
    parses, so an invalid call is reported to the model instead of running with ``{}``.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: str = "{}"

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


class Usage(BaseModel):
    """Token accounting for one call (or a sum of calls).

    ``None`` is *unknown*: the endpoint did not say (no ``usage`` in its answer, a stream whose
    server ignored ``stream_options.include_usage``, no ``completion_tokens_details``). It is not
    zero, and a sum with an unknown part is unknown: a total that counts only the calls that
    reported would pass for the whole. Start a sum from :meth:`zero`.
    """

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_tokens: int | None = None

    @classmethod
    def zero(cls) -> Usage:
        """No calls yet: every count known, and 0."""
        return cls(prompt_tokens=0, completion_tokens=0, total_tokens=0, reasoning_tokens=0, cached_tokens=0)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=_plus(self.prompt_tokens, other.prompt_tokens),
            completion_tokens=_plus(self.completion_tokens, other.completion_tokens),
            total_tokens=_plus(self.total_tokens, other.total_tokens),
            reasoning_tokens=_plus(self.reasoning_tokens, other.reasoning_tokens),
            cached_tokens=_plus(self.cached_tokens, other.cached_tokens),
        )


def _plus(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


class TokenTrace(BaseModel):
    """Exact tokens of one assistant turn, as sampled by a token-exact backend.

    ``prompt_ids`` is the full prompt the completion endpoint saw for this turn; ``completion_ids``
    and ``completion_logprobs`` are what it sampled. Episode-level traces are assembled from these
    by :mod:`trajforge.llm.token_trace` without ever re-tokenizing sampled text.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    finish_reason: str | None = None
    model_version: int | None = None
    """Which weights sampled this turn, when the server says (``trajforge serve``'s
    ``model_version``, SGLang's ``weight_version``): a turn may be sampled after a reload."""


class SamplingParams(BaseModel):
    """Per-request sampling settings; ``None`` means "let the endpoint decide"."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    seed: int | None = None
    reasoning_effort: str | None = Field(
        default=None, description="low|medium|high; sent as reasoning_effort / reasoning.effort"
    )
    reasoning_disabled: bool = Field(default=False, description="ask the provider to not reason")
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="merged into the request body (provider routing, etc.)"
    )


class AssistantTurn(BaseModel):
    """What a model returned for one request, normalised across providers."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage = Field(default_factory=Usage)
    model: str | None = None
    latency_s: float = 0.0
    parse_errors: list[str] = Field(
        default_factory=list,
        description="tool calls the backend could not parse from raw text; the loop tells the model",
    )
    token_trace: TokenTrace | None = None
    calls_from_text: str | None = Field(
        default=None,
        description="the parser family that recovered tool_calls from the text (the endpoint returned "
        "the model's calls as content); None: the endpoint parsed them, or there are none",
    )

    def to_message(self) -> dict[str, Any]:
        """The OpenAI-format assistant message, with reasoning kept under ``reasoning``."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [tc.to_openai() for tc in self.tool_calls]
        return msg


class ModelErrorKind(enum.StrEnum):
    """Why a model call failed; decides whether anybody should retry."""

    TRANSIENT = "transient"  # 429, 5xx, timeouts, connection errors, malformed bodies
    PERMANENT = "permanent"  # 400/401/403/404: retrying cannot help
    CONTEXT_LENGTH = "context_length"  # the conversation no longer fits
    AUTH = "auth"  # 401/403: a bad or missing key


class ModelError(Exception):
    """A model call that failed after the client's own retries.

    The message always names the endpoint and the HTTP status (when there is one) and never
    contains the API key.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: ModelErrorKind,
        endpoint: str = "",
        status: int | None = None,
        attempts: int = 1,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.endpoint = endpoint
        self.status = status
        self.attempts = attempts

    @property
    def transient(self) -> bool:
        return self.kind is ModelErrorKind.TRANSIENT
