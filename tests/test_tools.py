"""Terminal and file tools against real sandboxes (local for speed, bwrap for confinement)."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from trajforge.sandbox import create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.tools import ToolContext, default_registry
from trajforge.tools.toolsets import TOOLSETS, UnknownToolsetError


@pytest.fixture(params=["local", "bwrap"])
async def ctx(request):
    factory = create_sandbox_factory(SandboxConfig(kind=request.param, command_timeout_s=20))
    sandbox = await factory.create("tools-test")
    try:
        yield ToolContext(task_id="tools-test", sandbox=sandbox)
    finally:
        await sandbox.close()


@pytest.fixture(scope="module")
def registry():
    return default_registry()


async def call(registry, ctx, name, **args):
    return await registry.get(name)(args, ctx)


def test_every_declared_tool_is_registered(registry):
    """Registered, or (its backend not configured) marked unavailable with the reason."""
    for toolset, names in TOOLSETS.items():
        for name in names:
            tool = registry.get(name)
            if tool is None:
                assert registry.unavailable_reason(name), name
                continue
            assert tool.toolset == toolset
            assert tool.parameters["type"] == "object"
    with pytest.raises(UnknownToolsetError, match="known toolsets"):
        registry.for_toolsets(["terminal", "nope"])


async def test_pending_toolset_says_it_is_not_implemented(registry, ctx):
    out = await call(registry, ctx, "rl_list_environments")
    assert not out.ok and "not implemented" in out.content


async def test_terminal_session_persists_cd_and_exports(registry, ctx):
    out = await call(registry, ctx, "terminal", command="mkdir -p sub && cd sub && export FOO=bar")
    assert out.ok
    out = await call(registry, ctx, "terminal", command="basename $(pwd); echo $FOO; exit 3")
    body = orjson.loads(out.content)
    # ``exit`` ends the shell as in ``bash -c``; the model is told, and the session goes on
    assert body["output"] == (
        "sub\nbar\n\n[the shell ended (status 3); the next command runs in a new shell with the "
        "session as it was before this command]\n"
    )
    assert body["exit_code"] == 3 and "truncated" not in body
    assert out.ok  # a non-zero exit is the command's result, not a tool failure
    out = await call(registry, ctx, "terminal", command="basename $(pwd); echo $FOO")
    assert orjson.loads(out.content)["output"] == "sub\nbar\n"


@pytest.mark.parametrize("kind", ["local", "bwrap"])
async def test_the_output_cap_is_the_outputs_alone(registry, kind):
    """A command printing exactly the cap and ending its shell: the model reads all it printed and
    the note after it; the note neither counts against the cap nor is cut by it."""
    factory = create_sandbox_factory(SandboxConfig(kind=kind, command_timeout_s=20, output_cap_bytes=64))
    sandbox = await factory.create("cap-test")
    try:
        ctx = ToolContext(task_id="cap-test", sandbox=sandbox)
        out = await call(registry, ctx, "terminal", command="printf 'x%.0s' $(seq 64); exit 3")
        body = orjson.loads(out.content)
        assert body == {
            "output": "x" * 64 + "\n[the shell ended (status 3); the next command runs in a new shell "
            "with the session as it was before this command]\n",
            "exit_code": 3,
        }
    finally:
        await sandbox.close()


async def test_terminal_timeout_is_a_tool_failure(registry, ctx):
    out = await call(registry, ctx, "terminal", command="sleep 30", timeout=0.5)
    assert not out.ok and "timed out" in out.content


async def test_background_process_lifecycle(registry, ctx):
    out = await call(registry, ctx, "terminal", command="echo start; sleep 0.3; echo end", background=True)
    proc_id = orjson.loads(out.content)["id"]
    waited = orjson.loads(
        (await call(registry, ctx, "process", action="wait", id=proc_id, timeout=10)).content
    )
    assert waited["status"] == "exited" and waited["exit_code"] == 0
    assert "start" in waited["output"] and "end" in waited["output"]

    out = await call(registry, ctx, "terminal", command="sleep 100", background=True)
    long_id = orjson.loads(out.content)["id"]
    polled = orjson.loads((await call(registry, ctx, "process", action="poll", id=long_id)).content)
    assert polled["status"] == "running"
    await call(registry, ctx, "process", action="kill", id=long_id)
    polled = orjson.loads((await call(registry, ctx, "process", action="poll", id=long_id)).content)
    assert polled["status"] == "exited"
    listing = orjson.loads((await call(registry, ctx, "process", action="list")).content)
    assert {p["id"] for p in listing["processes"]} == {proc_id, long_id}
    bad = await call(registry, ctx, "process", action="poll", id="nope")
    assert not bad.ok and proc_id in bad.content


async def test_file_tools_roundtrip_patch_and_search(registry, ctx):
    out = await call(registry, ctx, "write_file", path="pkg/a.py", content="x = 1\ny = 2\nx = 1\n")
    assert out.ok, out.content
    out = await call(registry, ctx, "read_file", path="pkg/a.py", offset=2, limit=1)
    assert out.content.startswith("y = 2") and "more lines" in out.content

    dup = await call(registry, ctx, "patch", path="pkg/a.py", old_string="x = 1", new_string="x = 3")
    assert not dup.ok and "2 times" in dup.content
    missing = await call(registry, ctx, "patch", path="pkg/a.py", old_string="zzz", new_string="q")
    assert not missing.ok and "not found" in missing.content
    ok = await call(registry, ctx, "patch", path="pkg/a.py", old_string="y = 2", new_string="y = 5")
    assert ok.ok
    assert (await ctx.sandbox.read_bytes("pkg/a.py")) == b"x = 1\ny = 5\nx = 1\n"

    found = orjson.loads((await call(registry, ctx, "search_files", pattern="y = 5")).content)
    assert found["count"] == 1 and "pkg/a.py:2:y = 5" in found["matches"][0]
    none = orjson.loads((await call(registry, ctx, "search_files", pattern="absent-text")).content)
    assert none["matches"] == []


async def test_search_files_leaves_the_session_as_it_was(registry, ctx):
    """The search runs in the rollout's resident shell: it must not end it (an ``exit`` there ends
    the shell as in ``bash -c``), which would kill the model's background jobs and put the shell's
    note among the matches."""
    await call(registry, ctx, "terminal", command="echo hit > f.txt; KEEP=1; sleep 300 &")
    for pattern in ("hit", "absent-text"):  # grep's status 0 and 1
        body = orjson.loads((await call(registry, ctx, "search_files", pattern=pattern)).content)
        assert body["matches"] == (["./f.txt:1:hit"] if pattern == "hit" else []), body
    out = orjson.loads((await call(registry, ctx, "terminal", command="echo $KEEP; jobs | wc -l")).content)
    assert out["output"] == "1\n1\n", out


async def test_file_tools_refuse_paths_outside_the_sandbox(registry, ctx):
    out = await call(registry, ctx, "write_file", path="../../escape.txt", content="x")
    assert not out.ok and "permission denied" in out.content
    out = await call(registry, ctx, "read_file", path="/etc/passwd")
    assert not out.ok
    out = await call(registry, ctx, "read_file", path="missing.txt")
    assert not out.ok and "not found" in out.content


async def test_bad_arguments_are_reported(registry, ctx):
    out = await call(registry, ctx, "terminal")
    assert not out.ok and "'command' is required" in out.content
    out = await call(registry, ctx, "process", action="explode")
    assert not out.ok and "unknown action" in out.content


async def test_parallel_read_only_calls_do_not_interfere(registry, ctx):
    for i in range(5):
        await ctx.sandbox.write_bytes(f"f{i}.txt", f"content {i}".encode())
    outs = await asyncio.gather(*(call(registry, ctx, "read_file", path=f"f{i}.txt") for i in range(5)))
    assert [o.content for o in outs] == [f"content {i}" for i in range(5)]
