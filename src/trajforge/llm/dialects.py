"""What differs between the inference servers trajforge talks to, in one table.

Every OpenAI-compatible server speaks the same chat-completions wire, but not the same dialect of
it. Measured against llama.cpp (issue 37): llama-server reads a past turn's reasoning only under
``reasoning_content`` (trajforge sent ``reasoning``: earlier turns lost their ``<think>``);
llama-cpp-python's server returns well-formed Hermes calls as plain content and takes no token-id
prompts; llama-server returns completion logprobs as ``logprobs.content[{id, logprob}]``; a server
may ignore ``stream_options.include_usage``. A :class:`Dialect` names each such difference once, and
the clients read it instead of testing for servers here and there: adding a server is one entry in
:data:`DIALECTS` (and a test), not edits across the client.

``--endpoint-dialect auto`` picks the entry from what the server says about itself
(:mod:`trajforge.llm.server_probe`); an explicit name skips the probe.

What is read back is not dialect-dependent: reasoning is read from ``reasoning_content``,
``reasoning``, ``reasoning_details`` or inline ``<think>`` whatever the server
(:func:`trajforge.messages.reasoning_from_fields`), completion logprobs in every shape the
token-exact client knows (:mod:`trajforge.llm.completion_wire`). A dialect decides what we *send*
and what we *expect*.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from trajforge.llm.completion_wire import EndpointKind

ReasoningStyle = Literal["auto", "openai", "openrouter", "chat_template", "none"]
"""How ``reasoning_effort`` / ``reasoning_disabled`` go on the wire (``auto``: the dialect's)."""

ReasoningField = Literal["reasoning", "reasoning_content", "content"]
"""Where a past assistant turn's reasoning travels back to the server: a field of the message, or
``content`` (inline, as ``<think>...</think>`` before the text, for a server that drops fields it
does not know)."""

DialectName = Literal[
    "openai", "openrouter", "vllm", "sglang", "llamacpp", "llamacpp_python", "ollama", "trajforge"
]
DIALECT_CHOICES: tuple[str, ...] = ("auto", *DialectName.__args__)  # type: ignore[attr-defined]
"""What ``--endpoint-dialect`` accepts: ``auto`` (probe the server) or a name of :data:`DIALECTS`."""


class Dialect(BaseModel):
    """How one kind of server wants to be spoken to. Frozen: one shared instance per name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    server: str = Field(description="what it is, as people call it (printed at preflight)")
    reasoning_field: ReasoningField = Field(
        description="the field a past assistant turn's reasoning is sent back under (the other is "
        "renamed); content: inline as <think>...</think> before the text"
    )
    null_content: bool = Field(
        default=True,
        description="takes content: null on an assistant turn that only calls tools (else sent as '')",
    )
    reasoning_style: Literal["openai", "openrouter", "chat_template", "none"] = Field(
        description="how reasoning_effort / reasoning_disabled are asked for"
    )
    parses_tool_calls: bool = Field(
        description="the server always parses the model's calls into tool_calls itself; where it may "
        "not (a vLLM without --enable-auto-tool-choice, llama-cpp-python), --tool-call-parser auto "
        "recovers calls it returned as text"
    )
    stream_usage: bool = Field(
        description="honours stream_options.include_usage (a usage chunk at the end of a stream)"
    )
    token_endpoint: EndpointKind | None = Field(
        description="the token-id completion API it serves (--tokenizer); None: it takes no token-id "
        "prompts, and the token-exact client refuses it at preflight"
    )
    unsupported_sampling: frozenset[str] = Field(
        default=frozenset(), description="request fields it rejects: left out of every request"
    )
    sampling_defaults: Mapping[str, Any] = Field(
        default_factory=dict,
        description="sent with every request unless the request sets them: where the server's own "
        "defaults truncate the model's distribution (llama.cpp's top_k 40, top_p 0.95, min_p 0.05; "
        "llama-cpp-python's repeat_penalty 1.1 too), the model's own distribution is asked for, as "
        "the other servers sample by default and the token-exact logprobs assume",
    )


def _d(**fields: object) -> Dialect:
    return Dialect.model_validate(fields)


_UNTRUNCATED = MappingProxyType({"top_k": 0, "top_p": 1.0, "min_p": 0.0})
"""llama.cpp's samplers off (0 / 1.0 / 0.0 disable them): the distribution the model computes."""


DIALECTS: MappingProxyType[str, Dialect] = MappingProxyType(
    {
        # The fallback for a server that says nothing about itself: OpenAI's own API and anything
        # that copies it. Calls it returned as text are recovered (it may be anything).
        "openai": _d(
            name="openai",
            server="an OpenAI-compatible endpoint",
            reasoning_field="reasoning",
            reasoning_style="openai",
            parses_tool_calls=False,
            stream_usage=True,
            token_endpoint="openai_completions",
        ),
        "openrouter": _d(
            name="openrouter",
            server="OpenRouter",
            reasoning_field="reasoning",
            reasoning_style="openrouter",
            parses_tool_calls=True,
            stream_usage=True,
            token_endpoint=None,
        ),
        # vllm serve: /v1/completions takes token ids and returns them with return_tokens_as_token_ids.
        "vllm": _d(
            name="vllm",
            server="vLLM",
            reasoning_field="reasoning_content",
            reasoning_style="chat_template",
            parses_tool_calls=False,
            stream_usage=True,
            token_endpoint="openai_completions",
        ),
        "sglang": _d(
            name="sglang",
            server="SGLang",
            reasoning_field="reasoning_content",
            reasoning_style="chat_template",
            parses_tool_calls=False,
            stream_usage=True,
            token_endpoint="sglang_generate",
        ),
        # llama.cpp's llama-server: reads reasoning_content only (common/chat.cpp), parses calls only
        # with --jinja and a template it recognises, /v1/completions takes token ids and answers
        # logprobs.content[{id, logprob}].
        "llamacpp": _d(
            name="llamacpp",
            server="llama.cpp (llama-server)",
            reasoning_field="reasoning_content",
            reasoning_style="chat_template",
            parses_tool_calls=False,
            stream_usage=True,
            token_endpoint="openai_completions",
            sampling_defaults=_UNTRUNCATED,
        ),
        # llama-cpp-python's server (python -m llama_cpp.server): no parser for Hermes calls; its
        # request types drop every message field but content/tool_calls and want content a string;
        # its /v1/completions validates the prompt as text (a token-id list is HTTP 500).
        "llamacpp_python": _d(
            name="llamacpp_python",
            server="llama-cpp-python (python -m llama_cpp.server)",
            reasoning_field="content",
            null_content=False,
            reasoning_style="none",
            parses_tool_calls=False,
            stream_usage=False,
            token_endpoint=None,
            sampling_defaults={**_UNTRUNCATED, "repeat_penalty": 1.0},
        ),
        # Ollama's OpenAI-compatible /v1: reasoning as `reasoning`; no token-id prompts.
        "ollama": _d(
            name="ollama",
            server="Ollama",
            reasoning_field="reasoning",
            reasoning_style="openai",
            parses_tool_calls=False,
            stream_usage=True,
            token_endpoint=None,
        ),
        # trajforge serve: parses calls with its --tool-call-parser, reads both reasoning fields.
        "trajforge": _d(
            name="trajforge",
            server="trajforge serve",
            reasoning_field="reasoning",
            reasoning_style="chat_template",
            parses_tool_calls=True,
            stream_usage=True,
            token_endpoint="vllm_generate",
        ),
    }
)


def get_dialect(name: str) -> Dialect:
    """The dialect called ``name``; ``ValueError`` listing the names for anything else."""
    dialect = DIALECTS.get(name)
    if dialect is None:
        raise ValueError(f"unknown endpoint dialect {name!r}; choose one of: {', '.join(DIALECT_CHOICES)}")
    return dialect


def check_dialect_name(value: str) -> str:
    """``value`` when ``--endpoint-dialect`` accepts it (``auto`` or a name), else ``ValueError``."""
    if value not in DIALECT_CHOICES:
        raise ValueError(f"unknown endpoint dialect {value!r}; choose one of: {', '.join(DIALECT_CHOICES)}")
    return value


DialectChoice = Annotated[str, AfterValidator(check_dialect_name)]
"""A config field naming a dialect (or ``auto``), checked as ``--endpoint-dialect`` is."""
