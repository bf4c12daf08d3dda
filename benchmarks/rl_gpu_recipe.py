"""The training path at real-model scale, on one device: LoRA and full fine-tuning, the rollout
server, weight sync -- step time, tokens/s, memory.

For each model (the embedded tiny policy, and a mid-size checkpoint made here from a config with
random weights: throughput does not depend on what the weights say) and each mode (``lora``,
``full``), with the trainer's own code (``rl/fit.py`` + ``rl/update.py``: bf16 autocast where the
device has it, gradient checkpointing, micro-batches):

- **train**: ``--steps`` GRPO updates of ``--batch`` sequences of ``--seq-len`` tokens (half
  prompt, half sampled; the sampler's logprobs are the policy's own, so the ratio is 1): seconds
  per step, trained tokens/s, peak memory;
- **serve**: the policy served by ``trajforge serve`` (the same server the builtin trainer uses)
  or vLLM (``--server vllm``: LoRA modes, adapters loaded at runtime), ``--rollouts`` concurrent
  requests of ``--rollout-tokens`` sampled tokens at T=1: generated tokens/s;
- **sync**: after each step the checkpoint (LoRA: the adapters; full: the weights) written and
  loaded by the server between requests: seconds to save, seconds to load.

It prints one line per (model, mode) and a JSON summary (``--json PATH``). On a CPU
(``--device cpu``, the defaults) it is a smoke run: the mid-size preset is ``cpu-small``. On a GPU,
docs/rl.md ("At real-model scale") gives the commands for 0.5-8B.

    python benchmarks/rl_gpu_recipe.py --device cpu
    python benchmarks/rl_gpu_recipe.py --device cuda --preset qwen2-0.5b --batch 16 --seq-len 1024
    python benchmarks/rl_gpu_recipe.py --device cuda --model-path /models/Qwen2.5-7B-Instruct --modes lora
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PRESETS: dict[str, dict[str, int]] = {
    # hidden, layers, heads, kv heads, intermediate: Qwen2-shaped; vocab is the tokenizer's
    "cpu-small": {"hidden": 256, "layers": 4, "heads": 4, "kv": 2, "intermediate": 768},
    "qwen2-0.5b": {"hidden": 896, "layers": 24, "heads": 14, "kv": 2, "intermediate": 4864},
    "qwen2-1.5b": {"hidden": 1536, "layers": 28, "heads": 12, "kv": 2, "intermediate": 8960},
    "qwen2-7b": {"hidden": 3584, "layers": 28, "heads": 28, "kv": 4, "intermediate": 18944},
}


def build_from_preset(name: str, tokenizer_dir: Path, out: Path, vocab: int | None) -> Path:
    """A Qwen2 checkpoint with random weights shaped like ``name``, saved with the tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    p = PRESETS[name]
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = Qwen2Config(
        vocab_size=max(vocab or 0, len(tok)),
        hidden_size=p["hidden"],
        intermediate_size=p["intermediate"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv"],
        max_position_embeddings=4096,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=p["hidden"] < 1024,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def peak_memory_gb(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (process peak RSS)


def synthetic_samples(model: Any, batch: int, seq_len: int, vocab: int, device: str) -> list[Any]:
    """``batch`` sequences, the second half sampled, with the policy's own logprobs as the sampler's."""
    import torch

    from trajforge.rl.fit import update_mode
    from trajforge.rl.grpo import Sample, collate, token_logprobs

    gen = torch.Generator().manual_seed(0)
    samples = []
    half = seq_len // 2
    for i in range(batch):
        tokens = torch.randint(3, vocab, (seq_len,), generator=gen).tolist()
        samples.append(
            Sample(tokens, [False] * half + [True] * (seq_len - half), [0.0] * seq_len, (-1.0) ** i)
        )
    update_mode(model)
    with torch.no_grad():
        for s in samples:
            lp, _ = token_logprobs(model, collate([s], 0, device))
            s.old_logprobs = [0.0] + [
                float(x) if m else 0.0 for x, m in zip(lp[0].tolist(), s.sampled[1:], strict=True)
            ]
    return samples


def train_phase(
    cfg: Any, model_dir: Path, device: str, args: argparse.Namespace
) -> tuple[Any, dict[str, Any]]:
    import torch

    from trajforge.rl.fit import load_policy, resolve_precision, trainable_parameters
    from trajforge.rl.update import grpo_update

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    model = load_policy(cfg, model_dir, device)
    params = trainable_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    samples = synthetic_samples(model, args.batch, args.seq_len, vocab, device)
    grpo_update(model, optimizer, samples, cfg, step=1, temperature=1.0, pad_id=0, device=device)  # warm-up
    times, tokens = [], 0
    for step in range(2, args.steps + 2):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        began = time.perf_counter()
        stats = grpo_update(
            model, optimizer, samples, cfg, step=step, temperature=1.0, pad_id=0, device=device
        )
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
        tokens += int(stats["trained_tokens"])
    return model, {
        "precision": resolve_precision(cfg.precision, device),
        "trainable_params_m": round(sum(p.numel() for p in params) / 1e6, 2),
        "total_params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
        "step_s": round(statistics.median(times), 4),
        "train_tokens_per_s": round(tokens / sum(times), 1),
        "train_peak_gb": round(peak_memory_gb(device), 3),
    }


async def serve_phase(
    model: Any, tokenizer: Any, cfg: Any, model_dir: Path, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    import aiohttp

    from trajforge.rl.checkpoint import save_model_dir
    from trajforge.rl.policy_server import PolicyServer

    lora = cfg.lora is not None
    prompt = list(range(5, 5 + args.prompt_tokens))
    body = {
        "prompt": {"prompt_token_ids": prompt},
        "max_tokens": args.rollout_tokens,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "ignore_eos": True,
        "logprobs": 0,
    }
    saves, loads, rates = [], [], []
    async with (
        PolicyServer(
            model_dir,
            model_dir,
            max_batch=args.rollouts,
            device=args.serve_device or args.device,
            dtype=args.serve_dtype,
            max_tokens=args.rollout_tokens,
            log_path=out / "serve.log",
        ) as server,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session,
    ):

        async def one(seed: int) -> int:
            async with session.post(f"{server.base_url}/generate", json={**body, "seed": seed}) as resp:
                data = await resp.json()
                if resp.status != 200:
                    raise RuntimeError(f"/generate: HTTP {resp.status} {data}")
                return len(data["token_ids"][0])

        for k in range(args.syncs):
            began = time.perf_counter()
            ckpt = await asyncio.to_thread(
                save_model_dir,
                out / f"sync-{k}",
                model,
                tokenizer,
                None,
                "bench.json",
                {},
                merged=not lora,
            )
            saves.append(time.perf_counter() - began)
            began = time.perf_counter()
            await server.reload(ckpt / "adapter" if lora else ckpt)
            loads.append(time.perf_counter() - began)
            began = time.perf_counter()
            generated = sum(await asyncio.gather(*(one(1000 * k + i) for i in range(args.rollouts))))
            rates.append(generated / (time.perf_counter() - began))
    return {
        "server": "trajforge serve",
        "sync": "adapter (merged onto the base by the server)" if lora else "full weights",
        "save_s": round(statistics.median(saves), 3),
        "load_s": round(statistics.median(loads), 3),
        "rollout_tokens_per_s": round(statistics.median(rates), 1),
    }


async def vllm_phase(
    model: Any, tokenizer: Any, cfg: Any, model_dir: Path, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """vLLM's OpenAI server with runtime LoRA loading (LoRA modes only): adapters synced through
    ``/v1/load_lora_adapter``, rollouts through ``/v1/completions``."""
    import aiohttp

    from trajforge.rl.checkpoint import save_model_dir

    if cfg.lora is None:
        return {
            "server": "vllm",
            "skipped": "full fine-tuning syncs through trajforge serve (--server trajforge)",
        }
    port = args.vllm_port
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--enable-lora",
        "--max-lora-rank",
        str(cfg.lora.r),
        "--max-loras",
        "2",
        "--gpu-memory-utilization",
        str(args.vllm_memory),
    ]
    log = await asyncio.to_thread((out / "vllm.log").open, "w")
    proc = await asyncio.create_subprocess_exec(*cmd, env=env, stdout=log, stderr=asyncio.subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
            for _ in range(900):
                try:
                    async with session.get(f"{base}/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if proc.returncode is not None:
                    raise RuntimeError(f"vllm exited with {proc.returncode}; see {out / 'vllm.log'}")
                await asyncio.sleep(1)
            saves, loads, rates = [], [], []
            for k in range(args.syncs):
                began = time.perf_counter()
                ckpt = await asyncio.to_thread(
                    save_model_dir, out / f"vsync-{k}", model, tokenizer, None, "bench.json", {}, merged=False
                )
                saves.append(time.perf_counter() - began)
                began = time.perf_counter()
                if k:
                    await session.post(f"{base}/v1/unload_lora_adapter", json={"lora_name": f"step{k - 1}"})
                async with session.post(
                    f"{base}/v1/load_lora_adapter",
                    json={"lora_name": f"step{k}", "lora_path": str(ckpt / "adapter")},
                ) as resp:
                    if resp.status != 200:
                        raise RuntimeError(f"vllm refused the adapter: {resp.status} {await resp.text()}")
                loads.append(time.perf_counter() - began)
                req = {
                    "model": f"step{k}",
                    "prompt": list(range(5, 5 + args.prompt_tokens)),
                    "max_tokens": args.rollout_tokens,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "ignore_eos": True,
                }

                async def one(seed: int, req: dict[str, Any] = req) -> int:
                    async with session.post(f"{base}/v1/completions", json={**req, "seed": seed}) as resp:
                        data = await resp.json()
                        return int(data["usage"]["completion_tokens"])

                began = time.perf_counter()
                generated = sum(await asyncio.gather(*(one(i) for i in range(args.rollouts))))
                rates.append(generated / (time.perf_counter() - began))
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), timeout=60)
        log.close()
    return {
        "server": "vllm",
        "sync": "adapter (runtime LoRA)",
        "save_s": round(statistics.median(saves), 3),
        "load_s": round(statistics.median(loads), 3),
        "rollout_tokens_per_s": round(statistics.median(rates), 1),
    }


def run_one(name: str, model_dir: Path, mode: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    import gc

    import torch
    from transformers import AutoTokenizer

    from trajforge.rl.config import TrainConfig

    cfg = TrainConfig.model_validate(
        {
            "env": "tiny_tasks",
            "model": model_dir,
            "lr": 1e-5 if mode == "full" else 1e-4,
            "micro_batch": args.micro_batch,
            "precision": args.precision,
            "gradient_checkpointing": args.checkpointing if name != "tiny" else False,
            "lora": {"r": args.lora_r, "alpha": 2 * args.lora_r} if mode == "lora" else None,
        }
    )
    model, row = train_phase(cfg, model_dir, args.device, args)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    out = root / f"{name}-{mode}"
    out.mkdir(parents=True, exist_ok=True)
    if args.server == "vllm":
        row.update(asyncio.run(vllm_phase(model, tokenizer, cfg, model_dir, out, args)))
    else:
        row.update(asyncio.run(serve_phase(model, tokenizer, cfg, model_dir, out, args)))
    row["peak_gb"] = round(peak_memory_gb(args.device), 3)
    del model
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"model": name, "mode": mode, **row}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (a smoke run)")
    ap.add_argument("--serve-device", default=None, help="the rollout server's device (default: --device)")
    ap.add_argument("--serve-dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument(
        "--preset",
        default=None,
        choices=sorted(PRESETS),
        help="the mid-size model's shape (default: qwen2-0.5b on a GPU, cpu-small on a CPU)",
    )
    ap.add_argument(
        "--model-path",
        type=Path,
        default=None,
        help="a local checkpoint to use as the mid-size model instead (e.g. a Qwen2.5 directory)",
    )
    ap.add_argument(
        "--vocab", type=int, default=None, help="the preset's vocabulary (default: the tokenizer's)"
    )
    ap.add_argument("--models", default="tiny,mid")
    ap.add_argument("--modes", default="lora,full")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    ap.add_argument(
        "--checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="gradient checkpointing on the mid-size model",
    )
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--server", default="trajforge", choices=["trajforge", "vllm"])
    ap.add_argument("--vllm-port", type=int, default=8011)
    ap.add_argument(
        "--vllm-memory",
        type=float,
        default=0.35,
        help="vLLM's --gpu-memory-utilization (the trainer shares the GPU)",
    )
    ap.add_argument("--rollouts", type=int, default=16, help="concurrent rollout requests per sync")
    ap.add_argument("--rollout-tokens", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--syncs", type=int, default=2, help="weight syncs (save + load + rollouts) per row")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()

    import torch

    from trajforge.endpoint import embedded_weights

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("torch sees no CUDA device; use --device cpu for a smoke run")
    preset = args.preset or ("qwen2-0.5b" if args.device.startswith("cuda") else "cpu-small")
    root = Path(tempfile.mkdtemp(prefix="rl-gpu-recipe-"))
    rows = []
    try:
        models: dict[str, Path] = {}
        if "tiny" in args.models.split(","):
            models["tiny"] = embedded_weights()
        if "mid" in args.models.split(","):
            models["mid"] = args.model_path or build_from_preset(
                preset, embedded_weights(), root / f"mid-{preset}", args.vocab
            )
        print(
            f"device {args.device} ({torch.cuda.get_device_name() if args.device.startswith('cuda') else 'cpu'}), "
            f"torch {torch.__version__}, mid = {args.model_path or preset}, batch {args.batch} x {args.seq_len} tokens",
            flush=True,
        )
        for name, path in models.items():
            for mode in args.modes.split(","):
                row = run_one(name, path, mode, args, root)
                rows.append(row)
                print(
                    f"{name:>4} {mode:>4}: {row['total_params_m']}M params ({row['trainable_params_m']}M trained, "
                    f"{row['precision']}), step {row['step_s']}s, train {row['train_tokens_per_s']} tok/s, "
                    f"rollouts {row.get('rollout_tokens_per_s', '-')} tok/s ({row.get('server')}), "
                    f"sync save {row.get('save_s', '-')}s + load {row.get('load_s', '-')}s, peak {row['peak_gb']} GB",
                    flush=True,
                )
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    summary = {
        "device": args.device,
        "preset": preset,
        "model_path": str(args.model_path) if args.model_path else None,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
