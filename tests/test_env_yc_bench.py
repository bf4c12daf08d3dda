"""yc_bench: the simulated startup under real bubblewrap -- the oracle's scripted strategy scores
well, doing nothing scores 0, a turn budget cuts the game short, and an agent that forges its
state, its game settings, the simulator or the verifier's files gains nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from trajforge.envs import RolloutBackends, Rollouts, load_env
from trajforge.envs.agents import agent_model_for
from trajforge.envs.library import ycsim
from trajforge.envs.library.yc_bench import YcBenchEnv, plan
from trajforge.testing.scripted_model import ScriptedModel, answer, tool_turn
from trajforge.tools.builtin import default_registry

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def _env(**overrides: Any) -> YcBenchEnv:
    env = load_env("yc_bench", overrides or None)
    assert isinstance(env, YcBenchEnv)
    return env


def test_the_simulator_is_deterministic_and_refuses_what_the_rules_forbid(tmp_path: Path) -> None:
    game = ycsim.Game(seed=7, difficulty="normal")
    log = str(tmp_path / "log.jsonl")
    assert ycsim.run(game, log, ["hire", "eng", "9"])[0] == 2  # more than 5 at once
    assert ycsim.run(game, log, ["advance", "5"])[0] == 2
    assert ycsim.run(game, log, ["set-cash", "1e9"])[1]["error"].startswith("unknown command")
    assert not Path(log).exists()  # refused commands are not logged
    for cmd in (
        ["set-price", "60"],
        ["spend", "marketing", "3000"],
        ["hire", "sales", "2"],
        ["advance", "4"],
    ):
        code, out = ycsim.run(game, log, cmd)
        assert code == 0 and out["ok"], out
    status = ycsim.run(game, log, ["status"])[1]
    assert status["week"] == 4 and status["team"] == {"eng": 2, "sales": 2, "support": 0}
    assert status["price_per_month"] == 60.0 and len(Path(log).read_text().splitlines()) == 4
    # the state is the log replayed from the seed: the same log gives the same state
    again = ycsim.replay(game, Path(log).read_text().splitlines())[0]
    assert ycsim.status(again, game) == status
    other = ycsim.replay(ycsim.Game(seed=8, difficulty="normal"), Path(log).read_text().splitlines())[0]
    assert ycsim.status(other, game) != status
    # forged lines are refused on replay and counted
    forged = [*Path(log).read_text().splitlines(), '{"cmd": "advance", "args": ["52"]}', "not json"]
    state, rejected = ycsim.replay(game, forged)
    assert rejected == 2 and state.week == 4


def test_bankruptcy_ends_the_game_with_zero() -> None:
    game = ycsim.Game(seed=1, difficulty="hard")
    state = ycsim.new_state(game)
    ycsim.apply(state, game, "spend", ["marketing", "200000"])
    while not state.dead:
        ycsim.apply(state, game, "advance", ["4"])
    with pytest.raises(ycsim.CommandError, match="bankrupt"):
        ycsim.apply(state, game, "advance", ["1"])
    scored = ycsim.score(state, game)
    assert scored["reward"] == 0.0 and scored["components"]["survived"] == 0.0


async def test_oracle_scores_well_and_doing_nothing_scores_zero(bwrap: Any) -> None:
    env = _env(difficulties=["easy", "normal"], max_concurrent_rollouts=4)
    items = env.eval_items(2)
    results: dict[str, list[float]] = {}
    for agent in ("oracle", "none"):
        model_for = agent_model_for(env, agent)
        rollouts = Rollouts(
            env, RolloutBackends(model_for(env, {}), bwrap, default_registry(), model_for=model_for)
        )
        eps = [await rollouts.episode(item) for item in items]
        for ep in eps:
            assert ep.reward_error is None, ep.reward_error
            assert ep.status == "completed"
        results[agent] = [ep.reward for ep in eps]
        if agent == "oracle":
            for ep, item in zip(eps, items, strict=True):
                assert ep.turns == len(plan(ycsim.Game(**item["game"]))) + 2  # status + plan + answer
                assert ep.reward_components["progress"] == 1.0 and ep.reward_components["rejected"] == 0
                # the verifier's fresh-exec score equals an in-process replay of the kept log
                again = await env.rescore(item, ep.messages, ep.kept)
                assert again is not None and again.reward == ep.reward
    assert all(r >= 0.6 for r in results["oracle"]), results
    assert results["none"] == [0.0, 0.0]


async def test_a_turn_budget_cuts_the_year_short(bwrap: Any) -> None:
    env = _env(max_agent_turns=5)
    item = env.eval_items(1)[0]

    def policy(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
        return tool_turn(("terminal", {"command": "python3 ycsim advance 1"}))

    ep = await Rollouts(env, RolloutBackends(ScriptedModel(policy), bwrap, default_registry())).episode(item)
    assert ep.termination == "max_turns" and ep.status == "partial"
    assert ep.reward_components["progress"] == pytest.approx(5 / 52, abs=1e-6)
    assert 0 < ep.reward < 0.05


async def test_forged_state_settings_simulator_and_verifier_files_gain_nothing(bwrap: Any) -> None:
    env = _env(difficulties=["hard"])
    item = env.eval_items(1)[0]
    fake_score = (
        "import json; print(json.dumps({'reward': 1.0, 'components': {}, 'week': 52, 'horizon': 52}))"
    )
    easy = json.dumps({**item["game"], "difficulty": "easy", "horizon": 4, "target": 1.0})
    steps = [
        # an easier game, a 4-week horizon, and a target of $1 in the agent's own settings file
        f"printf '%s' '{easy}' > ycsim_game.json && python3 ycsim advance 4",
        # a forged log: money out of nowhere, a year in one line
        'printf \'%s\\n\' \'{"cmd": "set-cash", "args": ["1e12"]}\' \'{"cmd": "advance", "args": ["52"]}\''
        " >> .ycsim/log.jsonl && echo '{\"cash\": 1e12}' > .ycsim/state.json",
        # a simulator that always wins, planted where the verifier's copy will go too
        f'mkdir -p .ycverify && echo "{fake_score}" > .ycverify/ycsim.py && cp .ycverify/ycsim.py ycsim',
    ]

    def policy(messages: list[dict[str, Any]], tools: Any, sampling: Any) -> Any:
        turn = sum(m["role"] == "assistant" for m in messages)
        if turn < len(steps):
            return tool_turn(("terminal", {"command": steps[turn]}))
        return answer("won")

    ep = await Rollouts(env, RolloutBackends(ScriptedModel(policy), bwrap, default_registry())).episode(item)
    assert ep.reward_error is None, ep.reward_error
    # scored on the item's own hard 52-week game: 4 weeks played, the forged lines refused
    assert ep.reward_components["rejected"] == 2
    assert ep.reward_components["progress"] == pytest.approx(4 / 52, abs=1e-6)
    assert ep.reward < 0.05
    # the agent's own view (easy settings) was not what was scored
    assert "target" in ep.item["game"] and ep.item["game"]["difficulty"] == "hard"


def test_oracle_plans_are_valid_plays_for_every_difficulty() -> None:
    env = _env()
    for item in env.eval_items(3):
        game = ycsim.Game(**item["game"])
        lines = [json.dumps({"cmd": c[0], "args": c[1:]}) for c in plan(game)]
        state, rejected = ycsim.replay(game, lines)
        assert rejected == 0 and state.week == game.horizon and not state.dead
        assert ycsim.score(state, game)["reward"] >= 0.6
