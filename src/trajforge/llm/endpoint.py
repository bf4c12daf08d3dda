"""Open the chat model a command should use: a given endpoint, or the embedded default policy.

With neither ``model`` nor ``base_url``, trajforge serves its own tiny policy with
``trajforge serve`` on a free loopback port and talks to it over the same HTTP path as any other
endpoint, so the default is not a special case anywhere below this function.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from pydantic import BaseModel, Field

from trajforge.llm.openai_client import OpenAIChatModel, OpenAIModelConfig


class EndpointConfig(BaseModel):
    """Where the model lives. ``api_key_env`` names an environment variable; keys never travel in argv."""

    model: str | None = Field(
        None, description="model name; omit both model and base_url for the embedded one"
    )
    base_url: str | None = Field(
        None, description="OpenAI-compatible endpoint root, e.g. http://host:8000/v1"
    )
    api_key_env: str | None = Field(None, description="env var holding the API key")
    stream: bool = Field(False, description="use SSE streaming")
    max_concurrency: int = Field(256, ge=1, description="requests in flight to the endpoint")
    requests_per_second: float | None = Field(None, gt=0, description="request start rate limit")
    request_timeout_s: float = Field(600.0, gt=0)
    max_retries: int = Field(5, ge=0)

    @property
    def embedded(self) -> bool:
        return self.model is None and self.base_url is None


def _client(cfg: EndpointConfig, base_url: str, model: str) -> OpenAIChatModel:
    return OpenAIChatModel(
        OpenAIModelConfig(
            base_url=base_url,
            model=model,
            api_key_env=cfg.api_key_env,
            stream=cfg.stream,
            max_concurrency=cfg.max_concurrency,
            requests_per_second=cfg.requests_per_second,
            request_timeout_s=cfg.request_timeout_s,
            max_retries=cfg.max_retries,
        )
    )


@contextlib.asynccontextmanager
async def open_chat_model(
    cfg: EndpointConfig, *, announce: Callable[[str], None] = lambda _msg: None
) -> AsyncIterator[OpenAIChatModel]:
    """Yield a ready client; for the embedded default, also run (and finally stop) its server."""
    if cfg.base_url is not None and cfg.model is None:
        raise ValueError("--base-url needs --model (the model name the endpoint serves)")
    if cfg.model is not None and cfg.base_url is None:
        raise ValueError(
            "--model needs --base-url (an OpenAI-compatible endpoint); omit both to use the embedded policy"
        )
    if not cfg.embedded:
        model = _client(cfg, cfg.base_url or "", cfg.model or "")
        try:
            yield model
        finally:
            await model.aclose()
        return

    async with embedded_endpoint(announce=announce) as (base_url, name):
        model = _client(cfg, base_url, name)
        try:
            yield model
        finally:
            await model.aclose()


EMBEDDED_MODEL_NAME = "trajforge-tiny"


@contextlib.asynccontextmanager
async def embedded_endpoint(
    *, announce: Callable[[str], None] = lambda _msg: None
) -> AsyncIterator[tuple[str, str]]:
    """Serve the embedded tiny policy on a free loopback port; yields ``(base_url, model_name)``."""
    from trajforge.models.tiny import weights_path
    from trajforge.serve.launcher import LocalServer

    path = weights_path()
    announce(
        f"No --model/--base-url given: using the embedded tiny policy ({path}) served by "
        "`trajforge serve` on loopback. It is for demos and tests; point --base-url at a real endpoint for data."
    )
    async with LocalServer(path, extra_args=("--served-model-name", EMBEDDED_MODEL_NAME)) as server:
        yield server.openai_base_url, EMBEDDED_MODEL_NAME
