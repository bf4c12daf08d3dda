"""A sandbox that breaks under a rollout is the infrastructure's failure, not the model's.

Before: the exec agent's death became a tool result ("sandbox exec agent failed") and the rollout
went on to a final answer saved as *completed* although none of its later commands had run.
"""

from __future__ import annotations

import os
import shutil
import signal

import pytest

from trajforge.agent import AgentConfig, AgentLoop
from trajforge.sandbox import SandboxBrokenError, SandboxConfig, create_sandbox_factory
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools import ToolContext, default_registry
from trajforge.tools.files import MAX_LOAD_BYTES

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]


@pytest.fixture
async def sandbox(tmp_path):
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=str(tmp_path / "sb")))
    sb = await factory.create("broken")
    try:
        yield sb
    finally:
        await sb.close()


async def test_a_dead_exec_agent_ends_the_rollout_as_an_infrastructure_error(sandbox):
    killed: list[int] = []

    def policy(messages, tools, sampling):
        if len(messages) > 2 and not killed:  # after the first command: the sandbox dies under the rollout
            killed.append(sandbox.agent.pid)
            os.kill(sandbox.agent.pid, signal.SIGKILL)
            # and everything under it at once: a command in the resident shell takes about a
            # millisecond, less than bwrap's own teardown of the agent after its parent died
            sandbox.cgroup.kill_all()
        if len(messages) > 4:
            return answer("all done")
        return tool_turn(("terminal", {"command": "echo step"}), ("terminal", {"command": "echo twin"}))

    tools = default_registry().for_toolsets(["terminal"])
    loop = AgentLoop(ScriptedModel(policy), tools, ToolContext(task_id="t", sandbox=sandbox), AgentConfig())
    with pytest.raises(SandboxBrokenError):
        await loop.run([{"role": "user", "content": "go"}])


async def test_read_file_never_loads_more_than_its_bound(sandbox):
    """The model picks the file; a 40 MB one is read only up to MAX_LOAD_BYTES, and it is told."""
    size = MAX_LOAD_BYTES + 8 * 1024 * 1024
    await sandbox.exec(f"head -c {size} /dev/zero | tr '\\0' 'a' | fold -w 1000 > big.txt", timeout=60)
    ctx = ToolContext(task_id="t", sandbox=sandbox)
    read_file = default_registry().get("read_file")
    out = await read_file({"path": "big.txt", "offset": MAX_LOAD_BYTES // 1001 - 5}, ctx)
    assert f"only the first {MAX_LOAD_BYTES} bytes" in out.content
    patch = default_registry().get("patch")
    refused = await patch({"path": "big.txt", "old_string": "a", "new_string": "b"}, ctx)
    assert not refused.ok and "larger than" in refused.content
