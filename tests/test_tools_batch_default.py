"""The issue's "must show": a batch run with the ``default`` distribution where every toolset is
offered and used, with per-tool success rates in ``statistics.json``.

Everything is real and on 127.0.0.1: the policy model is a scripted OpenAI-compatible endpoint
that calls each tool in turn (reading element refs out of the browser's own snapshots), the web
and browser tools go to a local site with a SearXNG-compatible search API, vision and MoA talk to
scripted chat endpoints, image generation to the scripted images endpoint, commands and files run
in bubblewrap sandboxes, and the browser is the distribution's Chromium.
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
from pathlib import Path
from typing import Any

import orjson

from trajforge.testing import Reply, ToolCallSpec
from trajforge.testing.images import ScriptedImageServer
from trajforge.testing.policies import count_assistant_turns
from trajforge.tools.toolsets import TOOLSETS

sys.path.insert(0, str(Path(__file__).parent / "site"))
from localsite import start_site  # noqa: E402


def _last_tool_text(body: dict[str, Any], needle: str) -> str:
    for m in reversed(body["messages"]):
        if m.get("role") == "tool" and needle in str(m.get("content")):
            return str(m["content"])
    raise AssertionError(f"no tool result with {needle!r} in the conversation")


def _ref(body: dict[str, Any], pattern: str) -> str:
    match = re.search(pattern + r"[^\n]*\[ref=(e\d+)\]", _last_tool_text(body, "[ref="))
    assert match, pattern
    return match.group(1)


def agent_policy(site: str):
    """Calls every tool once (vision twice, browser_navigate/snapshot more), then answers."""
    steps: list[tuple[str, Any]] = [
        ("web_search", {"query": "lighthouse keeper"}),
        ("web_extract", {"urls": [f"{site}/page1"]}),
        ("vision_analyze", {"image_url": f"{site}/img/red.png", "question": "What colour is it?"}),
        ("image_generate", {"prompt": "A lighthouse at dusk"}),
        ("vision_analyze", {"image_url": "images/a-lighthouse-at-dusk-1.png", "question": "Describe it."}),
        ("mixture_of_agents", {"user_prompt": "How tall is a typical lighthouse?"}),
        ("terminal", {"command": "ls images && echo started > log.txt"}),
        ("terminal", {"command": "sleep 0.2; echo background done", "background": True}),
        ("process", {"action": "wait", "id": "bg1", "timeout": 20}),
        ("write_file", {"path": "notes.md", "content": "hello lighthouse\n"}),
        ("patch", {"path": "notes.md", "old_string": "hello", "new_string": "goodbye"}),
        ("read_file", {"path": "notes.md"}),
        ("search_files", {"pattern": "goodbye"}),
        ("browser_navigate", {"url": f"{site}/form"}),
        ("browser_snapshot", {}),
        ("browser_type", lambda b: {"ref": _ref(b, 'textbox "Your name"'), "text": "Ada"}),
        ("browser_click", lambda b: {"ref": _ref(b, 'button "Send"')}),
        ("browser_snapshot", {}),
        ("browser_back", {}),
        ("browser_scroll", {"direction": "down"}),
        ("browser_press", {"key": "Tab"}),
        ("browser_navigate", {"url": f"{site}/images"}),
        ("browser_get_images", {}),
        ("browser_vision", {"question": "What is on the page?"}),
        ("browser_console", {}),
    ]

    def policy(body: dict[str, Any]) -> Reply:
        step = count_assistant_turns(body)
        if step < len(steps):
            name, args = steps[step]
            return Reply(tool_calls=[ToolCallSpec(name, args(body) if callable(args) else args)])
        return Reply(content="All done: every tool was used.")

    return policy, len(steps)


def describe_image(body: dict[str, Any]) -> Reply:
    parts = body["messages"][-1]["content"]
    url = next(p["image_url"]["url"] for p in parts if p["type"] == "image_url")
    digest = hashlib.sha256(base64.b64decode(url.partition(",")[2])).hexdigest()[:12]
    return Reply(content=f"an image ({url.split(';')[0]}, sha {digest})")


async def test_default_distribution_offers_and_uses_every_toolset(tmp_path, scripted_server):
    from trajforge.batch.config import load_config
    from trajforge.batch.runner import run_batch

    site = await start_site()
    site.search_results = [{"title": "Lighthouse", "url": site.url("/page1"), "content": "keeper's log"}]
    try:
        vision = await scripted_server(describe_image, model="vision")
        expert = await scripted_server(lambda b: Reply(content="About 30 metres."), model="expert")
        down = await scripted_server(lambda b: Reply.fail(503, "overloaded"), model="down")
        aggregator = await scripted_server(lambda b: Reply(content="Typically 20-50 m."), model="agg")
        policy, steps = agent_policy(site.base)
        agent = await scripted_server(policy, model="agent")
        async with ScriptedImageServer() as images:
            tools = {
                "network": {"allow_cidrs": ["127.0.0.0/8"]},
                "web": {"provider": "searxng", "endpoint": site.base},
                "vision": {"endpoint": {"base_url": vision.base_url, "model": "vision"}},
                "image_gen": {"base_url": images.base_url, "model": "scripted-image"},
                "moa": {
                    "reference_models": [
                        {"base_url": expert.base_url, "model": "expert"},
                        {"base_url": down.base_url, "model": "down", "max_retries": 0},
                    ],
                    "aggregator": {"base_url": aggregator.base_url, "model": "agg"},
                },
            }
            dataset = tmp_path / "prompts.jsonl"
            dataset.write_text('{"prompt": "Research lighthouses."}\n{"prompt": "Draw a lighthouse."}\n')
            cfg = load_config(
                None,
                {
                    "dataset": dataset,
                    "run_name": "all-tools",
                    "output_dir": tmp_path / "data",
                    "model": "agent",
                    "base_url": agent.base_url,
                    "distribution": "default",
                    "sandbox": "bwrap",
                    "concurrency": 2,
                    "progress": "none",
                    "require_reasoning": False,
                    "tools": tools,
                },
            )
            said: list[str] = []
            summary = await run_batch(cfg, announce=said.append)
    finally:
        await site.runner.cleanup()

    assert not [m for m in said if "not offered" in m or "not implemented" in m], said
    stats = summary.statistics
    assert stats["status_counts"].get("completed") == 2, (stats["status_counts"], said)
    # every toolset of the distribution was offered to every sample...
    assert stats["toolset_usage"] == dict.fromkeys(
        ("web", "vision", "image_gen", "terminal", "file", "moa", "browser"), 2
    )
    # ...and every one of their tools was called and succeeded, with its rate in statistics.json
    on_disk = orjson.loads((tmp_path / "data" / "all-tools" / "statistics.json").read_bytes())
    tool_stats = on_disk["tool_statistics"]
    used = {name for ts, names in TOOLSETS.items() if ts != "rl" for name in names}
    assert set(tool_stats) == used, sorted(used ^ set(tool_stats))
    for name, row in tool_stats.items():
        assert row["failure"] == 0 and row["success_rate"] == 1.0, (name, row, on_disk["tool_error_counts"])
    assert tool_stats["vision_analyze"]["count"] == 4 and tool_stats["browser_navigate"]["count"] == 4
    assert sum(row["count"] for row in tool_stats.values()) == 2 * steps
    # the trajectories show what the tools returned
    records = [orjson.loads(line) for line in (tmp_path / "data" / "all-tools" / "trajectories.jsonl").open()]
    text = orjson.dumps(records).decode()
    assert "name = Ada" in text  # the form was filled and submitted through snapshot refs
    assert "images/a-lighthouse-at-dusk-1.png" in text and "references_failed" in text
    assert len(images.requests) == 2 and len(aggregator.requests) == 2


async def test_a_plain_batch_records_the_toolsets_it_offered_not_every_one_drawn(
    tmp_path, scripted_batch_config
) -> None:
    """Nothing configured but the local tools: the ``default`` distribution still draws vision,
    image_gen and moa, and a line once said so in ``toolsets``/``toolsets_used`` (7 toolsets
    where 3 were offered, issue 43). A toolset is recorded when one of its tools was offered."""
    from trajforge.batch.runner import run_batch
    from trajforge.testing.scripted_server import ScriptedServer

    rows = [{"prompt": f"say {i}"} for i in range(6)]
    async with ScriptedServer(lambda body: Reply(content="ok", reasoning="r"), api_key="k") as srv:
        cfg = scripted_batch_config(rows, srv.base_url, toolsets=None, distribution="default")
        await run_batch(cfg)
    lines = [orjson.loads(x) for x in (cfg.run_dir / "trajectories.jsonl").read_bytes().splitlines()]
    assert len(lines) == 6
    drawn_unconfigured = 0
    for line in lines:
        assert line["toolsets"] == line["toolsets_used"]
        for toolset in line["toolsets"]:
            assert set(TOOLSETS[toolset]) & set(line["tools"]), (toolset, line["tools"])
        drawn_unconfigured += not ({"vision", "image_gen", "moa"} & set(line["toolsets"]))
    assert drawn_unconfigured == 6  # none of the three, though the distribution draws them often
