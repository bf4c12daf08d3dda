"""What every route handler shares: the engine, the encoding tokenizer, the served name, the parser.

The engine decodes in its worker thread with its own tokenizer instance; handlers encode on the
event loop with this one. Fast tokenizers refuse concurrent use of one instance from two threads
("Already borrowed"), so the two never share.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError
from transformers import PreTrainedTokenizerBase

from trajforge.llm.parsers import ToolCallParser
from trajforge.serve.engine import Engine
from trajforge.serve.errors import EngineError
from trajforge.serve.protocol import APIError, validation_error
from trajforge.serve.sampling import SamplingSpec
from trajforge.serve.sequences import SequenceHandle

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class ServerContext:
    engine: Engine
    tokenizer: PreTrainedTokenizerBase
    model_name: str
    parser: ToolCallParser | None
    model_path: Path | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    def check_model(self, requested: str | None) -> None:
        """Any of: nothing, the served name, or the model directory path."""
        if not requested or requested == self.model_name:
            return
        if self.model_path is not None and requested == str(self.model_path):
            return
        raise APIError(
            404,
            f"The model `{requested}` does not exist; this server serves `{self.model_name}` (see /v1/models)",
            param="model",
        )

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)  # type: ignore[return-value]  # str for a flat list of ids

    def token_text(self, token_id: int) -> str:
        """One token's text as OpenAI ``logprobs`` show it (a partial UTF-8 sequence reads as U+FFFD)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)  # type: ignore[return-value]  # str for a flat list of ids

    def max_tokens(self, prompt_len: int, wanted: int | None) -> int:
        return self.engine.resolve_max_tokens(prompt_len, wanted)

    def submit_all(self, prompt_ids: list[int], specs: Sequence[SamplingSpec]) -> list[SequenceHandle]:
        """Submit every sequence of one prompt; if one is refused, the others are cancelled."""
        handles: list[SequenceHandle] = []
        try:
            for spec in specs:
                handles.append(self.engine.submit(prompt_ids, spec))
        except BaseException:
            for h in handles:
                h.cancel()
            raise
        return handles


CTX = web.AppKey("ctx", ServerContext)


async def read_body(request: web.Request, model: type[M]) -> M:
    """The JSON body validated as ``model``; a clear 400 otherwise."""
    raw = await request.read()
    try:
        data: Any = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from exc


def json_ok(body: Any) -> web.Response:
    """JSON via orjson: fast for long id lists, and -inf logprobs become null instead of invalid JSON."""
    return web.Response(body=orjson.dumps(body), content_type="application/json")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@contextlib.asynccontextmanager
async def owned_sequences(handles: list[SequenceHandle]) -> AsyncIterator[list[SequenceHandle]]:
    """Own a request's sequences: an engine failure becomes an OpenAI-shaped 500, and whatever is
    still generating when the request ends (client gone, error, early return) is cancelled."""
    try:
        yield handles
    except EngineError as exc:
        raise APIError(500, str(exc)) from exc
    finally:
        for h in handles:
            h.cancel()  # no-op for finished sequences
