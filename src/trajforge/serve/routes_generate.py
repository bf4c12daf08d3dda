"""``POST /generate`` in both token-level dialects RL stacks speak.

- **vLLM** (``{"prompt": {"prompt_token_ids": [...]}, "logprobs": 0, "max_tokens": ..}``, the body
  Atropos' ``VLLMServer`` sends): answers ``{"text": [..], "prompt": str, "finish_reasons": [..],
  "logprobs": [[[{"<id>": lp}] per token] per sequence], "prompt_token_ids": [..],
  "token_ids": [[..]]}`` -- the shape of vLLM's own api_server with logprobs.
- **SGLang** (``{"input_ids": [...], "sampling_params": {..}, "return_logprob": true}``): answers
  ``{"text", "output_ids", "meta_info": {"prompt_tokens", "completion_tokens", "finish_reason":
  {"type", "matched"}, "output_token_logprobs": [[lp, id, text|None], ..], "weight_version"}}``;
  a list of those when several prompts or ``n > 1`` were asked for.

The dialect is told by the body: ``input_ids``/``text``/``sampling_params`` mean SGLang.
Logprobs are the raw model distribution's (see :mod:`trajforge.serve.sampling`), like both
engines' defaults; every answer also says which weights version produced it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any, cast

from aiohttp import web

from trajforge.serve.context import CTX, ServerContext, json_ok, read_body
from trajforge.serve.errors import EngineError
from trajforge.serve.protocol import (
    APIError,
    SglangGenerateRequest,
    SglangSamplingParams,
    VllmGenerateRequest,
)
from trajforge.serve.sequences import SequenceHandle, SequenceResult

_SGLANG_KEYS = frozenset({"input_ids", "text", "sampling_params", "return_logprob"})


async def generate(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CTX]
    try:
        peek = await request.json()
    except ValueError:
        peek = None
    if isinstance(peek, dict) and _SGLANG_KEYS & peek.keys() and "prompt" not in peek:
        return await _sglang(request, ctx)
    return await _vllm(request, ctx)


async def _results(handles: list[SequenceHandle]) -> list[SequenceResult]:
    try:
        return list(await asyncio.gather(*(h.result() for h in handles)))
    except EngineError as exc:
        raise APIError(500, str(exc)) from exc
    finally:
        for h in handles:
            h.cancel()


async def _vllm(request: web.Request, ctx: ServerContext) -> web.Response:
    req = await read_body(request, VllmGenerateRequest)
    ctx.check_model(req.model)
    ids, prompt_text = _vllm_prompt(ctx, req)
    max_tokens = ctx.max_tokens(len(ids), req.max_tokens)
    top = req.logprobs or 0
    specs = [
        req.spec(max_tokens=max_tokens, defaults=ctx.engine.sampling_defaults, top_logprobs=top, index=j)
        for j in range(req.n)
    ]
    results = await _results(ctx.submit_all(ids, specs))
    return json_ok(_vllm_body(req, ids, prompt_text, results))


def _vllm_prompt(ctx: ServerContext, req: VllmGenerateRequest) -> tuple[list[int], str]:
    """The prompt's token ids (checked) and its text, whichever of the two the request gave."""
    try:
        prompt = req.prompt_ids_or_text()
    except ValueError as exc:
        raise APIError(400, str(exc), param="prompt") from exc
    if isinstance(prompt, str):
        return ctx.engine.check_prompt(ctx.encode(prompt, add_special_tokens=True)), prompt
    ids = ctx.engine.check_prompt(prompt)
    return ids, ctx.decode(ids, skip_special_tokens=False)


def _vllm_body(
    req: VllmGenerateRequest, ids: list[int], prompt_text: str, results: list[SequenceResult]
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "text": [r.text for r in results],
        "prompt": prompt_text,
        "finish_reasons": [r.finish_reason for r in results],
        "stop_reasons": [r.stop_reason for r in results],
        "prompt_token_ids": ids,
        "token_ids": [r.token_ids for r in results],
        "model_version": results[0].model_version,
    }
    if req.logprobs is not None:
        body["logprobs"] = [_vllm_logprobs(r) for r in results]
    return body


def _vllm_logprobs(result: SequenceResult) -> list[list[dict[str, float]]]:
    """Per token ``[{"<sampled id>": lp, "<top id>": lp, ...}]``: the sampled token comes first."""
    out = []
    for t, lp, top in zip(result.token_ids, result.logprobs, result.top_logprobs, strict=True):
        entry = {str(t): lp}
        for i, v in top:
            entry.setdefault(str(i), v)
        out.append([entry])
    return out


async def _sglang(request: web.Request, ctx: ServerContext) -> web.Response:
    req = await read_body(request, SglangGenerateRequest)
    prompts, single = _sglang_prompts(ctx, req)
    sp = req.sampling_params
    if sp.seed is None and sp.sampling_seed is not None:
        sp = sp.model_copy(update={"seed": sp.sampling_seed})
    results = await _results(_submit_sglang(ctx, req, sp, prompts))
    items = [_sglang_item(ctx, req, r) for r in results]
    return json_ok(items[0] if single and sp.n == 1 else items)


def _sglang_prompts(ctx: ServerContext, req: SglangGenerateRequest) -> tuple[list[list[int]], bool]:
    """The prompts as id lists, and whether the request gave a single one (then one answer, not a list)."""
    if req.input_ids is not None:
        if not req.input_ids or isinstance(req.input_ids[0], int):
            return [cast(list[int], list(req.input_ids))], True  # validated: all ints, or all lists
        return [list(p) for p in req.input_ids if isinstance(p, list)], False
    texts = [req.text] if isinstance(req.text, str) else list(req.text or [])
    return [ctx.encode(t, add_special_tokens=True) for t in texts], isinstance(req.text, str)


def _submit_sglang(
    ctx: ServerContext, req: SglangGenerateRequest, sp: SglangSamplingParams, prompts: list[list[int]]
) -> list[SequenceHandle]:
    """``sp.n`` sequences per prompt; if one is refused, those already submitted are cancelled."""
    handles: list[SequenceHandle] = []
    try:
        for raw in prompts:
            ids = ctx.engine.check_prompt(raw)
            max_tokens = ctx.max_tokens(len(ids), sp.max_new_tokens)
            defaults = ctx.engine.sampling_defaults
            specs = [
                dataclasses.replace(
                    sp.spec(
                        max_tokens=max_tokens, defaults=defaults, top_logprobs=req.top_logprobs_num, index=j
                    ),
                    prompt_logprobs=req.return_logprob and req.logprob_start_len >= 0,
                )
                for j in range(sp.n)
            ]
            handles += ctx.submit_all(ids, specs)
    except BaseException:
        for h in handles:
            h.cancel()
        raise
    return handles


def _sglang_item(ctx: ServerContext, req: SglangGenerateRequest, result: SequenceResult) -> dict[str, Any]:
    def text_of(token_id: int) -> str | None:
        return ctx.token_text(token_id) if req.return_text_in_logprobs else None

    matched: Any = result.stop_reason
    if result.finish_reason == "stop" and matched is None and result.token_ids:
        matched = result.token_ids[-1]  # SGLang reports the EOS id it stopped on
    finish: dict[str, Any] = {"type": result.finish_reason, "matched": matched}
    if result.finish_reason == "length":
        finish = {"type": "length", "length": len(result.token_ids)}
    meta: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "prompt_tokens": len(result.prompt_ids),
        "completion_tokens": len(result.token_ids),
        "finish_reason": finish,
        "weight_version": str(result.model_version),
    }
    if req.return_logprob:
        meta["output_token_logprobs"] = [
            [lp, t, text_of(t)] for t, lp in zip(result.token_ids, result.logprobs, strict=True)
        ]
        if result.prompt_logprobs is not None:  # SGLang: [logprob | None, id, text] per prompt token
            start = max(0, req.logprob_start_len)
            meta["input_token_logprobs"] = [
                [lp, t, text_of(t)]
                for lp, t in zip(result.prompt_logprobs[start:], result.prompt_ids[start:], strict=True)
            ]
        if req.top_logprobs_num:
            meta["output_top_logprobs"] = [
                [[v, i, text_of(i)] for i, v in top] for top in result.top_logprobs
            ]
    return {"text": result.text, "output_ids": result.token_ids, "meta_info": meta}
