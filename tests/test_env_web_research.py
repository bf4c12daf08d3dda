"""web_research end to end: a scripted agent searches a SearXNG-compatible endpoint, extracts a
page of a real local website (both on 127.0.0.1, allowed by the network policy) and answers, in
bubblewrap sandboxes; the reward judges the answer and whether it cites a page it fetched. Also
``trajforge env eval web_research`` with and without the web tools configured."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from trajforge.envs import RolloutBackends, Rollouts, load_env
from trajforge.envs.base import EnvDataError
from trajforge.envs.library.web_research import WebResearchEnv, normalize
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn

sys.path.insert(0, str(Path(__file__).parent / "site"))
from localsite import Site, start_site  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

QUESTION = "In what year was the Skerry Point lamp rebuilt?"


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    s = await start_site()
    s.search_results = [
        {"title": "Second page", "url": s.url("/page2"), "content": "The lamp was rebuilt"},
        {"title": "The lighthouse keeper", "url": s.url("/page1"), "content": "A keeper's log"},
    ]
    yield s
    await s.runner.cleanup()


def _tools(site: Site) -> dict[str, Any]:
    return {
        "network": {"allow_cidrs": ["127.0.0.0/8"]},
        "web": {"provider": "searxng", "endpoint": site.base},
    }


def _dataset(tmp_path: Path, site: Site) -> Path:
    path = tmp_path / "items.jsonl"
    rows = [
        {
            "id": "lamp",
            "category": "local",
            "question": QUESTION,
            "answer": "1911",
            "url": site.url("/page2"),
        },
        {
            "id": "electric",
            "category": "local",
            "question": "When did electricity reach the Skerry Point lamp?",
            "answer": "1952",
            "aliases": ["in 1952"],
            "url": site.url("/page2"),
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _researcher(reply: str | None = None, cite: str | None = None) -> Any:
    """Search, extract the first result, answer with the year found there after 'rebuilt in'."""

    def policy(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
        question = next(m["content"] for m in messages if m["role"] == "user")
        results = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
        if not results:
            return tool_turn(("web_search", {"query": question}))
        if len(results) == 1:
            return tool_turn(("web_extract", {"urls": [results[0]["results"][0]["url"]]}))
        page = results[1]["results"][0]
        year = page["content"].split("rebuilt in ")[1][:4] if "rebuilt" in question else "1952"
        return answer(f"The page says so.\nAnswer: {reply or year}\nSource: {cite or page['final_url']}")

    return policy


async def _episode(env: WebResearchEnv, bwrap: Any, policy: Any, item: dict[str, Any]) -> Any:
    registry = env.tool_registry()
    try:
        return await Rollouts(env, RolloutBackends(ScriptedModel(policy), bwrap, registry)).episode(item)
    finally:
        await registry.aclose()


async def test_search_extract_answer_scores_one_and_cites_the_fetched_page(
    site: Site, bwrap: Any, tmp_path: Path
) -> None:
    env = load_env("web_research", {"tools": _tools(site), "dataset_file": str(_dataset(tmp_path, site))})
    assert isinstance(env, WebResearchEnv)
    await env.setup()
    items = env.eval_items(2)
    for item in items:
        ep = await _episode(env, bwrap, _researcher(), item)
        assert ep.reward.error is None and ep.status == "completed"
        assert ep.tools == ["web_search", "web_extract"]
        assert ep.reward.value == 1.0, ep.reward.reason
        assert ep.reward.components["cited_fetched"] == 1.0 and ep.reward.components["searched"] == 1.0
    assert any(p.startswith("/search?") for p in site.requests) and "/page2" in site.requests
    # right answer, but the cited page was never fetched: the citation share is lost
    ep = await _episode(env, bwrap, _researcher(cite=site.url("/page1")), items[0])
    assert ep.reward.value == pytest.approx(0.8) and ep.reward.components["cited_fetched"] == 0.0
    # contains credit for a short answer with extra words; none for a wrong one
    ep = await _episode(env, bwrap, _researcher(reply="rebuilt in 1911"), items[0])
    assert ep.reward.value == pytest.approx(0.8) and ep.reward.components["contains"] == 1.0
    ep = await _episode(env, bwrap, _researcher(reply="1912"), items[0])
    assert ep.reward.value == 0.0
    # rescoring from the stored messages alone agrees
    again = await env.rescore(items[0], ep.messages, ep.reward.kept)
    assert again.reward == ep.reward.value


def test_normalization_and_answer_matching() -> None:
    assert normalize(" The 8,848.86 m. ") == "8848.86 m"
    assert normalize("Guido van Rossum!") == "guido van rossum"
    env = load_env("web_research")
    assert isinstance(env, WebResearchEnv)
    item = {"question": "q", "answer": "Canberra", "aliases": []}

    def final(text: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]

    assert env.judge(item, final("Answer: canberra.")).components["exact"] == 1.0
    long_dump = "Answer: " + " ".join(["word"] * 30) + " canberra"
    assert env.judge(item, final(long_dump)).reward == 0.0  # dumping text earns no contains credit
    assert env.judge(item, final("Sydney")).reward == 0.0


async def test_without_web_tools_the_env_refuses_to_start_saying_how_to_configure() -> None:
    env = load_env("web_research")
    with pytest.raises(EnvDataError, match=r"no search provider configured.*tools_config"):
        await env.setup()


async def _cli(*args: str) -> tuple[int, str]:
    exe = str(Path(sys.executable).with_name("trajforge"))
    proc = await asyncio.create_subprocess_exec(
        exe, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def test_env_eval_cli_with_a_tools_config_file_and_without(site: Site, tmp_path: Path) -> None:
    code, out = await _cli("env", "eval", "web_research", "--agent", "oracle", "--output-dir", str(tmp_path))
    assert code != 0 and "needs the web tools" in out and "--config" in out
    tools_file = tmp_path / "tools.yaml"
    tools_file.write_text(yaml.safe_dump({"tools": _tools(site)}))
    env_file = tmp_path / "env.yaml"
    env_file.write_text(
        yaml.safe_dump(
            {"tools_config": str(tools_file), "dataset_file": str(_dataset(tmp_path, site)), "group_size": 1}
        )
    )
    for agent, expected in (("oracle", 1.0), ("none", 0.0)):
        code, out = await _cli(
            "env", "eval", "web_research", "--config", str(env_file), "--agent", agent, "--max-samples", "2",
            "--output-dir", str(tmp_path), "--run-name", agent, "--json",
        )  # fmt: skip
        assert code == 0, out
        rewards = [
            json.loads(line)["reward"]["value"] for line in (tmp_path / agent / "episodes.jsonl").open()
        ]
        assert rewards == [expected, expected], out
