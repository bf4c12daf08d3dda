"""The supervised warm start (``warm_start`` in ``rl train``/``rl demo``): oracle demonstrations
-> supervised updates -> the model GRPO starts from.

Real parts: the tiny_tasks env, its oracle and verifier, bubblewrap sandboxes, a tiny Qwen2 with a
real (byte-level BPE + Jinja ChatML) tokenizer, ``trajforge serve`` for the GRPO step.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from typer.testing import CliRunner

from trajforge.envs.base import BaseEnv
from trajforge.envs.config import EnvConfig
from trajforge.envs.types import Item, RewardBreakdown
from trajforge.llm.chat_template import ChatTemplate
from trajforge.rl.config import TrainConfig, TrainConfigError, WarmStart
from trajforge.rl.grpo import Sample, collate, token_logprobs
from trajforge.rl.warm_start import INFO_FILE, collect_demonstrations, supervised_updates, warm_start
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.testing.tiny import IM_END
from trajforge.tools.builtin import default_registry

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.timeout(300),
]


class WrongOracleEnv(BaseEnv):
    """An env whose reference solution is wrong: its verifier fails every oracle episode."""

    name: ClassVar[str] = "wrong-oracle"
    description: ClassVar[str] = "test env: the oracle answers 'no', the verifier wants 'yes'"

    @classmethod
    def default_config(cls) -> EnvConfig:
        return EnvConfig(enabled_toolsets=["file"], max_agent_turns=2, sandbox="bwrap")

    def generate(self, index: int, *, split: str) -> Item:
        return {"id": f"{split}-{index}", "prompt": "Say yes."}

    def oracle_calls(self, item: Item) -> list[tuple[str, dict[str, Any]]]:
        return []

    def oracle_answer(self, item: Item, messages: list[dict[str, Any]]) -> str:
        return "no"

    async def compute_reward(self, item: Item, result: Any, ctx: Any) -> RewardBreakdown:
        last = str(result.messages[-1].get("content") or "") if result.messages else ""
        return RewardBreakdown(reward=1.0 if last.strip() == "yes" else 0.0)


@pytest.fixture
def tiny_model(tiny_chatml_model: Path) -> Path:
    return tiny_chatml_model


def _config(model: Path, out: Path, **extra: Any) -> TrainConfig:
    data: dict[str, Any] = {
        "env": "tiny_tasks",
        "model": model,
        "output_dir": out,
        "device": "cpu",
        "steps": 1,
        "group_size": 2,
        "groups_per_step": 1,
        "max_tokens": 12,
        "max_turns": 1,
        "concurrency": 4,
        "max_batch": 4,
        "micro_batch": 4,
        "env_overrides": {"families": ["arithmetic"], "sandbox": "bwrap"},
        "warm_start": {
            "updates": 3,
            "batch": 2,
            "lr": 5e-3,
            "env_overrides": {"families": ["write_file", "find_value"]},
        },
    }
    data.update(extra)
    return TrainConfig.model_validate(data)


def _mean_nll(model: Any, samples: list[Sample]) -> float:
    batch = collate(samples, 0)
    with torch.no_grad():
        lp, _ = token_logprobs(model.eval(), batch)
    return float(-(lp * batch.loss_mask).sum() / batch.loss_mask.sum())


def _mean_nll_of(model_dir: Path, samples: list[Sample]) -> float:
    """The token-mean NLL of ``samples`` under the model in ``model_dir`` (the first update's loss)."""
    from transformers import AutoModelForCausalLM

    return _mean_nll(AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32), samples)


async def _demos(cfg: TrainConfig, n: int, phase: int = 0) -> Any:
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", command_timeout_s=30))
    try:
        return await collect_demonstrations(
            cfg, n, factory, default_registry(), ChatTemplate.from_path(str(cfg.model)), phase=phase
        )
    finally:
        await close_factory(factory)


def test_demonstrations_are_the_oracles_passing_turns_and_supervision_fits_them(
    tiny_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    cfg = _config(tiny_model, tmp_path / "run")
    demos = asyncio.run(_demos(cfg, 4))
    # the warm start's own mix (not the GRPO mix, arithmetic only), every oracle episode passed
    assert demos.failed == 0 and demos.untraceable == 0 and len(demos.samples) == 4
    assert set(demos.by_family) == {"write_file", "find_value"} and sum(demos.by_family.values()) == 4
    template = ChatTemplate.from_path(str(tiny_model))
    for s in demos.samples:
        # trained positions: the assistant turns only, each ending with the end-of-turn token
        assert s.num_sampled > 0 and not s.sampled[0]
        turn_ends = [i for i in range(1, len(s.tokens)) if s.sampled[i - 1] and not s.sampled[i]]
        assert turn_ends and all(template.decode([s.tokens[i - 1]]) == IM_END for i in turn_ends)
        assert "<tool_call>" in template.decode([t for t, m in zip(s.tokens, s.sampled, strict=True) if m])

    for focal in (0.0, 2.0):  # plain NLL, and NLL weighted towards the tokens the model gets wrong
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
        start = {k: v.clone() for k, v in model.state_dict().items()}
        before = _mean_nll(model, demos.samples)
        seen: list[int] = []
        losses = supervised_updates(
            model,
            [demos.samples],
            WarmStart(updates=8, batch=2, lr=5e-3, decay=0.5, focal=focal),
            micro_batch=1,
            pad_id=0,
            device="cpu",
            on_update=lambda k, _loss, seen=seen: seen.append(k),
        )
        after = _mean_nll(model, demos.samples)
        assert seen == list(range(1, 9)) and len(losses) == 8
        assert losses[0] == pytest.approx(_mean_nll_of(tiny_model, demos.samples[:2]), rel=1e-3)
        assert after < before * 0.9, (focal, before, after)
        assert any(not torch.equal(v, model.state_dict()[k]) for k, v in start.items())


def test_a_phased_warm_start_trains_each_phase_on_its_own_mix_in_order(
    tiny_model: Path, tmp_path: Path
) -> None:
    """``phases``: each phase's demonstrations come from its own families and item stream, and its
    updates run in order on them, cycling within the phase."""
    from transformers import AutoModelForCausalLM

    phases = [
        {"updates": 3, "env_overrides": {"families": ["write_file"]}},
        {"updates": 2, "env_overrides": {"families": ["count_lines"]}},
    ]
    cfg = _config(tiny_model, tmp_path / "run", warm_start={"batch": 1, "lr": 1e-12, "phases": phases})
    assert cfg.warm_start is not None and cfg.warm_start.total_updates == 5
    first, second = (asyncio.run(_demos(cfg, 2, phase=i)) for i in (0, 1))
    assert dict(first.by_family) == {"write_file": 2} and dict(second.by_family) == {"count_lines": 2}
    # phase 0 draws from the single-phase warm start's item stream, later phases from their own
    plain = asyncio.run(
        _demos(
            _config(tiny_model, tmp_path / "p", warm_start={"env_overrides": phases[0]["env_overrides"]}), 2
        )
    )
    assert [s.tokens for s in plain.samples] == [s.tokens for s in first.samples]

    # lr ~0: the model does not move, so each update's loss is the NLL of the batch it trained on
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    losses = supervised_updates(
        model, [first.samples, second.samples], cfg.warm_start, micro_batch=1, pad_id=0, device="cpu"
    )
    expected = [first.samples[0], first.samples[1], first.samples[0], second.samples[0], second.samples[1]]
    assert losses == pytest.approx([_mean_nll(model, [s]) for s in expected], rel=1e-4)
    with pytest.raises(ValueError, match=r"2 phase\(s\) need samples each; got \[2, 0\]"):
        supervised_updates(model, [first.samples, []], cfg.warm_start, micro_batch=1, pad_id=0, device="cpu")


def test_an_oracle_that_never_passes_is_a_clear_error(tiny_model: Path, tmp_path: Path) -> None:
    cfg = _config(
        tiny_model,
        tmp_path / "run",
        env=f"{__file__}:WrongOracleEnv",
        env_overrides={},
        warm_start={"updates": 2, "batch": 2},
    )

    async def run() -> None:
        from trajforge.rl.checkpoint import RunDir

        factory = create_sandbox_factory(SandboxConfig(kind="bwrap", command_timeout_s=30))
        try:
            await warm_start(
                cfg, RunDir(tmp_path / "run"), device="cpu", factory=factory, registry=default_registry()
            )
        finally:
            await close_factory(factory)

    with pytest.raises(TrainConfigError, match=r"none of 4 oracle episodes gave a demonstration \(4 failed"):
        asyncio.run(run())
    assert not (tmp_path / "run" / "warm_start").exists()


def test_grpo_starts_from_the_warm_start_and_a_resumed_run_reuses_it(
    tiny_model: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from trajforge.rl.builtin import BuiltinTrainer

    out = tmp_path / "run"
    seen: list[tuple[Path, dict[str, Any]]] = []
    result = asyncio.run(
        BuiltinTrainer(
            _config(tiny_model, out, kl_coef=0.05, skip_uniform_groups=False),
            on_warm_start=lambda p, i: seen.append((p, i)),
        ).run()
    )
    warm = out / "warm_start"
    info = json.loads((warm / INFO_FILE).read_text())
    assert seen == [(warm, info)] and result.warm_start == info
    assert info["updates"] == 3 and info["demonstrations"] == 6 and info["oracle_failed"] == 0
    assert set(info["by_family"]) <= {"write_file", "find_value"} and info["seconds"] > 0
    assert (warm / "config.json").is_file() and (warm / "tokenizer.json").is_file()
    base, ws = load_file(str(tiny_model / "model.safetensors")), load_file(str(warm / "model.safetensors"))
    assert any(not torch.equal(base[k], ws[k]) for k in base), "the warm start changed no weight"
    # Step 1 samples from the server and trains on-policy: the server served the warm-started
    # weights (ratio 1 against its logprobs), and the KL reference is the warm start (KL 0 before
    # the first update), not the model the warm start began from.
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 1 and first["episodes"] == 2 and first["trained_tokens"] > 0
    assert first["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert first["kl_ref"] == pytest.approx(0.0, abs=1e-5)

    # Resume with more steps: the warm start is found complete, not run again, no hook call.
    stamp = (warm / "model.safetensors").stat().st_mtime_ns
    seen.clear()
    again = asyncio.run(
        BuiltinTrainer(
            _config(tiny_model, out, kl_coef=0.05, skip_uniform_groups=False, steps=2),
            on_warm_start=lambda p, i: seen.append((p, i)),
        ).run()
    )
    assert seen == [] and again.warm_start == {**info, "reused": True} and again.resumed_from == 1
    assert (warm / "model.safetensors").stat().st_mtime_ns == stamp
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]

    # A run directory whose warm start went missing says so instead of silently starting over.
    shutil.rmtree(warm)
    with pytest.raises(TrainConfigError, match="warm start .* is missing"):
        asyncio.run(
            BuiltinTrainer(_config(tiny_model, out, kl_coef=0.05, skip_uniform_groups=False, steps=3)).run()
        )


def test_warm_start_settings_are_validated_and_reach_the_cli(tmp_path: Path) -> None:
    from trajforge.cli.main import app
    from trajforge.endpoint import embedded_weights

    with pytest.raises(ValueError, match="warm_start runs in the builtin trainer only"):
        TrainConfig(env="tiny_tasks", model=embedded_weights(), trainer="trl", warm_start=WarmStart())
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        TrainConfig.model_validate(
            {"env": "tiny_tasks", "model": embedded_weights(), "warm_start": {"steps": 3}}
        )
    phased = {"phases": [{"updates": 4, "env_overrides": {"families": ["write_file"]}}, {"updates": 6}]}
    ws = WarmStart.model_validate(phased)
    assert ws.total_updates == 10 and [p.updates for p in ws.schedule()] == [4, 6]
    assert WarmStart(updates=7).schedule()[0].updates == 7 and WarmStart().total_updates == 250
    with pytest.raises(ValueError, match="either `updates` .* or `phases`"):
        WarmStart.model_validate({**phased, "updates": 5})
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        WarmStart.model_validate({"phases": [{"updates": 0}]})
    # rl demo's own warm start is a valid one: a fixed set of every family GRPO does not train on
    # (tests/test_rl_demo_fixed_set.py checks the split)
    from trajforge.experiments.closed_loop import WARM_START

    demo_ws = WarmStart.model_validate(WARM_START)
    assert demo_ws.total_updates >= 1 and demo_ws.demos == 100
    assert {"count_lines", "count_words", "find_value", "write_file"} <= set(
        demo_ws.env_overrides["families"]
    )
    # a dumped phased config (config.json; the train.yaml a managed run hands `rl train --config`)
    # validates again as written
    import yaml

    from trajforge.rl.runs.run_config import TRAIN_FILE, train_run_spec

    cfg = TrainConfig(env="tiny_tasks", model=embedded_weights(), warm_start=ws)
    assert TrainConfig.model_validate(cfg.model_dump(mode="json")) == cfg
    spec = train_run_spec({"env": "tiny_tasks", "model": str(embedded_weights()), "warm_start": phased})
    again = TrainConfig.model_validate(yaml.safe_load(spec.files[TRAIN_FILE]))
    assert again.warm_start is not None and again.warm_start.schedule() == ws.schedule()
    res = CliRunner().invoke(
        app,
        [
            "rl",
            "train",
            "tiny_tasks",
            "--trainer",
            "trl",
            "--warm-start-updates",
            "5",
            "--output-dir",
            str(tmp_path),
        ],
    )
    assert res.exit_code == 2 and "warm_start runs in the builtin trainer only" in res.output


def test_rl_demo_names_the_weights_it_cannot_start_from(tmp_path: Path) -> None:
    """``--model-path DIR`` that is no model directory stops the demo before anything is served or
    written, with the path and what to do."""
    from trajforge.cli.main import app

    missing = tmp_path / "no-such-model"
    res = CliRunner().invoke(
        app, ["rl", "demo", "--output-dir", str(tmp_path), "--run-name", "d", "--model-path", str(missing)]
    )
    assert res.exit_code == 2, (res.output, res.exception)
    assert str(missing) in res.output and "not a local transformers model directory" in res.output
    assert not (tmp_path / "d" / "report.json").exists()


@pytest.mark.timeout(900)  # four stages, each served and evaluated; slow on a loaded machine
@pytest.mark.slow
def test_rl_demo_measures_warm_start_grpo_and_the_controls_alike(tmp_path: Path) -> None:
    """``trajforge rl demo`` end to end, shrunk: the recipe's policy evaluated greedy and sampled,
    warm-started, then one GRPO step, the RFT control and the demonstration-set control from the
    same warm start with GRPO's counted compute, each evaluated on the same held-out items with the
    same per-episode seeds; the report gives GRPO's share and its margin over each control, the
    compute each spent, the failure kinds; the figure is written and the tables printed last."""
    from trajforge.cli.main import app
    from trajforge.endpoint import recipe_weights

    cfg = tmp_path / "small.yaml"
    cfg.write_text(
        "warm_start: {batch: 3, updates: 2, demos: 4, env_overrides: {families: [count_lines]}}\n"
        "group_size: 2\ngroups_per_step: 1\nconcurrency: 4\nmax_batch: 4\n"
        "rft: {rounds: 1, lrs: [1.0e-3], validation_items: 2, validation_k: 1}\n"
    )
    out = tmp_path / "demo"
    args = [
        "rl",
        "demo",
        "--output-dir",
        str(out.parent),
        "--run-name",
        out.name,
        "--max-samples",
        "5",
        "--eval-k",
        "2",
        "--control",
        "rft",
        "--control",
        "set",
        "--config",
        str(cfg),
    ]
    res = CliRunner().invoke(app, [*args, "--steps", "1"])
    assert res.exit_code == 0, (res.output, res.exception)
    report = json.loads((out / "report.json").read_text())
    names = [s["name"] for s in report["stages"]]
    assert names == ["before", "warm start", "GRPO", "RFT", "set SFT"]
    for stage in report["stages"]:
        cell = stage["families"]["all"]
        assert cell["items"] == 5 and 0.0 <= cell["sampled_pass1"]["value"] <= 1.0
        assert set(cell) >= {"greedy", "sampled_pass1", "sampled_pass_at_k"}
        assert (
            sum(stage["failures"]["sampled"].values()) == 10
            and sum(stage["failures"]["greedy"].values()) == 5
        )
    head = report["headline"]
    assert head["grpo_steps"] == 1 and set(head["sampled_pass1"]) == set(names)
    shares = report["shares"]["all"]
    for key in ("grpo_sampled", "grpo_greedy", "rft_sampled", "grpo_minus_rft_sampled", "set_sampled"):
        assert shares[key]["items"] == 5 and shares[key]["low"] <= shares[key]["delta"] <= shares[key]["high"]
    assert head["grpo_share_sampled_points"] == round(100 * shares["grpo_sampled"]["delta"], 1)
    assert head["grpo_minus_rft_sampled"]["points"] == round(
        100 * shares["grpo_minus_rft_sampled"]["delta"], 1
    )
    # every control had GRPO's counted compute from the same warm start: RFT its sampled episodes
    # and trained tokens, the set control its trained tokens on the warm start's own fixed set
    compute = report["compute"]
    grpo_tokens = compute["GRPO"]["trained_tokens"]
    assert compute["RFT"]["sampled_episodes"] == compute["GRPO"]["sampled_episodes"] == 2
    assert compute["set SFT"]["trained_tokens"] >= grpo_tokens and compute["set SFT"]["sampled_episodes"] == 0
    assert report["controls"]["set"]["fixed_set"] is True and report["controls"]["set"]["data"] == "set"
    assert report["controls"]["rft"]["validation_seed"] == report["eval"]["validation_seed"]
    assert report["warm_start"]["fixed_set"] == 4
    assert report["warm_start"]["updates"] == 2 and report["train_config"]["model"] == str(recipe_weights())
    # every stage: the same items, and the same seed for each sampled episode (paired comparison)
    seeds = []
    for d in ("eval-before", "eval-warm-start", "eval-GRPO", "eval-RFT", "eval-set-SFT"):
        eps = [json.loads(x) for x in (out / d / "sampled" / "episodes.jsonl").read_text().splitlines()]
        seeds.append(sorted((e["item_id"], e["rollout"], e["seed"]) for e in eps))
        greedy = (out / d / "greedy" / "episodes.jsonl").read_text().splitlines()
        assert len(eps) == 10 and len(greedy) == 5
    assert seeds[0] == seeds[1] == seeds[2] == seeds[3] == seeds[4]
    assert (out / "closed_loop.png").stat().st_size > 10_000
    # live lines while it ran, the tables at the end
    assert "grpo step 1/1 reward " in res.output and " eta " in res.output
    assert "GRPO minus it (sampled)" in res.output and "information used" in res.output
    assert "it/s" not in res.output

    # the same command again resumes the directory: nothing is trained again, every stage is
    # measured from the episodes already there, and the report counts the same compute
    again = CliRunner().invoke(app, [*args, "--steps", "1"])
    assert again.exit_code == 0, (again.output, again.exception)
    assert "GRPO: the finished run in" in again.output and "grpo step" not in again.output
    assert again.output.count("(an earlier run of this directory)") == 2
    rerun = json.loads((out / "report.json").read_text())
    assert rerun["compute"]["RFT"] == compute["RFT"] and rerun["compute"]["set SFT"] == compute["set SFT"]
    for a, b in zip(rerun["stages"], report["stages"], strict=True):
        assert (a["name"], a["families"], a["failures"]) == (b["name"], b["families"], b["failures"])
    for key in ("sampled_episodes", "trained_tokens", "steps"):
        assert rerun["compute"]["GRPO"][key] == compute["GRPO"][key]

    # one more step: GRPO resumes from step 1, and RFT's budget and the curve count both steps;
    # the stages trained again are measured afresh, not from the first model's episodes
    more = CliRunner().invoke(app, [*args, "--steps", "2"])
    assert more.exit_code == 0, (more.output, more.exception)
    assert "GRPO resumed from step 1; 1 steps run now" in more.output
    longer = json.loads((out / "report.json").read_text())
    assert longer["headline"]["grpo_steps"] == 2 and [m["step"] for m in longer["metrics"]] == [1, 2]
    assert longer["compute"]["GRPO"]["sampled_episodes"] == 4
    assert longer["compute"]["RFT"]["sampled_episodes"] == 4
    assert (
        longer["controls"]["rft"]["budget"]["trained_tokens"] == longer["compute"]["GRPO"]["trained_tokens"]
    )
    assert longer["compute"]["set SFT"]["trained_tokens"] >= longer["compute"]["GRPO"]["trained_tokens"]
    claimed = json.loads((out / "eval-GRPO" / "model.json").read_text())
    assert claimed["model_dir"].endswith("step-00002")
    assert len((out / "eval-GRPO" / "sampled" / "episodes.jsonl").read_text().splitlines()) == 10


def test_the_closed_loop_figure_draws_each_stage_apart(tmp_path: Path) -> None:
    """The warm start gets a stretch of its own left of step 0; GRPO and the controls (GRPO's
    compute) sit at GRPO's last step; the figure renders with and without controls."""
    from trajforge.experiments.plot import plot_closed_loop, stage_x

    def cell(p: float) -> dict[str, Any]:
        iv = {"value": p, "low": max(0.0, p - 0.1), "high": min(1.0, p + 0.1)}
        return {"items": 20, "greedy": iv, "sampled_pass1": iv, "sampled_pass_at_k": min(1.0, p + 0.2)}

    def stage(name: str, p: float) -> dict[str, Any]:
        return {
            "name": name,
            "seconds": 1.0,
            "families": {"all": cell(p), "arithmetic": cell(p), "write_file": cell(p / 2)},
        }

    metrics = [
        {"step": k, "reward_mean": 0.5, "reward_by_category": {"arithmetic": 0.6}} for k in range(1, 41)
    ]
    full = {
        "metrics": metrics,
        "eval": {"items": 40, "samples_per_item": 4},
        "stages": [
            stage("before", 0.3),
            stage("warm start", 0.5),
            stage("GRPO", 0.7),
            stage("RFT", 0.55),
            stage("set SFT", 0.1),
        ],
    }
    assert stage_x(full) == {"before": -10.0, "warm start": 0.0, "GRPO": 40.0, "RFT": 40.0, "set SFT": 40.0}
    no_control = {**full, "stages": full["stages"][:3]}
    for name, report in (("full", full), ("no-control", no_control)):
        assert plot_closed_loop(report, tmp_path / f"{name}.png").stat().st_size > 10_000
