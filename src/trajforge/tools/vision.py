"""``vision_analyze``: a question about an image, answered by an OpenAI-compatible multimodal model.

The image is a URL (fetched by the host, never by the sandbox, and only where the network policy
allows: see :class:`ImageSource`), a ``data:`` URL, or a file in the rollout's sandbox (read with
``read_bytes``, confined to its working directory). Whatever the source, the model endpoint gets
the bytes inline as a ``data:`` URL in an ``image_url`` content part: the endpoint then needs no
route to the image, and a private address never leaks to a hosted provider.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from trajforge.tools._args import ArgumentError, req_str
from trajforge.tools.base import FunctionTool, ToolContext, ToolOutput
from trajforge.tools.images import ImageError, data_url, decode_data_url
from trajforge.tools.model_endpoint import ModelEndpoint, open_chat_client

UrlFetcher = Callable[[str, int], Awaitable[bytes]]
"""``(url, max_bytes) -> body``: the host's fetch of an image URL, under the network policy.
Raises :class:`FetchRefused` (or any ``OSError``/``ValueError``) with a message for the model."""


class FetchRefused(ValueError):
    """A URL the host will not fetch (policy, size, status); the message goes to the model."""


class VisionConfig(BaseModel):
    """The multimodal model ``vision_analyze`` (and ``browser_vision``) asks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: ModelEndpoint | None = Field(
        None, description="the multimodal model; vision is not offered without one"
    )
    max_image_bytes: int = Field(20_000_000, ge=1, description="largest image sent, bytes")
    max_answer_chars: int = Field(20_000, ge=100, description="longest answer returned to the model")

    @property
    def ready(self) -> bool:
        return self.endpoint is not None


VISION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "image_url": {
            "type": "string",
            "description": "The image: an http(s) URL, or the path of an image file in your working "
            "directory (PNG, JPEG, GIF or WEBP).",
        },
        "question": {"type": "string", "description": "What you want to know about the image."},
    },
    "required": ["image_url", "question"],
}


async def image_bytes(source: str, ctx: ToolContext, max_bytes: int, fetch: UrlFetcher) -> bytes:
    """The bytes ``source`` names (URL, data URL or sandbox path), at most ``max_bytes``."""
    lowered = source.lower()
    if lowered.startswith(("http:", "https:")):  # the gate reads it as a browser would
        data = await fetch(source, max_bytes)
    elif lowered.startswith("data:"):
        return decode_data_url(source, max_bytes)
    else:
        path = source.removeprefix("file://")
        data = await ctx.ready_sandbox.read_bytes(path, max_bytes + 1)
    if len(data) > max_bytes:
        raise ImageError(f"{source} is larger than the {max_bytes} bytes allowed")
    return data


async def ask_about_image(endpoint: ModelEndpoint, url: str, question: str) -> str:
    """The model's answer to ``question`` about the image at ``url`` (a data URL).

    Raises :class:`~trajforge.llm.types.ModelError` after the client's retries."""
    from trajforge.llm.types import SamplingParams

    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": question},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]
    sampling = SamplingParams(max_tokens=endpoint.max_tokens, temperature=endpoint.temperature)
    async with open_chat_client(endpoint) as client:
        turn = await client.complete(messages, None, sampling)
    return (turn.content or "").strip()


def _source_error(source: str, exc: Exception) -> ToolOutput:
    if isinstance(exc, PermissionError):
        return ToolOutput.failure(f"permission denied: {source} (only your working directory is readable)")
    if isinstance(exc, FileNotFoundError):
        return ToolOutput.failure(f"no such file: {source}")
    if isinstance(exc, IsADirectoryError):
        return ToolOutput.failure(f"{source} is a directory, not an image")
    return ToolOutput.failure(f"cannot read the image {source}: {exc}")


def vision_tools(config: VisionConfig, fetch: UrlFetcher) -> list[FunctionTool]:
    """``vision_analyze`` on ``config``'s endpoint; ``fetch`` gets URLs from the host."""
    endpoint = config.endpoint
    if endpoint is None:
        raise ValueError("vision needs tools.vision.endpoint (an OpenAI-compatible multimodal model)")

    async def vision_analyze(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        try:
            source = req_str(args, "image_url").strip()
            question = req_str(args, "question").strip()
        except ArgumentError as exc:
            return ToolOutput.failure(str(exc))
        if not source or not question:
            return ToolOutput.failure("arguments 'image_url' and 'question' must not be empty")
        try:
            url = data_url(await image_bytes(source, ctx, config.max_image_bytes, fetch), source)
        except (OSError, ValueError) as exc:  # ImageError and FetchRefused are ValueErrors
            return _source_error(source, exc)
        from trajforge.llm.keys import MissingApiKeyError
        from trajforge.llm.types import ModelError

        try:
            answer = await ask_about_image(endpoint, url, question)
        except (ModelError, MissingApiKeyError) as exc:
            return ToolOutput.failure(f"the vision model failed: {exc}")
        if not answer:
            return ToolOutput.failure("the vision model returned an empty answer")
        body = {"image": source, "analysis": answer[: config.max_answer_chars]}
        return ToolOutput(content=orjson.dumps(body).decode())

    return [
        FunctionTool(
            name="vision_analyze",
            toolset="vision",
            description="Answer a question about an image (a URL or an image file in your working "
            "directory) with a vision model: describe it, read its text, find details.",
            parameters=VISION_SCHEMA,
            handler=vision_analyze,
        )
    ]
