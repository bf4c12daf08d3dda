"""verifiers 0.4.0's own ``vf-eval`` runs a trajforge env (taskset + harness plugin).

A scripted OpenAI-compatible endpoint on 127.0.0.1 plays the policy: it writes the requested
word into ``answer.txt`` with trajforge's ``write_file`` tool for some items and a wrong word for
others. Every model call goes through verifiers' interception server; each rollout runs in its
own bwrap sandbox, and the reward is the env's ``compute_reward`` reading the file back there.
The test checks the rewards in verifiers' ``traces.jsonl`` are exactly those.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verifiers", reason="the verifiers extra is not installed (pip install '.[verifiers]')")

from trajforge.testing.replies import Reply, ToolCallSpec  # noqa: E402
from trajforge.testing.scripted_server import last_user_text  # noqa: E402

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.timeout(300),
]

WORDS = ["apple", "river", "stone", "cloud"]

ENV_SOURCE = textwrap.dedent(
    '''
    """A test env: write a word into answer.txt; judged by reading it back in the sandbox."""
    from typing import Any, ClassVar

    from trajforge.envs.base import BaseEnv
    from trajforge.envs.config import EnvConfig
    from trajforge.envs.types import RewardBreakdown

    WORDS = {words!r}


    class AnswerFileEnv(BaseEnv):
        name: ClassVar[str] = "answer_file"

        @classmethod
        def default_config(cls) -> EnvConfig:
            return EnvConfig(enabled_toolsets=["file"], max_agent_turns=3, sandbox="bwrap")

        def eval_items(self, n: int) -> list[dict[str, Any]]:
            return [{{"id": f"w{{i}}", "word": WORDS[i % len(WORDS)]}} for i in range(n)]

        def format_prompt(self, item: dict[str, Any]) -> str:
            return f"Write the word {{item['word']}} into answer.txt."

        async def compute_reward(self, item, result, ctx) -> RewardBreakdown:
            run = await ctx.exec("cat answer.txt; echo; pwd")
            if run.exit_code != 0:
                return RewardBreakdown(reward=0.0, reason="answer.txt missing")
            text, where = run.stdout.decode().rsplit("\\n", 2)[:2]
            exact = text.strip() == item["word"]
            return RewardBreakdown(reward=1.0 if exact else 0.5, components={{"exact": float(exact)}}, reason=where)
    '''
).format(words=WORDS)

PLUGIN_SOURCE = textwrap.dedent(
    """
    from trajforge.rl.adapters.verifiers import EnvHarness, EnvTaskset

    __all__ = ["EnvTaskset", "EnvHarness"]
    """
)


def writer_policy(body: dict[str, Any]) -> Reply:
    """First turn: write the word (or, for 'river' and 'cloud', a wrong one); then answer."""
    if any(m.get("role") == "tool" for m in body["messages"]):
        return Reply(content="done")
    word = re.search(r"Write the word (\w+)", last_user_text(body))
    assert word is not None, last_user_text(body)
    text = word.group(1) if word.group(1) in ("apple", "stone") else "wrong"
    return Reply(tool_calls=[ToolCallSpec("write_file", {"path": "answer.txt", "content": text + "\n"})])


async def test_vf_eval_runs_a_trajforge_env_with_sandbox_rewards(
    scripted_server: Any, tmp_path: Path
) -> None:
    server = await scripted_server(writer_policy)
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "answer_env.py").write_text(ENV_SOURCE)
    (plugins / "trajforge_env_plugin.py").write_text(PLUGIN_SOURCE)
    vf_eval = Path(sys.executable).with_name("vf-eval")
    assert vf_eval.exists(), "verifiers' vf-eval console script is missing"
    out = tmp_path / "outputs"
    argv = [
        str(vf_eval),
        "trajforge_env_plugin",
        "--env.taskset.env",
        f"{plugins / 'answer_env.py'}:AnswerFileEnv",
        "--env.taskset.size",
        "4",
        "--env.agent.runtime.type",
        "subprocess",
        "-m",
        "scripted",
        "--client.base-url",
        server.base_url,
        "--client.api-key-var",
        "TF_NO_SUCH_KEY",
        "-n",
        "4",
        "-r",
        "2",
        "--no-push",
        "--no-rich",
        "-o",
        str(out),
        "--run.dir",
        "run",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(proc.communicate(), timeout=240)
    log = output.decode(errors="replace")
    assert proc.returncode == 0, log[-4000:]

    traces_file = out / "run" / "traces.jsonl"
    assert traces_file.exists(), log[-4000:]
    traces = [json.loads(line) for line in traces_file.read_text().splitlines() if line.strip()]
    assert len(traces) == 8, log[-4000:]
    host_has_workspace = os.path.exists("/workspace")  # noqa: ASYNC240 (one stat, after the run)
    by_word: dict[str, list[float]] = {}
    for episode in traces:
        assert episode["ok"] and episode["errors"] == [], episode["errors"]
        (t,) = episode["traces"]
        data = t["task"]["data"]
        info = t["info"]["trajforge"]
        assert info["status"] == "completed" and info["reward_error"] is None
        # judged inside bwrap: the verifier's pwd is the sandbox's own workdir, not a host path
        assert info["reward_reason"] == "/workspace" and not host_has_workspace
        reward = t["rewards"]["env_reward"]["score"]
        assert t["metrics"]["trajforge_reward"] == reward
        by_word.setdefault(data["item"]["word"], []).append(reward)
        # both model calls went through verifiers' interception (recorded on its trace)
        assert len(t["calls"]) == 2 and t["calls"][0]["finish_reason"] == "tool_calls"
    assert by_word == {"apple": [1.0, 1.0], "river": [0.5, 0.5], "stone": [1.0, 1.0], "cloud": [0.5, 0.5]}
    # and the scripted endpoint really served them: two calls per rollout
    assert server.counters["requests"] == 16
