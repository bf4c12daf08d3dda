"""The closed loop (``trajforge rl demo``): what GRPO itself adds, measured against more supervision.

Phases, each a function below:

1. :func:`measure` the starting policy -- the recipe's weights unless told otherwise -- on
   ``eval_n`` held-out ``tiny_tasks`` items through ``trajforge serve``: **greedy** (one episode
   per item) and **sampled** at the training temperature (``eval_k`` episodes per item; pass@1 is
   their mean, pass@k whether any passed), with the same per-episode seeds at every stage, so two
   stages are compared item by item (:func:`paired`: the mean per-item difference, 95% interval).
2. :func:`warm_stage` (only with a ``warm_start``: ``--warm-start`` or ``--config``):
   supervised updates on the demonstration set (:mod:`trajforge.rl.warm_start`), measured the
   same way. Off by default: measured, 40 updates on the other families' set drove arithmetic
   from 20% to 0% sampled (forgotten), which leaves GRPO's groups all-zero.
3. :func:`grpo_stage`: the builtin GRPO trainer from the start, on training items (other seeds)
   of the target family (:data:`DEMO_DEFAULTS`: arithmetic, mid-range when sampled, so groups are
   mixed -- a group whose rewards are all equal has no signal -- with a checker and no
   demonstrations: the case RL is for), stopped by the time budget (split so the control gets
   the same time).
4. :func:`control_stage`: the **equal-compute supervised control** -- the same wall time GRPO
   took, spent on supervised updates from the same start instead: epochs on the demonstration
   set (:data:`WARM_START`: the SFT data a user has, 100 oracle demonstrations of the other
   families; ``--control-data set``), or fresh oracle demonstrations of GRPO's own family
   (``--control-data oracle``: what supervision does where an oracle exists for the target) --
   measured the same way. GRPO's share is its gain over the start (the warm start when there is
   one, and then also over the starting weights); the control says whether "more SFT" would have
   done as well.
5. :func:`write_report`: ``report.json``, ``closed_loop.png`` (training reward per step, held-out
   success by stage; warm start, GRPO and control apart) and the table the command prints last.

Everything is overridable with ``--config`` (TrainConfig fields, ``warm_start`` included).
docs/benchmarks.md has the measured results and how the starting point was chosen.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajforge.endpoint import recipe_weights
from trajforge.envs.catalog import load_env
from trajforge.envs.episode import RolloutBackends
from trajforge.envs.runner import run_eval
from trajforge.envs.summary import EvalSummary, mean_interval
from trajforge.rl.builtin import UNFILTERED, BuiltinTrainer, resolve_device
from trajforge.rl.config import TrainConfig, TrainConfigError, WarmStart
from trajforge.rl.policy_server import PolicyServer
from trajforge.rl.progress import StepProgress
from trajforge.rl.samples import PASS_THRESHOLD
from trajforge.sandbox import close_factory, create_sandbox_factory
from trajforge.sandbox.types import SandboxConfig
from trajforge.tools.builtin import default_registry

EVAL_MAX_TOKENS = 256
"""max_tokens of an evaluation call: the embedded policy's context is 1024 tokens."""

DEMO_DEFAULTS: dict[str, Any] = {
    "env": "tiny_tasks",
    "group_size": 8,
    "groups_per_step": 8,
    "lr": 3e-4,
    "warmup_steps": 3,
    "kl_coef": 0.0,
    "scale_rewards": True,
    "max_staleness": 1,
    "temperature": 1.0,
    "max_tokens": 96,
    "max_turns": 3,
    "concurrency": 64,
    "max_batch": 64,
    "micro_batch": 16,
    "device": "cpu",
    "guide": "none",
    # the family with room when sampled, measured from the recipe's weights at T=1: arithmetic
    # ~31% (find_value ~4%: a success in ~28% of groups of 8; count_lines/count_words are solved
    # and write_file's copy is never sampled: uniform groups, no signal). It has a checker and no
    # demonstrations in the warm start's set (WARM_START): the case RL is for.
    "env_overrides": {"families": ["arithmetic"]},
}


WARM_START: dict[str, Any] = {
    "batch": 10,
    "lr": 1e-3,
    "decay": 0.2,
    "demos": 100,
    "env_overrides": {"families": ["write_file", "find_value", "count_lines", "count_words"]},
    "updates": 40,
}
"""``rl demo``'s demonstration set and warm-start settings: a fixed set of 100 demonstrations of
the families other than GRPO's (40 updates x 10 = 4 epochs when ``--warm-start`` runs it): the
SFT data a user has, which does not cover the target skill. The control trains on this set."""

TRAINED = "trained families"
"""The shares' row over the held-out items of the families GRPO trains on (the headline's)."""

CONTROL_DATA = ("set", "oracle")
"""The control's data: ``set`` -- the demonstration set (the warm start's data: more warm-start
updates); ``oracle`` -- fresh oracle demonstrations of GRPO's own families."""

CONTROL_CHUNK = 10
"""Supervised updates between the control's clock checks (and its demonstrations per collection,
times the warm start's batch)."""


class DemoError(RuntimeError):
    """The demo could not run (the message says why)."""


# ----------------------------------------------------------------------------- measurement


@dataclass
class StageEval:
    """One stage's held-out results: greedy and sampled summaries, and per item the share of its
    sampled episodes that passed (for paired comparisons), and its greedy result."""

    name: str
    greedy: EvalSummary
    sampled: EvalSummary
    sampled_by_item: dict[str, float]
    greedy_by_item: dict[str, float]
    family_of: dict[str, str]
    seconds: float

    def table(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "all": {
                "items": self.greedy.items,
                "greedy": self.greedy.pass_at_1.model_dump(),
                "sampled_pass1": self.sampled.pass_at_1.model_dump(),
                "sampled_pass_at_k": self.sampled.pass_at_k,
            }
        }
        for fam in sorted(self.greedy.by_category):
            out[fam] = {
                "items": self.greedy.by_category[fam].items,
                "greedy": self.greedy.by_category[fam].pass_at_1.model_dump(),
                "sampled_pass1": self.sampled.by_category[fam].pass_at_1.model_dump()
                if fam in self.sampled.by_category
                else None,
                "sampled_pass_at_k": _pass_at_k(self, fam),
            }
        return out


def _pass_at_k(stage: StageEval, family: str) -> float:
    """Share of the family's items with at least one passing sampled episode."""
    items = [i for i, f in stage.family_of.items() if f == family]
    return sum(stage.sampled_by_item[i] > 0 for i in items) / max(1, len(items))


def _per_item(run_dir: Path) -> tuple[dict[str, float], dict[str, str]]:
    passed: dict[str, list[float]] = defaultdict(list)
    family: dict[str, str] = {}
    for raw in (run_dir / "episodes.jsonl").read_text().splitlines():
        ep = json.loads(raw)
        passed[ep["item_id"]].append(1.0 if float(ep["reward"]) >= PASS_THRESHOLD else 0.0)
        family[ep["item_id"]] = ep.get("category") or "-"
    return {k: sum(v) / len(v) for k, v in passed.items()}, family


async def measure(
    name: str,
    model_dir: Path,
    tokenizer_dir: Path,
    out: Path,
    n: int,
    k: int,
    temperature: float,
    sampled_limits: dict[str, int] | None = None,
    families: list[str] | None = None,
) -> StageEval:
    """Greedy (1 per item) and sampled (``k`` per item at ``temperature``, unfiltered) held-out
    evaluation of ``model_dir`` through one ``trajforge serve``; both at once. ``sampled_limits``
    (``max_tokens``, ``max_agent_turns``): the sampled episodes' limits -- the training rollouts',
    so sampled pass@1 is the success rate GRPO optimises, measured on held-out items. ``families``:
    the held-out items of these families only (default: every family)."""
    began = time.monotonic()
    common: dict[str, Any] = {"max_tokens": EVAL_MAX_TOKENS, "max_concurrent_rollouts": 32}
    if families:
        common["families"] = families
    greedy_env = load_env("tiny_tasks", {**common, "agent_temperature": 0.0})
    sampled_env = load_env(
        "tiny_tasks",
        {
            **common,
            **(sampled_limits or {}),
            "agent_temperature": temperature,
            "extra_body": dict(UNFILTERED),
        },
    )
    factory = create_sandbox_factory(SandboxConfig(kind=greedy_env.config.sandbox, command_timeout_s=30))
    try:
        async with PolicyServer(
            model_dir,
            tokenizer_dir,
            max_batch=64,
            max_tokens=EVAL_MAX_TOKENS,
            name="trajforge-tiny",
            log_path=out / "serve.log",
        ) as server:
            backends = RolloutBackends(server.chat_model, factory, default_registry())
            greedy, sampled = await asyncio.gather(
                run_eval(greedy_env, backends, out / "greedy", n=n, group_size=1),
                run_eval(sampled_env, backends, out / "sampled", n=n, group_size=k),
            )
    finally:
        await close_factory(factory)
    by_item, family = _per_item(out / "sampled")
    greedy_by_item, _ = _per_item(out / "greedy")
    return StageEval(
        name, greedy.summary, sampled.summary, by_item, greedy_by_item, family, time.monotonic() - began
    )


def paired(
    a: StageEval, b: StageEval, *, sampled: bool = True, families: Collection[str] | None = None
) -> dict[str, float]:
    """``b - a`` on the same items (same seeds): the mean per-item difference of sampled pass@1
    (or greedy success) with a 95% normal interval over items (of ``families``, or all)."""
    xa = a.sampled_by_item if sampled else a.greedy_by_item
    xb = b.sampled_by_item if sampled else b.greedy_by_item
    items = [i for i in xa if i in xb and (families is None or a.family_of.get(i) in families)]
    diffs = [xb[i] - xa[i] for i in items]
    n = len(diffs)
    if n == 0:
        return {"delta": 0.0, "low": 0.0, "high": 0.0, "items": 0}
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    half = 1.96 * sd / math.sqrt(n)
    return {
        "delta": round(mean, 4),
        "low": round(mean - half, 4),
        "high": round(mean + half, 4),
        "items": n,
    }


# ----------------------------------------------------------------------------- the plan


@dataclass
class DemoPlan:
    output_dir: Path
    config: TrainConfig
    """GRPO's config (``model``: where the loop starts; ``warm_start``: the supervised stage)."""
    eval_n: int
    eval_k: int
    budget_s: float
    control: bool
    echo: Callable[[str], None]
    eval_families: list[str] | None = None
    """Held-out items of these families only (None: every family)."""
    control_data: str = "set"
    """What the control trains on (:data:`CONTROL_DATA`)."""
    began: float = field(default_factory=time.monotonic)

    @property
    def tokenizer(self) -> Path:
        return self.config.model

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def say(self, text: str) -> None:
        self.echo(f"[demo {self.elapsed():4.0f}s] {text}")

    async def measure(self, name: str, model_dir: Path) -> StageEval:
        self.say(
            f"evaluating {name}: {self.eval_n} held-out items, greedy and {self.eval_k} samples each "
            f"at T={self.config.temperature}"
        )
        stage = await measure(
            name,
            model_dir,
            self.tokenizer,
            self.output_dir / f"eval-{name.replace(' ', '-')}",
            self.eval_n,
            self.eval_k,
            float(self.config.temperature or 1.0),
            {
                k: v
                for k, v in (
                    ("max_tokens", self.config.max_tokens),
                    ("max_agent_turns", self.config.max_turns),
                )
                if v is not None
            },
            self.eval_families,
        )
        self.say(
            f"{name}: sampled pass@1 {_pct(stage.sampled.pass_at_1.value)}, greedy "
            f"{_pct(stage.greedy.pass_at_1.value)} ({stage.seconds:.0f}s)"
        )
        return stage


def make_plan(
    output_dir: Path,
    *,
    eval_n: int,
    eval_k: int,
    steps: int,
    overrides: dict[str, Any],
    budget_s: float,
    control: bool,
    echo: Callable[[str], None],
    eval_all_families: bool = False,
    control_data: str = "set",
) -> DemoPlan:
    if control_data not in CONTROL_DATA:
        raise DemoError(f"control data {control_data!r}: use one of {', '.join(CONTROL_DATA)}")
    data = {
        **DEMO_DEFAULTS,
        **overrides,
        "model": str(overrides.get("model") or recipe_weights()),
        "steps": steps,
        "output_dir": str(output_dir / "grpo"),
    }
    try:
        config = TrainConfig.model_validate(data)
    except ValueError as exc:
        raise TrainConfigError(f"invalid demo training config: {exc}") from None
    trained = config.env_overrides.get("families")
    families = None if eval_all_families or not isinstance(trained, list) else sorted(set(trained))
    return DemoPlan(output_dir, config, eval_n, eval_k, budget_s, control, echo, families, control_data)


# ----------------------------------------------------------------------------- the stages


async def warm_stage(plan: DemoPlan) -> tuple[Path, dict[str, Any] | None]:
    """The supervised warm start (or the starting model, when the config has none)."""
    cfg = plan.config
    if cfg.warm_start is None:
        return cfg.model, None
    from trajforge.rl.checkpoint import RunDir
    from trajforge.rl.warm_start import warm_start

    plan.say(f"warm start: {cfg.warm_start.total_updates} supervised updates on oracle demonstrations")
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", command_timeout_s=30))
    try:
        path, info = await warm_start(
            cfg,
            RunDir(plan.output_dir / "warm"),
            device=resolve_device(cfg.device),
            factory=factory,
            registry=default_registry(),
        )
    finally:
        await close_factory(factory)
    plan.say(
        f"warm start done: {info['demonstrations']} demonstrations, loss {info['loss_first_tenth']} -> "
        f"{info['loss_last_tenth']} ({info['seconds']}s)"
    )
    return path, info


async def grpo_stage(plan: DemoPlan, start: Path, seconds: float) -> tuple[Path, list[dict[str, Any]], float]:
    """GRPO from ``start`` until ``seconds`` of wall time would pass (model load and server start
    included); returns the last checkpoint, the metric lines and the seconds it took."""
    began = time.monotonic()
    cfg = plan.config.model_copy(update={"model": start, "warm_start": None})
    progress = StepProgress(cfg.steps, lambda line: plan.say(f"grpo {line}"), deadline=began + seconds)

    def out_of_time(line: dict[str, Any]) -> bool:
        step_s = float(line.get("step_s") or 0.0)
        return time.monotonic() - began + step_s > seconds

    plan.say(f"GRPO for up to {seconds:.0f}s ({cfg.steps} steps at most)")
    trainer = BuiltinTrainer(cfg, on_step=progress, stop_after=out_of_time)
    result = await trainer.run()
    return result.final_checkpoint, result.metrics, time.monotonic() - began


async def control_stage(plan: DemoPlan, start: Path, seconds: float) -> tuple[Path, dict[str, Any]]:
    """More supervised updates from ``start`` for ``seconds`` of wall time (demonstration
    collection included, as GRPO's rollouts are), the warm start's batch and lr, one AdamW across
    the chunks. On what (``plan.control_data``): ``set`` -- the demo's demonstration set (the
    warm start's settings, :data:`WARM_START` by default): the very set the warm start trained on
    when it ran, else that set collected now (its ``demos`` oracle episodes, from the warm start's
    item stream; in the control's time), cycled through in epochs -- or fresh demonstrations of
    its mix when it fixes no set; ``oracle`` -- fresh oracle demonstrations of GRPO's own families
    (what supervision does when an oracle exists for exactly what GRPO trains on: the strongest
    control)."""
    from trajforge.rl.checkpoint import save_model_dir
    from trajforge.rl.warm_start import collect_demonstrations, load_demonstrations, supervised_updates

    began = time.monotonic()
    cfg = plan.config
    device = resolve_device(cfg.device)
    base = cfg.warm_start or WarmStart.model_validate(WARM_START)
    fixed_set: list[Any] | None = None
    if plan.control_data == "set":
        mix = {**base.env_overrides, **base.schedule()[-1].env_overrides}
        kept = load_demonstrations(start)
        fixed_set = [s for phase in kept for s in phase] if kept else None
    else:
        mix = dict(cfg.env_overrides)
    collect_set = plan.control_data == "set" and fixed_set is None and base.demos is not None
    ws = WarmStart(
        updates=CONTROL_CHUNK,
        batch=base.batch,
        lr=base.lr,
        decay=0.0,
        focal=base.focal,
        env_overrides=mix,
    )
    ccfg = cfg.model_copy(update={"warm_start": ws})
    families = ", ".join(sorted(set(mix.get("families") or ["every family"])))
    if fixed_set:
        data = f"the warm start's fixed set of {len(fixed_set)} demonstrations ({families}), more epochs"
    elif collect_set:
        data = f"a fixed set of {base.demos} oracle demonstrations of {families}, in epochs"
    else:
        data = f"fresh oracle demonstrations of {families}"
    plan.say(f"control: supervised updates from GRPO's start for {seconds:.0f}s (GRPO's time) on {data}")

    def load() -> tuple[Any, Any, Any]:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(cfg.model))
        model: Any = AutoModelForCausalLM.from_pretrained(str(start), dtype=torch.float32)
        model = model.to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=0.0)
        return model, tokenizer, optimizer

    from trajforge.llm.chat_template import ChatTemplate

    model, tokenizer, optimizer = await asyncio.to_thread(load)
    template = await asyncio.to_thread(ChatTemplate.from_path, str(cfg.model))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", command_timeout_s=30))
    losses: list[float] = []
    demos = chunk = 0
    try:
        if collect_set:
            got = await collect_demonstrations(
                ccfg, base.demos or 0, factory, default_registry(), template, stream="warm-start"
            )
            if not got.samples:
                raise DemoError(f"control: none of {base.demos} oracle episodes gave a demonstration")
            fixed_set = got.samples
        looping = time.monotonic()  # a chunk's cost, for the clock, leaves the set's collection out
        while True:
            chunk += 1
            if fixed_set:
                # continue the cycle through the set where the last chunk left it
                at = (chunk - 1) * CONTROL_CHUNK * ws.batch % len(fixed_set)
                samples = fixed_set[at:] + fixed_set[:at]
            else:
                got = await collect_demonstrations(
                    ccfg,
                    CONTROL_CHUNK * ws.batch,
                    factory,
                    default_registry(),
                    template,
                    stream=f"control/{chunk}",
                )
                samples = got.samples
                demos += len(samples)
            if samples:
                losses += await asyncio.to_thread(
                    supervised_updates,
                    model,
                    [samples],
                    ws,
                    micro_batch=cfg.micro_batch,
                    pad_id=pad_id,
                    device=device,
                    optimizer=optimizer,
                )
            spent = time.monotonic() - began
            per_chunk = (time.monotonic() - looping) / chunk
            plan.say(f"control: {len(losses)} updates, loss {losses[-1] if losses else 0:.4f} ({spent:.0f}s)")
            if spent + per_chunk > seconds:
                break
    finally:
        await close_factory(factory)
    info = {
        "data": plan.control_data,
        "described": data,
        "updates": len(losses),
        "demonstrations": len(fixed_set) if fixed_set else demos,
        "fixed_set": bool(fixed_set),
        "epochs_on_the_set": round(len(losses) * ws.batch / len(fixed_set), 2) if fixed_set else None,
        "batch": ws.batch,
        "lr": ws.lr,
        "families": ws.env_overrides.get("families"),
        "loss_first": round(losses[0], 4) if losses else None,
        "loss_last": round(losses[-1], 4) if losses else None,
        "seconds": round(time.monotonic() - began, 1),
    }
    path = await asyncio.to_thread(
        save_model_dir, plan.output_dir / "control", model, tokenizer, None, "control.json", info
    )
    return path, info


# ----------------------------------------------------------------------------- the loop


def run_demo(
    output_dir: Path,
    *,
    eval_n: int = 40,
    eval_k: int = 4,
    steps: int = 200,
    overrides: dict[str, Any] | None = None,
    time_budget_s: float = 1200.0,
    control: bool = True,
    eval_all_families: bool = False,
    control_data: str = "set",
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    output_dir.mkdir(parents=True, exist_ok=True)
    plan = make_plan(
        output_dir,
        eval_n=eval_n,
        eval_k=eval_k,
        steps=steps,
        overrides=overrides or {},
        budget_s=time_budget_s,
        control=control,
        echo=echo,
        eval_all_families=eval_all_families,
        control_data=control_data,
    )
    return asyncio.run(closed_loop(plan))


async def closed_loop(plan: DemoPlan) -> dict[str, Any]:
    before = await plan.measure("before", plan.config.model)
    warm_dir, warm_info = await warm_stage(plan)
    warm = await plan.measure("warm start", warm_dir) if warm_info is not None else before
    # the rest of the budget: GRPO, its evaluation, then as much again for the control
    # (a later evaluation took up to ~1.45x the first in the measured runs: the control's policy
    # can write to max_tokens; the budget keeps room)
    eval_s = 1.5 * warm.seconds
    stages = 2 if plan.control else 1
    grpo_s = (plan.budget_s - plan.elapsed() - stages * eval_s) / stages
    if grpo_s < 30:
        raise DemoError(
            f"{plan.elapsed():.0f}s of the {plan.budget_s:.0f}s budget are spent before GRPO; "
            "raise --time-budget-min or lower --eval-n"
        )
    grpo_dir, metrics, grpo_took = await grpo_stage(plan, warm_dir, grpo_s)
    after = await plan.measure("GRPO", grpo_dir)
    control = control_info = None
    if plan.control:
        control_dir, control_info = await control_stage(plan, warm_dir, grpo_took)
        control = await plan.measure("control", control_dir)
    report = build_report(plan, before, warm, after, control, warm_info, control_info, metrics, grpo_took)
    write_report(plan, report)
    return report


def _stage_row(stage: StageEval, trained: Collection[str] | None) -> dict[str, Any]:
    table = stage.table()
    if trained:
        items = [i for i, f in stage.family_of.items() if f in trained]
        sampled = [stage.sampled_by_item[i] for i in items]
        greedy = [stage.greedy_by_item[i] for i in items if i in stage.greedy_by_item]
        table[TRAINED] = {
            "items": len(items),
            "greedy": mean_interval(greedy).model_dump(),
            "sampled_pass1": mean_interval(sampled).model_dump(),
            "sampled_pass_at_k": sum(x > 0 for x in sampled) / max(1, len(sampled)),
        }
    return {"name": stage.name, "seconds": round(stage.seconds, 1), "families": table}


def build_report(
    plan: DemoPlan,
    before: StageEval,
    warm: StageEval,
    after: StageEval,
    control: StageEval | None,
    warm_info: dict[str, Any] | None,
    control_info: dict[str, Any] | None,
    metrics: list[dict[str, Any]],
    grpo_s: float,
) -> dict[str, Any]:
    measured = [before, *([warm] if warm is not before else []), after, *([control] if control else [])]
    trained_list = plan.config.env_overrides.get("families")
    trained = sorted(set(trained_list)) if isinstance(trained_list, list) else None
    groups: dict[str, Collection[str] | None] = {"all": None}
    if trained:
        groups[TRAINED] = trained
    groups.update({fam: [fam] for fam in sorted(after.greedy.by_category)})
    shares: dict[str, Any] = {}
    for key, fams in groups.items():
        shares[key] = {
            "grpo_sampled": paired(warm, after, families=fams),
            "grpo_greedy": paired(warm, after, sampled=False, families=fams),
            "warm_start_sampled": paired(before, warm, families=fams),
            # against the starting weights too: a share over the warm start could be GRPO winning
            # back what the warm start cost, which this one would not show as a gain
            "grpo_over_start_sampled": paired(before, after, families=fams),
            "grpo_over_start_greedy": paired(before, after, sampled=False, families=fams),
        }
        if control is not None:
            shares[key]["control_sampled"] = paired(warm, control, families=fams)
            shares[key]["control_greedy"] = paired(warm, control, sampled=False, families=fams)
            shares[key]["grpo_minus_control_sampled"] = paired(control, after, families=fams)
    head = TRAINED if trained else "all"
    headline = {
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "seconds_total": round(plan.elapsed(), 1),
        "seconds_grpo": round(grpo_s, 1),
        "grpo_steps": len(metrics),
        "trained_families": trained,
        "share_over": head,
        "sampled_pass1": {s.name: s.sampled.pass_at_1.value for s in measured},
        "greedy": {s.name: s.greedy.pass_at_1.value for s in measured},
        "grpo_share_sampled_points": round(100 * shares[head]["grpo_sampled"]["delta"], 1),
        "grpo_share_greedy_points": round(100 * shares[head]["grpo_greedy"]["delta"], 1),
        "grpo_over_start_sampled_points": round(100 * shares[head]["grpo_over_start_sampled"]["delta"], 1),
    }
    if control is not None:
        for name, key in (
            ("control_share_sampled_points", "control_sampled"),
            ("control_share_greedy_points", "control_greedy"),
            ("grpo_minus_control_sampled_points", "grpo_minus_control_sampled"),
        ):
            headline[name] = round(100 * shares[head][key]["delta"], 1)
    return {
        "headline": headline,
        "stages": [_stage_row(s, trained) for s in measured],
        "shares": shares,
        "eval": {
            "families": plan.eval_families or "all",
            "items": plan.eval_n,
            "samples_per_item": plan.eval_k,
            "temperature": plan.config.temperature,
        },
        "warm_start": warm_info,
        "control": control_info,
        "metrics": metrics,
        "train_config": plan.config.model_dump(mode="json"),
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def format_table(report: dict[str, Any]) -> str:
    """The demo's closing table: per family, sampled pass@1 / pass@k / greedy at each stage, and
    GRPO's share (paired, over the warm start) next to the control's."""
    stages = report["stages"]
    k = report["eval"]["samples_per_item"]
    head = (
        ["family"]
        + [f"{s['name']} (p@1 / p@{k} / greedy)" for s in stages]
        + ["GRPO share", "control share", "GRPO over start"]
    )
    rows = [" | ".join(head), " | ".join("---" for _ in head)]
    for fam in stages[0]["families"]:
        cells = [fam]
        for s in stages:
            c = s["families"].get(fam)
            if c is None:
                cells.append("-")
                continue
            p1 = c["sampled_pass1"]["value"] if c["sampled_pass1"] else 0.0
            pk = c["sampled_pass_at_k"]
            if isinstance(pk, dict):  # "all": EvalSummary.pass_at_k, keyed by k (a string once in JSON)
                pk = pk.get(str(k), pk.get(k, 0.0))
            pk_value = float(pk or 0.0)
            cells.append(f"{_pct(p1)} / {_pct(pk_value)} / {_pct(c['greedy']['value'])}")
        sh = report["shares"].get(fam, {})
        for key in ("grpo_sampled", "control_sampled", "grpo_over_start_sampled"):
            d = sh.get(key)
            cells.append(
                f"{100 * d['delta']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]" if d else "-"
            )
        rows.append(" | ".join(cells))
    return "\n".join(rows)


def write_report(plan: DemoPlan, report: dict[str, Any]) -> None:
    out = plan.output_dir
    (out / "report.json").write_text(json.dumps(report, indent=2))
    try:
        from trajforge.rl.plot import plot_closed_loop

        plot_closed_loop(report, out / "closed_loop.png")
        plan.say(f"figure: {out / 'closed_loop.png'}")
    except ImportError:
        plan.say("matplotlib is not installed (pip install 'trajforge[rl]'): no figure")
    plan.say(f"report: {out / 'report.json'}")


TABLE_TITLE = (
    "held-out tiny_tasks by stage: sampled pass@1 at the training temperature / pass@k / greedy; "
    "shares are paired differences of sampled pass@1 over GRPO's start (the warm start when there is "
    "one; the last column: GRPO over the starting weights), in points (95% interval over items)"
)
