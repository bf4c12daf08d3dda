"""Does GRPO learn? The builtin trainer's own path from rewards to weights -- judged episodes with
their token traces -> ``build_samples`` (group advantages, uniform groups dropped) -> ``grpo_update``
(collate, the clipped ratio, token-mean loss, AdamW) -- on a bandit through a tiny real
transformers model. Nothing on that path is re-implemented here: the test hands the trainer
episodes as the rollouts hand them over, so flipping the advantage's sign anywhere on it (in
``group_advantages``, ``build_samples``, ``collate`` or ``grpo_loss``) fails the test (each flip
was applied and seen to fail: docs/rl.md).

The bandit: one prompt and a set of "winning" next tokens that the untrained model picks with
probability ~5% (chosen so: a random ordering of the vocabulary, cut where the model's own
probability mass reaches 5%). A rollout samples one token at T=1; reward 1 if it wins; a step is
GROUPS groups of GROUP rollouts.
Expected reward is read exactly off the model's distribution (no sampling noise), so the
assertions are about the policy, not about a lucky draw. With the reward inverted (1 for every
token but the winners) the same path must push the policy away from the winners: a control that
proves the rise comes from the reward signal and not from drift.

Also here: dropout is off during an update (an on-policy ratio is exactly 1 even for a model
configured with dropout), and per-token advantages (``opd``) reach the loss position by position.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from trajforge.envs.types import Episode, TokenRecord
from trajforge.llm.token_trace import MASKED, MASKED_LOGPROB
from trajforge.record import Reward
from trajforge.rl.config import TrainConfig
from trajforge.rl.grpo import Sample, collate
from trajforge.rl.samples import StepRollouts, build_samples
from trajforge.rl.update import grpo_update
from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer

PROMPTS = ["pick a word:"]
CHANCE = 0.05
GROUP = 16
GROUPS = 4
STEPS = 30
LR = 2e-2


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bandit")
    tok = build_tiny_tokenizer(root / "tok")
    build_tiny_model(root / "model", tok, hidden=32, layers=2, seed=0)
    return root / "model"


def _load(model_dir: Path, **overrides: Any) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, **overrides)


def _prompt_ids(model_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    return [list(tok(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS]


def _next_token_probs(model: Any, ids: list[int]) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)


def _winners(model: Any, prompts: list[list[int]], seed: int) -> list[set[int]]:
    """Per prompt, a random set of tokens holding ~CHANCE of the model's probability mass."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for ids in prompts:
        probs = _next_token_probs(model, ids)
        chosen, mass = set(), 0.0
        for t in torch.randperm(probs.shape[0], generator=gen).tolist():
            if mass >= CHANCE:
                break
            chosen.add(t)
            mass += float(probs[t])
        out.append(chosen)
    return out


def _expected_reward(model: Any, prompts: list[list[int]], winners: list[set[int]]) -> float:
    total = 0.0
    for ids, win in zip(prompts, winners, strict=True):
        probs = _next_token_probs(model, ids)
        total += float(probs[list(win)].sum())
    return total / len(prompts)


def _rollouts(
    model: Any, prompts: list[list[int]], winners: list[set[int]], gen: torch.Generator, invert: bool
) -> StepRollouts:
    """One step's groups as the rollouts hand them to the trainer: judged episodes, each with
    its exact token trace (prompt masked, the sampled token with the sampler's logprob)."""
    groups = []
    pairs = [pair for pair in zip(prompts, winners, strict=True) for _ in range(GROUPS)]
    for g, (ids, win) in enumerate(pairs):
        probs = _next_token_probs(model, ids)
        actions = torch.multinomial(probs, GROUP, replacement=True, generator=gen).tolist()
        group = []
        for r, a in enumerate(actions):
            won = a in win
            group.append(
                Episode(
                    item_id=f"bandit-{g}",
                    rollout=r,
                    group_size=GROUP,
                    status="completed",
                    reward=Reward(value=float(won != invert)),
                    trace=TokenRecord(
                        tokens=[*ids, a],
                        masks=[MASKED] * len(ids) + [a],
                        logprobs=[MASKED_LOGPROB] * len(ids) + [float(torch.log(probs[a]))],
                    ),
                )
            )
        groups.append(group)
    return StepRollouts(groups=groups, version=0, weights_step=0)


def _train(model_dir: Path, invert: bool) -> list[float]:
    torch.manual_seed(0)
    model = _load(model_dir)
    prompts = _prompt_ids(model_dir)
    winners = _winners(model, prompts, seed=1)
    cfg = TrainConfig(
        env="bandit", model=model_dir, lr=LR, group_size=GROUP, groups_per_step=GROUPS, micro_batch=64
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(2)
    curve = [_expected_reward(model, prompts, winners)]
    for step in range(1, STEPS + 1):
        batch = build_samples(
            _rollouts(model, prompts, winners, gen, invert),
            scale=cfg.scale_rewards,
            skip_uniform=cfg.skip_uniform_groups,
        )
        grpo_update(model, optimizer, batch.samples, cfg, step=step, temperature=1.0, pad_id=0, device="cpu")
        curve.append(_expected_reward(model, prompts, winners))
    return curve


def test_grpo_raises_expected_reward_through_the_trainers_path_and_the_inverted_reward_does_not(
    tiny_dir: Path,
) -> None:
    learned = _train(tiny_dir, invert=False)
    control = _train(tiny_dir, invert=True)
    start = learned[0]
    assert control[0] == pytest.approx(start)
    assert 0.04 <= start <= 0.08, start  # chance is small but not zero: groups carry some signal
    assert max(learned) >= 0.8 and learned[-1] >= 0.8, learned
    assert max(control) <= start + 0.02 and control[-1] < start, control


def test_dropout_is_off_during_an_update(tiny_dir: Path) -> None:
    """A model configured with heavy dropout: on-policy samples (logprobs from the model without
    dropout, as the server samples) give a ratio of exactly 1 and no sampler KL in the update."""
    model = _load(tiny_dir, attention_dropout=0.5)
    assert model.config.attention_dropout == 0.5
    gen = torch.Generator().manual_seed(3)
    samples = []
    for ids in _prompt_ids(tiny_dir):
        probs = _next_token_probs(model, ids)
        for k, a in enumerate(torch.multinomial(probs, 4, replacement=True, generator=gen).tolist()):
            lp = float(torch.log(probs[a]))
            samples.append(
                Sample([*ids, a], [False] * len(ids) + [True], [0.0] * len(ids) + [lp], (-1.0) ** k)
            )
    cfg = TrainConfig(env="bandit", model=tiny_dir, lr=1e-3, micro_batch=64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    model.train()  # whatever mode the caller left it in
    stats = grpo_update(model, optimizer, samples, cfg, step=1, temperature=1.0, pad_id=0, device="cpu")
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert stats["kl_sampler"] == pytest.approx(0.0, abs=1e-7)
    assert not model.training


def test_per_token_advantages_reach_each_position() -> None:
    """``opd``-style samples: each sampled position has its own advantage in the loss; a sample
    without them in the same batch gets its scalar advantage on every position."""
    scored = Sample(
        tokens=[1, 2, 3, 4],
        sampled=[False, True, True, True],
        old_logprobs=[0.0, -1.0, -1.0, -1.0],
        advantage=0.0,
        token_advantages=[0.0, 0.5, -2.0, 1.5],
    )
    plain = Sample(
        tokens=[1, 2, 3], sampled=[False, True, True], old_logprobs=[0.0, -1.0, -1.0], advantage=0.25
    )
    batch = collate([scored, plain], pad_id=0)
    assert batch.advantages.shape == (2, 3)
    assert batch.advantages[0].tolist() == [0.5, -2.0, 1.5]
    assert batch.advantages[1].tolist()[:2] == [0.25, 0.25]
    with pytest.raises(ValueError, match="one entry per position"):
        Sample(
            tokens=[1, 2],
            sampled=[False, True],
            old_logprobs=[0.0, -1.0],
            advantage=0.0,
            token_advantages=[1.0],
        )
