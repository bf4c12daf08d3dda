"""Which model a command talks to: a given OpenAI-compatible endpoint, or the embedded default.

One place decides it for every command (``run``, ``batch`` and its workers and preflight): the
pairing rule (``--model`` and ``--base-url`` together, or neither for the embedded policy), the
one builder of the endpoint client, and the embedded default itself -- ``trajforge serve`` with
the committed tiny policy on a free loopback port, reached over the same HTTP path as any other
endpoint, so the default is not a special case anywhere below. It sits above ``llm/`` (which
knows clients, not where models live) and ``serve/`` (which it launches).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from trajforge.extras import missing_ml
from trajforge.llm.dialects import DialectChoice
from trajforge.llm.parsers import ParserName

if TYPE_CHECKING:  # the client (and the openai SDK) load when one is built, not at CLI start-up
    from trajforge.llm.openai_client import OpenAIChatModel
    from trajforge.protocols import ChatModel

CompletionEndpoint = Literal["auto", "openai_completions", "vllm_generate", "sglang_generate"]

EMBEDDED_MODEL_NAME = "trajforge-tiny"
# Package data of ``trajforge.models.tiny`` (its recipe writes them), located without importing it.
_EMBEDDED_WEIGHTS = Path(__file__).resolve().parent / "models" / "tiny" / "weights"
_RECIPE_WEIGHTS = _EMBEDDED_WEIGHTS.parent / "recipe"


class MissingExtraError(ValueError):
    """The embedded policy cannot be served here: the ``ml`` extra is not installed."""


class EndpointConfig(BaseModel):
    """Where the model lives and how hard to use it. ``api_key_env`` names an environment
    variable; keys never travel in argv or configs."""

    model_config = ConfigDict(allow_inf_nan=False)  # rates and timeouts are finite numbers

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
    backoff_base_s: float = Field(1.0, gt=0, description="first retry pause (doubles, with jitter)")
    tokenizer: str | None = Field(
        None,
        description="token level: a LOCAL tokenizer directory (the model's chat template); requests go "
        "to a completions/generate endpoint as token ids and records carry exact tokens, masks and "
        "logprobs. 'auto' with the embedded policy: its own tokenizer",
    )
    completion_endpoint: CompletionEndpoint = Field(
        "auto",
        description="with tokenizer: which completion API the endpoint speaks (auto: its dialect's)",
    )
    tool_call_parser: ParserName = Field(
        "auto",
        description="tool-call format of the model's text (trajforge.llm.parsers; auto: detect it): parsed "
        "by the token-level client, and on the chat path from calls the endpoint returned as text (auto: "
        "where the dialect says the server may not parse them itself; none: never)",
    )
    endpoint_dialect: DialectChoice = Field(
        "auto",
        description="which server the endpoint is (llm/dialects.py: openai, vllm, sglang, llamacpp, "
        "llamacpp_python, ollama, openrouter, trajforge); auto: probe what it says about itself",
    )

    @property
    def embedded(self) -> bool:
        return self.model is None and self.base_url is None


def pairing_problem(model: str | None, base_url: str | None) -> str | None:
    """Why a ``--model``/``--base-url`` pair cannot be used, or None. The same rule everywhere."""
    if base_url is not None and model is None:
        return "--base-url needs --model (the model name the endpoint serves)"
    if model is not None and base_url is None:
        return (
            "--model needs --base-url (an OpenAI-compatible endpoint); omit both to use the embedded policy"
        )
    return None


def build_chat_model(cfg: EndpointConfig) -> OpenAIChatModel:
    """The endpoint client: the one place one is built from an :class:`EndpointConfig`."""
    from trajforge.llm.openai_client import OpenAIChatModel, OpenAIModelConfig

    problem = pairing_problem(cfg.model, cfg.base_url)
    if problem or cfg.model is None or cfg.base_url is None:
        raise ValueError(
            problem or "the embedded policy has no endpoint until it is served (open_chat_model)"
        )
    return OpenAIChatModel(
        OpenAIModelConfig(
            base_url=cfg.base_url,
            model=cfg.model,
            api_key_env=cfg.api_key_env,
            stream=cfg.stream,
            max_concurrency=cfg.max_concurrency,
            requests_per_second=cfg.requests_per_second,
            request_timeout_s=cfg.request_timeout_s,
            max_retries=cfg.max_retries,
            backoff_base_s=cfg.backoff_base_s,
            endpoint_dialect=cfg.endpoint_dialect,
            tool_call_parser=cfg.tool_call_parser,
        )
    )


def build_token_model(cfg: EndpointConfig) -> ChatModel:
    """The token-level client (``cfg.tokenizer`` set): exact tokens, masks and logprobs."""
    from trajforge.llm.completion_model import CompletionChatModel, CompletionModelConfig

    if cfg.tokenizer is None or cfg.base_url is None:
        raise ValueError("a token-level endpoint needs --tokenizer DIR and --base-url")
    if not Path(cfg.tokenizer).is_dir():
        raise ValueError(f"--tokenizer {cfg.tokenizer} is not a local directory with the model's tokenizer")
    return CompletionChatModel(
        CompletionModelConfig(
            max_context_tokens=_context_length(Path(cfg.tokenizer)),
            tokenizer_path=cfg.tokenizer,
            base_url=cfg.base_url,
            endpoint=cfg.completion_endpoint,
            endpoint_dialect=cfg.endpoint_dialect,
            model=cfg.model,
            parser=cfg.tool_call_parser,
            api_key_env=cfg.api_key_env,
            request_timeout_s=cfg.request_timeout_s,
            max_retries=cfg.max_retries,
            backoff_base_s=cfg.backoff_base_s,
            max_concurrency=cfg.max_concurrency,
        )
    )


def _context_length(model_dir: Path) -> int | None:
    """The context length a model directory's config.json states (so a call's max_tokens is
    cut to what fits instead of being refused by the server), or None."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) and value > 0 else None


@contextlib.asynccontextmanager
async def open_chat_model(
    cfg: EndpointConfig, *, announce: Callable[[str], None] = lambda _msg: None
) -> AsyncIterator[ChatModel]:
    """Yield a ready client (token-level when ``cfg.tokenizer`` is set); for the embedded
    default, also run (and finally stop) its server."""
    problem = pairing_problem(cfg.model, cfg.base_url)
    if problem:
        raise ValueError(problem)
    if cfg.tokenizer == "auto" and not cfg.embedded:
        raise ValueError("--tokenizer auto means the embedded policy's own; give a directory for --base-url")
    async with contextlib.AsyncExitStack() as stack:
        if cfg.embedded:
            base_url, name = await stack.enter_async_context(embedded_endpoint(announce=announce))
            update: dict[str, object] = {"base_url": base_url, "model": name}
            if cfg.tokenizer == "auto":
                update["tokenizer"] = str(embedded_weights())
            cfg = cfg.model_copy(update=update)
        model = build_token_model(cfg) if cfg.tokenizer else build_chat_model(cfg)
        try:
            yield model
        finally:
            await model.aclose()


async def preflight_model(model: ChatModel, announce: Callable[[str], None] = lambda _msg: None) -> None:
    """Prove the endpoint answers (and, token level, samples from token ids) before any sample, and
    say which server it is and in which dialect it is spoken to (``--endpoint-dialect``). A model
    without a preflight (an in-process one) has nothing to prove. Raises what the check raised."""
    from trajforge.protocols import SupportsPreflight

    if not isinstance(model, SupportsPreflight):
        return
    await model.check()
    summary = getattr(model, "endpoint_summary", None)
    if isinstance(summary, str):
        announce(summary)


def embedded_weights() -> Path:
    """Directory of the committed policy (config.json, model.safetensors, tokenizer, template).

    Raises ``FileNotFoundError`` saying how to build it when the weights are missing (for example
    in a source checkout where they were deleted).
    """
    if (
        not (_EMBEDDED_WEIGHTS / "config.json").is_file()
        or not (_EMBEDDED_WEIGHTS / "model.safetensors").is_file()
    ):
        raise FileNotFoundError(
            f"the embedded tiny policy is missing from {_EMBEDDED_WEIGHTS}; rebuild it with "
            f"`trajforge model build-tiny --model-path {_EMBEDDED_WEIGHTS}`"
        )
    return _EMBEDDED_WEIGHTS


def recipe_weights() -> Path:
    """Directory of the recipe's weights (``trajforge model build-tiny``'s output, before RL): the
    closed loop's starting point (``trajforge rl demo``), not the default policy."""
    if not (_RECIPE_WEIGHTS / "model.safetensors").is_file():
        raise FileNotFoundError(
            f"the recipe's tiny policy is missing from {_RECIPE_WEIGHTS}; rebuild it with "
            f"`trajforge model build-tiny --model-path {_RECIPE_WEIGHTS}`"
        )
    return _RECIPE_WEIGHTS


@contextlib.asynccontextmanager
async def embedded_endpoint(
    *, announce: Callable[[str], None] = lambda _msg: None
) -> AsyncIterator[tuple[str, str]]:
    """Serve the embedded tiny policy on a free loopback port; yields ``(base_url, model_name)``."""
    from trajforge.serve.launcher import LocalServer

    problem = missing_ml("the embedded default policy (no --model/--base-url)")
    if problem:
        raise MissingExtraError(problem)
    path = embedded_weights()
    announce(
        f"No --model/--base-url given: using the embedded tiny policy ({path}) served by "
        "`trajforge serve` on loopback. It is for demos and tests; point --base-url at a real endpoint for data."
    )
    async with LocalServer(path, extra_args=("--served-model-name", EMBEDDED_MODEL_NAME)) as server:
        yield server.openai_base_url, EMBEDDED_MODEL_NAME
