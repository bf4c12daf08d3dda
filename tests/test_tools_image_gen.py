"""image_generate against the scripted OpenAI images endpoint, saving into a real bwrap sandbox."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from trajforge.sandbox import create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.testing.images import ScriptedImageServer, prompt_png
from trajforge.tools import ToolContext
from trajforge.tools.builtin import build_registry
from trajforge.tools.config import ToolsConfigError, parse_tools_config

KEY_ENV = "TF_TEST_IMAGES_KEY"


@pytest.fixture
async def ctx(tmp_path) -> AsyncIterator[ToolContext]:
    factory = create_sandbox_factory(
        SandboxConfig(kind="bwrap", command_timeout_s=20, root_dir=str(tmp_path))
    )
    sandbox = await factory.create("image-gen-test")
    try:
        yield ToolContext(task_id="image-gen-test", sandbox=sandbox)
    finally:
        await sandbox.close()


def _tool(base_url: str, *, network: dict | None = None, **image_gen):
    cfg = parse_tools_config(
        {
            "network": {"allow_cidrs": ["127.0.0.0/8"]} if network is None else network,
            "image_gen": {"base_url": base_url, "model": "scripted-image", "max_retries": 0, **image_gen},
        }
    )
    tool = build_registry(cfg).get("image_generate")
    assert tool is not None and tool.toolset == "image_gen"
    return tool


async def test_b64_image_is_saved_in_the_sandbox(ctx, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sekrit-image-key")
    async with ScriptedImageServer(api_key="sekrit-image-key") as srv:
        tool = _tool(srv.base_url, api_key_env=KEY_ENV)
        out = await tool({"prompt": "A red fox in snow", "aspect_ratio": "landscape"}, ctx)
        assert out.ok, out.content
        body = orjson.loads(out.content)
        assert body["path"] == "images/a-red-fox-in-snow-1.png" and body["format"] == "png"
        assert body["size"] == "1536x1024" and body["revised_prompt"].endswith("A red fox in snow")
        [request] = srv.requests
        assert request == {
            "model": "scripted-image",
            "prompt": "A red fox in snow",
            "n": 1,
            "size": "1536x1024",
            "response_format": "b64_json",
        }
    # the file is really in the sandbox: the sandbox's own shell sees it
    saved = await ctx.ready_sandbox.read_bytes(body["path"])
    assert saved == prompt_png("A red fox in snow")
    listing = await ctx.ready_sandbox.exec("ls -l images/ && head -c 4 images/*.png | od -c | head -1")
    assert "a-red-fox-in-snow-1.png" in listing.output and "P   N   G" in listing.output


async def test_url_answer_is_fetched_and_a_second_image_gets_its_own_name(ctx):
    async with ScriptedImageServer() as srv:
        tool = _tool(srv.base_url, response_format="url")
        first = orjson.loads((await tool({"prompt": "cat"}, ctx)).content)
        second = orjson.loads((await tool({"prompt": "cat"}, ctx)).content)
        assert srv.image_fetches == 2
    assert first["path"] == "images/cat-1.png" and second["path"] == "images/cat-2.png"
    assert await ctx.ready_sandbox.read_bytes(second["path"]) == prompt_png("cat")


async def test_a_url_answer_goes_through_the_url_gate(ctx):
    """The provider's API is the operator's (outside the policy); the image URL it answers is
    fetched like any other host fetch: on loopback, under the default policy, it is refused."""
    async with ScriptedImageServer() as srv:
        out = await _tool(srv.base_url, network={}, response_format="url")({"prompt": "cat"}, ctx)
        assert srv.requests and srv.image_fetches == 0  # generated, never fetched
    assert not out.ok and "refused" in out.content and "loopback" in out.content


async def test_provider_errors_are_tool_errors_without_the_key(ctx, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sekrit-image-key")
    async with ScriptedImageServer(api_key="another-key") as srv:
        out = await _tool(srv.base_url, api_key_env=KEY_ENV)({"prompt": "x"}, ctx)
    assert not out.ok and "401" in out.content and "sekrit" not in out.content
    async with ScriptedImageServer(fail_status=400) as srv:
        out = await _tool(srv.base_url)({"prompt": "x"}, ctx)
    assert not out.ok and "400" in out.content and "scripted image error" in out.content
    async with ScriptedImageServer(not_an_image=True) as srv:
        out = await _tool(srv.base_url)({"prompt": "x"}, ctx)
    assert not out.ok and "not a PNG, JPEG, GIF or WEBP image" in out.content
    assert (
        await ctx.ready_sandbox.exec("test -e images && echo saved || echo none")
    ).output.strip() == "none"


async def test_bad_arguments_are_refused_before_any_request(ctx):
    async with ScriptedImageServer() as srv:
        tool = _tool(srv.base_url)
        assert "must not be empty" in (await tool({"prompt": "  "}, ctx)).content
        assert (
            "aspect_ratio must be one of"
            in (await tool({"prompt": "x", "aspect_ratio": "wide"}, ctx)).content
        )
        assert "'prompt' is required" in (await tool({}, ctx)).content
        assert srv.requests == []


def test_image_gen_config_errors_say_what_to_change():
    with pytest.raises(ToolsConfigError, match="tools.image_gen: .*needs both base_url and model"):
        parse_tools_config({"image_gen": {"model": "m"}})
    with pytest.raises(ToolsConfigError, match="output_dir must be a relative path"):
        parse_tools_config({"image_gen": {"base_url": "http://h/v1", "model": "m", "output_dir": "../x"}})
    with pytest.raises(ToolsConfigError, match="tools.image_gen.provider"):
        parse_tools_config({"image_gen": {"provider": "midjourney"}})
