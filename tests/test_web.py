"""web_search and web_extract against a real website and real search-API servers on 127.0.0.1."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from trajforge.tools.base import FunctionTool, ToolContext
from trajforge.tools.netpolicy import NetPolicy
from trajforge.tools.web import WebConfig, web_tools

sys.path.insert(0, str(Path(__file__).parent / "site"))
from localsite import Site, start_site  # noqa: E402

LOOPBACK = NetPolicy(allow_cidrs=["127.0.0.0/8"])


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    s = await start_site()
    s.search_results = [
        {"title": "The lighthouse keeper", "url": s.url("/page1"), "content": "A keeper's log"},
        {"title": "Metadata", "url": "http://169.254.169.254/latest/meta-data/", "content": "creds"},
        {"title": "Router", "url": "http://10.0.0.1/admin", "content": "admin"},
        {"title": "Report", "url": s.url("/doc.pdf"), "content": "pdf"},
    ]
    yield s
    await s.runner.cleanup()


def _tools(cfg: WebConfig) -> dict[str, FunctionTool]:
    return {t.name: t for t in web_tools(cfg)}


async def _call(tool: FunctionTool, **args: Any) -> tuple[Any, Any]:
    out = await tool(args, ToolContext(task_id="t"))
    return out, orjson.loads(out.content) if out.content.startswith("{") else out.content


async def test_searxng_search_filters_results_pointing_at_denied_addresses(site: Site) -> None:
    tools = _tools(WebConfig(provider="searxng", endpoint=site.base, policy=LOOPBACK))
    assert [t.toolset for t in tools.values()] == ["web", "web"]
    out, body = await _call(tools["web_search"], query="lighthouse keeper")
    assert out.ok
    assert [r["url"] for r in body["results"]] == [site.url("/page1"), site.url("/doc.pdf")]
    assert body["results"][0]["title"] == "The lighthouse keeper"
    assert "(lighthouse keeper)" in body["results"][0]["snippet"]  # the query reached the endpoint
    refused = {r["url"]: r["error"] for r in body["refused"]}
    assert "cloud metadata" in refused["http://169.254.169.254/latest/meta-data/"]
    assert "private" in refused["http://10.0.0.1/admin"]
    assert any(p.startswith("/search?") and "format=json" in p for p in site.requests)


async def test_hosted_providers_send_the_key_from_the_environment_and_never_show_it(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-test-very-secret-123"
    monkeypatch.setenv("MY_BRAVE_KEY", secret)
    monkeypatch.setenv("TAVILY_API_KEY", secret + "-tav")
    brave = _tools(
        WebConfig(provider="brave", endpoint=site.url("/brave"), api_key_env="MY_BRAVE_KEY", policy=LOOPBACK)
    )
    out, body = await _call(brave["web_search"], query="keeper")
    assert out.ok and body["results"][0]["url"] == site.url("/page1") and secret not in out.content
    tavily = _tools(WebConfig(provider="tavily", endpoint=site.url("/tavily"), policy=LOOPBACK))
    out, body = await _call(tavily["web_search"], query="keeper")
    assert out.ok and body["results"][0]["snippet"] == "A keeper's log" and secret not in out.content
    assert site.keys_seen == [secret, f"Bearer {secret}-tav"]
    # unset key: a clear tool error naming the variable, not the value
    monkeypatch.delenv("MY_BRAVE_KEY")
    cfg = WebConfig(provider="brave", endpoint=site.url("/brave"), api_key_env="MY_BRAVE_KEY")
    assert cfg.search_unready() == "the brave API key variable MY_BRAVE_KEY is not set"
    out, _ = await _call(_tools(cfg)["web_search"], query="x")
    assert not out.ok and "MY_BRAVE_KEY is not set" in out.content


async def test_search_endpoint_failure_is_a_tool_error(site: Site) -> None:
    tools = _tools(WebConfig(provider="searxng", endpoint=site.url("/nowhere"), policy=LOOPBACK))
    out, _ = await _call(tools["web_search"], query="x")
    assert not out.ok and "HTTP 404" in out.content


async def test_extract_html_to_markdown_with_title_and_final_url(site: Site) -> None:
    tools = _tools(WebConfig(policy=LOOPBACK))
    assert list(tools) == ["web_extract"]  # no provider: no web_search offered
    out, body = await _call(tools["web_extract"], urls=[site.url("/redirect"), site.url("/page2")])
    assert out.ok
    first, second = body["results"]
    assert first["final_url"] == site.url("/page1") and first["title"] == "The lighthouse keeper"
    assert first["type"] == "html"
    assert "lighthouse keeper of Skerry Point kept a logbook" in first["content"]
    assert "Copyright Skerry Point Trust" not in first["content"]  # boilerplate left out
    assert "[the second page]" in first["content"]  # links kept, as markdown
    assert second["title"] == "Second page" and "| 1911 | Rebuilt |" in second["content"]  # table -> markdown


async def test_extract_pdf_to_text(site: Site) -> None:
    tools = _tools(WebConfig(policy=LOOPBACK))
    out, body = await _call(tools["web_extract"], urls=site.url("/doc.pdf"))
    (res,) = body["results"]
    assert out.ok and res["type"] == "pdf" and res["title"] == "Skerry Report"
    assert "the lamp burned 3650 nights" in res["content"]


async def test_extract_reports_errors_per_url(site: Site) -> None:
    cfg = WebConfig(policy=LOOPBACK, max_bytes=100_000, timeout_s=1.0, max_chars=200)
    tools = _tools(cfg)
    urls = [
        site.url("/page1"),
        site.url("/huge"),
        site.url("/slow"),
        site.url("/missing"),
        site.url("/img/red.png"),
        site.url("/redirect-to?target=http://169.254.169.254/latest/meta-data/"),
        "ftp://example.com/x",
    ]
    cfg5 = WebConfig(policy=LOOPBACK, max_bytes=100_000, timeout_s=1.0, max_chars=200, max_urls=10)
    out, body = await _call(_tools(cfg5)["web_extract"], urls=urls)
    assert out.ok  # one page worked
    r = {x["url"]: x for x in body["results"]}
    assert "truncated" in r[urls[0]] and len(r[urls[0]]["content"]) == 200
    assert "larger than the 100000 bytes allowed" in r[urls[1]]["error"]
    assert "longer than the 1s allowed" in r[urls[2]]["error"]
    assert r[urls[3]]["error"] == "HTTP 404"
    assert "image/png" in r[urls[4]]["error"]
    assert "cloud metadata" in r[urls[5]]["error"] and "redirect from" in r[urls[5]]["error"]
    assert "only http and https" in r[urls[6]]["error"]
    # too many URLs: the tool does not run
    out, text = await _call(tools["web_extract"], urls=urls)
    assert not out.ok and "at most 5 URLs" in text


async def test_default_policy_refuses_loopback_pages(site: Site) -> None:
    out, body = await _call(_tools(WebConfig())["web_extract"], urls=[site.url("/page1")])
    assert not out.ok and "127.0.0.1 is a loopback address" in body["results"][0]["error"]
    assert site.requests == []


def test_config_errors_say_what_to_change() -> None:
    with pytest.raises(ValidationError, match="needs endpoint"):
        WebConfig(provider="searxng")
    with pytest.raises(ValidationError, match="name\\* of an environment variable"):
        WebConfig(provider="brave", api_key_env="sk-abc-123")
    assert WebConfig(provider="tavily").key_env == "TAVILY_API_KEY"


async def test_the_search_endpoint_is_admitted_and_its_redirects_are_not(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search API is the operator's (on loopback here, under the default policy): it is
    fetched through the same gate with its own host admitted; its results stay held to the
    policy, and a redirect it answers is checked like any other."""
    out, body = await _call(
        _tools(WebConfig(provider="searxng", endpoint=site.base))["web_search"], query="k"
    )
    assert out.ok and body["results"] == []  # the endpoint answered; its loopback results are refused
    assert {r["url"] for r in body["refused"]} >= {site.url("/page1"), site.url("/doc.pdf")}
    monkeypatch.setenv("BRAVE_API_KEY", "k")
    to_metadata = site.url("/redirect-to?target=http://169.254.169.254/latest/meta-data/")
    out, _ = await _call(_tools(WebConfig(provider="brave", endpoint=to_metadata))["web_search"], query="k")
    assert not out.ok and "refused by the network policy" in out.content and "cloud metadata" in out.content
    assert "q=k" not in out.content  # the query part of a URL stays out of the error
