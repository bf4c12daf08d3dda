"""What the scripted server can answer: replies, the tool calls in them, and injected faults.

The vocabulary a test speaks to :class:`~trajforge.testing.scripted_server.ScriptedServer`;
how a reply looks on the wire is :mod:`trajforge.testing.wire`, which replies a conversation
gets is :mod:`trajforge.testing.policies`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import orjson

ReasoningField = Literal["reasoning_content", "reasoning", "reasoning_details", "think"]
PolicyFn = Callable[[dict[str, Any]], "Reply | Awaitable[Reply]"]


def retry_after_headers(seconds: float) -> dict[str, str]:
    """``Retry-After`` (whole seconds) and ``retry-after-ms``, as OpenAI sends them."""
    return {"Retry-After": str(max(0, round(seconds))), "retry-after-ms": str(int(seconds * 1000))}


@dataclasses.dataclass
class ToolCallSpec:
    """One tool call the server will emit. ``arguments`` may be a dict or raw (even invalid) JSON."""

    name: str
    arguments: dict[str, Any] | str = dataclasses.field(default_factory=dict)
    id: str | None = None

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return orjson.dumps(self.arguments).decode()


@dataclasses.dataclass(kw_only=True)
class Reply:
    """What the server answers to one request.

    A ``status`` other than 200 sends an OpenAI-shaped error body with ``error`` as its message.
    ``reasoning_field`` picks how reasoning travels: ``reasoning_content`` (DeepSeek/vLLM),
    ``reasoning`` (OpenRouter), ``reasoning_details`` (OpenRouter's structured list) or
    ``think`` (inline ``<think>...</think>`` at the start of the content). ``malformed`` sends a
    broken body instead (truncated JSON, or a cut SSE stream), ``delay_s`` waits before answering
    (longer than the client's timeout, it scripts a timeout).
    """

    content: str | None = None
    reasoning: str | None = None
    reasoning_field: ReasoningField = "reasoning_content"
    tool_calls: list[ToolCallSpec] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    status: int = 200
    error: str | None = None
    error_code: str | None = None
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    delay_s: float = 0.0
    usage: dict[str, Any] | None = None
    malformed: bool = False

    @classmethod
    def fail(
        cls,
        status: int,
        message: str | None = None,
        *,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> Reply:
        """An error reply; ``retry_after_s`` sets both ``Retry-After`` and ``retry-after-ms``."""
        headers = retry_after_headers(retry_after_s) if retry_after_s is not None else {}
        return cls(
            status=status, error=message or f"scripted error {status}", error_code=code, headers=headers
        )

    def resolved_finish_reason(self) -> str:
        return self.finish_reason or ("tool_calls" if self.tool_calls else "stop")


@dataclasses.dataclass(kw_only=True)
class FaultConfig:
    """Random failures injected before the policy runs, seeded for reproducible tests.

    Each chat request draws once from an RNG seeded by ``(seed, conversation key, request number
    within that conversation)``, so a conversation sees the same faults whatever the interleaving
    of concurrent requests. ``p_timeout`` makes the server hang for ``timeout_hang_s`` (longer
    than the client's timeout, but bounded so a test never hangs) before answering normally.
    ``p_malformed`` sends a truncated JSON body, or a cut SSE stream when streaming.
    """

    p_500: float = 0.0
    p_429: float = 0.0
    retry_after_s: float = 1.0
    p_timeout: float = 0.0
    timeout_hang_s: float = 5.0
    p_malformed: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        odds = self._odds().values()
        if any(p < 0 for p in odds) or sum(odds) > 1:
            raise ValueError(f"fault probabilities must be >= 0 and sum to at most 1 (got {sum(odds):.3f})")

    def _odds(self) -> dict[str, float]:
        return {
            "500": self.p_500,
            "429": self.p_429,
            "timeout": self.p_timeout,
            "malformed": self.p_malformed,
        }

    def draw(self, key: str, n: int) -> str | None:
        """The fault for request ``n`` of conversation ``key``: 500, 429, timeout, malformed or None."""
        odds = self._odds()
        if not any(odds.values()):
            return None
        u = random.Random(f"{self.seed}:{key}:{n}").random()
        for name, p in odds.items():
            if u < p:
                return name
            u -= p
        return None
