"""The RFT control (``rl/rft.py``) and what the demo reports with it (``experiments/closed_loop.py``, ``experiments/failures.py``).

- RFT learns through its own path: sampled episodes -> the passing ones kept -> supervised updates;
  on the bandit of ``test_rl_learning.py`` its expected reward rises (it is a real control, not a
  strawman that cannot learn).
- ``supervised_until`` stops within one sample of its token budget, cycling through its samples.
- ``rft`` end to end on a tiny model: GRPO's budget of sampled episodes and trained tokens spent
  round by round, the lr chosen per round on validation items (episodes counted apart), items from
  the run's training stream.
- The failure kinds, the paired pass@k difference, and the tables.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from trajforge.envs.base import BaseEnv
from trajforge.envs.config import EnvConfig
from trajforge.envs.types import Item, RewardBreakdown
from trajforge.experiments.failures import breakdown, failure_kind
from trajforge.record import Record, Reward
from trajforge.rl.config import TrainConfig
from trajforge.rl.grpo import Sample
from trajforge.rl.rft import RftBudget, RftSettings, rft, supervised_until

ENV_REF = f"{__file__}:ParityEnv"


class ParityConfig(EnvConfig):
    eval_seed: int = 0


class ParityEnv(BaseEnv):
    """Answer anything: reward 1 when the answer's length is even. A random tiny model passes
    about half the time, so a round keeps episodes and validation has a spread."""

    name: ClassVar[str] = "parity"
    description: ClassVar[str] = "test env: even-length answers pass"
    config_class: ClassVar[type[EnvConfig]] = ParityConfig

    @classmethod
    def default_config(cls) -> EnvConfig:
        return ParityConfig(enabled_toolsets=["file"], max_agent_turns=1, max_tokens=8, agent_temperature=1.0)

    def generate(self, index: int, *, split: str) -> Item:
        seed = getattr(self.config, "eval_seed", 0) if split == "eval" else self.config.seed
        return {"id": f"{split}-{seed}-{index}", "prompt": f"Say something ({split} {seed} {index})."}

    async def compute_reward(self, item: Item, result: Any, ctx: Any) -> RewardBreakdown:
        text = next(
            (str(m.get("content") or "") for m in reversed(result.messages) if m.get("role") == "assistant"),
            "",
        )
        return RewardBreakdown(reward=float(len(text) % 2 == 0), reason=f"length {len(text)}")


def test_supervised_until_stops_within_one_sample_of_its_budget(tiny_chatml_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_chatml_model), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    samples = [
        Sample([1, 2, 3, 4, 5 + i], [False, False, True, True, True], [0.0] * 5, 1.0) for i in range(5)
    ]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    updates, done, losses = supervised_until(
        model,
        optimizer,
        samples,
        tokens=40,
        batch=4,
        lr=1e-3,
        micro_batch=2,
        pad_id=0,
        device="cpu",
        precision="fp32",
        seed=0,
    )
    # 3 tokens a sample: 14 samples (42 tokens) in updates of 4, 4, 4, 2 -- cycling the 5 samples
    assert done == 42 and updates == 4 and len(losses) == 4
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert supervised_until(
        model,
        optimizer,
        [],
        tokens=40,
        batch=4,
        lr=1e-3,
        micro_batch=2,
        pad_id=0,
        device="cpu",
        precision="fp32",
        seed=0,
    ) == (0, 0, [])


def test_rft_learns_the_bandit_through_its_own_path(tmp_path: Path) -> None:
    """The bandit of test_rl_learning.py: keep the winning samples, train on them; the expected
    reward rises from ~5%."""
    from test_rl_learning import _expected_reward, _load, _prompt_ids, _rollouts, _winners
    from trajforge.rl.rft import kept_samples
    from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer(tmp_path / "tok")
    build_tiny_model(tmp_path / "model", tok, hidden=32, layers=2, seed=0)
    model = _load(tmp_path / "model")
    prompts = _prompt_ids(tmp_path / "model")
    winners = _winners(model, prompts, seed=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2, weight_decay=0.0)
    gen = torch.Generator().manual_seed(2)
    start = _expected_reward(model, prompts, winners)
    for _ in range(15):
        episodes = [ep for g in _rollouts(model, prompts, winners, gen, invert=False).groups for ep in g]
        kept = kept_samples(episodes)
        if kept:
            supervised_until(
                model,
                optimizer,
                kept,
                tokens=len(kept),
                batch=16,
                lr=2e-2,
                micro_batch=64,
                pad_id=0,
                device="cpu",
                precision="fp32",
                seed=0,
            )
    assert 0.04 <= start <= 0.08 and _expected_reward(model, prompts, winners) >= 0.5


def _parity_run(model: Path, tmp_path: Path) -> TrainConfig:
    """GRPO's config for the parity env on the tiny model: 2 groups of 4 per step, 8 tokens."""
    return TrainConfig.model_validate(
        {
            "env": ENV_REF,
            "model": model,
            "output_dir": tmp_path / "grpo",
            "group_size": 4,
            "groups_per_step": 2,
            "device": "cpu",
            "concurrency": 8,
            "micro_batch": 8,
            "max_tokens": 8,
            "temperature": 1.0,
        }
    )


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
@pytest.mark.timeout(600)
def test_rft_spends_grpos_budget_and_chooses_its_lr_on_validation(
    tiny_chatml_model: Path, tmp_path: Path
) -> None:
    cfg = _parity_run(tiny_chatml_model, tmp_path)
    budget = RftBudget(episodes=16, trained_tokens=60)
    settings = RftSettings(rounds=2, lrs=[1e-4, 5e-2], batch=4, validation_items=3, validation_k=2)
    lines: list[str] = []
    path, info = asyncio.run(
        rft(cfg, tiny_chatml_model, tmp_path / "rft", budget, settings, validation_seed=7, say=lines.append)
    )
    assert info["sampled_episodes"] == 16 and len(info["rounds"]) == 2
    assert all(r["episodes"] == 8 for r in info["rounds"])
    trained = [r for r in info["rounds"] if r["kept"]]
    assert trained, "no round kept an episode (a random tiny model passes about half the time)"
    for r in trained:
        assert r["lr"] in (1e-4, 5e-2) and set(r["validation"]) == {"0.0001", "0.05"}
        assert r["validation"][f"{r['lr']:g}"] == max(r["validation"].values())
    # within one sample of GRPO's trained tokens (each sample here has at most 8 + 1 sampled tokens)
    assert 60 <= info["trained_tokens"] <= 60 + 9 or len(trained) < 2
    assert info["validation_episodes"] == 3 * 2 * 2 * len(trained)
    assert (path / "model.safetensors").is_file() and json.loads((path / "rft.json").read_text())[
        "updates"
    ] >= 1
    # the validation items were the validation seed's, the training items the run's own stream
    val_rows = [
        json.loads(x)
        for x in (
            tmp_path
            / "rft"
            / "candidates"
            / f"round-{trained[0]['round']}-lr-0.0001"
            / "validation"
            / "episodes.jsonl"
        )
        .read_text()
        .splitlines()
    ]
    assert {r["item_id"] for r in val_rows} == {f"eval-7-{i}" for i in range(3)}


class _Stop(Exception):
    pass


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
@pytest.mark.timeout(600)
def test_a_stopped_rft_resumes_after_its_last_finished_round(tiny_chatml_model: Path, tmp_path: Path) -> None:
    """Stopped inside round 2 (after its sampling), a rerun into the same directory continues from
    round 1's checkpoint: round 1 is neither sampled nor trained again, the report counts both
    rounds once, and a checkpoint of another run (another budget) is not taken for this one's."""
    from trajforge.rl.rft import ROUND_DIR, ROUND_FILE, finished_rounds, run_identity

    cfg = _parity_run(tiny_chatml_model, tmp_path)
    budget = RftBudget(episodes=16, trained_tokens=60)
    settings = RftSettings(rounds=2, lrs=[1e-3], batch=4, validation_items=2, validation_k=1)
    out = tmp_path / "rft"
    first: list[str] = []

    def stop_in_round_2(line: str) -> None:
        first.append(line)
        if line.startswith("rft round 2/2"):
            raise _Stop

    with pytest.raises(_Stop):
        asyncio.run(
            rft(cfg, tiny_chatml_model, out, budget, settings, validation_seed=7, say=stop_in_round_2)
        )
    saved = json.loads((out / ROUND_DIR / ROUND_FILE).read_text())
    assert [r["round"] for r in saved["rounds"]] == [1] and not (out / "final").exists()
    identity = run_identity(cfg, tiny_chatml_model, budget, settings, 7)
    assert finished_rounds(out, identity) is not None
    other = run_identity(cfg, tiny_chatml_model, RftBudget(episodes=32, trained_tokens=60), settings, 7)
    assert finished_rounds(out, other) is None  # another budget: started over, never continued

    second: list[str] = []
    path, info = asyncio.run(
        rft(cfg, tiny_chatml_model, out, budget, settings, validation_seed=7, say=second.append)
    )
    assert any(line.startswith("rft: resuming after round 1 of 2") for line in second)
    assert not any(line.startswith("rft round 1/2") for line in second)
    assert sum(line.startswith("rft round 2/2:") for line in second) == 1
    assert info["resumed_after_round"] == 1
    assert [r["round"] for r in info["rounds"]] == [1, 2] and info["rounds"][0] == saved["rounds"][0]
    assert info["sampled_episodes"] == 16
    assert info["trained_tokens"] == sum(r["trained_tokens"] for r in info["rounds"])
    assert info["validation_episodes"] == 2 * sum(1 for r in info["rounds"] if r["kept"])
    assert (path / "model.safetensors").is_file() and not (out / ROUND_DIR).exists()


def test_failure_kinds_fold_the_particulars_away() -> None:
    def rec(
        reward: float = 0.0, reward_reason: str = "", reward_error: str | None = None, **kw: Any
    ) -> Record:
        base: dict[str, Any] = {
            "key": "k",
            "status": "completed",
            "reason_kind": "final_answer",
            "tool_stats": {"terminal": {"count": 1}},
        }
        return Record(**{**base, **kw}, reward=Reward(value=reward, reason=reward_reason, error=reward_error))

    assert failure_kind(rec(reward=1.0)) == "passed"
    wrong = [
        rec(reward_reason="answer 42 is wrong; expected 45"),
        rec(reward_reason="answer -7 is wrong; expected 1,009"),
    ]
    assert {failure_kind(r) for r in wrong} == {"answer N is wrong; expected N"}
    assert (
        failure_kind(rec(reward_reason="the answer names 2 numbers (3, 4), not one"))
        == "the answer names N numbers (...), not one"
    )
    assert (
        failure_kind(rec(reward_reason="apple.txt holds 'x y', expected 'x y z'"))
        == "FILE holds '...', expected '...'"
    )
    assert failure_kind(rec(status="partial", reason_kind="truncated")) == "ended: truncated"
    assert failure_kind(rec(status="failed", reason_kind="model_error")) == "failed: model_error"
    assert (
        failure_kind(rec(reward_reason="no final answer", tool_stats={})) == "no final answer (no tool call)"
    )
    assert failure_kind(rec(reward_error="boom")) == "reward code raised"
    assert breakdown([*wrong, rec(reward=1.0)]) == {"answer N is wrong; expected N": 2, "passed": 1}


def test_paired_pass_at_k_and_the_table() -> None:
    from trajforge.engine.summary import summarize
    from trajforge.experiments.closed_loop import StageEval, format_table, paired

    def stage(name: str, by_item: dict[str, float]) -> StageEval:
        summary = summarize([], "tiny_tasks")
        return StageEval(
            name, summary, summary, by_item, dict(by_item), {i: "arithmetic" for i in by_item}, 1.0
        )

    a = stage("RFT", {"x": 0.0, "y": 0.25, "z": 1.0})
    b = stage("GRPO", {"x": 0.5, "y": 0.0, "z": 1.0})
    assert paired(a, b)["delta"] == pytest.approx((0.5 - 0.25 + 0) / 3, abs=1e-4)
    assert paired(a, b, metric="pass_at_k")["delta"] == pytest.approx((1 - 1 + 0) / 3, abs=1e-4)

    def row(name: str, sampled: float, at_k: float, greedy: float) -> dict[str, Any]:
        rates = {
            "sampled_pass1": {"value": sampled},
            "sampled_pass_at_k": {"4": at_k},
            "greedy": {"value": greedy},
        }
        return {"name": name, "families": {"all": rates}}

    report = {
        "stages": [row("before", 0.2, 0.5, 0.4), row("GRPO", 0.6, 0.9, 0.9), row("RFT", 0.5, 0.9, 0.95)],
        "eval": {"samples_per_item": 4},
        "headline": {"share_over": "all"},
        "shares": {
            "all": {
                "grpo_sampled": {"delta": 0.4, "low": 0.3, "high": 0.5},
                "rft_sampled": {"delta": 0.3, "low": 0.2, "high": 0.4},
                "grpo_minus_rft_sampled": {"delta": 0.1, "low": 0.02, "high": 0.18},
                "grpo_minus_rft_greedy": {"delta": -0.05, "low": -0.1, "high": 0.0},
            }
        },
        "compute": {
            "GRPO": {
                "steps": 32,
                "sampled_episodes": 2048,
                "trained_tokens": 90000,
                "oracle_episodes": 0,
                "seconds": 600,
                "information": "reward",
            }
        },
    }
    table = format_table(report)
    assert (
        "RFT | 50.0% / 90.0% / 95.0% | +30.0 [+20.0, +40.0] | +10.0 [+2.0, +18.0] | -5.0 [-10.0, +0.0]"
        in table
    )
    assert "GRPO | 32 | 2048 | 90000 | 0 | 600 | reward" in table


@pytest.mark.parametrize("lr", [0.0, -1e-4])
def test_an_rft_learning_rate_must_be_positive(lr: float) -> None:
    """A zero or negative candidate would train nothing (or away from what passed) and could still
    win the validation round by doing least harm."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="greater than 0"):
        RftSettings(lrs=[1e-4, lr])
