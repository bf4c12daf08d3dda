"""A model cannot set its own limits: durations and sizes in tool arguments are bounded.

Issue 9, item 4: ``terminal`` honoured ``timeout: 1e9`` (a ``sleep 100`` outlived everything) and
read NaN as "timed out at once"; ``trajforge run`` had no session deadline. Real bubblewrap
sandboxes, the real agent loop with :class:`ScriptedModel`, and the real CLI against a scripted
endpoint on loopback. Wall-clock bounds below are generous ceilings, never measurements.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from trajforge.agent import AgentConfig, Termination, run_session
from trajforge.batch.config import ConfigError, load_config
from trajforge.batch.scheduler import build_agent_config
from trajforge.sandbox import create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.testing import ScriptedModel, answer, tool_turn
from trajforge.testing.scripted_server import Reply, ScriptedServer, ToolCallSpec
from trajforge.tools import ToolContext, ToolLimits, default_registry

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

TRAJFORGE = str(Path(sys.executable).with_name("trajforge"))
CEILING_S = 60.0  # far above any clamp used here; only catches a command that was not killed
LIMITS = ToolLimits(max_command_timeout_s=1, max_tail_bytes=64, max_read_lines=3, max_search_results=2)


@pytest.fixture
async def ctx():
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", command_timeout_s=20))
    sandbox = await factory.create("limits")
    try:
        yield ToolContext(task_id="limits", sandbox=sandbox, limits=LIMITS)
    finally:
        await sandbox.close()


@pytest.fixture(scope="module")
def registry():
    return default_registry()


async def call(registry, ctx, name, **args):
    return await registry.get(name)(args, ctx)


async def _exists(ctx: ToolContext, path: str) -> bool:
    res = await ctx.sandbox.exec(f"test -e {path} && echo present || echo absent")
    return res.output.strip() == "present"


async def test_huge_timeout_is_clamped_and_the_model_is_told(registry) -> None:
    """Through the agent loop: the model asks for 1e9 s, the command dies at the 1 s maximum."""
    model = ScriptedModel(
        [tool_turn(("terminal", {"command": "sleep 100", "timeout": 1e9})), answer("gave up")]
    )
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap"))
    started = time.monotonic()
    result = await run_session(
        "sleep",
        model=model,
        registry=registry,
        toolsets=["terminal"],
        sandbox_factory=factory,
        config=AgentConfig(tool_limits=ToolLimits(max_command_timeout_s=1)),
    )
    assert time.monotonic() - started < CEILING_S
    assert result.termination is Termination.FINAL_ANSWER
    [error] = result.tool_errors
    assert error.tool_name == "terminal" and error.error == "timeout"
    body = orjson.loads(result.messages[2]["content"])
    assert "timed out" in body["error"] and body["exit_code"] is None
    assert body["clamped"] == "timeout 1e+09s is more than the 1s allowed; it was set to 1s"


@pytest.mark.parametrize("timeout", ["NaN", "nan", "inf", "-Infinity", "1e999", -1, 0, -0.0])
async def test_non_finite_or_negative_timeouts_are_tool_errors_and_nothing_runs(
    registry, ctx, timeout
) -> None:
    out = await call(registry, ctx, "terminal", command="touch ran", timeout=timeout)
    assert not out.ok
    # The allowed range, for the model to correct itself.
    assert "'timeout' must be a number of seconds greater than 0 and at most 1;" in out.content
    assert "The command was not run" in out.content
    assert not await _exists(ctx, "ran")


@pytest.mark.parametrize("timeout", ["soon", True, [5], {"s": 5}])
async def test_timeouts_that_are_not_numbers_are_tool_errors(registry, ctx, timeout) -> None:
    out = await call(registry, ctx, "terminal", command="touch ran", timeout=timeout)
    assert not out.ok and "'timeout' must be a number" in out.content
    assert not await _exists(ctx, "ran")


async def test_nan_literal_in_raw_arguments_never_reaches_the_tool(registry) -> None:
    """``{"timeout": NaN}`` is not JSON: reported as such to the model, the command not run."""
    raw = '{"command": "touch ran", "timeout": NaN}'
    look = {"command": "test -e ran && echo present || echo absent"}
    model = ScriptedModel([tool_turn(("terminal", raw)), tool_turn(("terminal", look)), answer("ok")])
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap"))
    result = await run_session(
        "nan", model=model, registry=registry, toolsets=["terminal"], sandbox_factory=factory
    )
    [error] = result.tool_errors
    assert "not valid JSON" in error.error and "not run" in error.error
    assert orjson.loads(result.messages[-2]["content"])["output"] == "absent\n"


async def test_timeouts_within_the_limit_are_kept(registry, ctx) -> None:
    out = await call(registry, ctx, "terminal", command="echo fine", timeout="0.9")
    body = orjson.loads(out.content)
    assert out.ok and body["output"] == "fine\n" and "clamped" not in body


async def test_process_wait_and_tail_are_bounded(registry, ctx) -> None:
    started = orjson.loads(
        (
            await call(
                registry,
                ctx,
                "terminal",
                command="head -c 500 /dev/zero | tr '\\0' x; sleep 100",
                background=True,
            )
        ).content
    )
    proc = started["id"]
    begun = time.monotonic()
    out = await call(registry, ctx, "process", action="wait", id=proc, timeout=1e9, tail_bytes=10**30)
    assert time.monotonic() - begun < CEILING_S
    body = orjson.loads(out.content)
    assert body["status"] == "running" and body["note"] == "still running after waiting 1s"
    assert "timeout 1e+09s is more than the 1s allowed" in body["clamped"]
    assert "tail_bytes 1e+30 is more than the 64 allowed; it was set to 64" in body["clamped"]
    out = await call(registry, ctx, "process", action="read", id=proc, tail_bytes=10**30)
    body = orjson.loads(out.content)
    assert out.ok and body["output"] == "x" * 64
    assert body["clamped"] == "tail_bytes 1e+30 is more than the 64 allowed; it was set to 64"
    for bad in ("nan", -1, 0, 2.5, "inf"):
        out = await call(registry, ctx, "process", action="read", id=proc, tail_bytes=bad)
        assert not out.ok and "'tail_bytes' must be a whole number from 1 to 64" in out.content
    for bad in ("nan", "-inf", -3):
        out = await call(registry, ctx, "process", action="wait", id=proc, timeout=bad)
        assert not out.ok and "greater than 0 and at most 1" in out.content
    await call(registry, ctx, "process", action="kill", id=proc)


async def test_file_tool_sizes_are_bounded(registry, ctx) -> None:
    await ctx.sandbox.exec('for i in $(seq 0 9); do echo "line $i hit"; done > f.txt')
    out = await call(registry, ctx, "read_file", path="f.txt", offset=2, limit=1e12)
    assert out.ok
    assert out.content.splitlines()[:3] == ["line 1 hit", "line 2 hit", "line 3 hit"]
    assert "[limit 1e+12 is more than the 3 allowed; it was set to 3]" in out.content
    assert "use offset=5 to continue" in out.content
    out = await call(registry, ctx, "read_file", path="f.txt", offset=1e300)
    assert out.ok and out.content == ""  # past the end: nothing, not a crash
    for name, bad in (("offset", "nan"), ("offset", -1), ("limit", "inf"), ("limit", 0), ("limit", 1.5)):
        out = await call(registry, ctx, "read_file", path="f.txt", **{name: bad})
        assert not out.ok and f"'{name}' must be a whole number" in out.content, (name, bad)

    out = await call(registry, ctx, "search_files", pattern="hit", max_results=10**9)
    body = orjson.loads(out.content)
    assert out.ok and body["count"] == 2
    assert body["clamped"] == "max_results 1e+09 is more than the 2 allowed; it was set to 2"
    for bad in ("NaN", "inf", -5, 0):
        out = await call(registry, ctx, "search_files", pattern="hit", max_results=bad)
        assert not out.ok and "'max_results' must be a whole number from 1 to 2" in out.content


def test_limits_are_typed_and_reach_batch_rollouts(tmp_path: Path) -> None:
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_command_timeout_s"):
            ToolLimits(max_command_timeout_s=bad)
    ds = tmp_path / "d.jsonl"
    ds.write_text('{"prompt": "p"}\n')
    base = dict(dataset=ds, run_name="r", output_dir=tmp_path, model="m", base_url="http://127.0.0.1:9/v1")
    cfg = load_config(None, {**base, "max_command_timeout": 5, "command_timeout": 5})
    assert build_agent_config(cfg, []).tool_limits.max_command_timeout_s == 5
    with pytest.raises(ConfigError, match="command_timeout 60s is above --max-command-timeout 5s"):
        load_config(None, {**base, "max_command_timeout": 5})


def _run_cli(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    proc = subprocess.run(
        [TRAJFORGE, *args], cwd=cwd, env=dict(os.environ), capture_output=True, text=True, timeout=180
    )
    return proc, time.monotonic() - started


def test_run_session_deadline_ends_with_timeout(tmp_path: Path) -> None:
    """``trajforge run`` always ends: the model's 1e9 s command is cut at the session deadline."""
    script = [
        Reply(
            reasoning="wait", tool_calls=[ToolCallSpec("terminal", {"command": "sleep 100", "timeout": 1e9})]
        ),
        Reply(content="never reached"),
    ]
    with ScriptedServer(script).in_thread() as srv:
        common = ["--model", "scripted", "--base-url", srv.base_url]
        proc, elapsed = _run_cli(
            [
                "run",
                "sleep",
                *common,
                "--toolsets",
                "terminal",
                "--sample-timeout",
                "3",
                "--output",
                "out.jsonl",
            ],
            tmp_path,
        )
    assert proc.returncode == 1, proc.stderr
    assert elapsed < CEILING_S + 30
    line = orjson.loads((tmp_path / "out.jsonl").read_bytes())
    assert line["termination"] == Termination.TIMEOUT.value and line["completed"] is False
    assert "session deadline of 3s passed" in proc.stderr
    assert "Traceback" not in proc.stderr

    for flag, bad in (
        ("--sample-timeout", "nan"),
        ("--sample-timeout", "0"),
        ("--max-command-timeout", "inf"),
    ):
        proc, _ = _run_cli(["run", "x", "--model", "m", flag, bad], tmp_path)
        named = flag
        assert proc.returncode == 2 and f"{named} must be a number of seconds greater than 0" in proc.stderr
