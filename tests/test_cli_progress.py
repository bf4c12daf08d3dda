"""Progress you can watch: the phase before anything is counted, done/total, rate and ETA; plain
lines off a terminal, a rich bar on one; export and report tell their progress; --json output stays
parseable on stdout."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from export_runs import tool_run
from trajforge.batch.progress import PlainProgress, RateWindow, RichProgress, Snapshot
from trajforge.cli.live import LiveProgress, eta_text
from trajforge.cli.main import app
from trajforge.export.formats import export
from trajforge.report import build_report


def _snap(done: int, elapsed: float, total: int = 100) -> Snapshot:
    return Snapshot(
        total=total,
        completed=done,
        failed=0,
        partial=0,
        filtered=0,
        session_done=done,
        elapsed_s=elapsed,
        tokens=0,
    )


def test_batch_plain_progress_shows_the_phase_instead_of_a_frozen_zero() -> None:
    out = io.StringIO()
    plain = PlainProgress("run", stream=out, every_s=0)
    plain.phase("starting the model server (embedded policy)")
    plain.update(_snap(0, 12.0))
    plain.phase("first samples in flight")
    plain.update(_snap(0, 20.0))
    plain.update(_snap(10, 30.0))
    lines = out.getvalue().splitlines()
    assert lines[:4] == [
        "[run] starting the model server (embedded policy)",
        "[run] 0/100 starting the model server (embedded policy) (12s)",
        "[run] first samples in flight",
        "[run] 0/100 first samples in flight (20s)",
    ]
    assert lines[4].startswith("[run] 10/100 completed=10") and "eta=" in lines[4]


def test_batch_rate_and_eta_follow_the_recent_window_not_the_slow_start() -> None:
    """40 s of start-up, then 2 samples/s: the ETA is from 2/s, not from done/elapsed."""
    window = RateWindow(window_s=30.0)
    window.add(_snap(0, 40.0, total=200))
    for t in range(1, 31):
        rate, eta = window.add(_snap(2 * t, 40.0 + t, total=200))
    assert rate == 2.0 and eta == (200 - 60) / 2.0
    assert _snap(60, 70.0, total=200).rate < 1.0  # what the whole session's average would have said


def test_eta_holds_steady_when_samples_finish_in_bursts() -> None:
    """Samples of a batch finish together (a batched model answers them at once): 8 every 40 s,
    a steady 0.2/s. The ETA must not swing with each burst (issue 43: 20m -> 4m50 -> 44m) and
    must track the truth: 1000 samples, from the tenth burst on within 25% of the true time left,
    and never rising by more than a tenth between two updates (it rises a little between bursts:
    the rate is measured up to now, so a stall would show)."""
    window = RateWindow()
    etas = []
    for second in range(0, 2000, 5):
        done = 8 * (second // 40)
        _, eta = window.add(_snap(done, 30.0 + second, total=1000))
        if second >= 400 and eta is not None:
            etas.append((second, done, eta))
    assert len(etas) > 100
    for (_, _, before), (second, _done, after) in zip(etas, etas[1:], strict=False):
        assert after <= before * 1.1, (second, before, after)
    for second, done, eta in etas:
        truth = (1000 - done) / 0.2
        assert abs(eta - truth) <= 0.25 * truth, (second, eta, truth)


def test_batch_rich_progress_shows_the_phase_then_the_counts() -> None:
    from rich.console import Console

    buf = io.StringIO()
    bar = RichProgress("run", 0, console=Console(file=buf, force_terminal=True, width=200))
    bar.phase("preflight: endpoint and sandbox")
    bar.update(_snap(0, 3.0))
    bar.update(_snap(5, 6.0))
    bar.close(_snap(5, 6.0))
    text = buf.getvalue()
    assert "preflight: endpoint and sandbox" in text and "5/100" in text and "ok 5" in text


def test_live_progress_plain_lines_have_phase_rate_and_eta() -> None:
    out = io.StringIO()
    now = [100.0]
    live = LiveProgress(
        "env eval tiny", unit="episodes", mode="plain", stream=out, every_s=0, quiet_s=0, clock=lambda: now[0]
    )
    live.phase("starting the embedded policy server")
    live.note("served on http://127.0.0.1:1234")
    live.phase("rollouts")
    live.advance(0, 10)
    now[0] += 10.0  # ten seconds later: the rate is 0.5/s
    live.advance(5, 10, "mean reward 0.400")
    lines = out.getvalue().splitlines()
    assert lines[0] == "[env eval tiny] starting the embedded policy server"
    assert lines[1] == "served on http://127.0.0.1:1234"
    assert lines[2] == "[env eval tiny] rollouts"
    assert lines[-1].startswith(
        "[env eval tiny] rollouts: 5/10 episodes | 0.50/s eta 10s | mean reward 0.400"
    )
    assert eta_text(3725) == "1h02m" and eta_text(125) == "2m05s" and eta_text(None) == "-"


def test_live_progress_is_quiet_for_short_work_and_none_prints_nothing() -> None:
    out = io.StringIO()
    live = LiveProgress("export", mode="plain", stream=out, every_s=0)  # default quiet_s: 2 s
    live.step("exporting", 1, 2)
    live.step("exporting", 2, 2)
    assert out.getvalue() == ""
    silent = LiveProgress("export", mode="none", stream=out, quiet_s=0)
    silent.step("exporting", 1, 2)
    silent.note("x")
    assert out.getvalue() == ""


def test_live_progress_rich_bar_renders_phase_and_figures() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    with LiveProgress("report", unit="lines", stream=out) as live:
        live.step("building the trajectory browser", 3, 6)
    assert "building the trajectory browser" in out.getvalue() and "3/6" in out.getvalue()


async def test_export_and_report_tell_their_progress(tmp_path: Path, scripted_batch_config: Any) -> None:
    run_dir = await tool_run(tmp_path, scripted_batch_config)
    seen: list[tuple[str, int, int]] = []
    export(run_dir, "messages", tmp_path / "m.jsonl", progress=lambda *a: seen.append(a))
    assert seen and all(phase == "exporting" for phase, _, _ in seen)
    assert seen[-1][1] == seen[-1][2] == (run_dir / "trajectories.jsonl").stat().st_size // 1024
    phases: list[str] = []
    build_report(run_dir, tmp_path / "r.html", progress=lambda phase, done, total: phases.append(phase))
    assert phases[0] == "reading the run's lines" and phases[-1] == "writing the page"
    assert "building the trajectory browser" in phases

    runner = CliRunner()
    result = runner.invoke(app, ["export", str(run_dir), "-f", "parquet", "--json", "--progress", "plain"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["rows"] == 2 and data["path"].endswith(".parquet") and "%|" not in result.stderr
    result = runner.invoke(app, ["report", str(run_dir), "--json", "-o", str(tmp_path / "r2.html")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["samples"] == 2 and (tmp_path / "r2.html").is_file()


def test_live_bar_keeps_its_numbers_whole_on_an_80_column_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Words give way on a narrow terminal, never done/total or the elapsed time (issue 43: env
    eval's elapsed column read ``0:00:…`` at 80 columns)."""
    import re

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("COLUMNS", "80")  # an 80-column terminal
    out = Terminal()
    live = LiveProgress("env eval tiny_tasks", unit="episodes", mode="rich", stream=out)
    live.phase("rollouts of the held-out items")
    live.advance(6, 12, "mean reward 0.750 pass@1 0.500")
    live._bar.refresh()
    live.close()
    last = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue()).split("\r")[-1].rstrip("\n")
    assert len(last) <= 80 and " 6/12 " in last and re.search(r" \d+:\d\d:\d\d ", last), last


def test_batch_notes_print_above_the_live_bar_whole() -> None:
    """The "No --model/--base-url given" note came out over the live bar, half a line of each (issue
    43): notes now go through the display, which prints them above itself."""
    import re

    from rich.console import Console

    buf = io.StringIO()
    bar = RichProgress("run", 0, console=Console(file=buf, force_terminal=True, width=80))
    bar.phase("starting the model server (embedded policy)")
    note = "No --model/--base-url given: using the embedded tiny policy served on loopback."
    bar.note(note)
    bar.update(_snap(5, 6.0))
    bar.close(_snap(5, 6.0))
    lines = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", buf.getvalue()).replace("\r", "\n").splitlines()
    assert note in [line.strip() for line in lines], lines


def test_plain_heartbeat_speaks_while_work_reports_nothing() -> None:
    """Work that reports rarely (rl train's first step: a minute on a CPU) says its phase and how
    long it has been in it, every few seconds, instead of nothing."""
    import time

    out = io.StringIO()
    live = LiveProgress("rl train", unit="steps", mode="plain", stream=out, quiet_s=0, heartbeat_s=0.05)
    live.phase("starting: loading the policy")
    for _ in range(400):  # until the heartbeat spoke twice (at most 20 s on a loaded machine)
        if out.getvalue().count("[rl train] starting: loading the policy (") >= 2:
            break
        time.sleep(0.05)
    live.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "[rl train] starting: loading the policy"
    assert sum(line.startswith("[rl train] starting: loading the policy (") for line in lines) >= 2, lines


async def test_before_the_first_sample_is_done_the_display_says_what_the_rollouts_did(
    tmp_path: Path, scripted_batch_config: Any
) -> None:
    """``make demo`` printed "0/20 first samples in flight" alone for its first 37 s (issue 43):
    the in-process worker counts model calls and tokens as they come, and the display says them."""
    import asyncio

    from trajforge.batch.runner import run_batch
    from trajforge.testing.scripted_server import Reply, ScriptedServer

    gate = asyncio.Event()

    async def policy(body: dict[str, Any]) -> Reply:
        if any(m["role"] == "assistant" for m in body["messages"]):
            await gate.wait()  # the second call of each sample waits: none can finish yet
            return Reply(content="done", reasoning="r")
        return Reply(reasoning="r", tool_calls=[_ls()])

    out = io.StringIO()
    sink = PlainProgress("demo", stream=out, every_s=0)
    async with ScriptedServer(policy, api_key="k") as srv:
        cfg = scripted_batch_config([{"prompt": f"p{i}"} for i in range(3)], srv.base_url, progress="plain")
        run = asyncio.create_task(run_batch(cfg, progress=sink))
        for _ in range(1200):  # until the display says it (at most a minute on a loaded machine)
            if "3 model calls answered" in out.getvalue():
                break
            await asyncio.sleep(0.05)
        gate.set()
        await run
    waiting = [line for line in out.getvalue().splitlines() if "model calls answered" in line]
    assert waiting and waiting[-1].startswith("[demo] 0/3 first samples in flight: 3 model calls answered, ")
    assert " tokens generated (" in waiting[-1]


def _ls() -> Any:
    from trajforge.testing.scripted_server import ToolCallSpec

    return ToolCallSpec("terminal", {"command": "ls"})


def test_the_activity_line_never_counts_unknown_usage_as_zero() -> None:
    """An endpoint that reports no usage (llm.types.Usage: None is unknown) leaves the token count
    unsaid, or a floor when some answers said it: never a total that passes for the whole."""
    from trajforge.batch.scheduler import Activity

    assert Activity(model_calls=2, tokens=40).text() == "2 model calls answered, 40 tokens generated"
    assert Activity(model_calls=2, tokens_unknown=2).text() == "2 model calls answered"
    some = Activity(model_calls=3, tokens=40, tokens_unknown=1).text()
    assert some == "3 model calls answered, at least 40 tokens generated"
