"""Server-sent events, and reading several sequences' events as they come.

A client that disconnects mid-stream is normal: writing then raises ``ConnectionResetError``, and
the route stops its sequences (the engine frees their rows at the next step).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
from aiohttp import web

from trajforge.serve.protocol import error_body
from trajforge.serve.sequences import SequenceHandle, SequenceResult, TokenEvent


async def open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive"}
    )
    await resp.prepare(request)
    return resp


async def send(resp: web.StreamResponse, payload: dict[str, Any]) -> None:
    await resp.write(b"data: " + orjson.dumps(payload) + b"\n\n")


async def send_done(resp: web.StreamResponse) -> None:
    await resp.write(b"data: [DONE]\n\n")


async def send_error(resp: web.StreamResponse, message: str) -> None:
    """End a stream whose headers already went out (200) with an OpenAI-shaped error event."""
    await send(resp, error_body(message, type_="server_error", code=500))
    await send_done(resp)


async def merged(
    handles: Sequence[SequenceHandle],
) -> AsyncIterator[tuple[int, TokenEvent | SequenceResult]]:
    """``(index, event)`` pairs from all handles in arrival order; each ends with its result.

    One waiting ``next_event`` task per live sequence; they are all cancelled on the way out
    (cancelling a queue ``get`` loses no event).
    """
    pending: dict[asyncio.Task[TokenEvent | SequenceResult], int] = {
        asyncio.create_task(h.next_event()): i for i, h in enumerate(handles)
    }
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: pending[t]):
                i = pending.pop(task)
                item = task.result()
                if not isinstance(item, SequenceResult):
                    pending[asyncio.create_task(handles[i].next_event())] = i
                yield i, item
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
