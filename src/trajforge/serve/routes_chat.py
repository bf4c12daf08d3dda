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
        text = ctx.tokenizer.apply_chat_template(
            template_messages(req.messages),
            tools=tools,  # type: ignore[arg-type]  # transformers: list[dict | Callable]
            add_generation_prompt=True,
            tokenize=False,
            **(req.chat_template_kwargs or {}),
        )
    except (TemplateError, TypeError, KeyError, ValueError) as exc:
        raise APIError(
            400, f"the chat template could not render these messages: {exc}", param="messages"
        ) from exc
    if not isinstance(text, str):  # chat_template_kwargs asked for something else (return_dict, ...)
        raise APIError(
            400, "chat_template_kwargs must leave the template's output text", param="chat_template_kwargs"
        )
    return text


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


def _choice(
    ctx: ServerContext,
    req: ChatCompletionRequest,
    index: int,
    result: SequenceResult,
    splitter: OutputSplitter,
) -> dict[str, Any]:
    out = splitter.split(result.text)
    logprobs = None
    if req.logprobs:
        logprobs = {"content": _logprob_entries(ctx, result.token_ids, result.logprobs, result.top_logprobs)}
    choice: dict[str, Any] = {
        "index": index,
        "message": _message(out),
        "logprobs": logprobs,
        "finish_reason": _finish_reason(result, out),
        "stop_reason": result.stop_reason,
    }
    if req.return_token_ids:
        choice["token_ids"] = result.token_ids
    return choice


def _response(
    ctx: ServerContext,
    req: ChatCompletionRequest,
    prompt_ids: list[int],
    results: list[SequenceResult],
    splitter: OutputSplitter,
) -> dict[str, Any]:
    choices = [_choice(ctx, req, i, result, splitter) for i, result in enumerate(results)]
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
    try:
        await _ChatStream(resp, ctx, req, splitter, len(handles)).run(handles, len(prompt_ids))
    except ConnectionResetError:
        log.info("client went away during a chat stream")
    except EngineError as exc:
        await send_error(resp, str(exc))
    return resp


class _ChatStream:
    """One streamed chat answer: each choice's deltas as its text settles, then its calls and end."""

    def __init__(
        self,
        resp: web.StreamResponse,
        ctx: ServerContext,
        req: ChatCompletionRequest,
        splitter: OutputSplitter,
        n: int,
    ) -> None:
        self.resp, self.ctx, self.req, self.splitter = resp, ctx, req, splitter
        self.chunk = _ChunkMaker(ctx)
        self.streams = [StreamSplitter(splitter) for _ in range(n)]
        self.pending: list[list[TokenEvent]] = [[] for _ in range(n)]  # logprobs/ids not yet sent
        self.completion_tokens = 0

    async def run(self, handles: list[SequenceHandle], prompt_tokens: int) -> None:
        for i in range(len(handles)):
            await send(self.resp, self.chunk(i, {"role": "assistant", "content": ""}))
        async for i, item in merged(handles):
            if isinstance(item, TokenEvent):
                await self._token(i, item)
            else:
                await self._end(i, item)
        if self.req.stream_options is not None and self.req.stream_options.include_usage:
            total = usage(prompt_tokens, self.completion_tokens)
            await send(self.resp, {**self.chunk.base, "choices": [], "usage": total})
        await send_done(self.resp)

    async def _token(self, i: int, event: TokenEvent) -> None:
        self.pending[i].append(event)
        reasoning, content = self.streams[i].feed(event.text)
        if reasoning or content or self.req.logprobs or self.req.return_token_ids:
            await self._send_delta(i, reasoning, content)

    async def _end(self, i: int, result: SequenceResult) -> None:
        """The rest of choice ``i``'s text, its tool calls, and its finish chunk."""
        self.completion_tokens += len(result.token_ids)
        out = self.splitter.split(result.text)
        reasoning, content = self.streams[i].finish(out)
        stream = self.streams[i]
        if stream.sent_content != (out.content or "") or stream.sent_reasoning != (out.reasoning or ""):
            log.warning("streamed text diverged from the final split for choice %d", i)
        if reasoning or content or self.pending[i]:
            await self._send_delta(i, reasoning, content)
        await _send_tool_calls(self.resp, self.chunk, i, out)
        end = self.chunk(i, {}, finish_reason=_finish_reason(result, out), stop_reason=result.stop_reason)
        await send(self.resp, end)

    async def _send_delta(self, i: int, reasoning: str, content: str) -> None:
        await send(
            self.resp, _delta_chunk(self.ctx, self.req, self.chunk, i, reasoning, content, self.pending[i])
        )
        self.pending[i] = []


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
