"""The seed's reward verbs on the verifier context under the real bwrap sandbox: ``terminal()``
(output and exit code, timeouts, a fresh hardened shell by default), ``upload``/``download``,
``web_search`` refused when not configured, and the same-session mode: a service the agent
started, its cwd and its exported variables are seen by reward code in ``reward_shell: session``
and not in the default."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, ClassVar

import pytest

from trajforge.envs import RolloutBackends, Rollouts
from trajforge.envs.base import BaseEnv
from trajforge.envs.config import EnvConfig
from trajforge.envs.library.swe import SweEnv
from trajforge.envs.types import RewardBreakdown
from trajforge.envs.verifier import VerifierContext
from trajforge.sandbox import SandboxConfig, agent_scripts, close_factory, create_sandbox_factory
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools.builtin import default_registry

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

# The agent's work: a directory it cds into, a variable it exports, a service it leaves running.
SERVE = (
    "mkdir -p site && cd site && printf 'hello from the agent\\n' > index.html && "
    "export SERVICE_TOKEN=t0k3n && "
    "(setsid python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 &) && "
    "for i in $(seq 50); do python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8765/')\" "
    "2>/dev/null && break; sleep 0.1; done; echo started"
)
CHECK = (
    "echo cwd=$(basename $PWD) token=${SERVICE_TOKEN:-unset}; "
    "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8765/index.html', timeout=3).read().decode())\""
)


class ServiceEnv(BaseEnv):
    """Reward: the agent's service answers; components say what the reward shell saw."""

    name: ClassVar[str] = "service_check"

    def generate(self, index: int, *, split: str) -> dict[str, Any]:
        return {"id": f"s{index}", "prompt": "Serve index.html on 127.0.0.1:8765."}

    async def compute_reward(self, item: Any, result: Any, ctx: VerifierContext) -> RewardBreakdown:
        got = await ctx.terminal(CHECK, timeout=30)
        out = got["output"]
        return RewardBreakdown(
            reward=1.0 if got["exit_code"] == 0 and "hello from the agent" in out else 0.0,
            components={
                "in_site": float("cwd=site" in out),
                "token": float("token=t0k3n" in out),
                "served": float("hello from the agent" in out),
            },
            reason=f"{(out.splitlines() or [''])[0]} | {out[-200:]}",
        )


@pytest.fixture
async def factory(tmp_path):
    f = create_sandbox_factory(SandboxConfig(kind="bwrap", root_dir=str(tmp_path / "sb")))
    yield f
    await close_factory(f)


def _episode_env(shell: str) -> ServiceEnv:
    return ServiceEnv(EnvConfig(enabled_toolsets=["terminal"], max_agent_turns=3, reward_shell=shell))


async def _run(env: BaseEnv, factory: Any, turns: list[Any]) -> Any:
    backends = RolloutBackends(model=ScriptedModel(turns), factory=factory, registry=default_registry())
    return await Rollouts(env, backends).episode(env.generate(0, split="train"))


async def test_session_mode_sees_the_agents_service_cwd_and_variables(factory):
    turns = [tool_turn(("terminal", {"command": SERVE})), answer("serving")]
    ep = await _run(_episode_env("session"), factory, turns)
    assert ep.reward.value == 1.0, ep.reward.reason
    assert ep.reward.components == {"in_site": 1.0, "token": 1.0, "served": 1.0}


async def test_default_fresh_mode_sees_none_of_them(factory):
    turns = [tool_turn(("terminal", {"command": SERVE})), answer("serving")]
    ep = await _run(_episode_env("fresh"), factory, turns)
    # the rollout's processes were stopped and the reward shell is a clean one from the workdir
    assert ep.reward.value == 0.0
    assert ep.reward.components == {"in_site": 0.0, "token": 0.0, "served": 0.0}, ep.reward.reason
    assert "token=unset" in (ep.reward.reason or "") and "cwd=site" not in (ep.reward.reason or "")


async def test_session_mode_refuses_the_trusted_runners(factory):
    """A signed verifier result means nothing while the rollout's processes live: swe refuses."""
    env = SweEnv(SweEnv.default_config().with_overrides({"reward_shell": "session"}))
    task = env.eval_items(1)[0]
    from trajforge.envs.agents import oracle_model_for

    backends = RolloutBackends(
        model=ScriptedModel(["unused"]),
        factory=factory,
        registry=default_registry(),
        model_for=oracle_model_for(env),
    )
    ep = await Rollouts(env, backends).episode(task)
    assert ep.reward.value == 0.0
    assert "reward_shell: session" in (ep.reward.reason or ""), ep.reward.reason


class VerbsEnv(BaseEnv):
    """Exercises the verbs in one reward call; the components say which behaved."""

    name: ClassVar[str] = "verbs"
    host_dir: ClassVar[Path]

    def generate(self, index: int, *, split: str) -> dict[str, Any]:
        return {"id": "v", "prompt": "nothing"}

    async def compute_reward(self, item: Any, result: Any, ctx: VerifierContext) -> RewardBreakdown:
        checks: dict[str, float] = {}
        ok = await ctx.terminal("echo out; echo err >&2; exit 3")
        checks["exit_code"] = float(ok["exit_code"] == 3 and not ok["timed_out"])
        checks["output"] = float("out" in ok["output"] and "err" in ok["output"])
        slow = await ctx.terminal("sleep 30", timeout=1)
        checks["timeout"] = float(slow["exit_code"] == -1 and slow["timed_out"])
        # fresh: the rollout's HOME (its ~), in the hardened environment, not the rollout's session
        env_out = (await ctx.terminal("echo $HOME; echo ${PYTHONPATH:-none}; echo $XDG_CONFIG_HOME"))[
            "output"
        ]
        checks["rollouts_home"] = float(env_out.splitlines()[0] == ctx.workdir and "none" in env_out)
        checks["own_config"] = float(".trajforge-verifier" in env_out.splitlines()[2])
        checks["in_order"] = float(ok["output"] == "out\nerr\n")
        # upload / download of a file and of a tree, byte exact
        up = self.host_dir / "up"
        (up / "d").mkdir(parents=True)
        (up / "d" / "b.bin").write_bytes(bytes(range(256)))
        (up / "a.txt").write_text("alpha\n")
        written = await ctx.upload(up, "incoming")
        one = await ctx.upload(up / "a.txt", "single.txt")
        checks["upload"] = float(
            sorted(written) == ["incoming/a.txt", "incoming/d/b.bin"]
            and one == ["single.txt"]
            and (await ctx.read_file("incoming/d/b.bin")) == bytes(range(256))
        )
        down = await ctx.download("incoming", self.host_dir / "down")
        single = await ctx.download("single.txt", self.host_dir / "single.txt")
        checks["download"] = float(
            len(down) == 2
            and (self.host_dir / "down" / "d" / "b.bin").read_bytes() == bytes(range(256))
            and single == [self.host_dir / "single.txt"]
        )
        await ctx.write_file("w.txt", "written")
        checks["write_read"] = float(await ctx.read_file("w.txt") == b"written")
        try:
            await ctx.web_search("anything")
            checks["web_refused"] = 0.0
        except KeyError as exc:
            checks["web_refused"] = float("not configured" in str(exc))
        listed = await ctx.call_tool("terminal", {"command": "ls incoming"})
        checks["call_tool"] = float("a.txt" in listed.content)
        return RewardBreakdown(reward=min(checks.values()), components=checks, reason=str(checks))


async def test_terminal_and_the_file_verbs(factory, tmp_path):
    VerbsEnv.host_dir = tmp_path / "host"
    env = VerbsEnv(EnvConfig(enabled_toolsets=["terminal"], max_agent_turns=2))
    ep = await _run(env, factory, [answer("done")])
    assert ep.reward.error is None, ep.reward.reason
    assert all(v == 1.0 for v in (ep.reward.components or {}).values()), ep.reward.components
    assert ep.reward.value == 1.0


async def test_the_rl_agent_cannot_choose_the_session_shell_or_host_paths(tmp_path):
    """Where reward commands run, and the swe env's host paths, are the operator's settings."""
    from trajforge.rl.runs.manager import Manager
    from trajforge.rl.runs.tools import RLToolSettings, rl_tools
    from trajforge.tools.base import ToolContext

    tools = {
        t.name: t for t in rl_tools(Manager(tmp_path / "runs"), RLToolSettings(envs_dir=tmp_path / "envs"))
    }
    ctx = ToolContext(task_id="rl")
    picked = await tools["rl_select_environment"]({"name": "swe"}, ctx)
    assert picked.ok, picked.content
    for field, value in (
        ("reward_shell", "session"),
        ("instances", "/etc/passwd"),
        ("repos_dir", "/"),
        ("test_env_dir", "/home"),
    ):
        out = await tools["rl_edit_config"]({"field": field, "value": value}, ctx)
        assert not out.ok and f"{field} is locked" in out.content, out.content


async def test_web_verbs_call_the_runs_configured_web_tools(factory):
    """``web_search`` / ``web_extract`` go to the run's web tools (a SearXNG-style server and a
    site on 127.0.0.1, allowed by the policy), as the model's calls would."""
    import sys

    import orjson

    from trajforge.tools.netpolicy import NetPolicy
    from trajforge.tools.web import WebConfig, web_tools

    sys.path.insert(0, str(Path(__file__).parent / "site"))
    from localsite import start_site

    site = await start_site()
    sandbox = await factory.create("web-verbs")
    try:
        site.search_results = [
            {"title": "The lighthouse keeper", "url": site.url("/page1"), "content": "log"}
        ]
        cfg = WebConfig(provider="searxng", endpoint=site.base, policy=NetPolicy(allow_cidrs=["127.0.0.0/8"]))
        ctx = VerifierContext(sandbox, tools={t.name: t for t in web_tools(cfg)})
        found = await ctx.web_search("lighthouse keeper")
        assert found.ok and orjson.loads(found.content)["results"][0]["url"] == site.url("/page1")
        page = await ctx.web_extract([site.url("/page1")])
        assert page.ok and "lighthouse" in page.content.lower()
    finally:
        await sandbox.close()
        await site.runner.cleanup()


class PlacementEnv(BaseEnv):
    """Places a verifier file at an absolute path outside the workdir, as Hermes Agent's Terminal-
    Bench 2 env puts its tests in ``/tests``; and one through a link the rollout made."""

    name = "placement_test"
    target: ClassVar[str] = "/tests/test.sh"
    swallow: ClassVar[bool] = False

    def generate(self, index: int, *, split: str) -> dict[str, Any]:
        return {"id": f"p{index}", "prompt": "do nothing"}

    async def compute_reward(self, item: Any, result: Any, ctx: VerifierContext) -> RewardBreakdown:
        try:
            await ctx.write_file(self.target, "exit 0\n")
        except OSError as exc:  # what a seed env's ToolContext turns into an error dict: scores 0
            return RewardBreakdown(reward=0.0, reason=f"OSError: {exc}")
        except Exception as exc:  # as Hermes Agent's benchmark envs do: "verification failed", 0
            if self.swallow:
                return RewardBreakdown(reward=0.0, reason=f"swallowed: {exc}")
            raise
        return RewardBreakdown(reward=1.0, reason="placed")


async def test_a_verifier_that_cannot_place_its_files_fails_the_reward_not_the_rollout(factory):
    """bwrap's system is read-only: a verifier file at /tests cannot be written there. That is
    the setup's failure, said as a reward error naming --sandbox docker, never a silent 0 (the
    published TB2 env scored every correct rollout 0 this way)."""
    env = PlacementEnv(EnvConfig(enabled_toolsets=["terminal"], max_agent_turns=2))
    ep = await _run(env, factory, [answer("done")])
    assert ep.reward.error is not None and "VerifierPlacementError" in ep.reward.error, ep.reward.reason
    assert "--sandbox docker" in ep.reward.error
    PlacementEnv.swallow = True  # reward code that catches every exception cannot score it either
    try:
        ep = await _run(env, factory, [answer("done")])
    finally:
        PlacementEnv.swallow = False
    assert ep.reward.error is not None and "VerifierPlacementError" in ep.reward.error, ep.reward.reason


async def test_a_write_the_rollout_blocked_is_the_rollouts_failure(factory):
    """A link the rollout left in /tmp that points into the read-only system: the verifier's write
    fails there too, but the rollout caused it (it may be avoiding its verdict), so it stays an
    OSError the env scores, not a reward error that would drop the episode from training."""
    env = PlacementEnv(EnvConfig(enabled_toolsets=["terminal"], max_agent_turns=2))
    PlacementEnv.target = "/tmp/blocked/test.sh"
    try:
        turns = [tool_turn(("terminal", {"command": "ln -s /usr/share /tmp/blocked"})), answer("done")]
        ep = await _run(env, factory, turns)
    finally:
        PlacementEnv.target = "/tests/test.sh"
    assert ep.reward.error is None, ep.reward.error
    assert ep.reward.value == 0.0 and (ep.reward.reason or "").startswith("OSError"), ep.reward.reason


# What a command prints that reads like the sandbox's note: the command's own output, to be kept.
LOOKALIKE = "\n[the shell ended (status 0); the next command runs in a new shell, says this command]\n"


class NotesEnv(BaseEnv):
    """Reward code in the rollout's session reads what its commands printed, exactly: the
    sandbox's notes come apart from the output, never cut out of it by their wording."""

    name: ClassVar[str] = "notes"
    seen: ClassVar[dict[str, Any]] = {}

    def generate(self, index: int, *, split: str) -> dict[str, Any]:
        return {"id": "n", "prompt": "nothing"}

    async def compute_reward(self, item: Any, result: Any, ctx: VerifierContext) -> RewardBreakdown:
        quoted = LOOKALIKE.replace("\n", "\\n")
        type(self).seen = {
            "lookalike": await ctx.terminal(f"printf '{quoted}'"),
            "ended": await ctx.terminal("echo out; exit 3"),
        }
        return RewardBreakdown(reward=1.0)


async def test_session_output_is_what_the_command_printed_and_notes_come_apart(factory):
    env = NotesEnv(EnvConfig(enabled_toolsets=["terminal"], max_agent_turns=2, reward_shell="session"))
    ep = await _run(env, factory, [answer("done")])
    assert ep.reward.value == 1.0, ep.reward.reason
    lookalike, ended = NotesEnv.seen["lookalike"], NotesEnv.seen["ended"]
    # before, a regex cut the note's words out of the output, whoever printed them
    assert lookalike == {"output": LOOKALIKE, "exit_code": 0, "timed_out": False, "notes": []}
    assert ended["output"] == "out\n" and ended["exit_code"] == 3, ended
    assert ended["notes"] == [agent_scripts.ENDED % 3], ended
