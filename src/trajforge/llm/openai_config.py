"""How to reach one model on one OpenAI-compatible endpoint: :class:`OpenAIModelConfig`.

Its own module because both the client (:mod:`trajforge.llm.openai_client`) and the wire
encoding (:mod:`trajforge.llm.chat_wire`, which spells the request the config asks for) read it.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trajforge.llm.dialects import Dialect, DialectChoice, ReasoningStyle
from trajforge.llm.parsers import ParserName
from trajforge.llm.retry import BackoffBase, BackoffMax, MaxRetries, MaxRetryAfter

__all__ = ["OpenAIModelConfig", "ReasoningStyle"]


class OpenAIModelConfig(BaseModel):
    """How to reach one model on one OpenAI-compatible endpoint.

    The API key itself is never part of the config (configs get logged and saved): only the
    *name* of the environment variable holding it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    base_url: str = Field(description="endpoint root, e.g. https://openrouter.ai/api/v1")
    model: str = Field(description="model name sent in every request")
    api_key_env: str | None = Field(
        default=None,
        description="env var holding the key; None tries OPENAI_API_KEY then OPENROUTER_API_KEY",
    )
    stream: bool = Field(default=False, description="use SSE streaming (same AssistantTurn either way)")
    request_timeout_s: float = Field(default=600.0, gt=0, description="read timeout of one attempt")
    connect_timeout_s: float = Field(default=10.0, gt=0, description="TCP/TLS connect timeout")
    max_retries: MaxRetries = 5
    backoff_base_s: BackoffBase = 1.0
    backoff_max_s: BackoffMax = 60.0
    max_retry_after_s: MaxRetryAfter = 300.0
    max_concurrency: int = Field(default=256, ge=1, description="requests in flight through this client")
    requests_per_second: float | None = Field(default=None, gt=0, description="request start rate limit")
    reasoning_style: ReasoningStyle = Field(
        default="auto",
        description="how reasoning_effort/reasoning_disabled go on the wire: openai (top-level "
        "reasoning_effort), openrouter (reasoning: {...}), chat_template (vLLM/SGLang "
        "chat_template_kwargs), none; auto: the endpoint dialect's",
    )
    endpoint_dialect: DialectChoice = Field(
        default="auto",
        description="which server this is (trajforge.llm.dialects: openai, vllm, sglang, llamacpp, "
        "llamacpp_python, ollama, openrouter, trajforge); auto: probe what the server says about itself",
    )
    tool_call_parser: ParserName = Field(
        default="auto",
        description="tool calls the endpoint returned as text are parsed with this family "
        "(trajforge.llm.parsers) and run; auto: detect the family, only where the dialect says the "
        "server may not parse calls itself; none: never",
    )
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = Field(
        default="max_tokens", description="OpenAI's reasoning models want max_completion_tokens"
    )
    stream_include_usage: bool = Field(default=True, description="ask for a usage chunk when streaming")
    extra_headers: dict[str, str] = Field(default_factory=dict, description="sent with every request")
    check_timeout_s: float = Field(default=15.0, gt=0, description="timeout of the check() preflight")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parsed = urlparse(value)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"base_url must be an http(s) URL like https://host/v1, got {value!r}")
        return value.rstrip("/")

    def resolved_reasoning_style(self, dialect: Dialect | None = None) -> ReasoningStyle:
        """The configured style, else the dialect's (without one: openrouter for openrouter.ai, else openai)."""
        if self.reasoning_style != "auto":
            return self.reasoning_style
        if dialect is not None:
            return dialect.reasoning_style
        host = urlparse(self.base_url).hostname or ""
        return "openrouter" if host.endswith("openrouter.ai") else "openai"
