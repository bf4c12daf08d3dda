"""The builtin trainer with LoRA and gradient checkpointing, end to end on CPU: ``trajforge serve``
hosts the policy and reloads the *adapters* after each step (merged onto its base), checkpoints
keep the adapters every step and the merged weights where a full model is needed (resumable and
final), and a crashed run resumes from its adapters.

Real parts: a tiny Qwen2, peft, the server as a child process, bubblewrap sandboxes, the env's
reward (``tests/test_rl_train.py``'s letters env).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.timeout(900),
]

ENV_REF = f"{Path(__file__).parent / 'test_rl_train.py'}:LettersEnv"


def _metrics(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_builtin_lora_run_reloads_adapters_checkpoints_and_resumes(
    tiny_chatml_model: Path, tmp_path: Path
) -> None:
    import torch
    from safetensors.torch import load_file

    from trajforge.rl.builtin import BuiltinTrainer
    from trajforge.rl.config import TrainConfig

    out = tmp_path / "run"

    class Crash(RuntimeError):
        pass

    def crash_after_step_2(line: dict[str, Any]) -> None:
        if line["step"] == 2:
            raise Crash("simulated crash after step 2's checkpoint")

    fields: dict[str, Any] = {
        "env": ENV_REF,
        "model": tiny_chatml_model,
        "steps": 2,
        "group_size": 4,
        "groups_per_step": 2,
        "lr": 5e-3,
        "device": "cpu",
        "output_dir": out,
        "checkpoint_every": 2,
        "keep_checkpoints": 3,
        "micro_batch": 2,
        "lora": {"r": 4, "alpha": 8.0},
        "gradient_checkpointing": True,
        "kl_coef": 0.05,
    }
    with pytest.raises(Crash):
        asyncio.run(BuiltinTrainer(TrainConfig.model_validate(fields), on_step=crash_after_step_2).run())
    first = _metrics(out)
    assert [m["step"] for m in first] == [1, 2] and [m["server_version"] for m in first] == [1, 2]
    # on-policy at step 1: the server's logprobs (its base + no adapter yet) are the trainer's
    assert first[0]["ratio_mean"] == pytest.approx(1.0, abs=1e-4) and first[0]["trained_tokens"] > 0
    assert first[1]["kl_ref"] is not None and first[1]["kl_ref"] >= 0.0  # the base, adapters off
    step1, step2 = out / "checkpoints/step-00001", out / "checkpoints/step-00002"
    # step 1 is not resumable: only its adapters were written (what the server reloaded)
    assert (step1 / "adapter/adapter_model.safetensors").is_file() and not (
        step1 / "model.safetensors"
    ).exists()
    # step 2 is: adapters, the merged weights (a plain checkpoint) and the optimizer
    assert (step2 / "adapter/adapter_model.safetensors").is_file() and (step2 / "optimizer.pt").is_file()
    base, merged = (
        load_file(str(tiny_chatml_model / "model.safetensors")),
        load_file(str(step2 / "model.safetensors")),
    )
    assert merged.keys() == base.keys()
    assert [k for k in base if not torch.equal(base[k], merged[k])]
    # (step 1's directory has no full weights, so the server's version 1 can only be its adapters,
    # merged onto the base: PolicyServer.reload raises on a refusal)

    # the run resumes from step 2's adapters (not from the merged weights as a new base)
    asyncio.run(BuiltinTrainer(TrainConfig.model_validate({**fields, "steps": 3})).run())
    lines = _metrics(out)
    assert [m["step"] for m in lines] == [1, 2, 3] and lines[2]["resumed_from"] == 2
    # the resumed server started on the base and loaded step 2's adapters first, then step 3's
    assert lines[2]["server_version"] == 2 and lines[2]["staleness"] == 0
    final = json.loads((out / "state.json").read_text())
    assert final["step"] == 3 and final["final"] is True
    step3 = out / final["checkpoint"]
    assert (step3 / "model.safetensors").is_file() and (step3 / "adapter/adapter_config.json").is_file()
    # the adapters keep training from where they were: step 3 moved the step-2 adapters
    a2 = load_file(str(step2 / "adapter/adapter_model.safetensors"))
    a3 = load_file(str(step3 / "adapter/adapter_model.safetensors"))
    assert a2.keys() == a3.keys() and any(not torch.equal(a2[k], a3[k]) for k in a2)
    # the final merged weights serve: a fresh server on the base loads the adapters and serves them
    from test_serve_adapters import _generate, _load, _merged_logprobs
    from trajforge.serve.launcher import LocalServer

    ids = [1, 7, 9, 30, 41, 5]

    async def served() -> None:
        async with LocalServer(tiny_chatml_model, device="cpu") as server:
            status, body = await _load(server, step3 / "adapter")
            assert status == 200, body
            assert server.base_url is not None
            token, lp, _ = await _generate(server.base_url, ids)
            assert lp == pytest.approx(float(_merged_logprobs(step3, ids)[token]), abs=1e-4)

    asyncio.run(served())
