"""An in-process :class:`~trajforge.protocols.ChatModel` that answers from a script.

For fast unit tests of the agent loop and anything above it: no HTTP, no event-loop threads.
Prefer it to a new mock. (To test the wire protocol, retries and streaming, use
:class:`trajforge.testing.scripted_server.ScriptedServer` with the real client instead.)

A script is a list of steps served in order *per conversation* (keyed by the first user
message, like the scripted server), each one of:

- an :class:`AssistantTurn` -- returned as is (a copy);
- a ``str`` -- a final answer with that content;
- an exception instance (e.g. a :class:`ModelError`) -- raised, to test error handling.

Or a policy: a callable ``(messages, tools, sampling) -> AssistantTurn | str`` (or awaitable).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import itertools
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson

from trajforge.llm.types import AssistantTurn, ModelError, ModelErrorKind, SamplingParams, ToolCall

Step = AssistantTurn | str | BaseException
ModelPolicy = Callable[
    [list[dict[str, Any]], list[dict[str, Any]] | None, SamplingParams | None],
    "AssistantTurn | str | Awaitable[AssistantTurn | str]",
]

_ids = itertools.count(1)


def tool_turn(
    *calls: tuple[str, dict[str, Any] | str], reasoning: str | None = None, content: str | None = None
) -> AssistantTurn:
    """An assistant turn calling ``calls`` (``(name, arguments)``; a str is raw, maybe invalid, JSON)."""
    tool_calls = [
        ToolCall(
            id=f"call_{next(_ids)}",
            name=name,
            arguments=args if isinstance(args, str) else orjson.dumps(args).decode(),
        )
        for name, args in calls
    ]
    return AssistantTurn(
        content=content, reasoning=reasoning, tool_calls=tool_calls, finish_reason="tool_calls"
    )


def answer(content: str, reasoning: str | None = None) -> AssistantTurn:
    """A final-answer turn."""
    return AssistantTurn(content=content, reasoning=reasoning, finish_reason="stop")


@dataclasses.dataclass
class ScriptedCall:
    """What one ``complete`` call received (messages deep-copied at call time)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    sampling: SamplingParams | None


def _conversation_key(messages: list[dict[str, Any]]) -> str:
    for m in messages:
        if m.get("role") == "user":
            content = m.get("content")
            return content if isinstance(content, str) else orjson.dumps(content).decode()
    return ""


class ScriptedModel:
    """Plays back a script (or asks a policy) instead of calling a model.

    ``calls`` records every request. An exhausted script raises a PERMANENT :class:`ModelError`
    saying so, which the agent loop reports as a model error -- visible, not a hang.
    ``delay_s`` makes each call take that long (for concurrency tests).
    """

    def __init__(
        self,
        script: Sequence[Step] | ModelPolicy,
        *,
        name: str = "scripted",
        delay_s: float = 0.0,
    ) -> None:
        self._script = script
        self._name = name
        self.delay_s = delay_s
        self.calls: list[ScriptedCall] = []
        self.closed = False
        self._positions: Counter[str] = Counter()

    @property
    def name(self) -> str:
        return self._name

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
    ) -> AssistantTurn:
        self.calls.append(ScriptedCall(copy.deepcopy(messages), copy.deepcopy(tools), sampling))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        step = await self._next_step(messages, tools, sampling)
        if isinstance(step, BaseException):
            raise step
        turn = (
            AssistantTurn(content=step, finish_reason="stop") if isinstance(step, str) else step.model_copy()
        )
        turn.model = turn.model or self._name
        return turn

    async def _next_step(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams | None,
    ) -> Step:
        if callable(self._script):
            result = self._script(messages, tools, sampling)
            return await result if inspect.isawaitable(result) else result
        key = _conversation_key(messages)
        position = self._positions[key]
        if position >= len(self._script):
            raise ModelError(
                f"ScriptedModel: script exhausted after {len(self._script)} steps for conversation {key[:60]!r}",
                kind=ModelErrorKind.PERMANENT,
                endpoint="scripted",
            )
        self._positions[key] += 1
        return self._script[position]

    async def aclose(self) -> None:
        self.closed = True
