"""``self.server`` of a seed env: atroposlib's ``ServerManager`` as the seed's code calls it.

Seed envs call ``await self.server.chat_completion(messages=..., n=1, max_tokens=...,
temperature=..., split="eval")`` and read ``completion.choices[0].message``; they hand
``self.server`` to ``HermesAgentLoop``. Here it is the run's own model (``--model``/``--base-url``
or the embedded policy), bound while ``env eval`` runs; the answers are openai
``ChatCompletion`` objects, as atroposlib's are.

What it does not have says so: ``managed_server()`` raises ``NotImplementedError`` (the seed falls
back to its Phase 1 path on exactly that), and so do ``completion()`` and ``get_logprobs()``
(exact tokens come from a token-level endpoint: ``env eval --tokenizer``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from trajforge.llm.types import SamplingParams
from trajforge.protocols import ChatModel


class SeedServer:
    """The seed's ``self.server``: chat completions from the run's model."""

    def __init__(self) -> None:
        self.servers: list[Any] = []  # no atroposlib server objects: _use_managed_server() is False
        self.tool_parser: str | None = None
        self._model: ChatModel | None = None
        self._fit: Callable[[int | None], int | None] = lambda n: n

    def bind(self, model: ChatModel, fit: Callable[[int | None], int | None]) -> None:
        """Answer with ``model`` (``fit`` makes a ``max_tokens`` fit the endpoint's context)."""
        self._model, self._fit = model, fit

    def unbind(self) -> None:
        self._model = None

    @property
    def model(self) -> ChatModel:
        if self._model is None:
            raise RuntimeError(
                "self.server answers only while `trajforge env eval` runs this env (its model is "
                "--model/--base-url, or the embedded policy)"
            )
        return self._model

    async def chat_completion(
        self,
        *,
        messages: list[dict[str, Any]],
        n: int = 1,
        max_tokens: int | None = None,
        temperature: float | None = None,
        tools: list[dict[str, Any]] | None = None,
        extra_body: dict[str, Any] | None = None,
        split: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """``n`` answers of the run's model as one openai ``ChatCompletion``."""
        from openai.types.chat import ChatCompletion

        sampling = SamplingParams(
            temperature=temperature,
            max_tokens=self._fit(max_tokens),
            extra_body=dict(extra_body or {}),
            **{k: kwargs[k] for k in ("top_p", "stop", "seed") if k in kwargs},
        )
        choices = []
        usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        for index in range(max(1, n)):
            turn = await self.model.complete(list(messages), tools or None, sampling)
            message: dict[str, Any] = {"role": "assistant", "content": turn.content}
            if turn.tool_calls:
                message["tool_calls"] = [tc.to_openai() for tc in turn.tool_calls]
            if turn.reasoning:
                message["reasoning_content"] = turn.reasoning
            choices.append(
                {"index": index, "message": message, "finish_reason": turn.finish_reason or "stop"}
            )
            for key in usage:
                usage[key] += getattr(turn.usage, key, 0) or 0
        return ChatCompletion.model_validate(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model.name,
                "choices": choices,
                "usage": usage,
            }
        )

    async def completion(self, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "self.server.completion (raw text completion) is not available: trajforge's env eval "
            "speaks chat; for exact tokens run it with --tokenizer (a token-level endpoint)"
        )

    async def get_logprobs(self, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "self.server.get_logprobs (prompt logprobs from vLLM) is not available in env eval; the "
            "on-policy distillation it feeds is trajforge's `opd` env and `trajforge rl train`"
        )

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "self.server.tokens_and_logprobs_completion is not available in env eval: run it with "
            "--tokenizer (a token-level endpoint) and the records carry tokens, masks and logprobs"
        )

    def dedicated_server(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("self.server.dedicated_server: env eval has one endpoint, --base-url")

    async def update_weight(self, *args: Any, **kwargs: Any) -> None:
        """Atropos's weight-version bookkeeping: nothing to update in an evaluation."""

    async def wait_for_sem(self, *args: Any, **kwargs: Any) -> None:
        """Atropos's request throttle: trajforge's client has its own (``max_concurrency``)."""

    def managed_server(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "no atroposlib ManagedServer in env eval: exact tokens come from --tokenizer (a "
            "token-level endpoint), and the rollout's record carries them"
        )


__all__ = ["SeedServer"]
