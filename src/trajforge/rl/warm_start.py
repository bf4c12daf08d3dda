"""Demonstration warm start: supervised updates on the env's reference trajectories before GRPO.

Why: GRPO learns only from reward spread inside a group, so a skill the policy samples almost
never is out of its reach. Measured on the embedded policy (docs/benchmarks.md, "Closed loop"):
write_file succeeds in ~1-2% of temperature-1 samples, guided groups alone did not move it in a
20-minute run, and plain supervision on the oracle's trajectories needs ~175 updates of 10 with
every family in the mix before the copy appears (``benchmarks/rl_copy_probe.py``). So the
builtin trainer can start with that supervision, the usual recipe (supervised, then RL), as
an explicit stage with its own numbers -- not hidden inside the RL steps.

The demonstrations are the guided samples of :mod:`trajforge.rl.guide`: the env's oracle run
through the same rollout machinery (real tools in the real sandbox, the env's verifier; only
episodes that pass are kept), their assistant turns rendered by the policy's own chat template
(:func:`~trajforge.rl.guide.oracle_trace`). The loss is the mean negative log-likelihood of the
assistant tokens. Items come from their own stream (the run's seed, derived with
``"warm-start"``), never the held-out ones, and from the warm start's own mix
(:class:`~trajforge.rl.config.WarmStart.env_overrides`) so families GRPO does not train on are
replayed rather than forgotten.

``phases`` make it a curriculum: a skill the mix drowns -- write_file's copy appeared after
80-175 updates of write_file alone in every probe run, and after 150-350+ (or not at all) with
every family mixed in -- gets phases of its own, and a last phase on every family wins back
what they overwrote. One optimizer and one lr schedule run over all the phases; each phase
draws its items from its own stream.

By default every update sees fresh demonstrations (the oracle is free here). ``demos: N`` fixes a
set of N oracle episodes per phase, collected once and cycled through in epochs -- what a user
with a demonstration dataset of that size has; the set is kept beside the model
(``demonstrations.jsonl``) so more supervision on the same data (the demo's control) can be run
later.

Resumable: the model goes to ``OUTPUT_DIR/warm_start/`` with ``warm_start.json``, renamed into
place complete; a run that finds it skips the stage. GRPO starts from it and takes it as the KL
reference (the policy GRPO should stay near is the one it started from).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajforge.distributions import derive_seed
from trajforge.envs.agents import NoAgent, agent_model_for
from trajforge.envs.catalog import load_env
from trajforge.envs.running.episode import RolloutBackends, Rollouts
from trajforge.llm.chat_template import ChatTemplate
from trajforge.protocols import SandboxFactory
from trajforge.rl.checkpoint import RunDir, save_model_dir
from trajforge.rl.config import TrainConfig, TrainConfigError, WarmStart
from trajforge.rl.grpo import Sample
from trajforge.rl.guide import GuideError, oracle_trace
from trajforge.rl.samples import PASS_THRESHOLD
from trajforge.tools.registry import ToolRegistry

log = logging.getLogger(__name__)

INFO_FILE = "warm_start.json"
DEMOS_FILE = "demonstrations.jsonl"
"""The fixed set (``WarmStart.demos``) beside the warm-started model: one sample per line (its
phase, family, tokens and which of them the policy writes), what the demo's control trains on."""


@dataclass
class Demonstrations:
    """The oracle's passing trajectories as trainable samples, and what was not usable."""

    samples: list[Sample] = field(default_factory=list)
    families: list[str] = field(default_factory=list)
    """Each sample's family (parallel to ``samples``)."""
    by_family: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    """Oracle episodes the verifier did not pass (not trained on)."""
    untraceable: int = 0
    """Passing episodes the policy's template could not render as sampled turns."""
    reasons: list[str] = field(default_factory=list)
    """The first few reasons for the two counts above."""

    def note(self, reason: str) -> None:
        if len(self.reasons) < 5:
            self.reasons.append(reason)


async def collect_demonstrations(
    config: TrainConfig,
    n: int,
    factory: SandboxFactory,
    registry: ToolRegistry,
    template: ChatTemplate,
    *,
    phase: int = 0,
    stream: str | None = None,
) -> Demonstrations:
    """``n`` oracle episodes on fresh training items of the warm start's mix (of its ``phase``-th
    phase), run concurrently. Each phase draws from its own item stream (``stream`` names another,
    e.g. the demo's supervised control)."""
    ws = _settings(config)
    name = stream or ("warm-start" if phase == 0 else f"warm-start/{phase}")
    overrides: dict[str, Any] = {
        **config.env_overrides,
        **ws.env_overrides,
        **ws.schedule()[phase].env_overrides,
        "seed": derive_seed(config.seed, name) & ((1 << 63) - 1),
        "max_concurrent_rollouts": config.concurrency,
    }
    env = load_env(config.env, overrides)
    try:
        oracle_for = agent_model_for(env, "oracle")
    except ValueError as exc:
        raise TrainConfigError(f"warm_start: {exc}") from None
    await env.setup()
    rollouts = Rollouts(env, RolloutBackends(NoAgent(), factory, registry, model_for=oracle_for))
    items = [await env.get_next_item() for _ in range(n)]
    episodes = await asyncio.gather(*(rollouts.episode(item) for item in items))
    out = Demonstrations()
    for ep in episodes:
        if ep.score < PASS_THRESHOLD:
            out.failed += 1
            out.note(f"{ep.item_id}: the oracle scored {ep.reward_value} ({ep.status}: {ep.reason})")
            continue
        try:
            tokens, sampled = oracle_trace(
                ep.messages, template, registry.schemas(registry.for_toolsets(ep.toolsets))
            )
        except GuideError as exc:
            out.untraceable += 1
            out.note(f"{ep.item_id}: {exc}")
            continue
        out.samples.append(_demonstration(tokens, sampled))
        out.families.append(ep.category or "-")
        out.by_family[ep.category or "-"] += 1
    return out


def dump_demonstrations(phases: list[Demonstrations]) -> bytes:
    """``demonstrations.jsonl``'s bytes: every phase's samples, one per line."""
    lines = [
        json.dumps(
            {"phase": i, "family": fam, "tokens": s.tokens, "sampled": s.sampled}, separators=(",", ":")
        )
        for i, d in enumerate(phases)
        for s, fam in zip(d.samples, d.families, strict=True)
    ]
    return ("\n".join(lines) + "\n").encode()


def load_demonstrations(model_dir: Path) -> list[list[Sample]] | None:
    """A warm start's fixed set, per phase (None when it trained on fresh demonstrations: no
    ``demonstrations.jsonl``)."""
    path = model_dir / DEMOS_FILE
    if not path.is_file():
        return None
    phases: dict[int, list[Sample]] = {}
    for raw in path.read_text().splitlines():
        row = json.loads(raw)
        phases.setdefault(int(row["phase"]), []).append(_demonstration(row["tokens"], row["sampled"]))
    return [phases[i] for i in sorted(phases)]


def _demonstration(tokens: list[int], sampled: list[bool]) -> Sample:
    """A demonstration as a trainable sample: the policy's own tokens trained on with weight 1
    (no sampler logprobs: supervised, not a ratio)."""
    return Sample(tokens=tokens, sampled=sampled, old_logprobs=[0.0] * len(tokens), advantage=1.0)


def supervised_updates(
    model: Any,
    phases: list[list[Sample]],
    ws: WarmStart,
    *,
    micro_batch: int,
    pad_id: int,
    device: str,
    on_update: Callable[[int, float], None] | None = None,
    optimizer: Any = None,
    precision: str = "fp32",
) -> list[float]:
    """AdamW updates of ``ws.batch`` samples each: for each phase of ``ws.schedule()`` its
    ``updates``, cycling through that phase's samples (``phases[i]``) in order; one optimizer,
    lr constant then linearly decayed over the last ``ws.decay`` share of all the updates.
    Blocking: run it in a worker thread. Returns the loss of every update (mean NLL per assistant
    token, before the focal weights); ``on_update(k, loss)`` is called after update k (1-based).

    With ``ws.focal = g > 0`` each token's NLL is weighted by ``(1 - p)^g`` (p: the model's
    probability of the demonstrated token, no gradient through the weight): the few tokens the
    policy gets wrong -- a value to copy -- get the update instead of the many it already writes
    right. AdamW's step does not depend on the loss's scale, so this redistributes the update
    rather than shrinking it. ``optimizer``: continue one (its moments) instead of a new AdamW.
    ``precision``: ``bf16`` autocasts the forward passes (:func:`trajforge.rl.fit.autocast`)."""
    import torch

    from trajforge.rl.fit import supervised_update

    if optimizer is None:
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=ws.lr, weight_decay=0.0
        )
    schedule = ws.schedule()
    if len(phases) != len(schedule) or not all(phases):
        raise ValueError(f"{len(schedule)} phase(s) need samples each; got {[len(p) for p in phases]}")
    order = [
        (samples, j) for samples, phase in zip(phases, schedule, strict=True) for j in range(phase.updates)
    ]
    total = len(order)
    decay_from = int(total * (1 - ws.decay))
    losses: list[float] = []
    for k, (samples, j) in enumerate(order):
        lr = ws.lr if k < decay_from else ws.lr * (total - k) / max(1, total - decay_from)
        for group in optimizer.param_groups:
            group["lr"] = lr
        model.train()  # (an on_update callback may have evaluated)
        batch = [samples[(j * ws.batch + i) % len(samples)] for i in range(ws.batch)]
        tokens = float(sum(s.num_sampled for s in batch)) or 1.0
        loss = supervised_update(
            model, optimizer, batch, tokens=tokens, micro_batch=micro_batch, pad_id=pad_id, device=device,
            precision=precision, focal=ws.focal,
        )  # fmt: skip
        losses.append(loss)
        if on_update is not None:
            on_update(k + 1, loss)
    optimizer.zero_grad(set_to_none=True)
    return losses


async def warm_start(
    config: TrainConfig, run_dir: RunDir, *, device: str, factory: SandboxFactory, registry: ToolRegistry
) -> tuple[Path, dict[str, Any]]:
    """The warm-started model directory and its report; runs the stage unless a complete one is
    already in ``run_dir`` (a resumed run)."""
    ws = _settings(config)
    final = run_dir.warm_start_dir
    if (final / INFO_FILE).is_file():
        return final, {**json.loads((final / INFO_FILE).read_text()), "reused": True}
    began = time.monotonic()
    template = await asyncio.to_thread(ChatTemplate.from_path, str(config.model))
    schedule = ws.schedule()
    phases: list[Demonstrations] = []
    for i, phase in enumerate(schedule):
        n = ws.demos or phase.updates * ws.batch
        demos = await collect_demonstrations(config, n, factory, registry, template, phase=i)
        where = f"phase {i + 1} of {len(schedule)}: " if len(schedule) > 1 else ""
        if not demos.samples:
            raise TrainConfigError(
                f"warm_start: {where}none of {n} oracle episodes gave a demonstration ({demos.failed} "
                f"failed the verifier, {demos.untraceable} could not be rendered by the policy's "
                f"template): {'; '.join(demos.reasons)}"
            )
        log.info("warm start: %s%d demonstrations (%s)", where, len(demos.samples), dict(demos.by_family))
        phases.append(demos)
    collected_s = time.monotonic() - began

    def train() -> tuple[Any, Any, list[float]]:
        import torch
        from transformers import AutoTokenizer

        from trajforge.rl.fit import load_policy, resolve_precision

        torch.manual_seed(derive_seed(config.seed, "warm-start") & 0x7FFFFFFF)
        tokenizer = AutoTokenizer.from_pretrained(str(config.model))
        model = load_policy(config, config.model, device)  # LoRA, checkpointing as the run says
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        losses = supervised_updates(
            model,
            [d.samples for d in phases],
            ws,
            micro_batch=config.micro_batch,
            pad_id=pad_id,
            device=device,
            precision=resolve_precision(config.precision, device),
        )
        return model, tokenizer, losses

    model, tokenizer, losses = await asyncio.to_thread(train)
    head = losses[: max(1, len(losses) // 10)]
    tail = losses[-max(1, len(losses) // 10) :]
    by_family: Counter[str] = sum((d.by_family for d in phases), Counter())
    info: dict[str, Any] = {
        "updates": ws.total_updates,
        "batch": ws.batch,
        "lr": ws.lr,
        "decay": ws.decay,
        "focal": ws.focal,
        "oracle_episodes": sum(ws.demos or p.updates * ws.batch for p in schedule),
        "fixed_set": ws.demos,
        "epochs": round(
            sum(p.updates for p in schedule) * ws.batch / max(1, sum(len(d.samples) for d in phases)), 2
        ),
        "demonstrations": sum(len(d.samples) for d in phases),
        "by_family": dict(sorted(by_family.items())),
        "oracle_failed": sum(d.failed for d in phases),
        "untraceable": sum(d.untraceable for d in phases),
        "reasons": [r for d in phases for r in d.reasons][:5],
        "loss_first_tenth": round(sum(head) / len(head), 4),
        "loss_last_tenth": round(sum(tail) / len(tail), 4),
        "collect_s": round(collected_s, 1),
        "seconds": round(time.monotonic() - began, 1),
        "device": device,
    }
    if ws.phases:
        info["phases"] = [
            {
                "updates": phase.updates,
                "env_overrides": phase.env_overrides,
                "demonstrations": len(d.samples),
                "by_family": dict(sorted(d.by_family.items())),
                "loss_last": round(losses[sum(p.updates for p in schedule[: i + 1]) - 1], 4),
            }
            for i, (phase, d) in enumerate(zip(schedule, phases, strict=True))
        ]
    extra = {DEMOS_FILE: dump_demonstrations(phases)} if ws.demos else None
    await asyncio.to_thread(save_model_dir, final, model, tokenizer, None, INFO_FILE, info, extra)
    log.info("warm start: %s", info)
    return final, info


def _settings(config: TrainConfig) -> WarmStart:
    if config.warm_start is None:
        raise TrainConfigError("this run has no warm_start settings")
    return config.warm_start
