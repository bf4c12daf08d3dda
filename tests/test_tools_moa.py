"""mixture_of_agents against scripted OpenAI-compatible endpoints: references on their own servers,
one of them failing, and the aggregator seeing only the answers that arrived."""

from __future__ import annotations

from typing import Any

import orjson

from trajforge.testing import FaultConfig, Reply
from trajforge.testing.policies import last_user_text
from trajforge.tools import ToolContext
from trajforge.tools.builtin import build_registry
from trajforge.tools.config import parse_tools_config


def expert(name: str):
    def policy(body: dict[str, Any]) -> Reply:
        return Reply(content=f"{name} says 42 for: {last_user_text(body)}")

    return policy


def aggregator(body: dict[str, Any]) -> Reply:
    system = body["messages"][0]
    assert system["role"] == "system"
    return Reply(content="SYNTHESIS of [" + system["content"].split("Answers:\n", 1)[1] + "]")


def _endpoint(srv, **kw) -> dict[str, Any]:
    return {"base_url": srv.base_url, "model": srv.model, "max_retries": 0, **kw}


def _tool(refs, agg, **moa):
    cfg = parse_tools_config(
        {"moa": {"reference_models": [_endpoint(s) for s in refs], "aggregator": _endpoint(agg), **moa}}
    )
    tool = build_registry(cfg).get("mixture_of_agents")
    assert tool is not None and tool.toolset == "moa"
    return tool


async def test_references_answer_in_parallel_and_one_failure_is_reported(scripted_server):
    alpha = await scripted_server(expert("alpha"), model="alpha")
    beta = await scripted_server(expert("beta"), model="beta", latency_s=0.05)
    broken = await scripted_server(expert("broken"), model="broken", faults=FaultConfig(p_500=1.0))
    agg = await scripted_server(aggregator, model="agg")
    tool = _tool([alpha, beta, broken], agg)
    out = await tool({"user_prompt": "What is 6*7?"}, ToolContext("t"))
    assert out.ok, out.content
    body = orjson.loads(out.content)
    assert body["references_answered"] == 2
    [failure] = body["references_failed"]
    assert failure["model"] == "broken" and "500" in failure["error"]
    assert "alpha says 42 for: What is 6*7?" in body["response"]
    assert "beta says 42 for: What is 6*7?" in body["response"]
    assert body["response"].startswith("SYNTHESIS of [")
    # the aggregator got the user's question after the references' answers
    [agg_request] = agg.requests
    assert agg_request["messages"][-1] == {"role": "user", "content": "What is 6*7?"}
    assert "broken says" not in agg_request["messages"][0]["content"]


async def test_all_references_failing_is_a_tool_error(scripted_server):
    down = [await scripted_server(expert("x"), faults=FaultConfig(p_500=1.0)) for _ in range(2)]
    agg = await scripted_server(aggregator)
    out = await _tool(down, agg)({"user_prompt": "q"}, ToolContext("t"))
    assert not out.ok and "only 0 of 2 reference models answered" in (out.error or "")
    assert len(orjson.loads(out.content)["references_failed"]) == 2
    assert agg.requests == []


async def test_min_references_and_aggregator_failure(scripted_server):
    ok = await scripted_server(expert("ok"))
    down = await scripted_server(expert("down"), faults=FaultConfig(p_500=1.0))
    agg = await scripted_server(aggregator)
    out = await _tool([ok, down], agg, min_references=2)({"user_prompt": "q"}, ToolContext("t"))
    assert not out.ok and "only 1 of 2" in (out.error or "") and "need 2" in (out.error or "")
    dead_agg = await scripted_server(aggregator, faults=FaultConfig(p_500=1.0))
    out = await _tool([ok], dead_agg)({"user_prompt": "q"}, ToolContext("t"))
    assert not out.ok and "the aggregator model failed" in (out.error or "")
    assert orjson.loads(out.content)["references_answered"] == 1
    assert "argument 'user_prompt'" in (await _tool([ok], agg)({}, ToolContext("t"))).content
