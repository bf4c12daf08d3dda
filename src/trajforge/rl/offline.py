"""GRPO on records already written: ``trajforge rl train ENV --records RUN_DIR``.

A ``batch`` run with ``--env`` and ``--tokenizer`` (or an ``env eval`` on a token-level endpoint)
writes records that carry everything a GRPO step needs: the reward, and the exact tokens, masks
and the sampler's logprobs. Data generated once for SFT trains RL as it is: the records of one
prompt (``prompt_index``, or ``item_id`` for an env run) form a group, ``groups_per_step`` groups
a step, and each step is the builtin trainer's update (the ratio against the recorded logprobs,
so the records' policy need not be the one trained). No rollout is sampled; the checkpoints,
``metrics.jsonl`` and ``state.json`` are the builtin trainer's, so the run resumes the same way.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from trajforge.record import Record, RecordError, read
from trajforge.rl.builtin import BuiltinTrainer, StepHook, TrainResult
from trajforge.rl.checkpoint import RunState
from trajforge.rl.config import TrainConfig, TrainConfigError
from trajforge.rl.samples import StepRollouts, build_samples, rollout_metrics

RECORD_FILES = ("trajectories.jsonl", "filtered.jsonl", "failed.jsonl", "episodes.jsonl")
"""Where a run keeps its records: a batch run's three output files, an env run's one."""


def read_groups(run_dir: Path) -> list[list[Record]]:
    """The run's judged records grouped by prompt, in prompt order; unjudged ones are left out
    (a null reward is "not judged", never a 0 to train towards)."""
    if not any((run_dir / name).is_file() for name in RECORD_FILES):
        raise TrainConfigError(
            f"--records {run_dir}: no {', '.join(RECORD_FILES)} there; pass the directory a "
            "`trajforge batch --env ENV --tokenizer ...` or `trajforge env eval` run wrote"
        )
    groups: dict[tuple[int, str], list[Record]] = defaultdict(list)
    try:
        for name in RECORD_FILES:
            for record in read(run_dir / name):
                if record.reward_value is None:
                    continue
                index = record.prompt_index
                groups[(index if index is not None else -1, record.item_id or "")].append(record)
    except RecordError as exc:
        raise TrainConfigError(f"--records: {exc}") from None
    if not groups:
        raise TrainConfigError(
            f"--records {run_dir}: no judged record (run batch with --env ENV so each line has a reward)"
        )
    return [sorted(groups[k], key=lambda r: r.rollout) for k in sorted(groups)]


class RecordsTrainer(BuiltinTrainer):
    """The builtin trainer's update, checkpoints and metrics, on recorded groups instead of
    fresh rollouts."""

    async def run(self) -> TrainResult:
        cfg = self.config
        assert cfg.records is not None
        groups = await asyncio.to_thread(read_groups, cfg.records)
        state = await asyncio.to_thread(self.run_dir.open, cfg)
        if state is not None and state.step >= cfg.steps:
            raise TrainConfigError(
                f"{cfg.output_dir} already finished step {state.step} of {cfg.steps}; raise --steps to "
                "train further or pick another --output-dir"
            )
        model, tokenizer, optimizer, ref = await asyncio.to_thread(self._load, state, cfg.model)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        temperature = float(groups[0][0].sampling.get("temperature", 1.0))  # the logprobs' own
        start = state.step + 1 if state else 1
        metrics: list[dict[str, Any]] = []
        last = cfg.model
        for step in range(start, cfg.steps + 1):
            began = time.monotonic()
            first = ((step - 1) * cfg.groups_per_step) % len(groups)
            chosen = [groups[(first + k) % len(groups)] for k in range(min(cfg.groups_per_step, len(groups)))]
            batch = build_samples(
                StepRollouts(chosen, version=0, weights_step=0),
                scale=cfg.scale_rewards,
                skip_uniform=cfg.skip_uniform_groups,
            )
            stats = await self._update(model, optimizer, ref, batch.samples, temperature, pad_id, step)
            last = await asyncio.to_thread(
                self.run_dir.save, step, model, tokenizer, optimizer, {"weights_of_step": step}
            )
            await asyncio.to_thread(
                self.run_dir.write_state,
                RunState(step=step, checkpoint=self.run_dir.relative(last), final=step == cfg.steps),
            )
            line = {
                "step": step,
                "records": str(cfg.records),
                **rollout_metrics(batch),
                **stats,
                "train_s": round(time.monotonic() - began, 3),
                "checkpoint": self.run_dir.relative(last),
                "device": self.device,
                "time": time.time(),
            }
            await asyncio.to_thread(self.run_dir.append_metrics, line)
            metrics.append(line)
            if self.on_step is not None:  # the CLI's live line, as for the builtin trainer
                res = self.on_step(line)
                if asyncio.iscoroutine(res):
                    await res
        return TrainResult(
            steps_done=len(metrics),
            last_step=cfg.steps,
            final_checkpoint=last,
            resumed_from=state.step if state else None,
            metrics=metrics,
        )


def train_on_records(config: TrainConfig, *, on_step: StepHook | None = None) -> TrainResult:
    """Blocking entry point (the CLI's, with ``--records``)."""
    return asyncio.run(RecordsTrainer(config, on_step=on_step).run())
