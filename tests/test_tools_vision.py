"""vision_analyze against a scripted OpenAI-compatible multimodal endpoint on 127.0.0.1.

Images come from a local HTTP site (fetched by the host under the network policy) and from files
in a real bubblewrap sandbox; the scripted endpoint validates the image content part as a strict
real endpoint does and answers with what it received, so the tests see the bytes arrive intact.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from trajforge.sandbox import create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.testing import FaultConfig, Reply
from trajforge.testing.images import solid_png
from trajforge.tools import ToolContext
from trajforge.tools.builtin import build_registry
from trajforge.tools.config import parse_tools_config

PNG = solid_png((10, 200, 30))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def describe_image(body: dict[str, Any]) -> Reply:
    """Answer with the question and a digest of the image the request carried."""
    parts = body["messages"][-1]["content"]
    question = next(p["text"] for p in parts if p["type"] == "text")
    url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
    header, _, payload = url.partition(",")
    data = base64.b64decode(payload)
    return Reply(content=f"{header} sha={_sha(data)} q={question}")


@pytest.fixture
async def site() -> AsyncIterator[str]:
    """A local site: an image, a redirect to it, an HTML page, a large image."""

    async def png(_: web.Request) -> web.Response:
        return web.Response(body=PNG, content_type="image/png")

    async def redirect(_: web.Request) -> web.Response:
        raise web.HTTPFound("/img/cat.png")

    async def page(_: web.Request) -> web.Response:
        return web.Response(text="<html>hello</html>", content_type="text/html")

    async def big(_: web.Request) -> web.Response:
        return web.Response(body=PNG + b"\0" * 200_000, content_type="image/png")

    app = web.Application()
    app.add_routes(
        [
            web.get("/img/cat.png", png),
            web.get("/go", redirect),
            web.get("/page.html", page),
            web.get("/big.png", big),
        ]
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def sandbox_ctx(tmp_path) -> AsyncIterator[ToolContext]:
    factory = create_sandbox_factory(
        SandboxConfig(kind="bwrap", command_timeout_s=20, root_dir=str(tmp_path))
    )
    sandbox = await factory.create("vision-test")
    try:
        yield ToolContext(task_id="vision-test", sandbox=sandbox)
    finally:
        await sandbox.close()


def _registry(base_url: str, *, allow_loopback: bool = True, max_image_bytes: int = 100_000):
    policy = {"allow_cidrs": ["127.0.0.0/8"]} if allow_loopback else {}
    cfg = parse_tools_config(
        {
            "network": policy,
            "vision": {
                "endpoint": {"base_url": base_url, "model": "scripted", "max_retries": 0},
                "max_image_bytes": max_image_bytes,
            },
        }
    )
    return build_registry(cfg)


async def _analyze(registry, ctx, image: str, question: str = "what colour?"):
    tool = registry.get("vision_analyze")
    assert tool is not None and tool.toolset == "vision"
    return await tool({"image_url": image, "question": question}, ctx)


async def test_image_from_url_reaches_the_model_as_a_data_url(scripted_server, site):
    srv = await scripted_server(describe_image)
    registry = _registry(srv.base_url)
    out = await _analyze(registry, ToolContext("t"), f"{site}/go")  # redirect followed, then checked
    assert out.ok, out.content
    body = orjson.loads(out.content)
    assert body["image"] == f"{site}/go"
    assert body["analysis"] == f"data:image/png;base64 sha={_sha(PNG)} q=what colour?"
    [request] = srv.requests
    assert request["model"] == "scripted" and request["messages"][0]["role"] == "user"


async def test_image_from_a_sandbox_file(scripted_server, sandbox_ctx):
    srv = await scripted_server(describe_image)
    registry = _registry(srv.base_url)
    await sandbox_ctx.ready_sandbox.write_bytes("pics/cat.png", PNG)
    out = await _analyze(registry, sandbox_ctx, "pics/cat.png", "describe it")
    assert out.ok, out.content
    assert orjson.loads(out.content)["analysis"].endswith(f"sha={_sha(PNG)} q=describe it")

    outside = await _analyze(registry, sandbox_ctx, "/etc/hostname")
    assert not outside.ok and "permission denied" in outside.content
    missing = await _analyze(registry, sandbox_ctx, "pics/none.png")
    assert not missing.ok and "no such file" in missing.content
    await sandbox_ctx.ready_sandbox.write_bytes("notes.txt", b"just text")
    text = await _analyze(registry, sandbox_ctx, "notes.txt")
    assert not text.ok and "not a PNG, JPEG, GIF or WEBP image" in text.content
    assert len(srv.requests) == 1  # nothing that is not an image goes to the model


async def test_default_policy_refuses_a_loopback_image_url(scripted_server, site):
    srv = await scripted_server(describe_image)
    registry = _registry(srv.base_url, allow_loopback=False)
    out = await _analyze(registry, ToolContext("t"), f"{site}/img/cat.png")
    assert not out.ok
    assert "refused" in out.content and "loopback" in out.content and "allow_cidrs" in out.content
    assert srv.requests == []


async def test_non_image_and_oversized_urls_are_tool_errors(scripted_server, site):
    srv = await scripted_server(describe_image)
    registry = _registry(srv.base_url, max_image_bytes=100_000)
    page = await _analyze(registry, ToolContext("t"), f"{site}/page.html")
    assert not page.ok and "is not a PNG, JPEG, GIF or WEBP image" in page.content
    big = await _analyze(registry, ToolContext("t"), f"{site}/big.png")
    assert not big.ok and "100000 bytes" in big.content
    assert srv.requests == []


async def test_data_url_image_is_accepted(scripted_server):
    srv = await scripted_server(describe_image)
    registry = _registry(srv.base_url)
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    out = await _analyze(registry, ToolContext("t"), url)
    assert out.ok and f"sha={_sha(PNG)}" in out.content


async def test_endpoint_failure_is_a_tool_error(scripted_server, site):
    srv = await scripted_server(describe_image, faults=FaultConfig(p_500=1.0))
    registry = _registry(srv.base_url)
    out = await _analyze(registry, ToolContext("t"), f"{site}/img/cat.png")
    assert not out.ok and "the vision model failed" in out.content and "500" in out.content


async def test_strict_endpoint_rejects_malformed_image_parts(scripted_server):
    """The scripted endpoint validates content parts as a strict real one does."""
    from trajforge.testing.validation import validate_request

    def body(parts: list[dict[str, Any]], role: str = "user") -> dict[str, Any]:
        return {"model": "m", "messages": [{"role": role, "content": parts}]}

    good = [{"type": "text", "text": "q"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]
    assert validate_request(body(good)) is None
    assert "only allowed in messages with role 'user'" in (validate_request(body(good, "system")) or "")
    bad_url = [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]
    assert "must be an http(s) URL or a data:image" in (validate_request(body(bad_url)) or "")
    bad_b64 = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]
    assert "invalid base64" in (validate_request(body(bad_b64)) or "")
    assert "unknown content part type" in (validate_request(body([{"type": "audio"}])) or "")
