"""The run report end to end: a real batch (scripted endpoint on loopback, bubblewrap sandboxes) and
a real env run (tiny_tasks judged in bwrap), ``trajforge report`` on each directory, the file opened
from disk in headless Chromium, what it renders checked (axis labels, legends with units, every
label inside its picture, no "null" and no "no data" where the run has data) and a full-page
screenshot taken of each."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from playwright.async_api import expect
from typer.testing import CliRunner

from trajforge.batch.runner import run_batch
from trajforge.cli.main import app
from trajforge.report import ReportOptions, build_report, charts
from trajforge.testing.scripted_server import Reply, ToolCallSpec

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
HAVE_CHROMIUM = os.path.exists(CHROMIUM)
XSS = '</script><img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
MARKER = "zebra-marker-7319"
GARBLED = '<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"\n</tool_call>'


def _policy(body: dict[str, Any]) -> Reply:
    """Every shape the report must show: tool calls and results, think blocks, a failing call,
    a hallucinated tool, a turn without reasoning, a run past max_turns, and hostile text."""
    prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
    turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if prompt.startswith("garbled"):  # the endpoint returns the model's call as broken text
        if turn == 0:
            return Reply(content=GARBLED, reasoning="call it")
        return Reply(content="answered after all", reasoning="plain answer")
    if prompt.startswith("bad"):
        if turn == 0:
            return Reply(
                reasoning="try",
                tool_calls=[ToolCallSpec("terminal", {"cmd": 1}), ToolCallSpec("nosuchtool", {})],
            )
        return Reply(content="gave up", reasoning="no luck")
    if prompt.startswith("terse"):
        return Reply(content="an answer without reasoning")
    if prompt.startswith("loop"):
        return Reply(reasoning="again", tool_calls=[ToolCallSpec("terminal", {"command": "true"})])
    if prompt.startswith("evil"):
        if turn == 0:
            return Reply(
                reasoning=f"</think>{XSS}",
                tool_calls=[
                    ToolCallSpec("terminal", {"command": "printf '%s' '<script>window.__pwned=3</script>'"})
                ],
            )
        return Reply(content=f"{XSS} <b onmouseover=window.__pwned=4>bold</b>", reasoning="done <think>")
    if turn < 2:
        return Reply(
            reasoning=f"step {turn} for {prompt}",
            tool_calls=[ToolCallSpec("terminal", {"command": f"echo out-{turn}"})],
        )
    return Reply(content=f"answer to {prompt}", reasoning="final")


PROMPTS = [f"task {i}" for i in range(6)] + [
    f"find {MARKER}",
    "bad args",
    "terse",
    "garbled call",
    "loop forever",
    f"evil {XSS}",
]


@pytest.fixture
async def real_run(scripted_server: Callable, scripted_batch_config: Callable) -> Path:
    srv = await scripted_server(_policy)
    cfg = scripted_batch_config(
        [{"prompt": p} for p in PROMPTS], srv.base_url, sandbox="bwrap", require_reasoning=True, max_turns=4
    )
    await run_batch(cfg)
    return Path(cfg.run_dir)


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    playwright = pytest.importorskip("playwright.async_api")
    if not HAVE_CHROMIUM:
        pytest.skip("the distribution's chromium is not installed (make system-deps installs it)")
    async with playwright.async_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        chromium = await p.chromium.launch(executable_path=CHROMIUM, args=args)
        yield chromium
        await chromium.close()


async def _open(browser: Any, path: Path, *, bypass_csp: bool = False) -> tuple[Any, list[str]]:
    page = await browser.new_page(bypass_csp=bypass_csp)
    problems: list[str] = []
    page.on("pageerror", lambda exc: problems.append(f"pageerror: {exc}"))
    page.on(
        "console",
        lambda msg: problems.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None,
    )
    await page.goto(path.as_uri())
    await page.wait_for_selector("body[data-browser=ready]")
    return page, problems


async def _rows(page: Any) -> list[str]:
    return await page.eval_on_selector_all("#tf-rows tr", "rows => rows.map(r => r.getAttribute('data-key'))")


@pytest.mark.bwrap
async def test_report_of_a_real_run_in_chromium(real_run: Path, browser: Any, tmp_path: Path) -> None:
    lines = [
        orjson.loads(raw)
        for name in ("trajectories.jsonl", "filtered.jsonl", "failed.jsonl")
        for raw in (real_run / name).read_bytes().splitlines()
    ]
    by_status = {
        s: sum(1 for line in lines if line["status"] == s) for s in {line["status"] for line in lines}
    }
    assert by_status == {"completed": 8, "filtered": 3, "partial": 1}  # the hostile one is filtered too
    evil = next(line for line in lines if line["conversations"][1]["value"].startswith("evil"))
    marked = next(line for line in lines if MARKER in line["conversations"][1]["value"])

    out = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", str(real_run), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert f"{len(lines)} samples, {len(lines)} trajectories embedded" in result.output
    html = out.read_text()
    assert "<script>window.__pwned" not in html and "<img src=x" not in html  # escaped in the file itself

    page, problems = await _open(browser, out)
    # Charts: SVG marks carrying the run's numbers.
    status_marks = await page.eval_on_selector_all(
        "#chart-status svg .mark", "ms => ms.map(m => [m.dataset.label, Number(m.dataset.value)])"
    )
    assert dict(status_marks) == {s: float(n) for s, n in by_status.items()}
    for chart in ("turns", "tokens", "latency"):
        counts = await page.eval_on_selector_all(
            f"#chart-{chart} svg rect.mark", "ms => ms.map(m => Number(m.dataset.value))"
        )
        assert sum(counts) == len(lines), chart
    tool_marks = await page.eval_on_selector_all(
        "#chart-tools svg .mark", "ms => ms.map(m => m.dataset.label)"
    )
    assert tool_marks == ["terminal", "(unparsed tool call)"]
    unparsed = await _table_row(page, "#tool-table", "(unparsed tool call)")
    assert unparsed == ["(unparsed tool call)", "1", "0", "1", "100.0%", "1"]
    assert await page.locator("#chart-throughput svg polyline.series").count() >= 2
    reasons = await page.eval_on_selector_all("#status svg .mark", "ms => ms.map(m => m.dataset.label)")
    assert {"no_reasoning", "hallucinated_tool", "max_turns"} <= set(reasons)
    failure_rate = await page.inner_text("#tool-table")
    assert "terminal" in failure_rate and "1" in failure_rate
    assert await page.locator("#no-rewards").count() == 1  # batch lines carry no reward yet
    await _check_rendering(page, tmp_path / "batch-report.png")
    latency = await _texts(page, "#chart-latency")
    walls = sorted(line["timings"]["wall_s"] for line in lines)
    assert any(t.startswith("p99 ") and t.endswith(" s") for t in latency), latency  # labelled, with unit
    assert f"{charts.fmt(walls[0])} s" in latency  # the axis starts at the fastest sample
    legend = await _texts(page, "#chart-throughput g.legend")
    assert legend[0] == f"all: {len(lines)} samples, " + legend[0].split(", ")[1]
    assert all(t.endswith(" samples/s") for t in legend), legend
    assert await page.locator("#percentiles").inner_text() and "-" not in await _table_row(
        page, "#percentiles", "model s"
    )

    # The browser lists every sample; search finds the known one; a filter narrows.
    assert sorted(await _rows(page)) == sorted(line["key"] for line in lines)
    await page.fill("#f-q", MARKER)
    await expect(page.locator("#tf-rows tr")).to_have_count(1)
    assert await _rows(page) == [marked["key"]]
    await page.fill("#f-q", "")
    await page.select_option("#f-status", "filtered")
    await expect(page.locator("#tf-rows tr")).to_have_count(3)
    await page.select_option("#f-status", "")
    await page.select_option("#f-tool", "terminal")
    used_terminal = sum(1 for x in lines if x["tool_stats"]["terminal"]["count"])
    await expect(page.locator("#tf-rows tr")).to_have_count(used_terminal)
    await page.select_option("#f-tool", "")

    # A sample renders as think blocks, tool calls and results.
    await page.click(f"#tf-rows tr[data-key='{marked['key']}']")
    detail = page.locator("#tf-detail")
    assert await detail.locator("details.think pre").first.inner_text() == f"step 0 for find {MARKER}"
    assert await detail.locator(".call .name").first.inner_text() == "terminal"
    assert "echo out-0" in await detail.locator(".call pre").first.inner_text()
    assert await detail.locator(".result pre").first.inner_text() == "out-0\n"
    assert await detail.locator(".turn.role-assistant").count() == 3
    assert await detail.locator("h3").inner_text() == f"sample {marked['prompt_index']} · {marked['key']}"

    # The unparsed call reads as the text it was, never as a call to a tool.
    garbled = next(line for line in lines if line["conversations"][1]["value"] == "garbled call")
    await page.fill("#f-q", "garbled")
    await expect(page.locator("#tf-rows tr")).to_have_count(1)
    await page.click(f"#tf-rows tr[data-key='{garbled['key']}']")
    first = detail.locator(".turn.role-assistant").first
    assert "unparsed tool call (not run)" in await first.inner_text()
    assert await first.locator(".call .name").count() == 0
    await page.fill("#f-q", "")

    # The hostile sample is text: nothing ran, no element was made from it.
    await page.fill("#f-q", "evil")
    await expect(page.locator("#tf-rows tr")).to_have_count(1)
    await page.click(f"#tf-rows tr[data-key='{evil['key']}']")
    text = await detail.inner_text()
    assert XSS in text and "<script>window.__pwned=3</script>" in text and "<b onmouseover" in text
    assert await page.evaluate("window.__pwned") is None
    assert await page.locator("img").count() == 0 and await page.locator("#tf-detail b").count() == 0
    assert await page.locator("script").count() == 2  # the data block and the page's own script
    assert problems == []

    # The escaping alone holds: without the Content-Security-Policy nothing runs either.
    bare, problems = await _open(browser, out, bypass_csp=True)
    await bare.click(f"#tf-rows tr[data-key='{evil['key']}']")
    assert XSS in await bare.inner_text("#tf-detail")
    await bare.hover("#tf-detail")
    assert await bare.evaluate("window.__pwned") is None and await bare.locator("img").count() == 0
    assert problems == []


async def _texts(page: Any, selector: str) -> list[str]:
    return await page.eval_on_selector_all(f"{selector} text", "ts => ts.map(t => t.textContent)")


async def _table_row(page: Any, table: str, first_cell: str) -> list[str]:
    rows = await page.eval_on_selector_all(
        f"{table} tr", "rs => rs.map(r => Array.from(r.cells).map(c => c.textContent.trim()))"
    )
    return next(r for r in rows if r and r[0] == first_cell)


async def _check_rendering(page: Any, screenshot: Path) -> None:
    """What Chromium drew: every chart label inside its SVG's viewBox (nothing clipped), no
    "null" and no "no data" anywhere on the page, and a full-page screenshot of it."""
    outside = await page.evaluate(
        """() => Array.from(document.querySelectorAll("svg.chart-svg")).flatMap(svg => {
            const vb = svg.viewBox.baseVal;
            return Array.from(svg.querySelectorAll("text")).map(t => [t.textContent, t.getBBox()])
              .filter(([_, b]) => b.x < vb.x - 0.5 || b.y < vb.y - 0.5 ||
                      b.x + b.width > vb.x + vb.width + 0.5 || b.y + b.height > vb.y + vb.height + 0.5)
              .map(([text, b]) => `${svg.closest("figure").id}: ${text} at ${b.x.toFixed(1)}+${b.width.toFixed(1)}`);
        })"""
    )
    assert outside == [], outside
    text = await page.inner_text("body")
    assert "null" not in text and "no data" not in text and "undefined" not in text
    png = await page.screenshot(path=str(screenshot), full_page=True)
    assert len(png) > 10_000


def _synthetic_line(i: int, status: str, blob: str) -> bytes:
    reward: dict[str, Any] = {}
    if i % 3 == 0:
        reward = {"reward": (i % 10) / 10, "reward_breakdown": {"correct": float(i % 2), "format": 0.5}}
    elif i % 3 == 1:
        reward = {"reward": None}
    line = {
        "prompt_index": i,
        "key": f"k{i}",
        "status": status,
        "reason": "final_answer"
        if status == "completed"
        else f"{'timeout' if status == 'failed' else 'no_reasoning'}: why",
        "conversations": [
            {"from": "system", "value": "SYSTEM " + "tools " * 200},
            {"from": "human", "value": f"prompt {i}"},
            {
                "from": "gpt",
                "value": f'<think>\nthinking {i}\n</think>\n<tool_call>\n{{"name": "terminal", "arguments": {{"command": "cat big"}}}}\n</tool_call>',
            },
            {
                "from": "tool",
                "value": f'<tool_response>\n{{"tool_call_id": "c", "name": "terminal", "content": {{"output": "{blob}", "exit_code": 0}}}}\n</tool_response>',
            },
            {"from": "gpt", "value": f"<think>\nok\n</think>\nanswer {i}"},
        ],
        "metadata": {"model": "m"},
        "api_calls": 2,
        "toolsets_used": ["terminal"],
        "tool_stats": {"terminal": {"count": 1, "success": 1, "failure": 0}},
        "usage": {"total_tokens": 100 + i % 500, "completion_tokens": 20},
        "timings": {
            "wall_s": 0.5 + (i % 100) / 50,
            "model_s": 0.3,
            "tool_s": 0.1,
            "finished_at": f"2026-01-01T00:{(i // 1000) % 60:02d}:{(i // 17) % 60:02d}.000+00:00",
        },
        **reward,
    }
    return orjson.dumps(line) + b"\n"


async def test_a_large_run_is_sampled_and_the_file_bounded(tmp_path: Path, browser: Any) -> None:
    run = tmp_path / "big"
    run.mkdir()
    blob = "x" * 20_000  # every tool output is long: the cut and the size bound both matter
    n = 6000
    statuses = [
        "failed" if i in (17, 4242, 5999) else "filtered" if i % 50 == 0 else "completed" for i in range(n)
    ]
    with (run / "trajectories.jsonl").open("wb") as fh:
        fh.writelines(_synthetic_line(i, s, blob) for i, s in enumerate(statuses) if s == "completed")
    with (run / "filtered.jsonl").open("wb") as fh:
        fh.writelines(_synthetic_line(i, s, blob) for i, s in enumerate(statuses) if s == "filtered")
    with (run / "failed.jsonl").open("wb") as fh:
        fh.writelines(_synthetic_line(i, s, blob) for i, s in enumerate(statuses) if s == "failed")
    out = tmp_path / "big.html"
    opts = ReportOptions(max_trajectories=400, max_bytes=600_000, max_text_chars=1000)
    summary = build_report(run, out, opts)
    size = out.stat().st_size
    assert summary.lines == n and size == summary.size_bytes <= opts.max_bytes
    assert (
        summary.sampled == 400
        and 0 < summary.embedded < 400
        and summary.left_out_for_size == 400 - summary.embedded
    )
    html = out.read_text()
    data = orjson.loads(html.split('<script type="application/json" id="tf-data">')[1].split("</script>")[0])
    kept = data["records"]
    assert len(kept) == summary.embedded and len(data["systems"]) == 1  # the long system prompt stored once
    assert all(len(seg["text"]) < 1100 for r in kept for _, segs in r["t"] for seg in segs)
    assert kept[0]["t"][2][0] == "tool" and "19,000 characters cut" in kept[0]["t"][2][1][0]["text"]

    page, problems = await _open(browser, out)
    note = await page.inner_text("#tf-sampling")
    assert f"{summary.embedded:,} of {n:,}" in note and "left out to keep the file under" in note
    status_marks = dict(
        await page.eval_on_selector_all(
            "#chart-status svg .mark", "ms => ms.map(m => [m.dataset.label, Number(m.dataset.value)])"
        )
    )
    assert status_marks == {
        "completed": n - 120 - 3,
        "filtered": 120,
        "failed": 3,
    }  # statistics cover every line
    assert len(await _rows(page)) == 50  # one page of the list
    rewards = await page.eval_on_selector_all(
        "#chart-rewards svg rect.mark", "ms => ms.map(m => Number(m.dataset.value))"
    )
    assert sum(rewards) == n // 3
    table = await page.inner_text("#reward-table")
    assert "breakdown: correct" in table and "breakdown: format" in table
    count = await page.inner_text("#tf-count")
    await page.check("#f-hasr")
    with_reward = sum(1 for r in kept if r["rw"] is not None)
    assert count.startswith(f"{len(kept)} of {len(kept)}") and 0 < with_reward < len(kept)
    await expect(page.locator("#tf-count")).to_have_text(
        f"{with_reward} of {len(kept)} embedded trajectories match"
    )
    assert problems == []


async def test_rare_statuses_are_shown_whole_when_sampled(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    statuses = ["failed" if i in (3, 777) else "completed" for i in range(3000)]
    (run / "trajectories.jsonl").write_bytes(
        b"".join(_synthetic_line(i, s, "y") for i, s in enumerate(statuses) if s == "completed")
    )
    (run / "failed.jsonl").write_bytes(
        b"".join(_synthetic_line(i, s, "y") for i, s in enumerate(statuses) if s == "failed")
    )
    summary = build_report(run, None, ReportOptions(max_trajectories=100))
    assert summary.path == run / "report.html" and summary.embedded == 100 and summary.left_out_for_size == 0
    html = summary.path.read_text()
    data = orjson.loads(html.split('id="tf-data">')[1].split("</script>")[0])
    assert [r["i"] for r in data["records"] if r["s"] == "failed"] == [3, 777]
    assert sum(r["s"] == "completed" for r in data["records"]) == 98


def _env_policy() -> Any:
    """tiny_tasks arithmetic: the first rollout of an item computes in the terminal and answers
    right; the second first writes its call as broken text (the loop says it could not be parsed),
    then calls, then answers wrong. Each turn reports tokens and time, as an endpoint would."""
    from trajforge.llm.types import AssistantTurn, ToolCall, Usage

    started: dict[str, int] = {}

    def turn(content: str | None = None, calls: list[ToolCall] | None = None) -> AssistantTurn:
        return AssistantTurn(
            content=content,
            reasoning="thinking",
            tool_calls=calls or [],
            finish_reason="tool_calls" if calls else "stop",
            usage=Usage(prompt_tokens=120, completion_tokens=30, total_tokens=150),
            latency_s=0.05,
        )

    def policy(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> AssistantTurn:
        prompt = next(str(m["content"]) for m in messages if m["role"] == "user")
        done = sum(1 for m in messages if m["role"] == "assistant")
        if done == 0:
            started[prompt] = started.get(prompt, -1) + 1
            if started[prompt] % 2 == 1:
                return turn(GARBLED)
        second = any(m["role"] == "user" and "could not be parsed" in str(m["content"]) for m in messages)
        if not any(m["role"] == "tool" for m in messages):
            expr = prompt.split("What is ")[-1].split("?")[0] if "What is " in prompt else "1 + 1"
            for lead in ("Compute ", "Use the terminal to calculate "):
                if prompt.startswith(lead):
                    expr = prompt[len(lead) :].split(" using")[0].rstrip(".")
            call = ToolCall(
                id=f"c{done}",
                name="terminal",
                arguments=orjson.dumps({"command": f"echo $(({expr}))"}).decode(),
            )
            return turn(calls=[call])
        printed = orjson.loads(next(m["content"] for m in messages if m["role"] == "tool"))["output"].strip()
        return turn("The answer is 0." if second else f"The answer is {printed}.")

    return policy


@pytest.fixture
async def env_run(tmp_path: Path) -> Path:
    from trajforge.envs import RolloutBackends, load_env, run_eval
    from trajforge.sandbox import close_factory, create_sandbox_factory
    from trajforge.sandbox.types import SandboxConfig
    from trajforge.testing.scripted_model import ScriptedModel
    from trajforge.tools.builtin import default_registry

    env = load_env("tiny_tasks", {"families": ["arithmetic"], "max_concurrent_rollouts": 4})
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap"))
    run_dir = tmp_path / "env-run"
    try:
        model = ScriptedModel(_env_policy(), name="scripted-policy")
        await run_eval(env, RolloutBackends(model, factory, default_registry()), run_dir, n=3, group_size=2)
    finally:
        await close_factory(factory)
    return run_dir


@pytest.mark.bwrap
async def test_report_of_an_env_run_in_chromium(env_run: Path, browser: Any, tmp_path: Path) -> None:
    episodes = [orjson.loads(x) for x in (env_run / "episodes.jsonl").read_bytes().splitlines()]
    assert len(episodes) == 6 and sorted(e["reward"]["value"] for e in episodes) == [0.0] * 3 + [1.0] * 3
    out = tmp_path / "env.html"
    result = CliRunner().invoke(app, ["report", str(env_run), "--output", str(out)])
    assert result.exit_code == 0, result.output
    page, problems = await _open(browser, out)
    await _check_rendering(page, tmp_path / "env-report.png")

    run = await page.inner_text("#run")
    assert "tiny_tasks" in run and "scripted-policy" in run and "3 × 2" in run
    assert "mean reward [95% CI]\t0.500 [" in run and "pass@1 [95% CI]" in run
    # tokens, seconds in the model and in tools, finish times: what the episodes now record
    tokens = await page.eval_on_selector_all(
        "#chart-tokens svg rect.mark", "ms => ms.map(m => Number(m.dataset.value))"
    )
    assert sum(tokens) == 6
    for label in ("model s", "tool s", "total tokens"):
        row = await _table_row(page, "#percentiles", label)
        assert "-" not in row[1:], (label, row)
    assert await page.locator("#chart-throughput svg polyline.series").count() >= 2
    # rewards of 0 and 1: a bar each, labelled 0 and 1 (no bin edge such as 0.967)
    assert await _texts(page, "#chart-rewards") == ["3", "0", "0", "1"]
    assert [
        m
        for m in await page.eval_on_selector_all(
            "#chart-rewards svg rect.mark", "ms => ms.map(m => [m.dataset.label, Number(m.dataset.value)])"
        )
    ] == [["0", 3], ["1", 3]]
    unparsed = await _table_row(page, "#tool-table", "(unparsed tool call)")
    assert unparsed[1:] == ["3", "0", "3", "100.0%", "3"]

    # the browser names episodes by item and rollout
    title = await page.locator("#tf-detail h3").inner_text()
    assert title in {f"{e['item_id']} · rollout {e['rollout']} · arithmetic" for e in episodes}
    labels = await page.eval_on_selector_all("#tf-rows td.lbl", "ts => ts.map(t => t.textContent)")
    assert sorted(labels) == sorted(f"{e['item_id']} #{e['rollout']}" for e in episodes)
    assert len(set(labels)) == len(episodes)  # two rollouts of an item are two rows that read apart

    # the reward boxes apply as they are typed in (no Enter, no leaving the box)
    await page.fill("#f-rmin", "1")
    await expect(page.locator("#tf-rows tr")).to_have_count(3)
    assert (
        await page.locator("#tf-detail .kv").inner_text() != ""
        and "reward\t1" in await page.locator("#tf-detail .kv").inner_text()
    )
    # a filter nothing matches shows no trajectory, not the last one that matched something
    await page.fill("#f-rmin", "5")
    await expect(page.locator("#tf-rows tr")).to_have_count(0)
    await expect(page.locator("#tf-detail")).to_have_text("no embedded trajectory matches the filters")
    await page.fill("#f-rmin", "")
    await expect(page.locator("#tf-rows tr")).to_have_count(len(episodes))
    assert problems == []
