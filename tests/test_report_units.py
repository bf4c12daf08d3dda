"""The report's parts on their own: file names, turn splitting, cuts, sampling, escaping, CLI errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from trajforge.cli.main import app
from trajforge.record import Record, RecordError, Reward, load
from trajforge.report.facts import RunFacts, percentiles
from trajforge.report.page import embed_json
from trajforge.report.sample import StatusSampler
from trajforge.report.source import OUTPUT_FILES, RUN_FILE, STATISTICS_FILE, LineRef
from trajforge.report.turns import RecordBuilder, cut, segments


def test_file_names_are_the_batch_factorys() -> None:
    from trajforge.batch import run_file, writer
    from trajforge.engine import books

    assert set(OUTPUT_FILES) == {*writer.OUTPUT_FILES.values(), books.EPISODES_FILE}
    assert RUN_FILE == run_file.RUN_FILE
    assert STATISTICS_FILE == "statistics.json"


def test_turn_text_splits_into_think_calls_results_and_text() -> None:
    gpt = (
        '<think>\nplan </tool_call> a\n</think>\nsome text\n<tool_call>\n{"name": "terminal", "arguments": '
        '{"command": "ls"}}\n</tool_call>\n<tool_call>\nnot json\n</tool_call>'
    )
    segs = segments(gpt, 1000)
    assert [s["k"] for s in segs] == ["think", "text", "call", "call"]
    assert segs[0]["text"] == "plan </tool_call> a" and segs[1]["text"] == "some text"
    assert segs[2]["name"] == "terminal" and json.loads(segs[2]["text"]) == {"command": "ls"}
    assert segs[3]["bad"] is True and segs[3]["text"] == "not json"
    tool = (
        '<tool_response>\n{"tool_call_id": "c", "name": "terminal", "content": {"output": "boom", "exit_code": 2}}\n'
        '</tool_response>\n<tool_response>\n{"name": "x", "content": "Error: unknown tool"}\n</tool_response>'
    )
    res = segments(tool, 1000)
    assert [(s["k"], s["name"], s["text"], s.get("err")) for s in res] == [
        ("result", "terminal", "boom", True),
        ("result", "x", "Error: unknown tool", True),
    ]
    assert res[0]["meta"] == '{"exit_code": 2}'
    # A scratchpad is a think block; an unclosed think runs to the end.
    assert segments("<REASONING_SCRATCHPAD>s</REASONING_SCRATCHPAD>ok", 100) == [
        {"k": "think", "text": "s"},
        {"k": "text", "text": "ok"},
    ]
    assert segments("<think>cut off", 100) == [{"k": "think", "text": "cut off"}]


def test_long_text_keeps_head_and_tail() -> None:
    text = "A" * 5000 + "Z" * 5000
    short = cut(text, 1000)
    assert short.startswith("A" * 750) and short.endswith("Z" * 250) and "9,000 characters cut" in short
    assert cut("short", 1000) == "short"


def test_record_stores_the_system_prompt_once_and_reads_tools_and_rewards() -> None:
    builder = RecordBuilder(500)
    line = {
        "prompt_index": 4,
        "key": "k",
        "status": "completed",
        "conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "hi"}],
        "tool_stats": {"terminal": {"count": 2, "success": 1, "failure": 1}, "process": {"count": 0}},
        "toolsets_used": ["terminal"],
        "reward": 0.5,
        "reward_breakdown": {"a": 1},
    }
    first, second = builder.record(load(line)), builder.record(load({**line, "reward": None}))
    assert builder.systems == ["S"] and first["sys"] == second["sys"] == 0
    assert first["tu"] == ["terminal"] and first["tf"] == ["terminal"] and first["p"] == "hi"
    assert first["rw"] == 0.5 and first["rb"] == {"a": 1} and second["rw"] is None
    with pytest.raises(RecordError, match="reward"):  # a bool is not a reward: no record
        load({**line, "reward": True})


def test_facts_handle_missing_fields_and_reasons() -> None:
    facts = RunFacts()
    facts.add(
        Record(
            key="a",
            status="filtered",
            reason="no_reasoning: x; hallucinated_tool: tool 'web' not offered; assistant turn 3 reasoning: y",
            reason_kind="no_reasoning,hallucinated_tool",
            reward=Reward(value=float("nan")),
        )
    )
    facts.add(Record(key="b", status="failed", reason="error(rate_limit): too many"))  # no reason_kind: older
    facts.add(None)
    facts.add(
        Record(
            key="c", status="completed", reward=Reward(value=1, components={"c": 1}), timings={"wall_s": 2}
        )
    )
    assert facts.lines == 3 and facts.unreadable == 1
    # one sample, one count, under the key statistics.json counts it by: never bars split off the text
    assert facts.reasons["filtered"] == {"no_reasoning,hallucinated_tool": 1}
    assert facts.reasons["failed"] == {"error(rate_limit)": 1}
    assert facts.rewards == [1.0] and facts.no_reward == 2 and facts.reward_parts == {"c": [1.0]}
    assert percentiles([1, 2, 3, 4]) == {"mean": 2.5, "p50": 2, "p90": 4, "p99": 4, "max": 4}
    assert percentiles([])["p50"] is None


def test_sampler_gives_rare_statuses_their_whole_share() -> None:
    sampler = StatusSampler(10, seed=1)
    for i in range(1000):
        sampler.offer("completed", LineRef(0, i, 1))
    for i in range(3):
        sampler.offer("failed", LineRef(2, i, 1))
    for i in range(20):
        sampler.offer("filtered", LineRef(1, i, 1))
    assert sampler.quotas()["failed"] == 3 and sum(sampler.quotas().values()) == 10
    chosen = sampler.chosen()
    assert len(chosen) == 10 and len(set(chosen)) == 10
    assert sum(1 for ref in chosen if ref.file == 2) == 3
    assert StatusSampler(0, 0).chosen() == []


def test_embedded_json_cannot_close_its_script_block() -> None:
    value = {"t": "</script><script>alert(1)</script><!-- & \u2028"}
    raw = embed_json(value)
    assert b"<" not in raw and b">" not in raw and b"&" not in raw and "\u2028".encode() not in raw
    assert orjson.loads(raw) == value


def test_cli_says_what_is_wrong(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "nope does not exist" in result.output
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2 and "is not a run directory trajforge wrote" in result.output
    (tmp_path / "trajectories.jsonl").write_bytes(b"")
    result = runner.invoke(app, ["report", str(tmp_path), "--max-size-mb", "0.1"])
    assert result.exit_code == 2 and "--max-size-mb must be at least 0.5" in result.output
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0 and (tmp_path / "report.html").exists()
    assert "the run has no samples yet" in (tmp_path / "report.html").read_text()


def _episode(rollout: int, reward: float) -> bytes:
    from trajforge.envs.types import Episode

    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": f"count files {rollout}"},
        {
            "role": "assistant",
            "content": None,
            "reasoning": "I should run ls",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"output": "a\\nb\\n", "exit_code": 0}'},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c2", "type": "function", "function": {"name": "terminal", "arguments": "not json"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "Error: arguments are not JSON"},
        {"role": "assistant", "content": "<think>two</think>2 files"},
    ]
    episode = Episode(
        env="tiny_tasks",
        item_id=f"item{rollout}",
        rollout=rollout,
        group_size=2,
        seed=rollout,
        item={"q": "count"},
        toolsets=["terminal"],
        tools=["terminal"],
        messages=messages,
        status="completed",
        termination="final_answer",
        turns=3,
        reward=Reward(value=reward, components={"correct": reward, "format": 1.0}),
        timings={"wall_s": 1.5},
        key=f"item{rollout}#{rollout}",
        tool_stats={"terminal": {"count": 2, "success": 1, "failure": 1}},
    )
    return orjson.dumps(episode.model_dump(mode="json")) + b"\n"


def test_an_env_run_reads_as_a_batch_run(tmp_path: Path) -> None:
    """``episodes.jsonl`` lines (OpenAI messages, reward components) get the same report."""
    from trajforge.report import build_report

    (tmp_path / "episodes.jsonl").write_bytes(_episode(0, 1.0) + _episode(1, 0.0))
    summary = build_report(tmp_path)
    assert summary.lines == 2 and summary.embedded == 2
    html = summary.path.read_text()
    data = orjson.loads(html.split('id="tf-data">')[1].split("</script>")[0])
    first = data["records"][0]
    assert data["systems"] == ["be brief"] and first["key"] == "item0#0" and first["p"] == "count files 0"
    assert first["tu"] == ["terminal"] and first["tf"] == ["terminal"] and first["n"] == 3
    assert first["rw"] == 1.0 and first["rb"] == {"correct": 1.0, "format": 1.0}
    kinds = [[seg["k"] for seg in segs] for _, segs in first["t"]]
    assert kinds == [["text"], ["think", "call"], ["result"], ["call"], ["result"], ["think", "text"]]
    assert first["t"][1][1][1]["name"] == "terminal" and json.loads(first["t"][1][1][1]["text"]) == {
        "command": "ls"
    }
    assert first["t"][2][1][0]["text"] == "a\nb\n" and first["t"][2][1][0]["meta"] == '{"exit_code": 0}'
    assert first["t"][3][1][0]["bad"] is True and first["t"][4][1][0]["err"] is True
    assert 'id="chart-rewards"' in html and "breakdown: correct" in html


def test_a_few_distinct_rewards_get_a_bar_each_and_continuous_axes_end_at_their_last_edge() -> None:
    from trajforge.report import charts

    svg = str(charts.histogram([0.0, 1.0, 1.0, 0.0, 1.0], "reward", discrete_max=12))
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert labels == ["3", "0", "0", "1"] and "0.967" not in svg  # peak, zero, then one bar per value
    walls = [0.5 + k / 10 for k in range(40)]
    svg = str(charts.histogram(walls, "wall", " s", markers={"p50": 2.5, "p99": 4.4}))
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert "0.5 s" in labels and "4.4 s" in labels  # the first and the last bin edge (p99), not a bin start
    line_x = float(re.search(r'<line x1="([\d.]+)"[^>]*class="marker"><title>p99', svg).group(1))
    text_x = float(re.search(r'<text x="([\d.]+)"[^>]*>p99 4\.4 s<', svg).group(1))
    assert line_x == 630.0 and text_x < line_x  # at the right edge the label leans left of its line
