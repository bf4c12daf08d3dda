"""opd: a tiny student served by ``trajforge serve`` rolls out tiny_tasks in bubblewrap; a teacher
(``trajforge serve`` again, SGLang ``/generate`` with prompt logprobs) scores every token. The
student as its own teacher gives advantages ~0; a different teacher gives nonzero ones; lengths
equal the trace, zero exactly where the student did not sample. The served prompt logprobs are
checked against a forward pass of the teacher's weights."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from trajforge.envs import RolloutBackends, Rollouts, load_env
from trajforge.llm.completion_model import CompletionChatModel, CompletionModelConfig
from trajforge.serve.app import run_server
from trajforge.serve.config import ServeConfig
from trajforge.testing.tiny import build_tiny_model, build_tiny_tokenizer
from trajforge.tools.builtin import default_registry

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("opd")
    tok = build_tiny_tokenizer(root / "tok")
    out = {}
    for name, seed in (("student", 0), ("teacher", 1)):
        build_tiny_model(root / name, tok, seed=seed)
        out[name] = root / name
    return out


def _serve(path: Path) -> Any:
    return run_server(ServeConfig(model_path=path, port=0, device="cpu", max_batch=4, batch_wait_ms=1))


def _forward_logprobs(path: Path, tokens: list[int]) -> list[float]:
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True).eval()
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), dim=-1)
    return [float(lp[i - 1, tokens[i]]) for i in range(1, len(tokens))]


async def test_prompt_logprobs_of_the_served_teacher_are_its_forward_pass(models: dict[str, Path]) -> None:
    tokens = [5, 77, 123, 9, 300, 42, 17]
    async with _serve(models["teacher"]) as server, httpx.AsyncClient() as client:
        body = {
            "input_ids": tokens,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
        }
        got = (await client.post(f"{server.base_url}/generate", json=body)).json()
    entries = got["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == tokens and entries[0][0] is None
    assert [e[0] for e in entries[1:]] == pytest.approx(
        _forward_logprobs(models["teacher"], tokens), abs=1e-4
    )


async def _episodes(models: dict[str, Path], teacher: str, bwrap: Any) -> list[Any]:
    async with _serve(models["student"]) as student, _serve(models[teacher]) as teach:
        env = load_env(
            "opd",
            {
                "teacher_base_url": teach.base_url,
                "max_tokens": 24,
                "max_agent_turns": 2,
                "agent_temperature": 1.0,
            },
        )
        await env.setup()
        model = CompletionChatModel(
            CompletionModelConfig(
                tokenizer_path=str(models["student"]), base_url=student.base_url, endpoint="sglang_generate"
            )
        )
        try:
            rollouts = Rollouts(env, RolloutBackends(model, bwrap, default_registry()))
            return [await rollouts.episode(item, rollout=0) for item in env.eval_items(2)]
        finally:
            await model.aclose()


async def test_student_as_teacher_gives_zero_advantages_a_different_teacher_does_not(
    models: dict[str, Path], bwrap: Any
) -> None:
    for teacher in ("student", "teacher"):
        for ep in await _episodes(models, teacher, bwrap):
            assert ep.reward.error is None, ep.reward.error
            assert ep.trace is not None, ep.trace_error
            adv = ep.reward.token_advantages
            assert adv is not None and len(adv) == len(ep.trace.tokens) == len(ep.trace.masks)
            sampled = [i for i, m in enumerate(ep.trace.masks) if m != -100]
            assert sampled and all(adv[i] == 0.0 for i, m in enumerate(ep.trace.masks) if m == -100)
            assert ep.reward.components["sampled_tokens"] == len(sampled)
            assert ep.reward.value == ep.reward.components["task_reward"]  # reward: task (default)
            if teacher == "student":
                assert max(abs(adv[i]) for i in sampled) < 1e-3
            else:
                assert max(abs(adv[i]) for i in sampled) > 0.05
                assert ep.reward.components["mean_advantage"] == pytest.approx(
                    sum(adv[i] for i in sampled) / len(sampled)
                )


async def test_without_a_teacher_the_env_refuses_to_start() -> None:
    env = load_env("opd")
    with pytest.raises(ValueError, match="teacher_base_url"):
        await env.setup()


def test_rl_train_opd_trains_on_the_teachers_per_token_advantages(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """``rl train opd`` (builtin trainer): every group's task reward is 0 for a random student (all
    groups uniform: no scalar signal), yet it trains -- on the per-token advantages the teacher
    gave, carried by every episode. The TRL path refuses the env, naming the trainer that does."""
    import asyncio

    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from trajforge.cli.main import app
    from trajforge.rl.builtin import BuiltinTrainer
    from trajforge.rl.config import TrainConfig

    async def run(teacher_url: str) -> Any:
        cfg = TrainConfig(
            env="opd",
            model=models["student"],
            steps=2,
            group_size=2,
            groups_per_step=2,
            lr=5e-3,
            max_tokens=16,
            max_turns=1,
            device="cpu",
            output_dir=tmp_path / "run",
            env_overrides={"teacher_base_url": teacher_url, "sandbox": "bwrap"},
        )
        return await BuiltinTrainer(cfg).run()

    async def with_teacher() -> Any:
        async with _serve(models["teacher"]) as teacher:
            return await run(teacher.base_url)

    result = asyncio.run(with_teacher())
    for line in result.metrics:
        assert line["episodes"] == 4 and line["untraced"] == 0
        assert line["token_advantage_episodes"] == 4 and line["trained_tokens"] > 0
        assert line["groups_uniform"] == 2 or line["reward_std"] > 0
    before = load_file(str(models["student"] / "model.safetensors"))
    after = load_file(str(result.final_checkpoint / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)

    refused = CliRunner().invoke(
        app,
        [
            "rl", "train", "opd", "--model", str(models["student"]), "--trainer", "trl",
            "--output-dir", str(tmp_path / "trl"),
        ],
    )  # fmt: skip
    assert refused.exit_code == 2 and "use --trainer builtin" in refused.output, refused.output
