"""A scripted OpenAI images endpoint on loopback: ``POST /v1/images/generations``.

Why: ``image_generate`` must be tested against the real wire format (the openai SDK's request,
``b64_json`` or ``url`` answers, OpenAI-shaped errors), not a mock. Requests are validated as the
real API does (``prompt`` required, ``n`` 1..10, ``size`` ``WxH``, ``response_format`` url or
b64_json), so a client bug fails here first.

Each answer is a real PNG (a small solid square whose colour derives from the prompt: the same
prompt gives the same bytes), built with the standard library. ``url`` answers point back at this
server (``GET /images/<id>.png``).

Usage::

    async with ScriptedImageServer() as srv:
        ... base_url=srv.base_url ...          # ends in /v1
        srv.requests                           # every generation request body
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
import time
import zlib
from typing import Any

import orjson
from aiohttp import web

from trajforge.testing.wire import error_body

_SIZE = re.compile(r"\d{2,5}x\d{2,5}|auto")


def solid_png(rgb: tuple[int, int, int], side: int = 8) -> bytes:
    """A valid ``side``x``side`` RGB PNG of one colour (stdlib only)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" + bytes(rgb) * side
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * side))
        + chunk(b"IEND", b"")
    )


def prompt_png(prompt: str) -> bytes:
    """The PNG this server answers ``prompt`` with."""
    digest = hashlib.sha256(prompt.encode()).digest()
    return solid_png((digest[0], digest[1], digest[2]))


def validate_generation(body: Any) -> str | None:
    """What the real images API rejects in a generation request, or None."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    if not isinstance(body.get("prompt"), str) or not body["prompt"].strip():
        return "'prompt' is required"
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 10:
        return "'n' must be an integer from 1 to 10"
    size = body.get("size")
    if size is not None and (not isinstance(size, str) or not _SIZE.fullmatch(size)):
        return f"'size' must look like 1024x1024, got {size!r}"
    fmt = body.get("response_format")
    if fmt is not None and fmt not in ("url", "b64_json"):
        return f"'response_format' must be 'url' or 'b64_json', got {fmt!r}"
    return None


class ScriptedImageServer:
    """An OpenAI-images-compatible endpoint on 127.0.0.1.

    ``fail_status`` makes every generation answer that HTTP error; ``not_an_image`` makes it
    return bytes that are not an image (a provider bug the tool must catch); ``api_key`` set
    requires ``Authorization: Bearer <api_key>``; ``model`` is what ``/v1/models`` lists.
    """

    def __init__(
        self,
        *,
        model: str = "scripted-image",
        api_key: str | None = None,
        fail_status: int | None = None,
        not_an_image: bool = False,
        revised_prompt: bool = True,
        host: str = "127.0.0.1",
    ) -> None:
        self.model = model
        self.fail_status = fail_status
        self.not_an_image = not_an_image
        self.revised_prompt = revised_prompt
        self.host = host
        self.port = 0
        self.requests: list[dict[str, Any]] = []
        self.image_fetches = 0
        self._auth = f"Bearer {api_key}" if api_key is not None else None
        self._images: dict[str, bytes] = {}
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        if self._runner is None:
            raise RuntimeError("ScriptedImageServer is not running; use 'async with'")
        return f"http://{self.host}:{self.port}/v1"

    async def __aenter__(self) -> ScriptedImageServer:
        app = web.Application()
        app.add_routes(
            [
                web.post("/v1/images/generations", self._generate),
                web.get("/v1/models", self._models),
                web.get("/images/{name}", self._image),
            ]
        )
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0)
        await site.start()
        self.port = runner.addresses[0][1]
        self._runner = runner
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def _denied(self, request: web.Request) -> web.Response | None:
        if self._auth is None or request.headers.get("Authorization") == self._auth:
            return None
        return _error(401, "Incorrect API key provided.", "invalid_api_key")

    async def _models(self, request: web.Request) -> web.Response:
        if denied := self._denied(request):
            return denied
        data = {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "trajforge"}]}
        return web.json_response(data, dumps=lambda d: orjson.dumps(d).decode())

    async def _image(self, request: web.Request) -> web.Response:
        data = self._images.get(request.match_info["name"])
        if data is None:
            return web.Response(status=404)
        self.image_fetches += 1
        return web.Response(body=data, content_type="image/png")

    async def _generate(self, request: web.Request) -> web.Response:
        if denied := self._denied(request):
            return denied
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(400, "request body is not valid JSON")
        self.requests.append(body)
        if problem := validate_generation(body):
            return _error(400, problem)
        if self.fail_status is not None:
            return _error(self.fail_status, f"scripted image error {self.fail_status}")
        fmt = body.get("response_format") or "b64_json"
        items = []
        for i in range(body.get("n", 1)):
            data = b"<html>not an image</html>" if self.not_an_image else prompt_png(body["prompt"])
            item: dict[str, Any] = {}
            if fmt == "url":
                name = f"{len(self._images)}-{i}.png"
                self._images[name] = data
                item["url"] = f"http://{self.host}:{self.port}/images/{name}"
            else:
                item["b64_json"] = base64.b64encode(data).decode()
            if self.revised_prompt:
                item["revised_prompt"] = f"A detailed rendering of {body['prompt']}"
            items.append(item)
        payload = {"created": int(time.time()), "data": items}
        return web.Response(body=orjson.dumps(payload), content_type="application/json")


def _error(status: int, message: str, code: str | None = None) -> web.Response:
    return web.Response(
        status=status, body=error_body(message, status, code), content_type="application/json"
    )
