"""Wire formats of the three raw completion endpoints the token-exact client speaks.

OpenAI ``/v1/completions`` (prompt as ids; vLLM's ``return_tokens_as_token_ids``, llama-server's
``logprobs.content[{id, logprob}]``), vLLM-style
``/generate`` (``prompt_token_ids``) and SGLang ``/generate`` (``input_ids``) all take a prompt
as token ids and give back sampled ids with one logprob each, but spell request and response
differently. This module is only that spelling -- pure functions, no I/O -- so each format can
be read and tested on its own, apart from :mod:`trajforge.llm.completion_model`'s HTTP, retries
and conversation memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from trajforge.llm.types import SamplingParams

EndpointKind = Literal["openai_completions", "vllm_generate", "sglang_generate"]

_TOKEN_ID_PREFIX = "token_id:"


def endpoint_path(kind: EndpointKind) -> str:
    """The route ``kind`` is served on, below the server root."""
    return "/v1/completions" if kind == "openai_completions" else "/generate"


@dataclass(frozen=True, slots=True)
class Sampled:
    """What an endpoint sampled: ids, one logprob per id, and why it stopped."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    version: int | None = None
    """The server's weight version that sampled them, when it says."""


class BadResponse(Exception):
    """A 200 response we cannot use; ``permanent`` when the server is misconfigured (no retry helps)."""

    def __init__(self, reason: str, *, permanent: bool = False) -> None:
        super().__init__(reason)
        self.permanent = permanent


def build_body(
    kind: EndpointKind, prompt_ids: list[int], sampling: SamplingParams, max_tokens: int, model: str
) -> dict[str, Any]:
    """The request body for one endpoint kind (``sampling.extra_body`` merged last)."""
    common: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "stop": sampling.stop,
        "seed": sampling.seed,
    }
    if kind == "vllm_generate":
        body = _vllm_body(prompt_ids, common, max_tokens)
    elif kind == "sglang_generate":
        body = _sglang_body(prompt_ids, common, max_tokens)
    else:
        body = _openai_body(prompt_ids, common, max_tokens, model)
    body = {k: v for k, v in body.items() if v is not None}
    return {**body, **sampling.extra_body}


def _vllm_body(prompt_ids: list[int], common: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    return {"prompt": {"prompt_token_ids": prompt_ids}, "logprobs": 0, "max_tokens": max_tokens, **common}


def _sglang_body(prompt_ids: list[int], common: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """SGLang nests sampling under ``sampling_params`` and calls the seed ``sampling_seed``."""
    params = {**common, "max_new_tokens": max_tokens, "sampling_seed": common["seed"]}
    params.pop("seed")
    return {
        "input_ids": prompt_ids,
        "sampling_params": {k: v for k, v in params.items() if v is not None},
        "return_logprob": True,
    }


def _openai_body(
    prompt_ids: list[int], common: dict[str, Any], max_tokens: int, model: str
) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
        **common,
    }


def parse_response(kind: EndpointKind, data: Any) -> Sampled:
    """Sampled ids, logprobs and finish reason from a 200 response of ``kind``."""
    try:
        if kind == "vllm_generate":
            return _parse_vllm(data)
        if kind == "sglang_generate":
            return _parse_sglang(data[0] if isinstance(data, list) else data)
        return _parse_openai(data)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise BadResponse(f"unexpected {kind} response shape ({type(exc).__name__}: {exc})") from None


def _parse_vllm(data: Mapping[str, Any]) -> Sampled:
    if "token_ids" not in data or "logprobs" not in data:
        raise BadResponse(
            "the /generate response has no token_ids/logprobs: the server must be a vLLM api_server "
            "that returns them when 'logprobs' is set (e.g. Atropos' example_trainer/vllm_api_server.py)",
            permanent=True,
        )
    ids = [int(t) for t in data["token_ids"][0]]
    logprobs = []
    for tid, step in zip(ids, data["logprobs"][0], strict=True):
        entry = step[0] if isinstance(step, list) else step
        value = entry.get(str(tid), entry.get(tid)) if isinstance(entry, Mapping) else None
        if value is None:
            raise BadResponse(f"no logprob for sampled token {tid}", permanent=True)
        logprobs.append(float(value["logprob"] if isinstance(value, Mapping) else value))
    reasons = data.get("finish_reasons") or [None]
    return Sampled(ids, logprobs, reasons[0], _version(data.get("model_version")))


def _parse_sglang(data: Mapping[str, Any]) -> Sampled:
    meta = data["meta_info"]
    triples = meta.get("output_token_logprobs")
    if triples is None:
        raise BadResponse("the SGLang response has no meta_info.output_token_logprobs", permanent=True)
    ids = [int(t[1]) for t in triples]
    if "output_ids" in data and [int(t) for t in data["output_ids"]] != ids:
        raise BadResponse("SGLang output_ids disagree with output_token_logprobs", permanent=True)
    finish = meta.get("finish_reason")
    reason = finish.get("type") if isinstance(finish, Mapping) else finish
    return Sampled(ids, [float(t[0]) for t in triples], reason, _version(meta.get("weight_version")))


def _parse_openai(data: Mapping[str, Any]) -> Sampled:
    choice = data["choices"][0]
    lp = choice.get("logprobs") or {}
    if isinstance(lp.get("content"), list):  # llama-server: logprobs.content[{id, token, logprob}]
        return _parse_llamacpp(choice, lp["content"], data)
    logprobs = lp.get("token_logprobs")
    if logprobs is None:
        raise BadResponse(
            "the /v1/completions response has no logprobs.token_logprobs (nor llama-server's logprobs.content)",
            permanent=True,
        )
    if choice.get("token_ids") is not None:
        ids = [int(t) for t in choice["token_ids"]]
    else:
        tokens = lp.get("tokens") or []
        if not all(isinstance(t, str) and t.startswith(_TOKEN_ID_PREFIX) for t in tokens):
            raise BadResponse(
                "the /v1/completions response gives tokens as text, not ids: use a vLLM server "
                "(it honours return_tokens_as_token_ids) or the vllm_generate endpoint",
                permanent=True,
            )
        ids = [int(t[len(_TOKEN_ID_PREFIX) :]) for t in tokens]
    if len(ids) != len(logprobs):
        raise BadResponse(f"{len(ids)} token ids but {len(logprobs)} logprobs", permanent=True)
    return Sampled(
        ids, [float(x) for x in logprobs], choice.get("finish_reason"), _version(data.get("model_version"))
    )


def _parse_llamacpp(choice: Mapping[str, Any], entries: list[Any], data: Mapping[str, Any]) -> Sampled:
    """llama-server's ``/v1/completions``: one ``{id, token, bytes, logprob, top_logprobs}`` per token."""
    if any("logprob" not in e or "id" not in e for e in entries):
        raise BadResponse(
            "logprobs.content entries without id/logprob (post_sampling_probs set?)", permanent=True
        )
    ids = [int(e["id"]) for e in entries]
    return Sampled(
        ids,
        [float(e["logprob"]) for e in entries],
        choice.get("finish_reason"),
        _version(data.get("model_version")),
    )


def _version(raw: Any) -> int | None:
    """A weight version as an int (SGLang sends a string), or None when absent or not a number."""
    try:
        return None if raw is None or isinstance(raw, bool) else int(raw)
    except (TypeError, ValueError):
        return None


def openai_finish_reason(raw: str | None) -> str | None:
    """``stop``/``length`` as OpenAI spells them; anything else passes through."""
    if raw in ("eos", "stop_token", "stop_str"):
        return "stop"
    return raw
