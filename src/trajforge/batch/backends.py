"""What rollouts run on: the endpoint client and the sandbox factory, built once per process.

The in-process worker uses the pair the run checked in its preflight; a spawned worker process
builds its own (neither an HTTP client nor a factory of live sandboxes crosses into a process).
Whatever :func:`open_backends` builds it also closes; what it is handed, the caller closes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from trajforge.batch.config import BatchConfig
from trajforge.batch.errors import RunError
from trajforge.endpoint import EndpointConfig, build_chat_model, build_token_model
from trajforge.protocols import ChatModel, SandboxFactory
from trajforge.raycluster import share_count, share_rate
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.layout import AgentFile

__all__ = ["Backends", "build_model", "open_backends", "share_count", "share_rate"]


@dataclass(frozen=True, slots=True)
class Backends:
    model: ChatModel
    sandbox_factory: SandboxFactory


@contextlib.asynccontextmanager
async def open_backends(
    cfg: BatchConfig,
    *,
    model: ChatModel | None = None,
    sandbox_factory: SandboxFactory | None = None,
    sandbox_agent: AgentFile | None = None,
) -> AsyncIterator[Backends]:
    """The given model and factory, or ones built from ``cfg`` (and closed on the way out).
    ``sandbox_agent``: the exec agent the parent's factory built, for a factory built here."""
    async with contextlib.AsyncExitStack() as owned:
        if model is None:
            model = build_model(cfg)
            owned.push_async_callback(model.aclose)
        if sandbox_factory is None:
            built = create_sandbox_factory(cfg.sandbox_config())
            built.adopt_agent(sandbox_agent)
            owned.push_async_callback(close_factory, built)
            sandbox_factory = built
        yield Backends(model, sandbox_factory)


def build_model(cfg: BatchConfig) -> ChatModel:
    """The endpoint client for one worker, holding its share of the endpoint budget. A missing
    key or a bad URL raises :class:`RunError` with the client's message (it says what to do)."""
    in_flight = share_count(cfg.max_concurrent_requests, cfg.workers)
    endpoint = EndpointConfig(
        base_url=cfg.base_url,
        model=cfg.model,
        api_key_env=cfg.api_key_env,
        max_concurrency=in_flight or max(cfg.concurrency, 1),
        requests_per_second=share_rate(cfg.rate_limit, cfg.workers),
        request_timeout_s=cfg.request_timeout,
        max_retries=cfg.request_retries,
        backoff_base_s=cfg.retry_backoff,
        tokenizer=cfg.tokenizer,
        completion_endpoint=cfg.completion_endpoint,
        tool_call_parser=cfg.tool_call_parser,
        endpoint_dialect=cfg.endpoint_dialect,
    )
    try:
        return build_token_model(endpoint) if cfg.tokenizer else build_chat_model(endpoint)
    except Exception as exc:
        raise RunError(str(exc)) from None
