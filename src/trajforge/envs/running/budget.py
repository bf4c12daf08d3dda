"""An env's token budget against the endpoint's context, checked before an evaluation runs.

An env config (a seed one: ``max_token_length: 16000``) may ask each model call for more new
tokens than the endpoint's whole context holds. No such request can be answered: every call is
refused and every episode ends before the model was reached. So before the run, the endpoint's
context is read where it says it (the endpoint probe of :mod:`trajforge.llm.server_probe`:
``/v1/models``' ``max_model_len`` and the like, llama-server's ``/props``; a token-level model's
own config), and a
``max_tokens`` at or over it is *clamped*: left unset, so each call gets what its context has
left (how vLLM, SGLang and ``trajforge serve`` treat an unset ``max_tokens``), with one note that
says so. An endpoint that does not say its context is not checked; an episode whose model was
never reached is a failure either way, never a completed 0 (:mod:`.judge`, :mod:`.episode`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from trajforge.envs.protocol import AgentEnv

log = logging.getLogger(__name__)


async def endpoint_context(model: Any) -> int | None:
    """The context length (tokens) the model's endpoint states; None when it does not say.

    A token-level model's own config says it (``max_context_tokens``); an HTTP client's endpoint
    says it to the one probe of :mod:`trajforge.llm.server_probe` (``/v1/models``, llama-server's
    ``/props``), run here if preflight has not run it yet. A dialect forced with
    ``--endpoint-dialect`` is not probed, so its context is not known here: its oversized requests
    fail each episode with the server's reason (never a completed 0).
    """
    config = getattr(model, "config", None)
    limit = getattr(config, "max_context_tokens", None)
    if isinstance(limit, int) and limit > 0:
        return limit
    if getattr(model, "server", None) is None:
        for ask in ("dialect", "kind"):  # OpenAIChatModel / CompletionChatModel: probes once
            method = getattr(model, ask, None)
            if callable(method):
                try:
                    await method()
                except Exception as exc:  # an unreachable endpoint: preflight says so
                    log.debug("no context length: %s", exc)
                break
    server = getattr(model, "server", None)
    context = getattr(server, "context_length", None)
    return context if isinstance(context, int) and context > 0 else None


def fitter(context: int | None) -> Callable[[int | None], int | None]:
    """``max_tokens`` -> what can be asked of an endpoint of ``context`` tokens (None: unset)."""

    def fit(max_tokens: int | None) -> int | None:
        if context is not None and max_tokens is not None and max_tokens >= context:
            return None
        return max_tokens

    return fit


async def fit_token_budget(
    env: AgentEnv, model: Any, announce: Callable[[str], None] = lambda _m: None
) -> Callable[[int | None], int | None]:
    """Clamp ``env.config.max_tokens`` to the endpoint's context (module docstring); the clamp,
    for code that asks the model itself (a seed env's ``self.server``)."""
    context = await endpoint_context(model)
    fit = fitter(context)
    asked = env.config.max_tokens
    if fit(asked) != asked:
        env.config = env.config.model_copy(update={"max_tokens": None})
        announce(
            f"note: max_tokens {asked} is not below the endpoint's context of {context} tokens, so no "
            "call could be answered; clamped: each call asks for what its context has left (max_tokens unset)"
        )
    return fit


__all__ = ["endpoint_context", "fit_token_budget", "fitter"]
