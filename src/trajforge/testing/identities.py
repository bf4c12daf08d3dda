"""What a server says about itself, so the scripted server can pass for another kind (issue 37).

``--endpoint-dialect auto`` (:mod:`trajforge.llm.server_probe`) tells servers apart by what they
answer about themselves: ``owned_by`` in ``/v1/models``, a ``Server`` header, a route only one
kind serves. An :class:`Identity` is that self-description; ``ScriptedServer(identity=...)``
answers with it and behaves as the real server does where a dialect says it differs (a server that
ignores ``stream_options.include_usage``). :data:`IDENTITIES` holds one per dialect, written from
the real servers' answers (llama-server and llama-cpp-python 0.3.36 measured here; vLLM, SGLang
and Ollama from their source).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any


@dataclasses.dataclass(frozen=True)
class Identity:
    """How a server describes itself, and the wire habits that go with it."""

    owned_by: str = "trajforge"
    card: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Extra fields of the ``/v1/models`` card (``max_model_len``, llama-server's ``meta``)."""
    routes: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """GET path -> the JSON it answers (llama-server's ``/props``, vLLM's ``/version``, ...)."""
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Sent with every answer (llama-server's ``Server: llama.cpp``)."""
    stream_usage: bool = True
    """Whether it honours ``stream_options.include_usage`` (llama-cpp-python does not)."""
    models_route: bool = True
    """Whether it serves ``/v1/models`` at all."""


IDENTITIES: Mapping[str, Identity] = MappingProxyType(
    {
        "trajforge": Identity(owned_by="trajforge", card={"max_model_len": 1024}),
        "vllm": Identity(
            owned_by="vllm", card={"max_model_len": 4096}, routes={"/version": {"version": "0.11.0"}}
        ),
        "sglang": Identity(owned_by="sglang", routes={"/get_server_info": {"version": "0.5.0"}}),
        "llamacpp": Identity(
            owned_by="llamacpp",
            card={"meta": {"n_ctx_train": 1024}},
            routes={"/props": {"default_generation_settings": {"n_ctx": 1024}, "build_info": "b0"}},
            headers={"Server": "llama.cpp"},
        ),
        "llamacpp_python": Identity(owned_by="me", stream_usage=False),
        "ollama": Identity(owned_by="library", routes={"/api/version": {"version": "0.12.0"}}),
        "openai": Identity(owned_by="system"),
    }
)
