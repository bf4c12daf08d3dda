"""Request bodies the server accepts, and the OpenAI error shape it answers bad ones with.

Validation is pydantic's, so every 400 names the offending field. OpenAI request bodies carry
many fields a local model has no use for (``user``, ``metadata``, ``parallel_tool_calls``...):
chat and completion requests ignore unknown fields like OpenAI does, while sampling settings that
would change the output and that this server does not implement (non-zero penalties, ``min_p``)
are refused instead of silently ignored. vLLM's ``/generate`` body is strict, as vLLM's is.
"""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from trajforge.serve.sampling import SamplingSpec


def error_body(
    message: str, *, type_: str = "invalid_request_error", param: str | None = None, code: Any = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class APIError(Exception):
    """Raised by handlers; the middleware turns it into an OpenAI-shaped JSON error."""

    def __init__(
        self, status: int, message: str, *, type_: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_ or {
            400: "invalid_request_error",
            404: "not_found_error",
            405: "invalid_request_error",
        }.get(status, "server_error")

    def response(self) -> web.Response:
        body = error_body(self.message, type_=self.type, param=self.param, code=self.status)
        return web.json_response(body, status=self.status)


def validation_error(exc: ValidationError) -> APIError:
    """The first problem pydantic found, as one readable 400."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "__root__")
    message = first.get("msg", "invalid request")
    return APIError(400, f"{where}: {message}" if where else message, param=where or None)


class _Sampling(BaseModel):
    """Sampling fields shared by every endpoint (OpenAI names plus vLLM's extensions)."""

    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    n: int = Field(default=1, ge=1, le=64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0

    @model_validator(mode="after")
    def _neutral_penalties(self) -> _Sampling:
        unsupported = [
            name
            for name, neutral in (
                ("presence_penalty", 0.0),
                ("frequency_penalty", 0.0),
                ("repetition_penalty", 1.0),
                ("min_p", 0.0),
            )
            if getattr(self, name) != neutral
        ]
        if unsupported:
            raise ValueError(
                f"{', '.join(unsupported)} not supported by trajforge serve; leave them at their defaults"
            )
        return self

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(s for s in self.stop if s)

    def spec(
        self, *, max_tokens: int, defaults: dict[str, float | int], top_logprobs: int = 0, index: int = 0
    ) -> SamplingSpec:
        """The engine's settings for sequence ``index`` of ``n`` (seeds differ per sequence)."""
        temperature = self.temperature if self.temperature is not None else defaults.get("temperature", 1.0)
        top_p = self.top_p if self.top_p is not None else defaults.get("top_p", 1.0)
        top_k = self.top_k if self.top_k is not None else defaults.get("top_k", 0)
        return SamplingSpec(
            max_tokens=max_tokens,
            temperature=float(temperature),
            top_p=float(top_p),
            top_k=int(top_k),
            stop=self.stops(),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=self.ignore_eos,
            seed=None if self.seed is None else self.seed + index,
            top_logprobs=top_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
        )


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(_Sampling):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    return_token_ids: bool = Field(default=False, description="vLLM: add prompt_token_ids / token_ids")
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("messages")
    @classmethod
    def _roles(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, msg in enumerate(messages):
            if not isinstance(msg.get("role"), str):
                raise ValueError(f"message {i} has no 'role'; every message needs role and content")
        return messages

    @property
    def wanted_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


PromptValue = str | list[int] | list[str] | list[list[int]]


class CompletionRequest(_Sampling):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    prompt: PromptValue
    max_tokens: int | None = Field(default=16, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False
    return_tokens_as_token_ids: bool = Field(
        default=False, description='vLLM: logprobs tokens as "token_id:<id>" (exact, no text round trip)'
    )

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, echo: bool) -> bool:
        if echo:
            raise ValueError("echo is not supported; the prompt ids are returned as prompt_token_ids")
        return echo


class VllmGenerateRequest(_Sampling):
    """vLLM's ``/generate``: ``prompt`` plus ``SamplingParams`` fields at the top level."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | list[int] | dict[str, Any]
    stream: Literal[False] = False
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    model: str | None = None
    detokenize: bool = True

    def prompt_ids_or_text(self) -> list[int] | str:
        p = self.prompt
        if isinstance(p, dict):
            ids, text = p.get("prompt_token_ids"), p.get("prompt")
            if isinstance(ids, list):
                return ids
            if isinstance(text, str):
                return text
            raise ValueError('prompt must be a string, a list of ids, or {"prompt_token_ids": [...]}')
        return p


class SglangSamplingParams(_Sampling):
    model_config = ConfigDict(extra="ignore")

    max_new_tokens: int | None = Field(default=128, ge=1)
    sampling_seed: int | None = None


class SglangGenerateRequest(BaseModel):
    """SGLang's ``/generate``: ``input_ids`` (or ``text``), ``sampling_params``, ``return_logprob``."""

    model_config = ConfigDict(extra="ignore")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SglangSamplingParams = Field(default_factory=SglangSamplingParams)
    return_logprob: bool = False
    logprob_start_len: int = Field(
        default=-1,
        description="with return_logprob: also input_token_logprobs from this prompt index (-1: none)",
    )
    top_logprobs_num: int = Field(default=0, ge=0, le=20)
    return_text_in_logprobs: bool = False
    stream: Literal[False] = False

    @model_validator(mode="after")
    def _one_prompt(self) -> SglangGenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of input_ids or text")
        return self


class LoadWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    # the plugin cannot type __init__ through AliasChoices; requests are validated, never built here
    path: str = Field(  # type: ignore[pydantic-alias]
        min_length=1,
        validation_alias=AliasChoices("path", "model_path"),  # model_path: SGLang's name
        description="checkpoint directory saved with save_pretrained",
    )
