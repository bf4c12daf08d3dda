"""A warm start on a fixed demonstration set (``warm_start.demos``) and the demo's supervised
controls: the set is collected once, cycled through in epochs, kept beside the model, and the
``set`` control trains more epochs on exactly it (no new oracle episode) -- or, the ``oracle``
control, on fresh oracle demonstrations of GRPO's own families -- each until GRPO's trained tokens.

Real parts: the tiny_tasks env, its oracle and verifier, bubblewrap sandboxes, a tiny Qwen2 with a
real tokenizer and chat template.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import trajforge.rl.warm_start as warm_start_module
from trajforge.experiments.closed_loop import (
    DEMO_DEFAULTS,
    WARM_START,
    DemoError,
    DemoPlan,
    control_stage,
    held_out_seed,
    make_plan,
    validation_seed,
)
from trajforge.llm.chat_template import ChatTemplate
from trajforge.rl.checkpoint import RunDir
from trajforge.rl.config import TrainConfig, TrainConfigError
from trajforge.rl.warm_start import (
    DEMOS_FILE,
    INFO_FILE,
    collect_demonstrations,
    load_demonstrations,
    warm_start,
)
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.tools.builtin import default_registry

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.timeout(300),
]


def _config(model: Path, out: Path, **warm: Any) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "env": "tiny_tasks",
            "model": model,
            "output_dir": out,
            "device": "cpu",
            "concurrency": 4,
            "micro_batch": 4,
            "env_overrides": {"families": ["arithmetic"], "sandbox": "bwrap"},
            "warm_start": {
                "updates": 4,
                "batch": 2,
                "lr": 1e-3,
                "env_overrides": {"families": ["count_lines", "find_value"]},
                **warm,
            },
        }
    )


async def _warm(cfg: TrainConfig, root: Path) -> tuple[Path, dict[str, Any]]:
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", command_timeout_s=30))
    try:
        return await warm_start(cfg, RunDir(root), device="cpu", factory=factory, registry=default_registry())
    finally:
        await close_factory(factory)


def test_a_fixed_set_is_collected_once_cycled_and_kept(tiny_chatml_model: Path, tmp_path: Path) -> None:
    cfg = _config(tiny_chatml_model, tmp_path / "run", demos=3)
    path, info = asyncio.run(_warm(cfg, tmp_path / "run"))
    # 3 oracle episodes (not updates x batch = 8), trained on for 8 / 3 epochs
    assert info["oracle_episodes"] == 3 and info["demonstrations"] == 3 and info["fixed_set"] == 3
    assert info["epochs"] == pytest.approx(8 / 3, abs=0.01) and info["updates"] == 4
    assert json.loads((path / INFO_FILE).read_text())["fixed_set"] == 3
    kept = load_demonstrations(path)
    assert kept is not None and [len(p) for p in kept] == [3]
    rows = [json.loads(x) for x in (path / DEMOS_FILE).read_text().splitlines()]
    assert {r["family"] for r in rows} <= {"count_lines", "find_value"} and {r["phase"] for r in rows} == {0}

    # the kept set is the warm start's own: the same item stream collected again gives the same tokens
    async def again() -> Any:
        factory = create_sandbox_factory(SandboxConfig(kind="bwrap", command_timeout_s=30))
        try:
            template = ChatTemplate.from_path(str(cfg.model))
            return await collect_demonstrations(cfg, 3, factory, default_registry(), template)
        finally:
            await close_factory(factory)

    fresh = asyncio.run(again())
    assert [s.tokens for s in fresh.samples] == [s.tokens for s in kept[0]]
    assert [s.sampled for s in fresh.samples] == [s.sampled for s in kept[0]]

    # without `demos`, nothing is kept (every update saw fresh demonstrations)
    plain, plain_info = asyncio.run(_warm(_config(tiny_chatml_model, tmp_path / "p"), tmp_path / "p"))
    assert load_demonstrations(plain) is None and plain_info["oracle_episodes"] == 8
    assert plain_info["fixed_set"] is None


def _plan(cfg: TrainConfig, out: Path) -> DemoPlan:
    return DemoPlan(out, cfg, 1, 1, ["set", "oracle"], lambda _line: None, ["arithmetic"])


def test_the_control_trains_more_epochs_on_the_warm_starts_set_or_on_the_oracle(
    tiny_chatml_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(tiny_chatml_model, tmp_path / "run", demos=3, batch=1)
    warm_dir, _ = asyncio.run(_warm(cfg, tmp_path / "run"))

    # 'set': the warm start's same 3 demonstrations, more epochs, and no oracle episode at all
    def no_oracle(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the set control collected new demonstrations")

    kept = load_demonstrations(warm_dir)
    assert kept is not None
    set_tokens = sum(s.num_sampled for s in kept[0])
    budget = 5 * set_tokens + 1  # five epochs and a bit: the control stops within one sample of it
    with monkeypatch.context() as m:
        m.setattr(warm_start_module, "collect_demonstrations", no_oracle)
        path, info = asyncio.run(control_stage(_plan(cfg, tmp_path / "c1"), warm_dir, "set", budget))
    assert info["data"] == "set" and info["fixed_set"] is True and info["demonstrations"] == 3
    assert budget <= info["trained_tokens"] < budget + max(s.num_sampled for s in kept[0])
    assert info["epochs_on_the_set"] == pytest.approx(info["trained_tokens"] / set_tokens, abs=0.01)
    assert info["updates"] >= 2 and info["oracle_episodes"] == 0 and info["sampled_episodes"] == 0
    assert "fixed set of 3" in info["described"] and (path / "model.safetensors").is_file()

    # 'set' with no warm start before it (GRPO starts from the plain weights): the set is collected
    # once, from the warm start's own item stream, and cycled
    calls: list[dict[str, Any]] = []
    real = warm_start_module.collect_demonstrations

    async def counted(*a: Any, **k: Any) -> Any:
        calls.append(k)
        return await real(*a, **k)

    with monkeypatch.context() as m:
        m.setattr(warm_start_module, "collect_demonstrations", counted)
        _, info = asyncio.run(control_stage(_plan(cfg, tmp_path / "c3"), tiny_chatml_model, "set", budget))
    assert [c.get("stream") for c in calls] == ["warm-start"]
    assert info["fixed_set"] is True and info["demonstrations"] == 3 and info["trained_tokens"] >= budget
    assert info["families"] == ["count_lines", "find_value"] and info["oracle_episodes"] == 3

    # 'oracle': fresh oracle demonstrations of GRPO's own families (arithmetic), not the warm start's,
    # each trained on once, collected until the budget is spent
    path, info = asyncio.run(control_stage(_plan(cfg, tmp_path / "c2"), warm_dir, "oracle", 400))
    assert info["data"] == "oracle" and info["fixed_set"] is False and info["families"] == ["arithmetic"]
    assert info["demonstrations"] >= 1 and info["updates"] >= 1 and 400 <= info["trained_tokens"] < 500
    assert info["oracle_episodes"] % 100 == 0 and info["oracle_episodes"] >= 100


def test_the_demos_own_setup_keeps_the_target_out_of_the_demonstrations(tmp_path: Path) -> None:
    """rl demo's defaults: GRPO's family has a checker and no demonstrations; the demonstration
    set covers every other family; each run seed has its own held-out and validation items, apart
    from each other and from the training items; an unknown control is refused by name."""
    grpo = set(DEMO_DEFAULTS["env_overrides"]["families"])
    warm = set(WARM_START["env_overrides"]["families"])
    assert grpo == {"arithmetic"} and not grpo & warm
    assert grpo | warm == {"arithmetic", "count_lines", "count_words", "find_value", "write_file"}
    # the held-out items the demo measures are not among the items GRPO trains on (a gain is not
    # memorised answers), nor among the validation items RFT chooses its lr on: 200 held-out and 48
    # validation prompts against the first 2,400 training items, for three seeds
    from trajforge.envs.catalog import load_env

    held_sets = []
    for seed in (0, 1, 2):
        env = load_env(
            "tiny_tasks", {"families": sorted(grpo), "seed": seed, "eval_seed": held_out_seed(seed)}
        )
        held = {item["prompt"] for item in env.eval_items(200)}
        val_env = load_env(
            "tiny_tasks", {"families": sorted(grpo), "seed": seed, "eval_seed": validation_seed(seed)}
        )
        val = {item["prompt"] for item in val_env.eval_items(48)}
        assert len(held) == 200 and len(val) == 48 and not held & val
        training = {env.generate(k, split="train")["prompt"] for k in range(2400)}
        assert not held & training and not val & training
        held_sets.append(held)
    assert not held_sets[0] & held_sets[1] and not held_sets[1] & held_sets[2]  # varied with the seed
    plan = make_plan(tmp_path, eval_n=4, eval_k=2, steps=1, overrides={}, echo=print)
    # GRPO starts from the given weights (a warm start on the other families drives arithmetic to
    # 0% sampled: docs/rl.md); the controls: RFT, the demonstration set, oracle demonstrations
    assert plan.config.warm_start is None and WARM_START["demos"] == 100
    assert plan.eval_families == ["arithmetic"] and plan.controls == ["rft", "set", "oracle"]
    assert plan.held_out_seed == held_out_seed(0) != plan.validation_seed
    with pytest.raises(DemoError, match="control 'more-sft': use any of rft, set, oracle, or none"):
        make_plan(tmp_path, eval_n=4, eval_k=2, steps=1, overrides={}, echo=print, controls=["more-sft"])
    with pytest.raises(DemoError, match="set control .* --family arithmetic only"):
        make_plan(
            tmp_path,
            eval_n=4,
            eval_k=2,
            steps=1,
            overrides={},
            echo=print,
            controls=["set"],
            family="write_file",
        )
    written = make_plan(tmp_path, eval_n=4, eval_k=2, steps=1, overrides={}, echo=print, family="write_file")
    assert written.controls == ["rft"] and written.eval_families == ["write_file"]
    assert "weights" in str(written.config.model)  # the embedded policy
    # ... sampled hot: at T=1 it passes ~94% (uniform groups), at T=1.5 ~50% (mixed); --config wins
    assert written.config.temperature == 1.5
    cooled = make_plan(
        tmp_path, eval_n=4, eval_k=2, steps=1, overrides={"temperature": 1.0}, echo=print, family="write_file"
    )
    assert cooled.config.temperature == 1.0

    # RFT's lr candidates: the family's low ones (higher collapsed RFT at T=1.5), --config's keys win
    def write_file_rft(rft: Any) -> Any:
        overrides = {"rft": rft}
        return make_plan(
            tmp_path, eval_n=4, eval_k=2, steps=1, overrides=overrides, echo=print, family="write_file"
        ).rft

    assert written.rft.lrs == [1e-5, 3e-5, 1e-4] and written.rft.validation_items == 48
    tuned = write_file_rft({"validation_items": 16})
    assert tuned.lrs == [1e-5, 3e-5, 1e-4] and tuned.validation_items == 16
    assert write_file_rft({"lrs": [1e-3]}).lrs == [1e-3]
    with pytest.raises(TrainConfigError, match="a mapping of RFT's fields"):
        write_file_rft([1e-3])
    arith = make_plan(tmp_path, eval_n=4, eval_k=2, steps=1, overrides={}, echo=print)
    assert arith.rft.lrs == [1e-4, 3e-4, 1e-3]  # arithmetic keeps RftSettings' defaults
    assert (
        make_plan(tmp_path, eval_n=4, eval_k=2, steps=1, overrides={}, echo=print, controls=["none"]).controls
        == []
    )
