"""``trajforge rl train`` end to end on CPU: a tiny Qwen2 trains through each trainer path.

Real parts only: ``trajforge serve`` as a child process hosting the policy, the token-exact
client, the agent loop, bubblewrap sandboxes, the env's ``compute_reward``; torch for the
builtin trainer and TRL's ``GRPOTrainer`` for ``--trainer trl``. Checked: the weights change, a
checkpoint appears, a server reloads it and then serves exactly the checkpoint's distribution,
and a run that crashes after a checkpoint continues from it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from trajforge.envs.base import BaseEnv
from trajforge.envs.config import EnvConfig
from trajforge.envs.types import Item, RewardBreakdown

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.timeout(600),
]

WORDS = ["apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "ocean"]
ENV_REF = f"{__file__}:LettersEnv"


class LettersEnv(BaseEnv):
    """Answer in free text; reward = how many of the item word's letters the answer has (/10).

    A random tiny model scores anywhere in [0, 1], so every group has a spread to learn from.
    """

    name: ClassVar[str] = "letters"
    description: ClassVar[str] = "test env: reward counts the item's letters in the answer"

    @classmethod
    def default_config(cls) -> EnvConfig:
        return EnvConfig(enabled_toolsets=["file"], max_agent_turns=1, max_tokens=12, agent_temperature=1.0)

    def generate(self, index: int, *, split: str) -> Item:
        word = WORDS[index % len(WORDS)]
        return {"id": f"{split}-{index}", "prompt": f"Write words with the letters of {word}.", "word": word}

    async def compute_reward(self, item: Item, result: Any, ctx: Any) -> RewardBreakdown:
        text = next(
            (str(m.get("content") or "") for m in reversed(result.messages) if m.get("role") == "assistant"),
            "",
        )
        return RewardBreakdown(reward=min(sum(ch in item["word"] for ch in text), 10) / 10)


@pytest.fixture
def tiny_model(tiny_chatml_model: Path) -> Path:
    return tiny_chatml_model


def _train(args: list[str]) -> Any:
    from trajforge.cli.main import app

    result = CliRunner().invoke(app, ["rl", "train", *args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result


def _args(model: Path, out: Path, steps: int, *extra: str) -> list[str]:
    return [
        ENV_REF,
        "--model-path",
        str(model),
        "--steps",
        str(steps),
        "--group-size",
        "4",
        "--groups",
        "2",
        "--lr",
        "5e-3",
        "--device",
        "cpu",
        "--output-dir",  # OUTPUT_DIR/RUN_NAME, as in every command that makes a run directory
        str(out.parent),
        "--run-name",
        out.name,
        *extra,
    ]


def _metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _changed(a: Path, b: Path) -> list[str]:
    import torch

    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    return [k for k in wa if not torch.equal(wa[k], wb[k])]


async def _first_token_logprob(base_url: str, prompt_ids: list[int]) -> tuple[int, float, int]:
    import aiohttp

    body = {"prompt": {"prompt_token_ids": prompt_ids}, "max_tokens": 1, "temperature": 0.0, "logprobs": 0}
    async with aiohttp.ClientSession() as s, s.post(f"{base_url}/generate", json=body) as resp:
        data = await resp.json()
        assert resp.status == 200, data
    token = data["token_ids"][0][0]
    return token, float(data["logprobs"][0][0][0][str(token)]), int(data["model_version"])


def _local_logprob(model_dir: Path, prompt_ids: list[int], token: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids])).logits[0, -1].float()
    return float(torch.log_softmax(logits, -1)[token])


async def _reload_check(initial: Path, checkpoint: Path) -> None:
    """A fresh server on the initial weights reloads ``checkpoint`` and serves its distribution."""
    import aiohttp
    from transformers import AutoTokenizer

    from trajforge.serve.launcher import LocalServer

    tok = AutoTokenizer.from_pretrained(str(initial))
    prompt_ids = tok.apply_chat_template(
        [{"role": "user", "content": "Write words with the letters of apple."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    prompt_ids = list(prompt_ids)
    async with LocalServer(initial, device="cpu") as server:
        assert server.base_url is not None
        tok_before, lp_before, v0 = await _first_token_logprob(server.base_url, prompt_ids)
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                f"{server.base_url}/v1/load_weights",
                json={"path": str(checkpoint)},
                headers=server.auth_headers(),
            ) as resp,
        ):
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["version"] == v0 + 1
        token, lp_after, v1 = await _first_token_logprob(server.base_url, prompt_ids)
    assert v1 == v0 + 1
    # the served distribution is the checkpoint's, not the initial model's
    assert lp_after == pytest.approx(_local_logprob(checkpoint, prompt_ids, token), abs=1e-4)
    assert (token, round(lp_after, 5)) != (tok_before, round(lp_before, 5))
    assert lp_before == pytest.approx(_local_logprob(initial, prompt_ids, tok_before), abs=1e-4)


@pytest.mark.slow
def test_builtin_trainer_trains_checkpoints_reloads_and_resumes(tiny_model: Path, tmp_path: Path) -> None:
    from trajforge.rl.builtin import BuiltinTrainer
    from trajforge.rl.config import TrainConfig

    out = tmp_path / "run"

    class Crash(RuntimeError):
        pass

    def crash_after_step_2(line: dict[str, Any]) -> None:
        if line["step"] == 2:
            raise Crash("simulated crash after step 2's checkpoint")

    cfg = TrainConfig(
        env=ENV_REF,
        model=tiny_model,
        steps=3,
        group_size=4,
        groups_per_step=2,
        lr=5e-3,
        device="cpu",
        output_dir=out,
        max_staleness=1,
        kl_coef=0.05,
        warmup_steps=2,
    )
    with pytest.raises(Crash):
        asyncio.run(BuiltinTrainer(cfg, on_step=crash_after_step_2).run())

    first = _metrics(out)
    assert [m["step"] for m in first] == [1, 2]
    assert [m["lr"] for m in first] == pytest.approx([2.5e-3, 5e-3])  # warm-up, then the peak
    state = json.loads((out / "state.json").read_text())
    assert state["step"] == 2 and state["checkpoint"] == "checkpoints/step-00002"
    step2 = out / state["checkpoint"]
    assert (step2 / "optimizer.pt").is_file() and (step2 / "tokenizer.json").is_file()
    assert _changed(tiny_model, step2), "training did not change any weight"
    for m in first:
        assert m["episodes"] == 8 and m["failed"] == 0 and m["reward_errors"] == 0 and m["untraced"] == 0
        assert m["trained_tokens"] > 0 and m["updates"] == 1
        assert 0.0 <= m["reward_mean"] <= 1.0 and m["reward_std"] >= 0.0
        for key in (
            "kl_ref",
            "kl_sampler",
            "entropy",
            "clip_fraction",
            "rollout_tokens_per_s",
            "train_tokens_per_s",
        ):
            assert isinstance(m[key], float), key
    # step 1 samples the initial weights and trains on-policy: ratio exactly 1 (server logprobs ==
    # the trainer's), no KL yet; every step's weights reached the server (one version per step)
    assert first[0]["staleness"] == 0 and first[0]["kl_sampler"] == pytest.approx(0.0, abs=1e-6)
    assert first[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert [m["server_version"] for m in first] == [1, 2]
    assert all(m["staleness"] <= 1 for m in first)

    # the same command again continues from step 2's checkpoint and runs step 3 only
    _train(_args(tiny_model, out, 3, "--kl", "0.05", "--max-staleness", "1"))
    lines = _metrics(out)
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert lines[2]["resumed_from"] == 2 and lines[2]["lr"] == pytest.approx(5e-3)
    assert lines[:2] == first
    final = json.loads((out / "state.json").read_text())
    assert final == {"step": 3, "checkpoint": "checkpoints/step-00003", "server_version": 1, "final": True}
    step3 = out / final["checkpoint"]
    assert _changed(step2, step3)
    # a finished run refuses to run again without more steps
    from trajforge.cli.main import app

    again = CliRunner().invoke(app, ["rl", "train", *_args(tiny_model, out, 3)])
    assert again.exit_code == 2 and "already finished step 3" in again.output

    asyncio.run(_reload_check(tiny_model, step3))


def test_trl_trainer_path_trains_and_its_checkpoint_serves(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "trl-run"
    _train(_args(tiny_model, out, 2, "--trainer", "trl", "--kl", "0.05"))
    lines = _metrics(out)
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["episodes"] == 8 and 0.0 <= m["reward_mean"] <= 1.0 and m["staleness"] == 0
        assert m["kl"] >= 0.0 and "entropy" in m and "clip_fraction" in m and m["tokens_per_s"] > 0
    state = json.loads((out / "state.json").read_text())
    assert state["step"] == 2 and state["final"] is True
    final = out / state["checkpoint"]
    assert (out / "trl" / "checkpoint-2" / "optimizer.pt").is_file()  # TRL's resumable checkpoint
    assert _changed(tiny_model, final), "TRL training did not change any weight"
    asyncio.run(_reload_check(tiny_model, final))


def test_config_errors_say_what_to_change(tiny_model: Path, tmp_path: Path) -> None:
    from trajforge.cli.main import app

    runner = CliRunner()
    bad = runner.invoke(
        app, ["rl", "train", ENV_REF, "--model", str(tmp_path), "--output-dir", str(tmp_path / "o")]
    )
    assert bad.exit_code == 2 and "no config.json" in bad.output
    cfg = tmp_path / "c.yaml"
    cfg.write_text("minibatches: 4\ngroups_per_step: 2\n")
    bad = runner.invoke(
        app,
        [
            "rl",
            "train",
            ENV_REF,
            "--model",
            str(tiny_model),
            "--config",
            str(cfg),
            "--output-dir",
            str(tmp_path / "o"),
        ],
    )
    assert bad.exit_code == 2 and "lower minibatches" in bad.output
    greedy = runner.invoke(
        app,
        [
            "rl",
            "train",
            ENV_REF,
            "--model",
            str(tiny_model),
            "--temperature",
            "0",
            "--output-dir",
            str(tmp_path / "g"),
        ],
    )
    assert greedy.exit_code == 2 and "--temperature > 0" in greedy.output


def test_step_lr_warms_up_linearly_and_depends_on_the_step_alone(tiny_model: Path) -> None:
    from trajforge.rl.config import TrainConfig, step_lr

    cfg = TrainConfig(env=ENV_REF, model=tiny_model, lr=1e-3, warmup_steps=4)
    assert [step_lr(cfg, s) for s in (1, 2, 4, 5, 50)] == pytest.approx([2.5e-4, 5e-4, 1e-3, 1e-3, 1e-3])
    assert step_lr(TrainConfig(env=ENV_REF, model=tiny_model, lr=1e-3), 1) == 1e-3


# --------------------------------------------------------------------------- issue 25's fixes


def test_trl_without_kl_prints_live_lines_and_a_resumed_run_continues(
    tiny_model: Path, tmp_path: Path
) -> None:
    """``--trainer trl`` without ``--kl``: TRL computes no KL (no reference model), the live line
    says ``kl -`` instead of failing to format None; no TRL/transformers progress bar leaks. The
    same command with more steps resumes from TRL's checkpoint (its callback reads TRL's
    ``TrainerState.global_step``, the run's own state separately)."""
    out = tmp_path / "trl-nokl"
    first = _train(_args(tiny_model, out, 1, "--trainer", "trl"))
    assert "step 1/1 reward " in first.output and " kl - " in first.output and "eta " in first.output
    assert "it/s" not in first.output and "%|" not in first.output and "{'loss'" not in first.output
    assert _metrics(out)[0]["kl"] is None
    # the phase is said before anything else (issue 43: a minute of silence, then step lines)
    assert first.output.startswith("[rl train] starting: loading the policy"), first.output[:200]
    second = _train(_args(tiny_model, out, 2, "--trainer", "trl"))
    assert "step 2/2 reward " in second.output and "[rl train] resuming:" in second.output
    lines = _metrics(out)
    assert [m["step"] for m in lines] == [1, 2] and lines[1]["resumed_from"] == 1
    assert json.loads((out / "state.json").read_text())["step"] == 2


def _model_with_sampling_defaults(root: Path) -> Path:
    """A tiny chat model whose generation_config.json sets top_p/top_k, as Qwen's does."""
    from transformers import GenerationConfig

    from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer

    tok = build_tiny_tokenizer(root / "tok", "chatml")
    build_tiny_model(root / "model", tok, hidden=32, layers=2, seed=0)
    GenerationConfig(do_sample=True, top_p=0.3, top_k=3, temperature=1.0).save_pretrained(str(root / "model"))
    return root / "model"


def test_training_rollouts_sample_the_full_distribution_whatever_the_model_ships(tmp_path: Path) -> None:
    """A server fills an omitted top_p/top_k from generation_config.json; training rollouts pin
    them off, so the first (on-policy) step's ratio against the server's logprobs is exactly 1
    and the sampler KL 0 (with top_k=3 the server's logprobs would be renormalised over 3 tokens)."""
    from trajforge.rl.builtin import BuiltinTrainer, full_distribution
    from trajforge.rl.config import TrainConfig, TrainConfigError
    from trajforge.serve.loading import generation_defaults

    model_dir = _model_with_sampling_defaults(tmp_path)
    from transformers import AutoModelForCausalLM

    assert generation_defaults(AutoModelForCausalLM.from_pretrained(str(model_dir))) == {
        "temperature": 1.0,
        "top_p": 0.3,
        "top_k": 3,
    }
    cfg = TrainConfig(
        env=ENV_REF,
        model=model_dir,
        steps=1,
        group_size=4,
        groups_per_step=2,
        device="cpu",
        output_dir=tmp_path / "run",
        skip_uniform_groups=False,
    )
    result = asyncio.run(BuiltinTrainer(cfg).run())
    line = result.metrics[0]
    assert line["trained_tokens"] > 0
    assert line["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert line["kl_sampler"] == pytest.approx(0.0, abs=1e-6)
    assert full_distribution({"seed": 1}) == {"seed": 1, "top_p": 1.0, "top_k": 0}
    with pytest.raises(TrainConfigError, match="top_p=0.9"):
        full_distribution({"top_p": 0.9})


async def _straddling_episode(tmp_path: Path) -> Any:
    """One tiny_tasks episode of the embedded policy whose server reloads weights after its first
    turn (the later turns are sampled by version 1)."""
    from trajforge.endpoint import embedded_weights
    from trajforge.envs.catalog import load_env
    from trajforge.envs.running.episode import RolloutBackends, Rollouts
    from trajforge.rl.policy_server import PolicyServer
    from trajforge.sandbox import close_factory, create_sandbox_factory
    from trajforge.sandbox.types import SandboxConfig
    from trajforge.tools.builtin import default_registry

    weights = embedded_weights()
    env = load_env("tiny_tasks", {"families": ["write_file"], "agent_temperature": 0.0, "sandbox": "bwrap"})
    await env.setup()
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", command_timeout_s=30))
    try:
        async with PolicyServer(weights, weights, max_batch=2, log_path=tmp_path / "serve.log") as server:

            class ReloadAfterFirstTurn:
                """The server's own chat model; after the first turn, new weights are loaded."""

                def __init__(self) -> None:
                    self.inner = server.chat_model
                    self.template = self.inner.template
                    self.calls = 0

                @property
                def name(self) -> str:
                    return self.inner.name

                async def complete(self, messages: Any, tools: Any = None, sampling: Any = None) -> Any:
                    turn = await self.inner.complete(messages, tools, sampling)
                    self.calls += 1
                    if self.calls == 1:
                        await server.reload(weights)
                    return turn

                async def aclose(self) -> None:
                    return None

            rollouts = Rollouts(env, RolloutBackends(ReloadAfterFirstTurn(), factory, default_registry()))
            return await rollouts.episode(await env.get_next_item())
    finally:
        await close_factory(factory)


def test_an_episode_straddling_a_reload_records_the_version_of_each_turn(tmp_path: Path) -> None:
    from trajforge.record import Reward
    from trajforge.rl.samples import StepRollouts, build_samples, span_staleness

    ep = asyncio.run(_straddling_episode(tmp_path))
    assert ep.turns >= 2 and ep.trace is not None, (ep.status, ep.reason)
    spans = ep.trace.span_versions
    assert spans is not None and len(spans) == ep.turns
    assert [v for _, _, v in spans] == [0] + [1] * (ep.turns - 1)
    assert all(s < e for s, e, _ in spans) and spans == sorted(spans)
    # the spans are the sampled positions, exactly
    sampled = {i for i, m in enumerate(ep.trace.masks) if m != -100}
    assert sampled == {i for s, e, _ in spans for i in range(s, e)}

    other = ep.model_copy(update={"rollout": 1, "reward": Reward(value=1.0 - ep.score)})
    batch = build_samples(StepRollouts(groups=[[ep, other]], version=0, weights_step=0))
    sample = batch.samples[0]
    assert sample.version == 0 and sample.span_versions == spans
    # trained at step 2 (weights of step 1 = version 1): the first turn is one step stale, the rest fresh
    stale = span_staleness([sample], 2, {0: 0, 1: 1})
    first_turn = spans[0][1] - spans[0][0]
    assert stale["staleness_max"] == 1 and stale["straddling_episodes"] == 1
    assert stale["staleness_mean"] == pytest.approx(first_turn / len(sampled), abs=1e-4)
