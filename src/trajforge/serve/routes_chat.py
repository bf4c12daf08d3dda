"""``POST /v1/chat/completions``: template -> engine -> reasoning / content / tool calls, JSON or SSE.

Extra fields beside OpenAI's: ``message.reasoning_content`` (the think block), ``message.parse_errors``
(tool calls the parser could not read, one line each with the offending text), ``stop_reason`` and
``model_version`` (which weights produced the answer), and with ``return_token_ids`` (vLLM's
flag) ``prompt_token_ids`` / ``choices[].token_ids``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web
from jinja2 import TemplateError

from trajforge.serve.chat import (
    ChatOutput,
    OutputSplitter,
    StreamSplitter,
    prompt_opens_reasoning,
    template_messages,
)
from trajforge.serve.context import CTX, ServerContext, json_ok, new_id, owned_sequences, read_body, usage
from trajforge.serve.errors import EngineError
from trajforge.serve.protocol import APIError, ChatCompletionRequest
from trajforge.serve.sequences import SequenceHandle, SequenceResult, TokenEvent
from trajforge.serve.sse import merged, open_stream, send, send_done, send_error

log = logging.getLogger(__name__)


def _render(ctx: ServerContext, req: ChatCompletionRequest, tools: list[dict[str, Any]] | None) -> str:
    if not getattr(ctx.tokenizer, "chat_template", None):
        raise APIError(
            400, "this model's tokenizer has no chat template; use /v1/completions with a raw prompt"
        )
    try:
        return ctx.tokenizer.apply_chat_template(
            template_messages(req.messages),
            tools=tools,
            add_generation_prompt=True,
            tokenize=False,
            **(req.chat_template_kwargs or {}),
        )
    except (TemplateError, TypeError, KeyError, ValueError) as exc:
        raise APIError(
            400, f"the chat template could not render these messages: {exc}", param="messages"
        ) from exc


def _logprob_entries(
    ctx: ServerContext, ids: list[int], lps: list[float], tops: list[Any]
) -> list[dict[str, Any]]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = ctx.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return [
        {**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]}
        for t, lp, top in zip(ids, lps, tops, strict=True)
    ]


def _message(out: ChatOutput) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": out.content}
    if out.reasoning is not None:
        msg["reasoning_content"] = out.reasoning
    if out.tool_calls:
        msg["tool_calls"] = [tc.to_openai() for tc in out.tool_calls]
    if out.parse_errors:
        msg["parse_errors"] = out.parse_errors
    return msg


def _finish_reason(result: SequenceResult, out: ChatOutput) -> str:
    return "tool_calls" if out.tool_calls else result.finish_reason


async def chat_completions(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CTX]
    req = await read_body(request, ChatCompletionRequest)
    ctx.check_model(req.model)
    tools = req.tools if req.tools and req.tool_choice != "none" else None
    prompt_text = _render(ctx, req, tools)
    prompt_ids = ctx.encode(prompt_text, add_special_tokens=False)
    max_tokens = ctx.max_tokens(len(prompt_ids), req.wanted_max_tokens)
    top = (req.top_logprobs or 0) if req.logprobs else 0
    defaults = ctx.engine.sampling_defaults
    specs = [
        req.spec(max_tokens=max_tokens, defaults=defaults, top_logprobs=top, index=i) for i in range(req.n)
    ]
    splitter = OutputSplitter(ctx.parser if tools else None, tools, prompt_opens_reasoning(prompt_text))
    async with owned_sequences(ctx.submit_all(prompt_ids, specs)) as handles:
        if req.stream:
            return await _stream(request, ctx, req, handles, splitter, prompt_ids)
        results = await asyncio.gather(*(h.result() for h in handles))
    return json_ok(_response(ctx, req, prompt_ids, results, splitter))


def _response(
    ctx: ServerContext,
    req: ChatCompletionRequest,
    prompt_ids: list[int],
    results: list[SequenceResult],
    splitter: OutputSplitter,
) -> dict[str, Any]:
    choices = []
    for i, result in enumerate(results):
        out = splitter.split(result.text)
        choice: dict[str, Any] = {
            "index": i,
            "message": _message(out),
            "logprobs": {
                "content": _logprob_entries(ctx, result.token_ids, result.logprobs, result.top_logprobs)
            }
            if req.logprobs
            else None,
            "finish_reason": _finish_reason(result, out),
            "stop_reason": result.stop_reason,
        }
        if req.return_token_ids:
            choice["token_ids"] = result.token_ids
        choices.append(choice)
    body: dict[str, Any] = {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": ctx.model_name,
        "choices": choices,
        "usage": usage(len(prompt_ids), sum(len(r.token_ids) for r in results)),
        "model_version": results[0].model_version if results else ctx.engine.version,
    }
    if req.return_token_ids:
        body["prompt_token_ids"] = prompt_ids
    return body


class _ChunkMaker:
    """Builds ``chat.completion.chunk`` payloads that share one id and timestamp."""

    def __init__(self, ctx: ServerContext) -> None:
        self.base = {
            "id": new_id("chatcmpl"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": ctx.model_name,
        }

    def __call__(self, index: int, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None, **extra}
        return {**self.base, "choices": [choice]}


async def _stream(
    request: web.Request,
    ctx: ServerContext,
    req: ChatCompletionRequest,
    handles: list[SequenceHandle],
    splitter: OutputSplitter,
    prompt_ids: list[int],
) -> web.StreamResponse:
    resp = await open_stream(request)
    chunk = _ChunkMaker(ctx)
    streams = [StreamSplitter(splitter) for _ in handles]
    pending: list[list[TokenEvent]] = [[] for _ in handles]  # logprobs/ids not yet sent
    completion_tokens = 0
    try:
        for i in range(len(handles)):
            await send(resp, chunk(i, {"role": "assistant", "content": ""}))
        async for i, item in merged(handles):
            if isinstance(item, TokenEvent):
                pending[i].append(item)
                reasoning, content = streams[i].feed(item.text)
                if reasoning or content or req.logprobs or req.return_token_ids:
                    await send(resp, _delta_chunk(ctx, req, chunk, i, reasoning, content, pending[i]))
                    pending[i] = []
                continue
            completion_tokens += len(item.token_ids)
            out = splitter.split(item.text)
            reasoning, content = streams[i].finish(out)
            if streams[i].sent_content != (out.content or "") or streams[i].sent_reasoning != (
                out.reasoning or ""
            ):
                log.warning("streamed text diverged from the final split for choice %d", i)
            if reasoning or content or pending[i]:
                await send(resp, _delta_chunk(ctx, req, chunk, i, reasoning, content, pending[i]))
                pending[i] = []
            await _send_tool_calls(resp, chunk, i, out)
            await send(
                resp, chunk(i, {}, finish_reason=_finish_reason(item, out), stop_reason=item.stop_reason)
            )
        if req.stream_options is not None and req.stream_options.include_usage:
            await send(
                resp, {**chunk.base, "choices": [], "usage": usage(len(prompt_ids), completion_tokens)}
            )
        await send_done(resp)
    except ConnectionResetError:
        log.info("client went away during a chat stream")
    except EngineError as exc:
        await send_error(resp, str(exc))
    return resp


def _delta_chunk(
    ctx: ServerContext,
    req: ChatCompletionRequest,
    chunk: _ChunkMaker,
    i: int,
    reasoning: str,
    content: str,
    events: list[TokenEvent],
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if reasoning:
        delta["reasoning_content"] = reasoning
    if content:
        delta["content"] = content
    extra: dict[str, Any] = {}
    if req.return_token_ids:
        extra["token_ids"] = [e.token_id for e in events]
    payload = chunk(i, delta, **extra)
    if req.logprobs:
        entries = _logprob_entries(
            ctx, [e.token_id for e in events], [e.logprob for e in events], [e.top for e in events]
        )
        payload["choices"][0]["logprobs"] = {"content": entries}
    return payload


async def _send_tool_calls(resp: web.StreamResponse, chunk: _ChunkMaker, i: int, out: ChatOutput) -> None:
    """Each call as OpenAI streams them: id + name first, then the arguments."""
    for k, call in enumerate(out.tool_calls):
        head = {
            "index": k,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        await send(resp, chunk(i, {"tool_calls": [head]}))
        await send(resp, chunk(i, {"tool_calls": [{"index": k, "function": {"arguments": call.arguments}}]}))
    if out.parse_errors:
        await send(resp, chunk(i, {"parse_errors": out.parse_errors}))
