"""A scripted token-level completion server on loopback: vLLM, SGLang and OpenAI wire formats.

Token-exact clients must be tested against real HTTP and *real token ids*: this server takes a
script of completion texts (or explicit ids), encodes each with the real tokenizer, and returns
those ids with deterministic fake logprobs, so a test knows exactly which id was "sampled" at
which position and can check masks and logprob alignment to the token. With a ``sampler``
(e.g. :class:`TorchSampler` over a tiny transformers model) it samples for real instead.

Routes (one server speaks all three; ``/generate`` tells vLLM from SGLang by the body):

- ``POST /generate`` vLLM-style: ``{"prompt": {"prompt_token_ids": [...]}, "logprobs": 0,
  "max_tokens", ...}`` -> ``{"text": [..], "prompt", "finish_reasons": [..], "logprobs":
  [[[{"<id>": lp}], ...]], "prompt_token_ids", "token_ids": [[...]]}`` (the shape of Atropos'
  vLLM api_server, which the reference used).
- ``POST /generate`` SGLang: ``{"input_ids": [...], "sampling_params": {...}, "return_logprob":
  true}`` -> ``{"text", "output_ids", "meta_info": {"finish_reason": {"type": ..},
  "prompt_tokens", "completion_tokens", "output_token_logprobs": [[lp, id, null], ...]}}``.
- ``POST /v1/completions`` OpenAI legacy completions with ``prompt`` as ids and ``logprobs``;
  with vLLM's ``return_tokens_as_token_ids`` the tokens come back as ``"token_id:<id>"``.

Usage::

    async with TokenServer(tokenizer, ["<think>\\nok\\n</think>\\n\\nHello"]) as srv:
        model = CompletionChatModel(CompletionModelConfig(tokenizer_path=..., base_url=srv.base_url))
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web


@dataclass(frozen=True)
class ScriptedReply:
    """One scripted completion.

    ``text`` is encoded with the tokenizer; ``ids`` (when given) are returned verbatim instead,
    e.g. a non-canonical split of a word, to prove a client never re-tokenizes. The end-of-turn
    id is appended when ``end_turn`` (what a model does when it stops naturally).
    """

    text: str = ""
    ids: Sequence[int] | None = None
    end_turn: bool = True
    finish_reason: str = "stop"


@dataclass(frozen=True)
class HTTPFailure:
    """Answer one request with this status instead of consuming a reply."""

    status: int = 500
    body: str = "scripted failure"


ScriptItem = str | ScriptedReply | HTTPFailure


@dataclass
class Served:
    """What one successful request got: the prompt it sent and what was 'sampled'."""

    route: str
    body: dict[str, Any]
    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    finish_reason: str


class Sampler(Protocol):
    """Real sampling: ``(prompt_ids, max_tokens, temperature, seed) -> (ids, logprobs, finish)``."""

    def __call__(
        self, prompt_ids: list[int], max_tokens: int, temperature: float, seed: int | None
    ) -> tuple[list[int], list[float], str]: ...


def fake_logprob(call_index: int, position: int) -> float:
    """Deterministic, distinct per call and position, so misalignment is visible."""
    return -round(call_index + 0.01 * (position + 1), 6)


@dataclass
class TokenServer:
    """The server; ``served`` and ``requests`` record what happened, for assertions."""

    tokenizer: Any
    script: Iterable[ScriptItem] = ()
    sampler: Sampler | None = None
    end_of_turn: str | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    served: list[Served] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queue: list[ScriptItem] = list(self.script)
        marker = self.end_of_turn or self.tokenizer.eos_token
        self._eot_id: int = self.tokenizer.convert_tokens_to_ids(marker)
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    def push(self, *items: ScriptItem) -> None:
        self._queue.extend(items)

    async def __aenter__(self) -> TokenServer:
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- routes ------------------------------------------------------------------------------

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"route": "/generate", **body})
        if "input_ids" in body:
            params = body.get("sampling_params") or {}
            got = await self._sample(
                "sglang", body, list(body["input_ids"]), params.get("max_new_tokens"), params
            )
            return got if isinstance(got, web.Response) else web.json_response(self._sglang(got, body))
        prompt = body.get("prompt")
        if not isinstance(prompt, dict) or "prompt_token_ids" not in prompt:
            return web.json_response({"error": "expected prompt.prompt_token_ids or input_ids"}, status=400)
        got = await self._sample("vllm", body, list(prompt["prompt_token_ids"]), body.get("max_tokens"), body)
        return got if isinstance(got, web.Response) else web.json_response(self._vllm(got, body))

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append({"route": "/v1/completions", **body})
        prompt = body.get("prompt")
        if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
            return web.json_response(
                {"error": {"message": "this server wants prompt as token ids"}}, status=400
            )
        got = await self._sample("openai", body, prompt, body.get("max_tokens"), body)
        return got if isinstance(got, web.Response) else web.json_response(self._openai(got, body))

    # -- sampling ----------------------------------------------------------------------------

    async def _sample(
        self,
        route: str,
        body: dict[str, Any],
        prompt_ids: list[int],
        max_tokens: int | None,
        params: dict[str, Any],
    ) -> Served | web.Response:
        limit = int(max_tokens) if max_tokens is not None else 16
        if self.sampler is not None:
            ids, logprobs, finish = await asyncio.to_thread(
                self.sampler, prompt_ids, limit, float(params.get("temperature") or 1.0), params.get("seed")
            )
        else:
            scripted = self._next_scripted(limit)
            if isinstance(scripted, web.Response):
                return scripted
            ids, logprobs, finish = scripted
        served = Served(route, body, prompt_ids, ids, logprobs, finish)
        self.served.append(served)
        return served

    def _next_scripted(self, limit: int) -> tuple[list[int], list[float], str] | web.Response:
        """The next scripted reply as (ids, logprobs, finish reason), cut at ``limit``; or its error."""
        if not self._queue:
            return web.json_response(
                {"error": f"scripted token server: script exhausted after {len(self.served)} replies"},
                status=400,
            )
        item = self._queue.pop(0)
        if isinstance(item, HTTPFailure):
            return web.json_response({"error": item.body}, status=item.status)
        reply = ScriptedReply(item) if isinstance(item, str) else item
        ids = list(reply.ids) if reply.ids is not None else self._encode(reply.text)
        if reply.end_turn:
            ids.append(self._eot_id)
        finish = reply.finish_reason
        if len(ids) > limit:
            ids, finish = ids[:limit], "length"
        return ids, [fake_logprob(len(self.served), i) for i in range(len(ids))], finish

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _decode(self, ids: list[int]) -> str:
        text: str = self.tokenizer.decode(ids, skip_special_tokens=False)
        return text

    # -- wire formats ------------------------------------------------------------------------

    def _vllm(self, s: Served, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "text": [self._decode(s.ids)],
            "prompt": self._decode(s.prompt_ids),
            "finish_reasons": [s.finish_reason],
        }
        if body.get("logprobs") is not None:
            out["logprobs"] = [[[{str(t): lp}] for t, lp in zip(s.ids, s.logprobs, strict=True)]]
            out["prompt_token_ids"] = s.prompt_ids
            out["token_ids"] = [s.ids]
        return out

    def _sglang(self, s: Served, body: dict[str, Any]) -> dict[str, Any]:
        finish: dict[str, Any] = {"type": s.finish_reason}
        if s.finish_reason == "stop" and s.ids:
            finish["matched"] = s.ids[-1]
        meta: dict[str, Any] = {
            "id": f"req-{len(self.served)}",
            "finish_reason": finish,
            "prompt_tokens": len(s.prompt_ids),
            "completion_tokens": len(s.ids),
            "cached_tokens": 0,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for t, lp in zip(s.ids, s.logprobs, strict=True)]
        return {"text": self._decode(s.ids), "output_ids": s.ids, "meta_info": meta}

    def _openai(self, s: Served, body: dict[str, Any]) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "text": self._decode(s.ids), "finish_reason": s.finish_reason}
        if body.get("logprobs") is not None:
            as_ids = bool(body.get("return_tokens_as_token_ids"))
            choice["logprobs"] = {
                "tokens": [f"token_id:{t}" if as_ids else self._decode([t]) for t in s.ids],
                "token_logprobs": s.logprobs,
                "top_logprobs": None,
                "text_offset": None,
            }
        return {
            "id": f"cmpl-{len(self.served)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model", "scripted"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(s.prompt_ids),
                "completion_tokens": len(s.ids),
                "total_tokens": len(s.prompt_ids) + len(s.ids),
            },
        }


class TorchSampler:
    """Real sampling from a (tiny) transformers causal LM, with the true logprob of each id.

    Runs on CPU in a worker thread (the server calls it via ``asyncio.to_thread``). Stops at
    ``stop_ids`` or ``max_tokens``; ``temperature <= 0`` is greedy.
    """

    def __init__(self, model: Any, stop_ids: Iterable[int]) -> None:
        self.model = model
        self.stop_ids = frozenset(stop_ids)

    def __call__(
        self, prompt_ids: list[int], max_tokens: int, temperature: float, seed: int | None
    ) -> tuple[list[int], list[float], str]:
        import torch

        gen = torch.Generator().manual_seed(seed if seed is not None else 0)
        ids, logprobs = list(prompt_ids), []
        with torch.no_grad():
            for _ in range(max_tokens):
                logits = self.model(torch.tensor([ids])).logits[0, -1].float()
                scaled = logits / temperature if temperature > 0 else logits
                logp = torch.log_softmax(scaled, dim=-1)
                if temperature > 0:
                    nxt = int(torch.multinomial(logp.exp(), 1, generator=gen))
                else:
                    nxt = int(torch.argmax(logp))
                ids.append(nxt)
                logprobs.append(float(logp[nxt]))
                if nxt in self.stop_ids:
                    return ids[len(prompt_ids) :], logprobs, "stop"
        return ids[len(prompt_ids) :], logprobs, "length"
