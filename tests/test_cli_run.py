"""``trajforge run`` end to end: real CLI process, scripted endpoint on loopback, bwrap sandbox."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from trajforge.testing.scripted_server import Reply, ScriptedServer, ToolCallSpec

TRAJFORGE = str(Path(sys.executable).with_name("trajforge"))


def _run(args: list[str], cwd: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the CLI; one that outlives the timeout is asked for its stacks (SIGUSR1) before it is
    killed, so a hang fails the test with where it hung."""
    env = {**os.environ, **(env_extra or {})}
    proc = subprocess.Popen(
        [TRAJFORGE, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(3)
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"trajforge {args} hung; its stacks:\n{err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_run_prints_answer_and_saves_trajectory(tmp_path: Path):
    script = [
        Reply(
            reasoning="I should count with the shell",
            tool_calls=[ToolCallSpec("terminal", {"command": "printf 'a\\nb\\nc\\n' | wc -l"})],
        ),
        Reply(content="There are 3 lines.", reasoning="wc said 3"),
    ]
    secret = "sk-test-secret-value-123"
    with ScriptedServer(script, api_key=secret).in_thread() as srv:
        proc = _run(
            [
                "run",
                "count lines",
                "--model",
                "scripted",
                "--base-url",
                srv.base_url,
                "--api-key-env",
                "MY_KEY",
                "--toolsets",
                "terminal,file",
                "--output",
                "out.jsonl",
            ],
            tmp_path,
            {"MY_KEY": secret},
        )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "There are 3 lines."
    table = [
        line.split() for line in proc.stderr.splitlines() if line.split()[:1] in (["tool"], ["terminal"])
    ]
    assert table == [["tool", "calls", "ok", "failed"], ["terminal", "1", "1", "0"]], proc.stderr
    line = orjson.loads((tmp_path / "out.jsonl").read_bytes())
    conv = line["conversations"]
    assert [t["from"] for t in conv] == ["system", "human", "gpt", "tool", "gpt"]
    assert conv[1]["value"] == "count lines"
    assert conv[2]["value"].startswith("<think>\nI should count with the shell\n</think>\n<tool_call>")
    assert '"content": {"output": "3\\n", "exit_code": 0}' in conv[3]["value"]
    assert line["completed"] is True and line["termination"] == "final_answer"
    assert line["messages"][0]["role"] == "user"
    assert secret not in (tmp_path / "out.jsonl").read_text() + proc.stdout + proc.stderr


def test_run_reports_bad_key_and_unknown_toolset(tmp_path: Path):
    with ScriptedServer([Reply(content="hi")], api_key="right").in_thread() as srv:
        proc = _run(
            ["run", "hi", "--model", "m", "--base-url", srv.base_url, "--api-key-env", "K"],
            tmp_path,
            {"K": "wrong-key-xyz"},
        )
        assert proc.returncode == 1
        failed = orjson.loads((tmp_path / "failed_trajectories.jsonl").read_bytes())
        assert failed["completed"] is False and failed["termination"] == "model_error"
        assert "401" in proc.stderr and "wrong-key-xyz" not in proc.stderr

        proc = _run(
            ["run", "hi", "--model", "m", "--base-url", srv.base_url, "--toolsets", "teleport"], tmp_path
        )
        assert proc.returncode == 2 and "unknown toolset 'teleport'" in proc.stderr
        proc = _run(["run", "hi", "--model", "m"], tmp_path)
        assert proc.returncode == 2 and "--base-url" in proc.stderr


def test_sigusr1_prints_the_stacks_of_a_waiting_run_and_it_carries_on(tmp_path: Path):
    """A run that seems stuck (here: an endpoint slow to answer) says where it waits on SIGUSR1:
    every thread's stack and every pending asyncio task's, and then it goes on to finish."""
    with ScriptedServer([Reply(content="late answer")], latency_s=4.0).in_thread() as srv:
        proc = subprocess.Popen(
            [TRAJFORGE, "run", "hi", "--model", "m", "--base-url", srv.base_url, "--toolsets", "file"],
            cwd=tmp_path,
            env={**os.environ, "OPENAI_API_KEY": "k"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while srv.counters["requests"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.counters["requests"] == 1, "the run never reached the endpoint"
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.strip() == "late answer"
    assert "SIGUSR1, the stacks of every thread" in err and "end of dump" in err
    assert "asyncio task(s) pending" in err and "run_session" in err, err


async def test_run_offers_toolsets_configured_in_tools_config(tmp_path: Path):
    """`--tools-config` gives `trajforge run` the same tools section a batch has: without it, asking
    for the web toolset is refused naming the fix; with it, web_search reaches the configured
    (SearXNG-compatible, loopback) backend and its result reaches the model."""
    import asyncio

    import yaml

    sys.path.insert(0, str(Path(__file__).parent / "site"))
    from localsite import start_site

    async def trajforge(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            TRAJFORGE, *args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    site = await start_site()
    site.search_results = [{"title": "Lighthouse", "url": site.url("/page1"), "content": "keeper's log"}]
    script = [
        Reply(tool_calls=[ToolCallSpec("web_search", {"query": "lighthouse keepers"})]),
        Reply(content="The keeper's log."),
    ]
    conf = tmp_path / "tools.yaml"
    conf.write_text(
        yaml.safe_dump(
            {
                "tools": {
                    "network": {"allow_cidrs": ["127.0.0.0/8"]},
                    "web": {"provider": "searxng", "endpoint": site.base},
                }
            }
        )
    )
    try:
        with ScriptedServer(script).in_thread() as srv:
            base = ["run", "find it", "--model", "scripted", "--base-url", srv.base_url, "--toolsets", "web"]
            code, _, err = await trajforge(*base)
            # web_extract needs no backend, so the toolset runs without web_search, said once
            assert "web_search" in err and "--tools-config" in err, err
            offered = [t["function"]["name"] for t in srv.requests[0]["tools"]]
            assert offered == ["web_extract"], offered
            # a toolset none of whose tools can run here is an error before any model call
            calls = len(srv.requests)
            code, _, err = await trajforge(*base[:-1], "vision")
            assert code == 2 and "vision" in err and "--tools-config" in err, err
            assert len(srv.requests) == calls
        with ScriptedServer(script).in_thread() as srv:
            base = ["run", "find it", "--model", "scripted", "--base-url", srv.base_url, "--toolsets", "web"]
            code, out, err = await trajforge(*base, "--tools-config", str(conf), "--output", "out.jsonl")
            assert sorted(t["function"]["name"] for t in srv.requests[0]["tools"]) == [
                "web_extract",
                "web_search",
            ]
        assert code == 0, err
        assert out.strip() == "The keeper's log."
        line = orjson.loads((tmp_path / "out.jsonl").read_bytes())
        tool_msgs = [m for m in line["messages"] if m["role"] == "tool"]
        assert len(tool_msgs) == 1 and "Lighthouse" in tool_msgs[0]["content"], tool_msgs
        assert any("/search" in r for r in site.requests), site.requests
    finally:
        await site.runner.cleanup()
