"""``image_generate``: an image from a prompt, saved into the rollout's sandbox.

Providers are a fixed map (:data:`PROVIDERS`), selected by ``tools.image_gen.provider``. The one
shipped speaks the OpenAI images API (``POST {base_url}/images/generations``), which OpenAI and
most self-hosted and hosted image servers implement; an image comes back inline (``b64_json``) or
as a URL the host then fetches (under the same network policy as every host fetch). The file is
written with the sandbox's confined ``write_bytes``, and the model gets its path, to use with its
other tools (``vision_analyze`` included).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trajforge.tools._args import ArgumentError, opt_str, req_str
from trajforge.tools.base import FunctionTool, ToolContext, ToolOutput
from trajforge.tools.images import SUPPORTED, sniff
from trajforge.tools.model_endpoint import check_env_name, check_http_url
from trajforge.tools.vision import UrlFetcher

AspectRatio = Literal["square", "landscape", "portrait"]


def _default_sizes() -> dict[AspectRatio, str]:
    return {"square": "1024x1024", "landscape": "1536x1024", "portrait": "1024x1536"}


class ImageGenConfig(BaseModel):
    """Where ``image_generate`` sends prompts; not offered until ``base_url`` and ``model`` are set."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    provider: Literal["openai"] = Field(
        "openai", description="API spoken: openai = POST {base_url}/images/generations"
    )
    base_url: str | None = Field(None, description="endpoint root, e.g. https://api.openai.com/v1")
    model: str | None = Field(None, description="image model name, e.g. gpt-image-1")
    api_key_env: str | None = Field(None, description="NAME of the env var holding the key")
    sizes: dict[AspectRatio, str] = Field(
        default_factory=_default_sizes,
        description="the size requested for each aspect ratio the model may ask for",
    )
    response_format: Literal["b64_json", "url"] | None = Field(
        "b64_json", description="asked of the provider; None sends none (gpt-image-* always answer b64_json)"
    )
    extra_body: dict[str, Any] = Field(default_factory=dict, description="merged into each request")
    request_timeout_s: float = Field(180.0, gt=0, description="timeout of one generation, s")
    max_retries: int = Field(2, ge=0, description="retries of a transient failure")
    max_image_bytes: int = Field(50_000_000, ge=1, description="largest image saved, bytes")
    output_dir: str = Field("images", description="directory in the sandbox the images go to")

    _url = field_validator("base_url")(staticmethod(lambda v: None if v is None else check_http_url(v)))
    _env = field_validator("api_key_env")(staticmethod(check_env_name))

    @model_validator(mode="after")
    def _paired(self) -> ImageGenConfig:
        if (self.base_url is None) != (self.model is None):
            raise ValueError("tools.image_gen needs both base_url and model (or neither: not offered)")
        if self.output_dir.startswith("/") or ".." in self.output_dir.split("/"):
            raise ValueError("tools.image_gen.output_dir must be a relative path inside the sandbox")
        return self

    @property
    def ready(self) -> bool:
        return self.base_url is not None and self.model is not None


@dataclass(frozen=True)
class GeneratedImage:
    """One image as a provider returned it: the bytes, or a URL to fetch them from."""

    data: bytes | None
    url: str | None
    revised_prompt: str | None


class ImageProvider(Protocol):
    """A backend that turns a prompt into one image. Errors: :class:`ImageGenError`."""

    async def generate(self, prompt: str, size: str) -> GeneratedImage: ...

    async def check(self) -> str: ...


class ImageGenError(Exception):
    """The provider failed; the message (no key in it) goes to the model."""


class OpenAIImages:
    """The OpenAI images API through the openai SDK (its errors and transport)."""

    def __init__(self, config: ImageGenConfig) -> None:
        from trajforge.llm.keys import resolve_api_key

        assert config.base_url is not None and config.model is not None
        self.config = config
        self.model = config.model
        self._key = resolve_api_key(config.api_key_env, config.base_url)

    def _client(self) -> Any:
        import openai

        from trajforge.llm.openai_client import NO_KEY_PLACEHOLDER

        key = self._key.secret.get_secret_value() if self._key.secret else NO_KEY_PLACEHOLDER
        return openai.AsyncOpenAI(
            api_key=key,
            base_url=self.config.base_url,
            timeout=self.config.request_timeout_s,
            max_retries=self.config.max_retries,
        )

    def _error(self, exc: Exception) -> ImageGenError:
        from trajforge.llm.keys import redact

        text = redact(str(exc), self._key.secret)[:500]
        status = getattr(exc, "status_code", None)
        where = f"{self.config.base_url} ({self.model})"
        return ImageGenError(f"{where} answered {status}: {text}" if status else f"{where}: {text}")

    async def generate(self, prompt: str, size: str) -> GeneratedImage:
        import openai

        extra: dict[str, Any] = dict(self.config.extra_body)
        if self.config.response_format is not None:
            extra["response_format"] = self.config.response_format
        async with self._client() as client:
            try:
                result = await client.images.generate(
                    model=self.model, prompt=prompt, n=1, size=size, extra_body=extra
                )
            except openai.OpenAIError as exc:
                raise self._error(exc) from None
        item = (result.data or [None])[0]
        if item is None:
            raise ImageGenError(f"{self.config.base_url} returned no image")
        data = None
        if item.b64_json:
            try:
                data = base64.b64decode(item.b64_json, validate=True)
            except (binascii.Error, ValueError):
                raise ImageGenError(f"{self.config.base_url} returned invalid base64") from None
        if data is None and not item.url:
            raise ImageGenError(f"{self.config.base_url} returned neither b64_json nor url")
        return GeneratedImage(data, item.url, item.revised_prompt)

    async def check(self) -> str:
        """Lists the endpoint's models (no image is generated: that costs money)."""
        import openai

        async with self._client() as client:
            try:
                page = await client.models.list()
            except openai.NotFoundError:
                return f"{self.config.base_url} answers (no /models route)"
            except openai.OpenAIError as exc:
                raise self._error(exc) from None
        ids = [m.id for m in page.data]
        listed = "listed" if self.model in ids else "NOT listed"
        return f"{self.config.base_url} answers; model {self.model!r} {listed}"


PROVIDERS: Mapping[str, type[OpenAIImages]] = {"openai": OpenAIImages}


def image_provider(config: ImageGenConfig) -> ImageProvider:
    return PROVIDERS[config.provider](config)


IMAGE_GEN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "prompt": {"type": "string", "description": "A detailed description of the image."},
        "aspect_ratio": {
            "type": "string",
            "enum": ["square", "landscape", "portrait"],
            "description": "Shape of the image (default square).",
        },
    },
    "required": ["prompt"],
}


def _file_stem(prompt: str, n: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", prompt.lower()).strip("-")[:40].strip("-") or "image"
    return f"{slug}-{n}"


def image_gen_tools(config: ImageGenConfig, fetch: UrlFetcher) -> list[FunctionTool]:
    """``image_generate`` on ``config``'s provider; ``fetch`` gets URL answers from the host."""
    if not config.ready:
        raise ValueError("image_gen needs tools.image_gen.base_url and model")
    provider = image_provider(config)

    async def image_generate(args: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        try:
            prompt = req_str(args, "prompt").strip()
            ratio = opt_str(args, "aspect_ratio", "square") or "square"
        except ArgumentError as exc:
            return ToolOutput.failure(str(exc))
        if not prompt:
            return ToolOutput.failure("argument 'prompt' must not be empty")
        size = config.sizes.get(ratio)  # type: ignore[call-overload]
        if size is None:
            return ToolOutput.failure(f"aspect_ratio must be one of {', '.join(config.sizes)}; got {ratio!r}")
        try:
            image = await provider.generate(prompt, size)
            data = image.data
            if data is None:
                assert image.url is not None
                data = await fetch(image.url, config.max_image_bytes)
        except (ImageGenError, OSError, ValueError) as exc:
            return ToolOutput.failure(f"image generation failed: {exc}")
        if len(data) > config.max_image_bytes:
            return ToolOutput.failure(f"the generated image is larger than {config.max_image_bytes} bytes")
        kind = sniff(data)
        if kind is None:
            return ToolOutput.failure(
                f"the provider returned {len(data)} bytes that are not a {SUPPORTED} image"
            )
        count = ctx.state["images_generated"] = ctx.state.get("images_generated", 0) + 1
        path = f"{config.output_dir.rstrip('/')}/{_file_stem(prompt, count)}.{kind[1]}"
        try:
            await ctx.ready_sandbox.write_bytes(path, data)
        except OSError as exc:
            return ToolOutput.failure(f"could not save the image to {path}: {exc}")
        body: dict[str, Any] = {"path": path, "bytes": len(data), "format": kind[1], "size": size}
        if image.revised_prompt:
            body["revised_prompt"] = image.revised_prompt
        return ToolOutput(content=orjson.dumps(body).decode())

    return [
        FunctionTool(
            name="image_generate",
            toolset="image_gen",
            description="Generate an image from a text prompt. The image is saved in your working "
            "directory and its path returned.",
            parameters=IMAGE_GEN_SCHEMA,
            handler=image_generate,
        )
    ]
