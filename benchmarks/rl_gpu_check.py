"""The builtin GRPO trainer on CUDA and on CPU: step time and tokens/s, side by side.

Same trainer, same env (``tiny_tasks``), same embedded policy, same seeds; only the device of the
trainer and of its rollout server (``trajforge serve``) changes. Prints one line per device and
the CUDA/CPU ratios. Run through ``benchmarks/rl_gpu_check.sh`` (which installs what is missing,
offline); ``--missing`` lists the pip names of the packages this needs that are not importable.

    python benchmarks/rl_gpu_check.py --steps 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

NEEDS = {  # module -> pip name
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "huggingface_hub": "huggingface_hub",
    "aiohttp": "aiohttp",
    "pydantic": "pydantic",
    "orjson": "orjson",
    "yaml": "pyyaml",
    "typer": "typer",
    "rich": "rich",
    "tenacity": "tenacity",
    "jinja2": "jinja2",
    "httpx": "httpx",
    "numpy": "numpy",
}


def missing() -> list[str]:
    return [pip for mod, pip in NEEDS.items() if importlib.util.find_spec(mod) is None]


def run(device: str, steps: int, group_size: int, groups: int, sandbox: str, root: Path) -> dict[str, float]:
    from trajforge.endpoint import embedded_weights
    from trajforge.rl.builtin import train_builtin
    from trajforge.rl.config import TrainConfig

    cfg = TrainConfig(
        env="tiny_tasks",
        model=embedded_weights(),
        device=device,
        serve_device=device,
        steps=steps,
        group_size=group_size,
        groups_per_step=groups,
        max_staleness=0,  # step time = rollouts + update, measured cleanly
        temperature=1.0,
        max_tokens=128,
        max_turns=3,
        concurrency=group_size * groups,
        max_batch=group_size * groups,
        sandbox=sandbox,
        output_dir=root / device.replace(":", "_"),
        checkpoint_every=steps,
    )
    began = time.monotonic()
    result = train_builtin(cfg)
    wall = time.monotonic() - began
    lines = result.metrics[1:] or result.metrics  # step 1 includes warm-up (CUDA init, caches)
    return {
        "steps": len(result.metrics),
        "wall_s": round(wall, 2),
        "step_s": round(statistics.fmean(m["step_s"] for m in lines), 3),
        "rollout_s": round(statistics.fmean(m["rollout_s"] for m in lines), 3),
        "train_s": round(statistics.fmean(m["train_s"] for m in lines), 3),
        "rollout_tokens_per_s": round(statistics.fmean(m["rollout_tokens_per_s"] for m in lines), 1),
        "train_tokens_per_s": round(statistics.fmean(m["train_tokens_per_s"] for m in lines), 1),
        "reward_mean": round(statistics.fmean(m["reward_mean"] for m in result.metrics), 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--missing", action="store_true", help="print the pip names of missing packages")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--devices", default="cuda,cpu")
    ap.add_argument("--sandbox", default="auto", help="auto (bwrap when installed, else local), bwrap, local")
    args = ap.parse_args()
    if args.missing:
        print(" ".join(missing()))
        return 0
    import torch

    sandbox = args.sandbox if args.sandbox != "auto" else ("bwrap" if shutil.which("bwrap") else "local")
    print(
        f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}, sandbox: {sandbox}",
        flush=True,
    )
    if torch.cuda.is_available():
        print(f"gpu: {torch.cuda.get_device_name(0)}", flush=True)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="rl-gpu-check-") as tmp:
        for device in args.devices.split(","):
            if device.startswith("cuda") and not torch.cuda.is_available():
                print(f"{device}: skipped (torch sees no CUDA device)", flush=True)
                continue
            results[device] = run(device, args.steps, args.group_size, args.groups, sandbox, Path(tmp))
            print(f"{device}: {json.dumps(results[device])}", flush=True)
    if "cuda" in results and "cpu" in results:
        c, g = results["cpu"], results["cuda"]
        print(
            "cuda vs cpu: step time x{:.2f} faster, update x{:.2f} faster, train tokens/s x{:.2f}, rollout tokens/s x{:.2f}".format(
                c["step_s"] / g["step_s"],
                c["train_s"] / g["train_s"],
                g["train_tokens_per_s"] / max(c["train_tokens_per_s"], 1e-9),
                g["rollout_tokens_per_s"] / max(c["rollout_tokens_per_s"], 1e-9),
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
