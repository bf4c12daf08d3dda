"""The one reward type (``trajforge.record.Reward``): what ``compute_reward`` returns, what the
judge hands the rollout step and what the record keeps, whole; and the one conversion of its
token advantages that every trainer uses (``trajforge.rl.rewards``)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import orjson
import pytest
from pydantic import ValidationError

from trajforge.envs import BaseEnv, EnvConfig, Item, RewardBreakdown, RolloutBackends, Rollouts
from trajforge.envs.types import RewardBreakdown as TypesBreakdown
from trajforge.record import Record, Reward, TokenRecord, load
from trajforge.rl.adapters.atropos_groups import scored_group
from trajforge.rl.rewards import aligned_token_advantages, scores_tokens
from trajforge.rl.samples import StepRollouts, build_samples
from trajforge.testing.scripted_model import ScriptedModel
from trajforge.tools.builtin import default_registry


def test_reward_breakdown_is_the_reward_and_keeps_its_spelling() -> None:
    """Env files (the user's, the seed's Hermes envs) build ``RewardBreakdown(reward=...)``: the
    same class, ``reward=`` the constructor spelling of ``value``."""
    assert RewardBreakdown is Reward is TypesBreakdown
    bd = RewardBreakdown(reward=0.5, components={"tests": 0.5}, reason="half", token_advantages=[0.1, -0.1])
    assert bd == Reward(value=0.5, components={"tests": 0.5}, reason="half", token_advantages=[0.1, -0.1])
    assert bd.value == bd.reward == bd.score == 0.5 and bd.judged
    assert Reward.model_validate({"reward": 1}) == Reward.model_validate({"value": 1}) == Reward(value=1.0)
    with pytest.raises(ValidationError, match="value"):
        RewardBreakdown(components={"a": 1.0})  # a value is required (null: not judged, said so)


def test_booleans_and_other_values_are_refused() -> None:
    for bad in ({"value": True}, {"reward": False}):
        with pytest.raises(ValidationError, match="not a boolean"):
            Reward.model_validate(bad)
    for wrong in (True, "1.0", None, {"reward": 1.0}):
        with pytest.raises(TypeError, match="compute_reward must return a float or a RewardBreakdown, not"):
            Reward.of(wrong)  # type: ignore[arg-type]
    assert Reward.of(1) == Reward(value=1.0) and isinstance(Reward.of(1).value, float)
    bd = RewardBreakdown(reward=0.25)
    assert Reward.of(bd) is bd


def test_a_breakdown_the_env_edits_as_it_goes_keeps_its_score() -> None:
    """``compute_reward`` code written for the old, mutable ``RewardBreakdown`` sets its fields
    as it checks: a frozen reward made it raise, and a correct rollout scored 0 as a failure."""
    bd = RewardBreakdown(reward=0.0, reason="tests not run")
    bd.reward = 1.0
    bd.reason = "all tests passed"
    bd.components["tests"] = 1.0
    assert (bd.value, bd.reward, bd.reason, bd.components) == (1.0, 1.0, "all tests passed", {"tests": 1.0})
    with pytest.raises(ValidationError, match="not a boolean"):  # assignments are validated
        bd.reward = True
    assert bd.model_copy(update={"kept": {"a": 1}}).kept == {"a": 1} and bd.kept == {}


def test_not_judged_failed_and_the_score() -> None:
    none = Reward.not_judged("not judged: the model was never reached (model_error)")
    assert none.value is None and not none.judged and none.score == 0.0 and none.error is None
    failed = Reward.failed("KeyError: 'x'")
    assert (failed.value, failed.error, failed.reason) == (
        0.0,
        "KeyError: 'x'",
        "reward failed: KeyError: 'x'",
    )
    # on the record: no judge at all, a judge that could not judge, a judged rollout
    assert Record(key="a", status="completed").score == 0.0
    assert Record(key="a", status="completed").reward_value is None
    assert Record(key="b", status="failed", reward=none).score == 0.0
    rec = Record(key="c", status="completed", reward=Reward(value=0.75))
    assert rec.score == rec.reward_value == 0.75
    assert Record(key="d", status="completed", reward=failed).reward_failed
    assert not rec.reward_failed and not Record(key="e", status="completed").reward_failed


def test_the_record_keeps_the_reward_whole_as_one_object() -> None:
    reward = Reward(
        value=1.0,
        components={"exact": 1.0},
        reason="r",
        kept={"files_b64": {"a": "eA=="}},
        token_advantages=[0.5],
    )
    line = orjson.loads(Record(key="k", status="completed", reward=reward).line())
    assert line["schema_version"] == 4
    assert line["reward"] == {
        "value": 1.0,
        "components": {"exact": 1.0},
        "reason": "r",
        "error": None,
        "token_advantages": [0.5],
        "kept": {"files_b64": {"a": "eA=="}},
    }
    assert not {"reward_components", "reward_reason", "reward_error", "kept"} & set(line)
    assert load(line).reward == reward
    with pytest.raises(ValueError, match="reward"):
        load({**line, "reward": 1.0})  # a version-4 line's reward is the object, not a number


def _traced(advantages: list[float] | None, value: float = 0.0, key: str = "k") -> Record:
    trace = TokenRecord(
        tokens=[5, 6, 7, 8, 9], masks=[-100, -100, 7, 8, -100], logprobs=[1.0, 1.0, -0.5, -0.25, 1.0]
    )
    reward = Reward(value=value, token_advantages=advantages)
    return Record(
        key=key, item_id="item", status="completed", termination="final_answer", reward=reward, trace=trace
    )


def test_token_advantages_align_to_the_trace_one_way_for_every_trainer() -> None:
    """Per sampled token or per position: one function (``rl.rewards``) aligns them, and the GRPO
    samples and the Atropos groups both give what it gives."""
    per_sampled, per_position = _traced([0.5, -0.5], key="a"), _traced([0.0, 0.0, 1.0, 1.0, 0.0], key="b")
    assert aligned_token_advantages(per_sampled) == [0.0, 0.0, 0.5, -0.5, 0.0]
    assert aligned_token_advantages(per_position) == [0.0, 0.0, 1.0, 1.0, 0.0]
    assert aligned_token_advantages(_traced(None)) is None and not scores_tokens(_traced(None))
    assert aligned_token_advantages(per_sampled.model_copy(update={"trace": None})) is None
    with pytest.raises(
        ValueError, match=r"episode bad: 3 token advantages for 2 sampled tokens \(5 in all\)"
    ):
        aligned_token_advantages(_traced([1.0, 2.0, 3.0], key="bad"))
    built = build_samples(StepRollouts(groups=[[per_sampled, per_position]], version=0, weights_step=0))
    group = scored_group([per_sampled, per_position], token_level=True, group_size=2).group
    assert group is not None
    expected = [aligned_token_advantages(per_sampled), aligned_token_advantages(per_position)]
    assert [s.token_advantages for s in built.samples] == group["advantages"] == expected
    assert built.uniform_groups == 1 and len(built.samples) == 2  # equal rewards: the tokens carry the signal


def test_an_env_returning_a_breakdown_with_token_advantages_trains_the_same() -> None:
    """What an env's ``RewardBreakdown(reward=..., token_advantages=...)`` becomes on the record
    trains as the version-3 record that kept them in its trace did (the same samples)."""
    env_side: Any = RewardBreakdown(
        reward=0.0, components={"task_reward": 0.0}, token_advantages=[0.25, -1.0]
    )
    now = _traced(None).model_copy(update={"reward": Reward.of(env_side)})
    v3 = orjson.loads(_traced(None).line())
    v3.update(schema_version=3, reward=0.0, reward_components={"task_reward": 0.0}, reward_reason="", kept={})
    v3["trace"]["token_advantages"] = [0.25, -1.0]
    old = load(v3)
    assert old.reward == now.reward
    samples = [
        build_samples(
            StepRollouts(groups=[[r, r.model_copy(update={"key": "k2"})]], version=0, weights_step=0)
        ).samples
        for r in (old, now)
    ]
    assert samples[0] == samples[1] and samples[0][0].token_advantages == [0.0, 0.0, 0.25, -1.0, 0.0]


class _OneBreakdownEnv(BaseEnv):
    """Keeps ONE breakdown at module scope and edits it for every rollout, as env code written
    against the old mutable ``RewardBreakdown`` may: each item's reward is its own number."""

    name: ClassVar[str] = "one_breakdown"
    shared: ClassVar[RewardBreakdown] = RewardBreakdown(reward=0.0)

    def generate(self, index: int, *, split: str) -> Item:
        return {"id": f"i{index}", "prompt": f"item {index}", "value": index / 10}

    async def compute_reward(self, item: Item, result: Any, ctx: Any) -> RewardBreakdown:
        await asyncio.sleep(0.05 * (3 - item["value"] * 10))  # the first item is judged last
        bd = type(self).shared
        bd.reward = float(item["value"])
        bd.reason = f"scored {item['id']}"
        return bd


async def test_a_breakdown_the_env_reuses_does_not_rewrite_earlier_records(bwrap: Any) -> None:
    """The record keeps a copy of what ``compute_reward`` returned, not the env's object: before,
    a frozen reward could not be edited, but an env that edits one object for its next rollout
    would otherwise rewrite the reward of every record still holding it."""
    env = _OneBreakdownEnv(EnvConfig(enabled_toolsets=[], max_agent_turns=1))
    backends = RolloutBackends(ScriptedModel(lambda *_a: "done"), bwrap, default_registry())
    rollouts = Rollouts(env, backends)
    items = [env.generate(i, split="eval") for i in range(3)]
    episodes = await asyncio.gather(*(rollouts.episode(item) for item in items))
    assert [(ep.reward_value, ep.reward.reason) for ep in episodes] == [
        (0.0, "scored i0"),
        (0.1, "scored i1"),
        (0.2, "scored i2"),
    ]
    assert all(ep.reward is not env.shared for ep in episodes)
