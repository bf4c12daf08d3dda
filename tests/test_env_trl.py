"""TRL's real GRPOTrainer driven by a trajforge env through ``rollout_func`` (CPU, offline).

The policy is a tiny Qwen2 built here with a tiny BPE tokenizer; rollouts run through the agent
loop, the tools and real bubblewrap sandboxes; the reward is computed by the env's
``compute_reward`` with a script executed *inside* the rollout's sandbox; TRL gets the exact
sampled tokens with their logprobs and trains on them.
"""

from __future__ import annotations

import math
import shutil
from typing import Any, ClassVar

import pytest

from trajforge.envs.base import BaseEnv
from trajforge.envs.config import EnvConfig
from trajforge.envs.types import Item, RewardBreakdown
from trajforge.sandbox.types import SandboxConfig

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.timeout(300),
]

WORDS = ["apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "ocean", "piano", "grape"]

SCORE_SH = (
    "#!/bin/sh\n"
    "# reward = how many of the item's letters the answer contains (0..10), and where it ran\n"
    'n=$(tr -cd "$(cat letters.txt)" < answer.txt | wc -c)\n'
    'echo "$n $(pwd)"\n'
)


class LettersEnv(BaseEnv):
    """Answer in free text; the reward counts the item's letters in the answer, in the sandbox."""

    name: ClassVar[str] = "letters"
    description: ClassVar[str] = "test env: reward computed by a shell script in the sandbox"

    @classmethod
    def default_config(cls) -> EnvConfig:
        return EnvConfig(enabled_toolsets=["file"], max_agent_turns=2, max_tokens=12, agent_temperature=1.0)

    def generate(self, index: int, *, split: str) -> Item:
        word = WORDS[index % len(WORDS)]
        return {
            "id": f"{split}-{index}",
            "prompt": f"Write words that use the letters of {word}.",
            "word": word,
        }

    def setup_files(self, item: Item) -> dict[str, str]:
        return {"letters.txt": item["word"]}

    def verifier_files(self, item: Item) -> dict[str, str]:
        return {"score.sh": SCORE_SH}

    async def compute_reward(self, item: Item, result: Any, ctx: Any) -> RewardBreakdown:
        answer = _last_text(result.messages)
        await ctx.write_file("answer.txt", answer.encode())
        run = await ctx.exec(["sh", "score.sh"])
        assert run.exit_code == 0, run.stderr
        count, where = run.stdout.decode().split(maxsplit=1)
        return RewardBreakdown(
            reward=min(int(count), 10) / 10, components={"letters": float(count)}, reason=where.strip()
        )


def _last_text(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "assistant":
            return str(m.get("content") or "")
    return ""


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer

    root = tmp_path_factory.mktemp("policy")
    tok = build_tiny_tokenizer(root / "tok", "chatml")
    model = build_tiny_model(root / "model", tok, hidden=32, layers=2, seed=0)
    return model, tok


def test_trl_grpo_trains_on_env_rollouts_with_sandbox_rewards(tiny_policy: Any, tmp_path: Any) -> None:
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from trajforge.rl.adapters.trl import EnvGRPO

    model, tok = tiny_policy
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    env = LettersEnv()
    groups = 2
    group_size = 4
    with EnvGRPO(env, sandbox=SandboxConfig(kind="bwrap", command_timeout_s=20), max_batch=8) as adapter:
        dataset = adapter.dataset(groups * 2)
        args = GRPOConfig(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=groups * group_size,
            num_generations=group_size,
            max_steps=2,
            learning_rate=5e-3,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            bf16=False,
            activation_checkpointing=False,
            temperature=1.0,
            seed=0,
            dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=adapter.reward_funcs,
            args=args,
            train_dataset=dataset,
            processing_class=tok,
            rollout_func=adapter.rollout_func,
        )
        out = trainer.train()
        episodes = adapter.last_episodes
        stats = adapter.stats

    # trained: finite loss, weights moved
    assert math.isfinite(out.training_loss)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    moved = [n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert moved, "no parameter changed"

    # every rollout ran (2 steps x 8), judged in its own bwrap sandbox by the env's script
    assert stats.calls == 2 and stats.episodes == 2 * groups * group_size
    assert len(episodes) == groups * group_size
    assert stats.failed == 0 and stats.reward_errors == 0 and stats.untraced == 0
    for ep in episodes:
        assert ep.reward.error is None
        assert ep.reward.reason.startswith("/") and ep.reward.reason != str(tmp_path)
        answer = _last_text(ep.messages)
        expected = min(sum(ch in ep.item["word"] for ch in answer), 10) / 10
        assert ep.reward.value == pytest.approx(expected)
        # exact traces reached TRL: equal lengths, sampled tokens = what the model wrote
        assert ep.trace is not None
        assert len(ep.trace.tokens) == len(ep.trace.masks) == len(ep.trace.logprobs)
    rewards = [ep.reward.value for ep in episodes]
    assert stats.last_rewards == rewards
    # the rewards TRL logged are the env's (mean of the last batch)
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) == 2
    assert logged[-1]["reward"] == pytest.approx(sum(rewards) / len(rewards), abs=1e-5)
    assert f"rewards/{env.name}_reward/mean" in logged[-1]


def test_trl_rollouts_mask_tool_results_in_multi_turn_episodes(tmp_path: Any) -> None:
    """The embedded policy calls tools: TRL's env_mask is 0 exactly on the tool results and the
    template text between turns, and 1 on every token the policy sampled, with its logprob."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import trajforge.models.tiny as tiny_pkg
    from trajforge.envs import load_env
    from trajforge.rl.adapters.trl import EnvGRPO

    weights = Path(tiny_pkg.__file__).parent / "weights"
    model = AutoModelForCausalLM.from_pretrained(str(weights), dtype="float32")
    tok = AutoTokenizer.from_pretrained(str(weights))
    env = load_env(
        "tiny_tasks", {"max_agent_turns": 3, "max_tokens": 96, "families": ["write_file", "find_value"]}
    )
    with EnvGRPO(env, sandbox=SandboxConfig(kind="bwrap", command_timeout_s=20)) as adapter:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=adapter.reward_funcs,
            args=GRPOConfig(
                output_dir=str(tmp_path / "out"),
                per_device_train_batch_size=4,
                num_generations=2,
                max_steps=1,
                learning_rate=1e-4,
                save_strategy="no",
                report_to=[],
                use_cpu=True,
                bf16=False,
                activation_checkpointing=False,
            ),
            train_dataset=adapter.dataset(2),
            processing_class=tok,
            rollout_func=adapter.rollout_func,
        )
        dataset_prompts = [row["prompt"] for row in adapter.dataset(2)]
        out = adapter.rollout_func([p for p in dataset_prompts for _ in range(2)], trainer)
        episodes = adapter.last_episodes
    assert len(episodes) == 4 and adapter.stats.untraced == 0
    multi = 0
    for ep, comp, mask, lps in zip(
        episodes, out["completion_ids"], out["env_mask"], out["logprobs"], strict=True
    ):
        assert ep.trace is not None
        sampled = [m != -100 for m in ep.trace.masks]
        start = sampled.index(True)
        assert comp == ep.trace.tokens[start:] and mask == [int(s) for s in sampled[start:]]
        assert all(lp < 0 or not m for lp, m in zip(lps, mask, strict=True))  # real logprobs where sampled
        assert all(lp == 0.0 for lp, m in zip(lps, mask, strict=True) if not m)
        tool_turns = [m for m in ep.messages if m.get("role") == "tool"]
        if tool_turns:
            multi += 1
            assert 0 in mask  # tool results are in the completion but not trained on
            # the tool result text sits in the masked stretch
            masked_text = tok.decode([t for t, m in zip(comp, mask, strict=True) if not m])
            assert str(tool_turns[0]["content"])[:20] in masked_text
    assert multi >= 1, "the embedded policy made no tool call in 4 rollouts"
    assert out["env_reward"] == [ep.reward.value for ep in episodes]
