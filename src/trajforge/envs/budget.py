"""An env's token budget against the endpoint's context, checked before an evaluation runs.

An env config (a seed one: ``max_token_length: 16000``) may ask each model call for more new
tokens than the endpoint's whole context holds. No such request can be answered: every call is
refused and every episode ends before the model was reached. So before the run, the endpoint's
context is read where it says it (``/models``: vLLM's and ``trajforge serve``'s
``max_model_len``, OpenRouter's ``context_length``; a token-level model's own config), and a
``max_tokens`` at or over it is *clamped*: left unset, so each call gets what its context has
left (how vLLM, SGLang and ``trajforge serve`` treat an unset ``max_tokens``), with one note that
says so. An endpoint that does not say its context is not checked; an episode whose model was
never reached is a failure either way, never a completed 0 (:mod:`.judge`, :mod:`.episode`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from trajforge.envs.protocol import AgentEnv

log = logging.getLogger(__name__)

_CONTEXT_KEYS = ("max_model_len", "context_length", "max_context_length", "context_window")


async def endpoint_context(model: Any) -> int | None:
    """The context length (tokens) the model's endpoint states; None when it does not say."""
    config = getattr(model, "config", None)
    limit = getattr(config, "max_context_tokens", None)
    if isinstance(limit, int) and limit > 0:
        return limit
    base_url = getattr(config, "base_url", None)
    name = getattr(config, "model", None)
    if not isinstance(base_url, str) or not isinstance(name, str):
        return None
    import httpx

    headers = {}
    key_env = getattr(config, "api_key_env", None)
    if isinstance(key_env, str) and os.environ.get(key_env):
        headers["Authorization"] = f"Bearer {os.environ[key_env]}"
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            response = await client.get(base_url.rstrip("/") + "/models", headers=headers)
        payload = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as exc:
        log.debug("no context length from %s/models: %s", base_url, exc)
        return None
    cards = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(cards, list):
        return None
    for card in cards:
        if isinstance(card, dict) and card.get("id") == name:
            for key in _CONTEXT_KEYS:
                value = card.get(key)
                if isinstance(value, int) and value > 0:
                    return value
    return None


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
