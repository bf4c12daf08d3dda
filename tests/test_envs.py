"""Environments: rollouts judged in their own sandbox (real bwrap, reused sandboxes), the
verifier's context, reward isolation and the attacks a rollout can try on its own reward."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any, ClassVar

import orjson
import pytest

from trajforge.agent.result import AgentResult
from trajforge.engine.limiter import ResizableLimiter
from trajforge.envs import (
    BaseEnv,
    EnvConfig,
    EnvConfigError,
    Episode,
    Item,
    RewardBreakdown,
    RolloutBackends,
    Rollouts,
    UnknownEnvError,
    VerifierContext,
    load_env,
    pass_at_k,
    read_episodes,
    run_eval,
    summarize,
)
from trajforge.record import Reward
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools.builtin import default_registry


def _first_user(messages: list[dict[str, Any]]) -> str:
    return next(str(m["content"]) for m in messages if m["role"] == "user")


def _turns(messages: list[dict[str, Any]]) -> int:
    return sum(m["role"] == "assistant" for m in messages)


class ProbeEnv(BaseEnv):
    """Each item names a marker; the rollout writes it; the reward checks that its own marker is
    there and that no other item's marker is (reused sandboxes must not leak)."""

    name: ClassVar[str] = "probe"
    description: ClassVar[str] = "test env"

    def generate(self, index: int, *, split: str) -> Item:
        return {"id": f"p{index}", "prompt": f"write marker m{index}", "marker": f"m{index}"}

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        files = await ctx.exec(["ls", "-A"])
        names = set(files.text.split())
        others = {n for n in names if n.startswith("m") and n != item["marker"]}
        own = item["marker"] in names
        return RewardBreakdown(
            reward=1.0 if own and not others else 0.0,
            components={"own": float(own), "others": float(len(others))},
            reason=f"files: {sorted(names)}",
        )


def _marker_policy(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
    marker = _first_user(messages).split()[-1]
    if _turns(messages) == 0:
        return tool_turn(("terminal", {"command": f"echo x > {marker}"}))
    return answer("done")


async def test_reward_sees_only_its_own_rollout_with_reused_sandboxes(bwrap: Any) -> None:
    env = ProbeEnv(EnvConfig(enabled_toolsets=["terminal"], max_concurrent_rollouts=4))
    backends = RolloutBackends(ScriptedModel(_marker_policy), bwrap, default_registry())
    rollouts = Rollouts(env, backends)
    items = [env.generate(i, split="eval") for i in range(6)]
    # two waves: the second runs in sandboxes reset after the first
    for wave in (items[:3], items[3:]):
        groups = await asyncio.gather(*(rollouts.group(item, 2) for item in wave))
        for group in groups:
            for ep in group:
                assert ep.reward.value == 1.0, ep.reward.reason
                assert ep.status == "completed"
                assert ep.toolsets == ["terminal"]
    assert len({ep.seed for ep in groups[0]}) == 2  # each rollout its own recorded seed


class PlantEnv(BaseEnv):
    """Hidden test files arrive after the rollout: what the rollout planted is overwritten."""

    name: ClassVar[str] = "plant"
    description: ClassVar[str] = "test env"

    def generate(self, index: int, *, split: str) -> Item:
        return {"id": f"q{index}", "prompt": "solve it"}

    def verifier_files(self, item: Item) -> dict[str, str]:
        return {"tests/check.sh": 'test "$(cat answer.txt)" = 42\n', "reward.txt": "0\n"}

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> float:
        res = await ctx.exec(["bash", "tests/check.sh"])
        reward_file = (await ctx.read_file("reward.txt")).decode().strip()
        return 1.0 if res.ok and reward_file == "0" else 0.0


def _cheater(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
    if _turns(messages) == 0:
        return tool_turn(
            (
                "terminal",
                {
                    "command": "mkdir -p tests bin && printf 'exit 0\\n' > tests/check.sh && echo 1 > reward.txt "
                    "&& echo 41 > answer.txt && printf '#!/bin/sh\\nexit 0\\n' > bin/bash && chmod +x bin/bash "
                    "&& export PATH=$PWD/bin:$PATH"
                    " && (while true; do echo 1 > reward.txt; echo 42 > answer.txt; sleep 0.01; done) "
                    ">/dev/null 2>&1 &"
                },
            )
        )
    return answer("done")


async def test_a_rollout_cannot_plant_tests_reward_files_path_or_a_background_writer(bwrap: Any) -> None:
    env = PlantEnv(EnvConfig(enabled_toolsets=["terminal"]))
    rollouts = Rollouts(env, RolloutBackends(ScriptedModel(_cheater), bwrap, default_registry()))
    ep = await rollouts.episode(env.generate(0, split="eval"))
    # The planted tests/check.sh and reward.txt were replaced, PATH is the sandbox's own, and the
    # loop that keeps writing 42 was killed before the verifier looked: answer.txt may hold 41 or
    # 42 depending on timing, so the check is made stricter below with a known-wrong answer.
    assert ep.reward.error is None
    final = await _answer_file_after(rollouts, env)
    assert final == 0.0


async def _answer_file_after(rollouts: Rollouts, env: PlantEnv) -> float:
    def policy(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
        if _turns(messages) == 0:
            return tool_turn(
                (
                    "terminal",
                    {
                        "command": "echo 41 > answer.txt; (sleep 0.5; while true; do echo 42 > answer.txt; "
                        "sleep 0.01; done) >/dev/null 2>&1 &"
                    },
                )
            )
        return answer("done")

    rollouts.backends.model = ScriptedModel(policy)
    ep = await rollouts.episode(env.generate(1, split="eval"))
    return ep.reward.value


class BigOutputEnv(BaseEnv):
    name: ClassVar[str] = "big"
    description: ClassVar[str] = "test env"

    def generate(self, index: int, *, split: str) -> Item:
        return {"id": "big", "prompt": "nothing"}

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        res = await ctx.exec(
            'python3 -c "import sys; sys.stdout.buffer.write(bytes(range(256)) * 204800)"; echo err >&2; exit 3'
        )
        digest = hashlib.sha256(res.stdout).hexdigest()
        ok = digest == hashlib.sha256(bytes(range(256)) * 204800).hexdigest()
        return RewardBreakdown(
            reward=float(ok and res.exit_code == 3 and res.stderr == b"err\n"),
            components={"bytes": float(len(res.stdout))},
        )


async def test_verifier_exec_returns_50_mb_intact_with_exit_code_and_stderr(bwrap: Any) -> None:
    env = BigOutputEnv(EnvConfig(enabled_toolsets=["terminal"]))
    rollouts = Rollouts(env, RolloutBackends(ScriptedModel(["ok"]), bwrap, default_registry()))
    ep = await rollouts.episode(env.generate(0, split="eval"))
    assert ep.reward.components["bytes"] == 256 * 204800  # 50 MiB
    assert ep.reward.value == 1.0, ep


class FilesEnv(BaseEnv):
    name: ClassVar[str] = "files"
    description: ClassVar[str] = "test env"

    def generate(self, index: int, *, split: str) -> Item:
        return {"id": "f", "prompt": "nothing"}

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        blob = bytes(range(256)) * 3
        await ctx.write_file("deep/dir/blob.bin", blob)
        same = await ctx.read_file("deep/dir/blob.bin") == blob
        # an argument that would be shell code if interpolated is passed as data
        evil = "x; touch pwned #"
        await ctx.write_file(evil, b"data")
        listed = (await ctx.exec(["cat", "--", evil])).stdout == b"data"
        pwned = await ctx.exists("pwned")
        hits = await ctx.search("needle", ".")
        # outside the workdir (e.g. a task's /logs): through cp/cat inside the sandbox, bytes exact
        await ctx.write_file(f"{ctx.sandbox.scratch_dir}/logs/r.bin", blob)  # type: ignore[attr-defined]
        outside = await ctx.read_file(f"{ctx.sandbox.scratch_dir}/logs/r.bin")  # type: ignore[attr-defined]
        tool = await ctx.call_tool("read_file", {"path": "deep/dir/blob.bin"})
        score = same and listed and not pwned and tool.ok and outside == blob
        return RewardBreakdown(
            reward=float(score),
            components={"hits": float(len(hits))},
            reason=str([h.path for h in hits]),
        )

    def setup_files(self, item: Item) -> dict[str, str]:
        return {"a.txt": "hay\nneedle here\n", "sub/b.txt": "needle\n"}


async def test_verifier_files_search_quoting_and_call_tool(bwrap: Any) -> None:
    env = FilesEnv(EnvConfig(enabled_toolsets=["terminal"]))
    rollouts = Rollouts(env, RolloutBackends(ScriptedModel(["ok"]), bwrap, default_registry()))
    ep = await rollouts.episode(env.generate(0, split="eval"))
    assert ep.reward.value == 1.0, ep.reward.reason
    assert ep.reward.components["hits"] == 2


class VerifierEnvProbe(BaseEnv):
    """What a verifier command runs in, after a rollout that planted dotfiles, a user site, a
    conftest beside the hidden tests, a git hook and a leftover process (the policy below)."""

    name: ClassVar[str] = "verifier_env"
    description: ClassVar[str] = "test env"

    def generate(self, index: int, *, split: str) -> Item:
        return {"id": "v", "prompt": "plant"}

    def verifier_files(self, item: Item) -> dict[str, str]:
        return {"tests/check.py": "import sys\nprint('ok', sys.flags.no_user_site, sys.pycache_prefix)\n"}

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> RewardBreakdown:
        env = (await ctx.exec("env")).text
        home = next(v.split("=", 1)[1] for v in env.splitlines() if v.startswith("HOME="))
        run = await ctx.exec(["bash", "-lc", "python3 tests/check.py; ls -A tests; git status --short"])
        leftover = await ctx.exec("(sleep 100 &) ; echo started")
        after = await ctx.exec("ps -eo args | grep -c '^sleep 100' || true")
        checks = {
            "rollouts_home": home == ctx.workdir and "PYTHONNOUSERSITE=1" in env,
            "own_config_dirs": all(
                f"{k}={ctx.sandbox.scratch_dir}/" in env for k in ("XDG_CONFIG_HOME", "TMPDIR")
            ),
            "system_path": "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in env,
            "no_usercustomize": run.text.startswith("ok 1 "),
            "pycache_elsewhere": "/pycache" in run.text.splitlines()[0],
            "conftest_gone": "conftest.py" not in run.text and "__pycache__" not in run.text,
            "no_hook": not await ctx.exists("HOOKED") and not await ctx.exists("PROFILED"),
            "leftover_killed": leftover.ok and after.text.strip() == "0",
        }
        return RewardBreakdown(
            reward=float(all(checks.values())),
            components={k: float(v) for k, v in checks.items()},
            reason=env[-300:] + run.text + run.stderr.decode(),
        )


def _planter(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
    if _turns(messages) == 0:
        return tool_turn(
            (
                "terminal",
                {
                    "command": "mkdir -p .local/lib/python3.11/site-packages tests/__pycache__ && "
                    "echo 'import os; os._exit(3)' > .local/lib/python3.11/site-packages/usercustomize.py && "
                    "echo 'raise SystemExit(4)' > tests/conftest.py && cp tests/conftest.py tests/__pycache__/x.pyc && "
                    "echo 'touch PROFILED' > .profile && cp .profile .bashrc && "
                    "printf '#!/bin/sh\\ntouch HOOKED\\n' > hook && chmod +x hook && git init -q . && "
                    "git config core.fsmonitor $PWD/hook && git config core.pager $PWD/hook && "
                    "git config alias.st '!touch HOOKED' && printf '[core]\\n\\tfsmonitor = %s/hook\\n' $PWD > .gitconfig"
                },
            )
        )
    return answer("done")


async def test_verifier_commands_see_the_rollouts_home_but_none_of_its_dotfiles(bwrap: Any) -> None:
    """HOME is the rollout's (``~`` names what the agent wrote), yet ~/.local's usercustomize.py,
    ~/.profile and ~/.bashrc (even under ``bash -l``) and ~/.gitconfig configure nothing a verifier
    runs; a conftest.py beside the hidden tests does not survive them either."""
    env = VerifierEnvProbe(EnvConfig(enabled_toolsets=["terminal"]))
    rollouts = Rollouts(env, RolloutBackends(ScriptedModel(_planter), bwrap, default_registry()))
    ep = await rollouts.episode(env.generate(0, split="eval"))
    assert ep.reward.error is None, ep.reward.error
    assert ep.reward.value == 1.0, (ep.reward.components, ep.reward.reason)


class RaisingEnv(BaseEnv):
    name: ClassVar[str] = "raising"
    description: ClassVar[str] = "test env"

    def generate(self, index: int, *, split: str) -> Item:
        return {"id": f"r{index}", "prompt": "x"}

    async def compute_reward(self, item: Item, result: AgentResult, ctx: VerifierContext) -> float:
        raise KeyError("expected_output")


async def test_a_reward_exception_scores_zero_with_the_reason(bwrap: Any) -> None:
    env = RaisingEnv(EnvConfig(enabled_toolsets=["terminal"]))
    rollouts = Rollouts(env, RolloutBackends(ScriptedModel(["ok"]), bwrap, default_registry()))
    ep = await rollouts.episode(env.generate(0, split="eval"))
    assert ep.reward.value == 0.0
    assert ep.reward.error == "KeyError: 'expected_output'"
    assert "reward failed" in ep.reward.reason
    assert ep.status == "completed"  # the rollout itself was fine


def _terminal_test_solver(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
    prompt = _first_user(messages)
    if _turns(messages) == 0 and "containing exactly this line:" in prompt:
        head, _, text = prompt.partition(" containing exactly this line: ")
        return tool_turn(("write_file", {"path": head.split()[-1], "content": text + "\n"}))
    return answer("done")


async def test_terminal_test_env_eval_writes_episodes_summary_and_resumes(tmp_path: Path, bwrap: Any) -> None:
    env = load_env("terminal_test", {"max_concurrent_rollouts": 4})
    backends = RolloutBackends(ScriptedModel(_terminal_test_solver), bwrap, default_registry())
    run = await run_eval(env, backends, tmp_path / "run", n=10, group_size=2)
    eps = read_episodes(tmp_path / "run" / "episodes.jsonl")
    assert len(eps) == 20 and run.ran == 20
    by_cat = run.summary.by_category
    assert by_cat["write_one"].mean_reward.value == 1.0  # the solver only knows this kind
    assert by_cat["sort_numbers"].mean_reward.value == 0.0
    assert run.summary.items == 10 and run.summary.group_size == 2
    assert set(run.summary.pass_at_k) == {1, 2}
    assert (tmp_path / "run" / "summary.json").exists()
    status = orjson.loads((tmp_path / "run" / "status.json").read_bytes())
    assert status["finished"] == 20 and status["rollouts"]["size"] == 4
    # kill -9 mid-write: a torn last line and a missing episode are rerun, nothing twice
    path = tmp_path / "run" / "episodes.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:17]) + lines[17][:40])
    again = await run_eval(env, backends, tmp_path / "run", n=10, group_size=2)
    assert again.ran == 3
    keys = [e.key for e in read_episodes(path)]
    assert len(keys) == 20 and len(set(keys)) == 20
    with pytest.raises(ValueError, match="differs in: group_size"):
        await run_eval(env, backends, tmp_path / "run", n=10, group_size=3)


async def test_terminal_test_rescore_from_kept_files_matches(tmp_path: Path, bwrap: Any) -> None:
    env = load_env("terminal_test")
    backends = RolloutBackends(ScriptedModel(_terminal_test_solver), bwrap, default_registry())
    run = await run_eval(env, backends, tmp_path / "r", n=5, group_size=1)
    for ep in read_episodes(run.run_dir / "episodes.jsonl"):
        again = await env.rescore(ep.item, ep.messages, ep.reward.kept)
        assert again is not None and again.reward == ep.reward.value


def test_terminal_test_partial_credit_is_documented_and_applied() -> None:
    from trajforge.envs.library.terminal_test import _score

    assert _score("a b\n", b"a b\n")[0] == 1.0
    assert _score("a b\n", b"a b")[0] == 1.0
    assert _score("a b\nc\n", b"a b  \nc\n\n\n")[0] == 0.5
    assert _score("a b\n", b"zzz")[0] == 0.0  # existing is not progress (no credit for junk)
    assert _score("a b\n", None)[0] == 0.0


def test_env_config_validation_says_what_to_change() -> None:
    with pytest.raises(ValueError, match="exclusive: keep enabled_toolsets"):
        EnvConfig(enabled_toolsets=["terminal"], distribution="default")
    with pytest.raises(EnvConfigError, match="group_size"):
        load_env("tiny_tasks", {"group_size": 0})
    with pytest.raises(ValueError, match="unknown toolset"):
        EnvConfig(enabled_toolsets=["nope"])
    with pytest.raises(UnknownEnvError, match="shipped envs: .*tiny_tasks"):
        load_env("nope")


def test_user_env_loads_from_a_file(tmp_path: Path) -> None:
    src = tmp_path / "my_env.py"
    src.write_text(
        "from trajforge.envs import BaseEnv\n"
        "class MyEnv(BaseEnv):\n"
        "    name = 'mine'\n    description = 'a user env'\n"
        "    def generate(self, index, *, split):\n        return {'id': str(index), 'prompt': 'hi'}\n"
        "    async def compute_reward(self, item, result, ctx):\n        return 1.0\n"
    )
    env = load_env(f"{src}:MyEnv", {"group_size": 3})
    assert env.name == "mine" and env.config.group_size == 3
    with pytest.raises(UnknownEnvError, match="has no .Nope."):
        load_env(f"{src}:Nope")


def test_distribution_draws_are_seeded_and_recorded() -> None:
    env = load_env("terminal_test", {"distribution": "development", "seed": 7})
    rollouts = Rollouts(env, RolloutBackends(ScriptedModel(["x"]), None, default_registry()))  # type: ignore[arg-type]
    draws = [rollouts.toolsets(s) for s in range(20)]
    assert draws == [rollouts.toolsets(s) for s in range(20)]
    assert len({tuple(d) for d in draws}) > 1


async def test_limiter_resizes_while_held() -> None:
    lim = ResizableLimiter(1)
    await lim.acquire()
    waiter = asyncio.create_task(lim.acquire())
    await asyncio.sleep(0.01)
    assert not waiter.done() and lim.waiting == 1
    await lim.resize(2)
    await asyncio.wait_for(waiter, 1)
    assert lim.in_use == 2
    await lim.resize(1)  # shrinking never interrupts holders
    await lim.release()
    third = asyncio.create_task(lim.acquire())
    await asyncio.sleep(0.01)
    assert not third.done()  # 1 in use == size 1
    await lim.release()
    await asyncio.wait_for(third, 1)


def test_pass_at_k_and_summary() -> None:
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 2) == 1.0
    assert abs(pass_at_k(4, 1, 2) - 0.5) < 1e-9

    def ep(item: str, r: int, reward: float, cat: str) -> Episode:
        return Episode(
            key=f"{item}#{r}",
            env="e",
            item_id=item,
            rollout=r,
            group_size=2,
            seed=r,
            category=cat,
            item={},
            toolsets=[],
            tools=[],
            messages=[],
            status="completed",
            termination="final_answer",
            reward=Reward(value=reward),
        )

    s = summarize(
        [ep("a", 0, 1.0, "x"), ep("a", 1, 0.0, "x"), ep("b", 0, 0.0, "y"), ep("b", 1, 0.0, "y")], "e"
    )
    assert s.pass_at_1.value == 0.25 and s.pass_at_k[2] == 0.5
    assert s.by_category["x"].mean_reward.value == 0.5
