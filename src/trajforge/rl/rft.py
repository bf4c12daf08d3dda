"""Rejection-sampling fine-tuning (RFT, expert iteration, STaR): the control GRPO must beat.

For a family with a checker and no demonstrations the question is not whether GRPO beats more
supervision on other data, but whether it beats the obvious use of the same checker: sample from
the current policy, keep what the checker passes, train on it with the supervised loss, repeat.
:func:`rft` runs that with GRPO's own ingredients and budget (``rl demo --control rft``):

- **the same start, items and sampling**: the run's :class:`~trajforge.rl.config.TrainConfig`
  (its env, item stream and seed -- GRPO's training items, in GRPO's order --, temperature,
  token and turn limits, unfiltered sampling) through the same ``trajforge serve`` and rollouts;
- **the same compute, counted, not timed** (:class:`RftBudget`): as many sampled episodes as
  GRPO sampled, split evenly over ``rounds``, and as many trained tokens (tokens that carried a
  loss) as GRPO trained on, reached round by round: each round trains on its kept episodes, in
  shuffled passes, until the running total of trained tokens reaches the budget's share for the
  rounds done (wall time moves with the machine's load, so it is reported, never matched);
- **its learning rate chosen on a validation split**: in each round every candidate of ``lrs``
  trains from the round's start (weights and AdamW state), is served and measured on
  ``validation_items`` items of their own (sampled pass@1 at the training temperature, ``k``
  each: never a held-out item, never a training item), and the best carries on (ties: the
  earlier candidate). The validation episodes are counted apart from the training budget.

What a round keeps is every passing episode with its exact token trace (the tokens the policy
sampled carry the loss; prompt, tool results and template text do not), as GRPO's samples are.
The loss is the token-mean negative log-likelihood; dropout is off as in GRPO's update
(:func:`~trajforge.rl.fit.update_mode`), and LoRA, bf16 and checkpointing follow the config.

**A stopped RFT resumes after its last finished round.** Each round ends by writing the policy,
its AdamW state and the rounds' reports to ``OUT/round/`` (whole or not at all); a rerun into
the same ``OUT`` with the same config, start, budget, settings and validation seed starts from
there -- the items of the finished rounds skipped in the run's stream, its episodes' seeds as
they were -- so a long control (an hour on the demo's CPU) loses at most one round to a stop.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from trajforge.distributions import derive_seed
from trajforge.envs.catalog import load_env
from trajforge.envs.protocol import AgentEnv
from trajforge.envs.running.episode import RolloutBackends, Rollouts, env_sandbox_config
from trajforge.envs.running.evaluate import run_eval
from trajforge.envs.types import Episode
from trajforge.llm.token_trace import MASKED
from trajforge.rl.builtin import UNFILTERED, resolve_device, training_env
from trajforge.rl.checkpoint import OPTIMIZER_FILE, save_model_dir
from trajforge.rl.config import TrainConfig
from trajforge.rl.grpo import Sample
from trajforge.rl.policy_server import PolicyServer
from trajforge.rl.samples import PASS_THRESHOLD
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.tools.builtin import default_registry

INFO_FILE = "rft.json"
ROUND_DIR = "round"
"""``OUT/round/``: the policy and optimizer after the latest finished round, for a resume."""
ROUND_FILE = "rft_round.json"


class RftSettings(BaseModel):
    """How the RFT control runs (``rl demo``'s ``rft`` in ``--config``)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    rounds: int = Field(4, ge=1, description="expert-iteration rounds: sample, keep, train")
    lrs: list[Annotated[float, Field(gt=0)]] = Field(  # finite (the model's allow_inf_nan), positive
        default_factory=lambda: [1e-4, 3e-4, 1e-3],
        min_length=1,
        description="candidate learning rates, chosen per round on the validation split",
    )
    batch: int = Field(16, ge=1, description="kept episodes per supervised update")
    validation_items: int = Field(48, ge=1, description="validation items (neither training nor held out)")
    validation_k: int = Field(2, ge=1, description="sampled episodes per validation item")


@dataclass
class RftBudget:
    """What GRPO spent, which RFT spends too."""

    episodes: int
    """Sampled training episodes (GRPO: steps x groups x group size)."""
    trained_tokens: int
    """Tokens that carried a loss, summed over the updates (GRPO: its metric lines' ``trained_tokens``)."""


@dataclass
class RoundReport:
    round: int
    episodes: int = 0
    passed: int = 0
    kept: int = 0
    kept_tokens: int = 0
    updates: int = 0
    trained_tokens: int = 0
    lr: float | None = None
    validation: dict[str, float] = field(default_factory=dict)
    """Candidate lr (as text) -> validation sampled pass@1."""
    seconds: float = 0.0


def kept_samples(episodes: list[Episode]) -> list[Sample]:
    """The passing episodes with a usable trace, as supervised samples on their sampled tokens."""
    out = []
    for ep in episodes:
        trace = ep.trace
        if ep.score < PASS_THRESHOLD or trace is None:
            continue
        sampled = [m != MASKED for m in trace.masks]
        if any(sampled):
            out.append(
                Sample(
                    tokens=list(trace.tokens),
                    sampled=sampled,
                    old_logprobs=[0.0] * len(trace.tokens),
                    advantage=1.0,
                )
            )
    return out


def supervised_until(
    model: Any,
    optimizer: Any,
    samples: list[Sample],
    *,
    tokens: int,
    batch: int,
    lr: float,
    micro_batch: int,
    pad_id: int,
    device: str,
    precision: str,
    seed: int,
) -> tuple[int, int, list[float]]:
    """Supervised updates of ``batch`` samples each, in shuffled passes over ``samples``, until
    ``tokens`` trained tokens are reached (the last update is cut to what is left of it). Returns
    ``(updates, trained tokens, losses)``. Blocking: run it in a worker thread."""
    from trajforge.rl.fit import supervised_update, update_mode

    for group in optimizer.param_groups:
        group["lr"] = lr
    rng = random.Random(seed)
    order: list[Sample] = []
    done = updates = 0
    losses: list[float] = []
    while samples and done < tokens:
        if len(order) < batch:
            fresh = list(samples)
            rng.shuffle(fresh)
            order += fresh
        chosen, order = order[:batch], order[batch:]
        # the last update takes only what the budget still needs (the sample that crosses it
        # included), so the total lands within one sample of it rather than one batch
        fit_in, running = [], done
        for s in chosen:
            if running >= tokens:
                break
            fit_in.append(s)
            running += s.num_sampled
        chosen = fit_in
        count = float(sum(s.num_sampled for s in chosen)) or 1.0
        update_mode(model)
        loss = supervised_update(
            model, optimizer, chosen, tokens=count, micro_batch=micro_batch, pad_id=pad_id, device=device,
            precision=precision,
        )  # fmt: skip
        optimizer.zero_grad(set_to_none=True)
        done += int(count)
        updates += 1
        losses.append(loss)
    return updates, done, losses


def run_identity(
    config: TrainConfig, start: Path, budget: RftBudget, settings: RftSettings, validation_seed: int
) -> dict[str, Any]:
    """What a resumed RFT must share with the run whose rounds it continues (JSON as written)."""
    identity = {
        "config": config.model_dump(mode="json", exclude={"output_dir"}),
        "start": str(Path(start).resolve()),
        "budget": vars(budget),
        "settings": settings.model_dump(mode="json"),
        "validation_seed": validation_seed,
    }
    loaded: dict[str, Any] = json.loads(json.dumps(identity))
    return loaded


def finished_rounds(out: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The round checkpoint an earlier run of ``out`` left with this identity, or None (none, an
    unreadable one, or another run's: that one is started over)."""
    try:
        info: dict[str, Any] = json.loads((out / ROUND_DIR / ROUND_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info if info.get("identity") == identity else None


def validation_env(config: TrainConfig, eval_seed: int) -> AgentEnv:
    """The run's env with held-out items drawn from ``eval_seed`` (the validation split), sampled
    as the training rollouts are."""
    overrides: dict[str, Any] = {
        **config.env_overrides,
        "eval_seed": eval_seed,
        "agent_temperature": config.temperature if config.temperature is not None else 1.0,
        "extra_body": dict(UNFILTERED),
        "max_concurrent_rollouts": config.concurrency,
    }
    if config.max_tokens is not None:
        overrides["max_tokens"] = config.max_tokens
    if config.max_turns is not None:
        overrides["max_agent_turns"] = config.max_turns
    return load_env(config.env, overrides)


async def rft(
    config: TrainConfig,
    start: Path,
    out: Path,
    budget: RftBudget,
    settings: RftSettings,
    *,
    validation_seed: int,
    say: Callable[[str], None] = lambda _line: None,
) -> tuple[Path, dict[str, Any]]:
    """Expert iteration from ``start`` within ``budget``; the final model directory and its report."""
    import torch
    from transformers import AutoTokenizer

    from trajforge.rl.fit import adapter_dir, load_policy, resolve_precision, trainable_parameters

    began = time.monotonic()
    device = resolve_device(config.device)
    precision = resolve_precision(config.precision, device)
    env = training_env(config)
    val_env = validation_env(config, validation_seed)
    rounds = settings.rounds
    per_round = max(config.group_size, budget.episodes // rounds)
    items_per_round = max(1, per_round // config.group_size)

    identity = run_identity(config, start, budget, settings, validation_seed)
    resumed = finished_rounds(out, identity)
    checkpoint = out / ROUND_DIR

    def load() -> tuple[Any, Any, Any]:
        torch.manual_seed(derive_seed(config.seed, "rft") & 0x7FFFFFFF)
        tokenizer = AutoTokenizer.from_pretrained(str(config.model))
        if resumed is None:
            model = load_policy(config, start, device)
        elif config.lora is not None:
            model = load_policy(config, start, device, adapter=adapter_dir(checkpoint))
        else:
            model = load_policy(config, checkpoint, device)
        optimizer = torch.optim.AdamW(trainable_parameters(model), lr=settings.lrs[0], weight_decay=0.0)
        if resumed is not None:
            optimizer.load_state_dict(
                torch.load(checkpoint / OPTIMIZER_FILE, map_location=device, weights_only=True)
            )
        return model, tokenizer, optimizer

    model, tokenizer, optimizer = await asyncio.to_thread(load)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    factory = create_sandbox_factory(
        env_sandbox_config(
            env, SandboxConfig(kind=env.config.sandbox, command_timeout_s=env.config.command_timeout_s)
        )
    )
    reports: list[RoundReport] = []
    trained = 0
    validation_episodes = 0
    earlier_seconds = 0.0
    if resumed is not None:
        reports = [RoundReport(**r) for r in resumed["rounds"]]
        trained, validation_episodes = int(resumed["trained"]), int(resumed["validation_episodes"])
        earlier_seconds = float(resumed["seconds"])
        say(f"rft: resuming after round {len(reports)} of {rounds} (an earlier run of {out})")
    try:
        await env.setup()
        await val_env.setup()
        async with PolicyServer(
            start,
            config.model,
            parser=env.config.tool_call_parser,
            max_batch=config.max_batch,
            device=config.serve_device,
            dtype=config.serve_dtype,
            max_tokens=env.config.max_tokens or 256,
            log_path=out / "serve.log",
        ) as server:
            registry = default_registry()
            backends = RolloutBackends(server.chat_model, factory, registry)
            rollouts = Rollouts(env, backends)
            if reports:
                for _ in range(len(reports) * items_per_round):  # the finished rounds' items
                    await env.get_next_item()
                await server.reload(checkpoint)
            for r in range(len(reports) + 1, rounds + 1):
                round_began = time.monotonic()
                rep = RoundReport(round=r)
                items = [await env.get_next_item() for _ in range(items_per_round)]
                episodes = await asyncio.gather(
                    *(
                        rollouts.episode(
                            item,
                            rollout=k,
                            group_size=config.group_size,
                            seed=derive_seed(config.seed, f"rft#{r}#{env.item_id(item)}#{k}"),
                        )
                        for item in items
                        for k in range(config.group_size)
                    )
                )
                kept = kept_samples(list(episodes))
                rep.episodes, rep.passed = len(episodes), sum(e.score >= PASS_THRESHOLD for e in episodes)
                rep.kept, rep.kept_tokens = len(kept), sum(s.num_sampled for s in kept)
                target = budget.trained_tokens * r // rounds - trained
                say(
                    f"rft round {r}/{rounds}: {rep.passed}/{rep.episodes} passed, {rep.kept_tokens} kept "
                    f"tokens; training to {max(0, target)} tokens"
                )
                if kept and target > 0:
                    base_state = copy.deepcopy(model.state_dict())
                    base_opt = copy.deepcopy(optimizer.state_dict())
                    best: tuple[float, float, dict[str, Any], dict[str, Any], int, int] | None = None
                    for lr in settings.lrs:
                        model.load_state_dict(base_state)
                        optimizer.load_state_dict(base_opt)
                        updates, done, _losses = await asyncio.to_thread(
                            supervised_until,
                            model,
                            optimizer,
                            kept,
                            tokens=target,
                            batch=settings.batch,
                            lr=lr,
                            micro_batch=config.micro_batch,
                            pad_id=pad_id,
                            device=device,
                            precision=precision,
                            seed=derive_seed(config.seed, f"rft-order#{r}"),
                        )
                        cand = out / "candidates" / f"round-{r}-lr-{lr:g}"
                        await asyncio.to_thread(
                            save_model_dir, cand, model, tokenizer, None, INFO_FILE, {"round": r, "lr": lr}
                        )
                        await server.reload(cand)
                        score = await _validate(val_env, backends, cand / "validation", settings)
                        validation_episodes += settings.validation_items * settings.validation_k
                        rep.validation[f"{lr:g}"] = round(score, 4)
                        say(
                            f"rft round {r}: lr {lr:g}: {updates} updates, validation pass@1 {100 * score:.1f}%"
                        )
                        if best is None or score > best[0]:
                            best = (
                                score,
                                lr,
                                copy.deepcopy(model.state_dict()),
                                copy.deepcopy(optimizer.state_dict()),
                                updates,
                                done,
                            )
                    assert best is not None
                    _, rep.lr, state, opt_state, rep.updates, rep.trained_tokens = best
                    model.load_state_dict(state)
                    optimizer.load_state_dict(opt_state)
                    trained += rep.trained_tokens
                    chosen = out / "candidates" / f"round-{r}-lr-{rep.lr:g}"
                    await server.reload(chosen)
                rep.seconds = round(time.monotonic() - round_began, 1)
                reports.append(rep)
                progress = {
                    "identity": identity,
                    "rounds": [vars(x) for x in reports],
                    "trained": trained,
                    "validation_episodes": validation_episodes,
                    "seconds": round(earlier_seconds + time.monotonic() - began, 1),
                }
                await asyncio.to_thread(
                    save_model_dir, checkpoint, model, tokenizer, optimizer, ROUND_FILE, progress
                )
    finally:
        await close_factory(factory)
    info: dict[str, Any] = {
        "rounds": [vars(rep) for rep in reports],
        "sampled_episodes": sum(rep.episodes for rep in reports),
        "passed_episodes": sum(rep.passed for rep in reports),
        "updates": sum(rep.updates for rep in reports),
        "trained_tokens": trained,
        "budget": vars(budget),
        "validation_episodes": validation_episodes,
        "validation_seed": validation_seed,
        "settings": settings.model_dump(),
        "precision": precision,
        "seconds": round(earlier_seconds + time.monotonic() - began, 1),
        "resumed_after_round": None if resumed is None else len(resumed["rounds"]),
    }
    path = await asyncio.to_thread(save_model_dir, out / "final", model, tokenizer, None, INFO_FILE, info)
    await asyncio.to_thread(shutil.rmtree, checkpoint, True)  # ``final`` is the run's result now
    return path, info


async def _validate(env: AgentEnv, backends: RolloutBackends, out: Path, settings: RftSettings) -> float:
    run = await run_eval(env, backends, out, n=settings.validation_items, group_size=settings.validation_k)
    return float(run.summary.pass_at_1.value)
