"""The ``trl`` trainer: TRL's ``GRPOTrainer`` on env rollouts, behind ``trajforge rl train``.

Rollouts come from :class:`~trajforge.rl.adapters.trl.EnvGRPO` (``rollout_func``: our agent loop,
sandboxes, ``compute_reward``, exact token traces with ``env_mask``), sampled by the live
module TRL trains (so there is no staleness: TRL samples between its own steps). This module
only maps :class:`~trajforge.rl.config.TrainConfig` onto ``GRPOConfig`` and gives the run the
same directory contract as the builtin trainer:

- TRL's own checkpoints (``trl/checkpoint-N``: weights, tokenizer, optimizer, scheduler, RNG)
  are servable model directories; after each save ``state.json`` names the newest, and a
  restarted run passes it to ``train(resume_from_checkpoint=...)``;
- ``metrics.jsonl`` gets one line per logged step with the shared names (``reward_mean``,
  ``reward_std``, ``pass_rate``, ``kl``, ``entropy``, ``clip_fraction``, ``tokens_per_s``,
  ``staleness`` = 0);
- the final weights are also saved as ``checkpoints/step-N`` (with LoRA: the adapters in
  ``adapter/`` and the merged weights as a plain checkpoint, :mod:`trajforge.rl.fit`).

Fitting a real model: ``lora`` becomes TRL's ``peft_config``, ``precision`` its ``bf16``,
``gradient_checkpointing`` its own, and ``micro_batch`` the per-device batch, with gradient
accumulation making up the step's episodes (:func:`batch_layout`). Under ``accelerate launch``
(``--num_processes N``) each process samples the groups of its share of the step's items (its own
live policy, sandboxes and rollouts; TRL gathers the rewards for the group advantages) and DDP
averages the gradients: two processes compute the update one process computes with the doubled
batch (tested on gloo). Only the main process writes the run directory.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

from trajforge.envs.hooks import scores_tokens
from trajforge.rl.builtin import StepHook, TrainResult, resolve_device, training_env
from trajforge.rl.checkpoint import RunDir, RunState, step_dir
from trajforge.rl.config import TrainConfig, TrainConfigError
from trajforge.rl.progress import quiet_third_party
from trajforge.rl.samples import PASS_THRESHOLD

TRL_DIR = "trl"

_NAMES = {
    "reward": "reward_mean",
    "reward_std": "reward_std",
    "kl": "kl",
    "entropy": "entropy",
    "clip_ratio/region_mean": "clip_fraction",
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "num_tokens": "num_tokens",
}


def _latest_trl_checkpoint(root: Path) -> Path | None:
    base = root / TRL_DIR
    if not base.is_dir():
        return None
    found = [p for p in base.iterdir() if p.is_dir() and p.name.startswith("checkpoint-")]
    found = [
        p
        for p in found
        if ((p / "config.json").is_file() or (p / "adapter_config.json").is_file())
        and (p / "trainer_state.json").is_file()
    ]
    return max(found, key=lambda p: int(p.name.split("-")[1]), default=None)


def batch_layout(config: TrainConfig, processes: int) -> tuple[int, int]:
    """``(per_device_train_batch_size, gradient_accumulation_steps)`` so that one optimizer
    step is one step's episodes (``groups_per_step x group_size``) over ``processes``, in
    micro-batches of at most ``micro_batch`` episodes. Each process must hold whole groups: TRL
    hands each its consecutive share of the step's rows, and a rollout's seed is its index in its
    group."""
    if config.groups_per_step % processes:
        raise TrainConfigError(
            f"groups_per_step={config.groups_per_step} does not split over {processes} processes; "
            "use a multiple of the process count so each process samples whole groups"
        )
    per_process = config.episodes_per_step // processes
    micro = max(d for d in range(1, min(config.micro_batch, per_process) + 1) if per_process % d == 0)
    return micro, per_process // micro


def train_trl(config: TrainConfig, *, on_step: StepHook | None = None) -> TrainResult:
    """Blocking. ``on_step`` gets each step's metric line as TRL logs it (the CLI's live line);
    TRL's own progress bar and printed log dicts are off."""
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer  # type: ignore[attr-defined]

    from trajforge.rl import fit
    from trajforge.rl.adapters.trl import EnvGRPO
    from trajforge.sandbox.types import SandboxConfig

    cfg = config
    device = resolve_device(cfg.device)
    # one process, or this one of `accelerate launch`'s (torchrun: on a CPU, gloo -- accelerate
    # takes a CPU run for a GPU one unless told, so the state is made here with `cpu` set)
    processes = PartialState(cpu=device == "cpu")
    main = processes.is_main_process
    per_device, accumulation = batch_layout(cfg, processes.num_processes)
    run_dir = RunDir(cfg.output_dir)
    if main:  # one writer of the run directory; the others read what it decided
        run_dir.open(cfg)
    processes.wait_for_everyone()
    run_state = run_dir.read_state()
    resume = _latest_trl_checkpoint(cfg.output_dir)
    if run_state is not None and run_state.step >= cfg.steps:
        raise TrainConfigError(
            f"{cfg.output_dir} already finished step {run_state.step} of {cfg.steps}; raise --steps or pick another --output-dir"
        )
    precision = fit.resolve_precision(cfg.precision, device)
    env = training_env(cfg)
    if scores_tokens(env):
        raise TrainConfigError(
            f"env {env.name!r} gives per-token advantages, which TRL's GRPOTrainer has no input for "
            "(it would train on the scalar reward alone); use --trainer builtin, which trains on them"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(cfg.model))
    model = AutoModelForCausalLM.from_pretrained(str(cfg.model))
    metrics: list[dict[str, Any]] = []

    class _Record(TrainerCallback):
        """metrics.jsonl lines from TRL's logs; state.json after each checkpoint."""

        def __init__(self) -> None:
            self.last = time.monotonic()
            self.tokens = 0

        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            # `state` is TRL's TrainerState (global_step); the run's own is `run_state`
            logs: dict[str, Any] | None = kwargs.get("logs")
            if not logs or "reward" not in logs or not state.is_world_process_zero:
                return
            now = time.monotonic()
            line: dict[str, Any] = {"step": int(state.global_step), "staleness": 0, "device": device}
            for key, name in _NAMES.items():
                if key in logs:
                    line[name] = logs[key]
            line.setdefault("kl", None)  # TRL computes it only with a reference (kl_coef > 0)
            rewards = list(adapter.stats.last_rewards)
            # this process's share of the step's episodes (TRL's `reward` above is over all of them)
            line["pass_rate"] = sum(r >= PASS_THRESHOLD for r in rewards) / max(1, len(rewards))
            line["episodes"] = len(rewards)
            line["processes"] = processes.num_processes
            line["step_s"] = round(now - self.last, 3)
            sampled = adapter.stats.sampled_tokens - self.tokens
            self.tokens = adapter.stats.sampled_tokens
            line["sampled_tokens"] = sampled
            line["tokens_per_s"] = round(sampled / max(now - self.last, 1e-9), 2)
            self.last = now
            if resume is not None:
                line["resumed_from"] = run_state.step if run_state else None
            line["time"] = time.time()
            run_dir.append_metrics(line)
            metrics.append(line)
            if on_step is not None:
                on_step(line)

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if not state.is_world_process_zero:
                return
            ckpt = cfg.output_dir / TRL_DIR / f"checkpoint-{state.global_step}"
            policy = kwargs.get("model")
            if cfg.lora is not None and policy is not None and ckpt.is_dir():
                # TRL saved the adapters; the merged weights make the checkpoint servable as well
                fit.save_merged(policy, ckpt)
            if (ckpt / "config.json").is_file():
                run_dir.write_state(RunState(step=int(state.global_step), checkpoint=run_dir.relative(ckpt)))

    sandbox = SandboxConfig(kind=env.config.sandbox, command_timeout_s=env.config.command_timeout_s)
    with EnvGRPO(env, sandbox=sandbox, max_batch=cfg.max_batch) as adapter:
        dataset = adapter.dataset(cfg.steps * cfg.groups_per_step)
        args = GRPOConfig(
            output_dir=str(cfg.output_dir / TRL_DIR),
            per_device_train_batch_size=per_device,
            gradient_accumulation_steps=accumulation,
            num_generations=cfg.group_size,
            max_steps=cfg.steps,
            learning_rate=cfg.lr,
            weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.max_grad_norm,
            lr_scheduler_type="constant_with_warmup" if cfg.warmup_steps else "constant",
            warmup_steps=cfg.warmup_steps,
            beta=cfg.kl_coef,
            num_iterations=cfg.epochs,
            epsilon=cfg.clip_low,
            epsilon_high=cfg.clip_high,
            scale_rewards="group" if cfg.scale_rewards else "none",
            temperature=env.config.agent_temperature,
            logging_steps=1,
            save_strategy="steps",
            save_steps=cfg.checkpoint_every,
            save_total_limit=cfg.keep_checkpoints,
            report_to=[],
            use_cpu=device == "cpu",
            bf16=precision == "bf16",
            gradient_checkpointing=cfg.gradient_checkpointing,
            seed=cfg.seed,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=cast(Any, adapter.reward_funcs),
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=adapter.rollout_func,
            callbacks=[_Record()],
            peft_config=fit.lora_config(cfg.lora) if cfg.lora is not None else None,
        )
        for noisy in (PrinterCallback, ProgressCallback):  # log dicts / bars: the CLI prints its own line
            trainer.remove_callback(noisy)
        with quiet_third_party():
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    final = step_dir(run_dir.root, cfg.steps)
    if main:
        final = run_dir.save(cfg.steps, trainer.model, tokenizer, None, {"trainer": "trl"})
        run_dir.write_state(RunState(step=cfg.steps, checkpoint=run_dir.relative(final), final=True))
    processes.wait_for_everyone()
    if processes.num_processes > 1:
        processes.destroy_process_group()  # gloo aborts the interpreter at exit otherwise
    return TrainResult(
        steps_done=len(metrics),
        last_step=cfg.steps,
        final_checkpoint=final,
        resumed_from=run_state.step if run_state else None,
        metrics=metrics,
    )
