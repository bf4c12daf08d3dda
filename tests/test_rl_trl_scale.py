"""The TRL path fitted for real models: LoRA, gradient checkpointing, gradient accumulation, and
``accelerate launch`` over two processes (CPU, gloo) -- each on a tiny Qwen2 with trajforge's own
rollouts (agent loop, bubblewrap sandboxes, the env's reward).

- ``batch_layout``: a step's episodes become per-device micro-batches and accumulation steps,
  whole groups per process, or a clear refusal.
- LoRA + checkpointing: TRL trains the adapters; the run's final checkpoint holds the adapters and
  the merged weights as a plain checkpoint, which a server loads.
- Two processes equal one with the doubled batch: ``accelerate launch --num_processes 2`` samples
  half the groups in each process, and after one step the weights are those of one process that
  sampled every group (the same rollouts: each one's seed is its item and index).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trajforge.rl.config import TrainConfig, TrainConfigError
from trajforge.rl.trl_trainer import batch_layout

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.timeout(900),
]

ENV_REF = f"{Path(__file__).parent / 'test_rl_train.py'}:LettersEnv"


def _cfg(model: Path, **fields: Any) -> TrainConfig:
    return TrainConfig(env="x", model=model, **fields)


def test_a_step_is_laid_out_in_micro_batches_and_accumulation(tiny_chatml_model: Path) -> None:
    # 8 groups x 8 = 64 episodes a step
    assert batch_layout(_cfg(tiny_chatml_model, micro_batch=16), 1) == (16, 4)
    assert batch_layout(_cfg(tiny_chatml_model, micro_batch=16), 2) == (16, 2)
    assert batch_layout(_cfg(tiny_chatml_model, micro_batch=64), 4) == (16, 1)
    assert batch_layout(_cfg(tiny_chatml_model, micro_batch=12, group_size=4, groups_per_step=6), 2) == (
        12,
        1,
    )
    assert batch_layout(_cfg(tiny_chatml_model, micro_batch=5, group_size=4, groups_per_step=6), 2) == (4, 3)
    with pytest.raises(TrainConfigError, match="does not split over 3 processes"):
        batch_layout(_cfg(tiny_chatml_model, groups_per_step=8), 3)


def _args(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "rl",
        "train",
        ENV_REF,
        "--trainer",
        "trl",
        "--model-path",
        str(model),
        "--steps",
        "1",
        "--group-size",
        "4",
        "--groups",
        "2",
        "--lr",
        "5e-3",
        "--device",
        "cpu",
        "--output-dir",
        str(out.parent),
        "--run-name",
        out.name,
        *extra,
    ]


def _run(argv: list[str], *, processes: int = 1, port: int = 0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1"}
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    cli = [sys.executable, "-m", "trajforge.cli.main", *argv]
    if processes > 1:
        accelerate = Path(sys.executable).with_name("accelerate")
        cli = [
            str(accelerate),
            "launch",
            "--multi_gpu",  # = torchrun; on a CPU the processes talk over gloo
            "--num_processes",
            str(processes),
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            str(port),
            "-m",
            "trajforge.cli.main",
            *argv,
        ]
    done = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=800, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


def _weights(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_two_processes_equal_one_with_the_doubled_batch(tiny_chatml_model: Path, tmp_path: Path) -> None:
    import torch

    one, two = tmp_path / "one", tmp_path / "two"
    _run(_args(tiny_chatml_model, one))
    _run(_args(tiny_chatml_model, two), processes=2, port=_free_port())
    lines = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1] and lines[0]["processes"] == 2
    assert lines[0]["episodes"] == 4  # the main process sampled its half of the 8
    single = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    assert single[0]["processes"] == 1 and single[0]["episodes"] == 8
    # the same rollouts (TRL's reward is over every process's episodes) ...
    assert lines[0]["reward_mean"] == pytest.approx(single[0]["reward_mean"], abs=1e-6)
    # ... the same gradient (its norm, over all parameters, before clipping) ...
    assert lines[0]["grad_norm"] == pytest.approx(single[0]["grad_norm"], rel=1e-5)
    # ... and the same update: AdamW's first step moves a weight by ~lr whatever its gradient's
    # size, so two float sums of one gradient differ by at most a rounding share of lr (5e-3)
    start, a, b = (
        _weights(tiny_chatml_model),
        _weights(one / "checkpoints/step-00001"),
        _weights(two / "checkpoints/step-00001"),
    )
    moved = 0
    for key in start:
        assert torch.allclose(a[key], b[key], atol=2e-5, rtol=0), key
        moved += not torch.equal(a[key], start[key])
    assert moved > 5


@pytest.mark.slow
def test_trl_trains_lora_adapters_with_checkpointing_and_saves_merged_weights(
    tiny_chatml_model: Path, tmp_path: Path
) -> None:
    import torch

    config = tmp_path / "lora.yaml"
    config.write_text("lora: {r: 4, alpha: 8.0}\ngradient_checkpointing: true\nmicro_batch: 2\n")
    out = tmp_path / "run"
    _run(_args(tiny_chatml_model, out, "--config", str(config)))
    final = out / "checkpoints/step-00001"
    adapter = final / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4
    start, merged = _weights(tiny_chatml_model), _weights(final)
    assert merged.keys() == start.keys()  # a plain checkpoint: the base's tensor names
    changed = [k for k in start if not torch.equal(start[k], merged[k])]
    # only the adapted (linear) layers moved; embeddings and norms are the base's
    assert changed and all(k.endswith("proj.weight") for k in changed)
    # TRL's own checkpoint is servable too (its adapters + the merged weights)
    assert (out / "trl" / "checkpoint-1" / "adapter_config.json").is_file()
    assert (out / "trl" / "checkpoint-1" / "model.safetensors").is_file()
    state = json.loads((out / "state.json").read_text())
    assert state["final"] is True and state["checkpoint"] == "checkpoints/step-00001"
