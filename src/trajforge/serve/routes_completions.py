"""``POST /v1/completions``: text or token-id prompts, legacy logprobs, and the sampled ids.

Token ids come back two ways, both vLLM's: every choice carries ``prompt_token_ids`` and
``token_ids`` (vLLM's ``return_token_ids`` output, always on here), and with
``return_tokens_as_token_ids`` the ``logprobs.tokens`` read ``"token_id:<id>"`` instead of text
that would have to be re-tokenized.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web

from trajforge.serve.context import CTX, ServerContext, json_ok, new_id, owned_sequences, read_body, usage
from trajforge.serve.errors import EngineError
from trajforge.serve.protocol import APIError, CompletionRequest
from trajforge.serve.sequences import SequenceHandle, SequenceResult, TokenEvent
from trajforge.serve.sse import merged, open_stream, send, send_done, send_error

log = logging.getLogger(__name__)


def prompt_list(ctx: ServerContext, prompt: Any) -> list[list[int]]:
    """OpenAI's four prompt forms (text, ids, list of texts, list of id lists) as id lists."""
    if isinstance(prompt, str):
        return [ctx.encode(prompt, add_special_tokens=True)]
    if not prompt:
        raise APIError(400, "prompt is empty", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    if all(isinstance(p, str) for p in prompt):
        return [ctx.encode(p, add_special_tokens=True) for p in prompt]
    return [list(p) for p in prompt]


class _Logprobs:
    """Legacy ``logprobs`` objects (tokens, token_logprobs, top_logprobs, text_offset)."""

    def __init__(self, ctx: ServerContext, as_ids: bool) -> None:
        self.ctx, self.as_ids = ctx, as_ids

    def token(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_ids else self.ctx.token_text(token_id)

    def build(self, ids: list[int], lps: list[float], tops: list[Any], offset: int = 0) -> dict[str, Any]:
        tokens = [self.token(t) for t in ids]
        top_logprobs = []
        for t, lp, top in zip(ids, lps, tops, strict=True):
            entry = {self.token(t): lp}  # the sampled token first (clients read the first entry)
            for i, v in top:
                entry.setdefault(self.token(i), v)
            top_logprobs.append(entry)
        offsets = []
        for tok in tokens:
            offsets.append(offset)
            offset += 0 if self.as_ids else len(tok)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": top_logprobs, "text_offset": offsets}


async def completions(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CTX]
    req = await read_body(request, CompletionRequest)
    ctx.check_model(req.model)
    prompts = [ctx.engine.check_prompt(p) for p in prompt_list(ctx, req.prompt)]
    async with owned_sequences([]) as handles:
        owners = _submit(ctx, req, prompts, handles)
        if req.stream:
            return await _stream(request, ctx, req, handles, _prompt_tokens(prompts, owners, req.n))
        results = await asyncio.gather(*(h.result() for h in handles))
    return json_ok(_response(ctx, req, _prompt_tokens(prompts, owners, req.n), results))


def _submit(
    ctx: ServerContext, req: CompletionRequest, prompts: list[list[int]], handles: list[SequenceHandle]
) -> list[int]:
    """Submit ``req.n`` sequences per prompt, adding them to ``handles``; the prompt index of each."""
    owners: list[int] = []
    for p_idx, ids in enumerate(prompts):
        max_tokens = ctx.max_tokens(len(ids), req.max_tokens)
        specs = [
            req.spec(
                max_tokens=max_tokens,
                defaults=ctx.engine.sampling_defaults,
                top_logprobs=req.logprobs or 0,
                index=j,
            )
            for j in range(req.n)
        ]
        handles.extend(ctx.submit_all(ids, specs))
        owners += [p_idx] * req.n
    return owners


def _prompt_tokens(prompts: list[list[int]], owners: list[int], n: int) -> int:
    """Prompt tokens counted once per prompt, not once per sequence."""
    return sum(len(prompts[o]) for o in owners[::n])


def _response(
    ctx: ServerContext, req: CompletionRequest, prompt_tokens: int, results: list[SequenceResult]
) -> dict[str, Any]:
    lp = _Logprobs(ctx, req.return_tokens_as_token_ids)
    return {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": ctx.model_name,
        "choices": [_choice(i, r, req, lp) for i, r in enumerate(results)],
        "usage": usage(prompt_tokens, sum(len(r.token_ids) for r in results)),
        "model_version": results[0].model_version if results else ctx.engine.version,
    }


def _choice(index: int, result: SequenceResult, req: CompletionRequest, lp: _Logprobs) -> dict[str, Any]:
    return {
        "index": index,
        "text": result.text,
        "logprobs": lp.build(result.token_ids, result.logprobs, result.top_logprobs)
        if req.logprobs is not None
        else None,
        "finish_reason": result.finish_reason,
        "stop_reason": result.stop_reason,
        "prompt_token_ids": result.prompt_ids,
        "token_ids": result.token_ids,
    }


async def _stream(
    request: web.Request,
    ctx: ServerContext,
    req: CompletionRequest,
    handles: list[SequenceHandle],
    prompt_tokens: int,
) -> web.StreamResponse:
    resp = await open_stream(request)
    try:
        await _CompletionStream(resp, ctx, req, len(handles)).run(handles, prompt_tokens)
    except ConnectionResetError:
        log.info("client went away during a completion stream")
    except EngineError as exc:
        await send_error(resp, str(exc))
    return resp


class _CompletionStream:
    """One streamed completion: a chunk per token of each choice, then its finish chunk."""

    def __init__(self, resp: web.StreamResponse, ctx: ServerContext, req: CompletionRequest, n: int) -> None:
        self.resp, self.req = resp, req
        self.lp = _Logprobs(ctx, req.return_tokens_as_token_ids)
        self.base = {
            "id": new_id("cmpl"),
            "object": "text_completion",
            "created": int(time.time()),
            "model": ctx.model_name,
        }
        self.offsets = [0] * n
        self.completion_tokens = 0

    async def run(self, handles: list[SequenceHandle], prompt_tokens: int) -> None:
        async for i, item in merged(handles):
            if isinstance(item, TokenEvent):
                await send(self.resp, self._chunk(i, item.text, [item]))
                self.offsets[i] += len(item.text)
                continue
            self.completion_tokens += len(item.token_ids)
            end = self._chunk(i, "", [], finish_reason=item.finish_reason, stop_reason=item.stop_reason)
            await send(self.resp, end)
        if self.req.stream_options is not None and self.req.stream_options.include_usage:
            total = usage(prompt_tokens, self.completion_tokens)
            await send(self.resp, {**self.base, "choices": [], "usage": total})
        await send_done(self.resp)

    def _chunk(self, i: int, text: str, events: list[TokenEvent], **extra: Any) -> dict[str, Any]:
        logprobs = None
        if self.req.logprobs is not None and events:
            ids = [e.token_id for e in events]
            logprobs = self.lp.build(
                ids, [e.logprob for e in events], [e.top for e in events], self.offsets[i]
            )
        choice = {"index": i, "text": text, "logprobs": logprobs, "finish_reason": None, **extra}
        choice["token_ids"] = [e.token_id for e in events]
        return {**self.base, "choices": [choice]}
