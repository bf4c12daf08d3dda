"""The models tools talk to (vision, mixture of agents): where they live and the one client builder.

Tools sit below :mod:`trajforge.endpoint` (which picks the *policy's* endpoint for a command), so
they cannot use its builder; :func:`chat_client` is the one place a tool's chat client is built,
on the same :class:`~trajforge.llm.openai_client.OpenAIChatModel` (same retries, error mapping and
key handling) as the policy's. Keys come from the environment variable a config names, never
from the config itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:  # the openai SDK loads when a tool first calls a model, not at CLI start-up
    from trajforge.llm.openai_client import OpenAIChatModel


def check_http_url(value: str, what: str = "base_url") -> str:
    """An ``http(s)://host/...`` URL without its trailing slash, or a ValueError saying so."""
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"{what} must be an http(s) URL like https://host/v1, got {value!r}")
    return value.rstrip("/")


def check_env_name(value: str | None) -> str | None:
    """The NAME of an environment variable (a key pasted here instead is refused)."""
    if value is not None and not value.isidentifier():
        raise ValueError(
            "api_key_env takes the NAME of an environment variable (e.g. OPENAI_API_KEY), not a key"
        )
    return value


class ModelEndpoint(BaseModel):
    """One model on one OpenAI-compatible chat endpoint, as a tool uses it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(description="OpenAI-compatible endpoint root, e.g. http://host:8000/v1")
    model: str = Field(min_length=1, description="model name sent in every request")
    api_key_env: str | None = Field(
        None,
        description="NAME of the env var holding the key (default: OPENAI_API_KEY or "
        "OPENROUTER_API_KEY when set, as for the policy; local servers need none)",
    )
    request_timeout_s: float = Field(120.0, gt=0, description="timeout of one request, s")
    max_retries: int = Field(2, ge=0, description="retries of a transient failure")
    max_tokens: int | None = Field(None, ge=1, description="max tokens of an answer")
    temperature: float | None = Field(None, ge=0, description="sampling temperature")

    _url = field_validator("base_url")(staticmethod(check_http_url))
    _env = field_validator("api_key_env")(staticmethod(check_env_name))

    @property
    def label(self) -> str:
        """How results and errors name this model (no key, ever)."""
        return f"{self.model}@{self.base_url}"


def chat_client(endpoint: ModelEndpoint) -> OpenAIChatModel:
    """A client for ``endpoint``; raises ``MissingApiKeyError`` when its named key variable is unset.

    Only :func:`open_chat_client` calls this outside the tests: a client belongs to one event
    loop, and a tool call is the one place that knows which loop it runs on.
    """
    from trajforge.llm.openai_client import OpenAIChatModel, OpenAIModelConfig

    return OpenAIChatModel(
        OpenAIModelConfig(
            base_url=endpoint.base_url,
            model=endpoint.model,
            api_key_env=endpoint.api_key_env,
            request_timeout_s=endpoint.request_timeout_s,
            max_retries=endpoint.max_retries,
            backoff_base_s=0.5,
            max_concurrency=64,
        )
    )


@contextlib.asynccontextmanager
async def open_chat_client(endpoint: ModelEndpoint) -> AsyncIterator[OpenAIChatModel]:
    """A client for the length of one tool call, closed after it.

    Why per call: tools are built once per process but called from whatever event loop runs the
    rollout (a worker's, a test's); a client's connection pool is bound to the loop that opened
    it. A vision or MoA call takes seconds, so one connection set-up per call is noise.
    """
    client = chat_client(endpoint)
    try:
        yield client
    finally:
        await client.aclose()
