"""The closed loop (``trajforge rl demo``): what GRPO adds, against the controls a researcher asks for.

Phases, each a function below:

1. :func:`measure` the starting policy on ``eval_n`` held-out items of the target family
   (:data:`FAMILIES`) through ``trajforge serve``: **greedy** (one episode per item) and
   **sampled** at the training temperature (``eval_k`` episodes per item; pass@1 is their mean,
   pass@k whether any passed), with the same per-episode seeds at every stage, so two stages are
   compared item by item (:func:`paired`: the mean per-item difference, 95% interval), and a
   breakdown of the failures by kind (:mod:`trajforge.experiments.failures`). The held-out items are drawn
   from a seed derived from the run's seed (:func:`held_out_seed`): another seed, another
   held-out set; a validation split of its own seed (:func:`validation_seed`) is what the RFT
   control chooses its learning rate on.
2. :func:`warm_stage` (only with a ``warm_start``): supervised updates on the demonstration set
   (:mod:`trajforge.rl.warm_start`), measured the same way.
3. :func:`grpo_stage`: the builtin GRPO trainer from the start on training items of the target
   family (a family with a checker and no demonstrations), for ``steps`` steps. Its budget is
   counted -- sampled episodes, trained tokens, optimizer steps -- never timed: wall time moves
   with the machine's load.
4. The controls (``controls``), each from the same start with GRPO's compute, each labelled by
   what information it used (:data:`CONTROL_INFO`):

   - ``rft``: rejection-sampling fine-tuning (:mod:`trajforge.rl.rft`): the same checker,
     training items, temperature, sampled episodes and trained tokens; its learning rate chosen
     per round on the validation split. The control GRPO must beat.
   - ``set``: supervised epochs on the demonstration set a user has (:data:`WARM_START`: 100
     oracle demonstrations of the *other* families) for GRPO's trained tokens: a forgetting
     control (no demonstration of the target; its best possible result is the start's).
   - ``oracle``: supervised updates on fresh oracle demonstrations of the target itself for
     GRPO's trained tokens: information GRPO does not have (the answer), so it bounds what
     supervision does where demonstrations exist.
5. :func:`write_report`: ``report.json``, ``closed_loop.png`` and the table the command prints.

Everything is overridable with ``--config`` (TrainConfig fields, ``warm_start`` and ``rft``).
docs/rl.md has the measured results.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajforge.distributions import derive_seed
from trajforge.endpoint import embedded_weights, recipe_weights
from trajforge.engine.summary import EvalSummary, mean_interval
from trajforge.envs.catalog import load_env
from trajforge.envs.running.episode import RolloutBackends
from trajforge.envs.running.evaluate import run_eval
from trajforge.experiments.failures import breakdown
from trajforge.record import Record
from trajforge.record import read as read_records
from trajforge.rl.builtin import UNFILTERED, BuiltinTrainer, resolve_device
from trajforge.rl.config import TrainConfig, TrainConfigError, WarmStart
from trajforge.rl.policy_server import PolicyServer
from trajforge.rl.progress import StepProgress
from trajforge.rl.rft import RftBudget, RftSettings
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
    "precision": "fp32",
    # the family with room when sampled, measured from the recipe's weights at T=1: arithmetic
    # ~20-31% (find_value ~4%: a success in ~28% of groups of 8; count_lines/count_words are solved
    # and write_file's copy is never sampled: uniform groups, no signal). It has a checker and no
    # demonstrations in the warm start's set (WARM_START): the case RL is for.
    "env_overrides": {"families": ["arithmetic"]},
}

DEMO_STEPS = 32
"""GRPO's steps by default (32 x 64 = 2,048 sampled episodes)."""

FAMILIES: dict[str, dict[str, Any]] = {
    "arithmetic": {
        "start": "recipe",
        "overrides": {"env": "tiny_tasks", "env_overrides": {"families": ["arithmetic"]}},
        "controls": ["rft", "set", "oracle"],
        "what": "integer arithmetic solved through the terminal; the checker reads the final answer",
    },
    "write_file": {
        "start": "embedded",
        # the embedded policy solves write_file greedily and in ~94% of samples at T=1 (uniform
        # groups: nothing to learn); at T=1.5 it passes ~50% (40 probe items, 2026-12-05), so its
        # groups are mixed from the first step. Trained and evaluated at that temperature: the
        # skill is the copy staying right under a hot sampler. (The recipe's weights pass ~2% at
        # T=1 -- the first word is wrong -- and a longer text, 5-8 words, 0%: no signal either.)
        "overrides": {
            "env": "tiny_tasks",
            "env_overrides": {"families": ["write_file"]},
            "temperature": 1.5,
        },
        "controls": ["rft"],
        # RFT's learning rates here: supervised passes over T=1.5 samples at 1e-4 or more collapsed
        # the sampled policy (1.2% and 1.6% held-out on seeds 0 and 1, validation pass@1 falling
        # every round, 2026-12-06); at 1e-5 it ends within ~4 points of the start. Lower candidates
        # give the control a fair chance (each round chose 1e-5 on validation). Keys of --config's
        # ``rft`` win.
        "rft": {"lrs": [1.0e-5, 3.0e-5, 1.0e-4]},
        "what": "write a given text to a file, sampled at T=1.5: the checker reads the file the "
        "multi-turn rollout left in its sandbox (the reward comes from the sandbox, not from the answer)",
    },
}
"""The demo's target families (``--family``): where GRPO starts, on which env, the default controls
and the family's RFT settings (``rft``, under --config's)."""


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
SFT data a user has, which does not cover the target skill. The ``set`` control trains on this set."""

TRAINED = "trained families"
"""The shares' row over the held-out items of the families GRPO trains on (the headline's)."""

CONTROLS = ("rft", "set", "oracle")
STAGE_NAMES = {"rft": "RFT", "set": "set SFT", "oracle": "oracle SFT"}
CONTROL_INFO = {
    "rft": "the checker's pass/fail on its own samples (GRPO's items, temperature, sampled episodes "
    "and trained tokens); lr chosen on a validation split",
    "set": "100 oracle demonstrations of the other families, none of the target (GRPO's trained "
    "tokens): a forgetting control, its best possible result is the start's",
    "oracle": "fresh oracle demonstrations of the target itself (GRPO's trained tokens): the answer, "
    "which GRPO never sees",
}
GRPO_INFO = "the checker's reward on its own samples"

SUPERVISED_BATCH = 10
"""Demonstrations per update of the ``set``/``oracle`` controls."""
ORACLE_CHUNK = 100
"""Oracle demonstrations collected at a time by the ``oracle`` control (each trained on once)."""
CONTROL_FILE = "control.json"
"""What a supervised control leaves in its model directory (its report)."""


class DemoError(RuntimeError):
    """The demo could not run (the message says why)."""


def held_out_seed(seed: int) -> int:
    """The held-out items' seed for run seed ``seed``: each run seed measures on its own items."""
    return derive_seed(seed, "rl-demo/held-out") & 0x7FFFFFFF


def validation_seed(seed: int) -> int:
    """The validation items' seed (the RFT control's lr choice): neither held out nor trained on."""
    return derive_seed(seed, "rl-demo/validation") & 0x7FFFFFFF


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
    failures_sampled: dict[str, int] = field(default_factory=dict)
    failures_greedy: dict[str, int] = field(default_factory=dict)

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


def _episodes(run_dir: Path) -> list[Record]:
    """The evaluation's episodes as records (lines of any version read alike: ``record.read``)."""
    return list(read_records(run_dir / "episodes.jsonl"))


def _per_item(rows: list[Record]) -> tuple[dict[str, float], dict[str, str]]:
    passed: dict[str, list[float]] = defaultdict(list)
    family: dict[str, str] = {}
    for ep in rows:
        item = ep.item_id or ep.key
        passed[item].append(1.0 if ep.score >= PASS_THRESHOLD else 0.0)
        family[item] = ep.category or "-"
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
    *,
    env: str = "tiny_tasks",
    eval_seed: int | None = None,
    seed: int = 0,
) -> StageEval:
    """Greedy (1 per item) and sampled (``k`` per item at ``temperature``, unfiltered) held-out
    evaluation of ``model_dir`` through one ``trajforge serve``; both at once. ``sampled_limits``
    (``max_tokens``, ``max_agent_turns``): the sampled episodes' limits -- the training rollouts',
    so sampled pass@1 is the success rate GRPO optimises, measured on held-out items. ``families``:
    the held-out items of these families only (default: every family). ``eval_seed``: which
    held-out items (default: the env's own)."""
    began = time.monotonic()
    await asyncio.to_thread(_claim_eval_dir, out, model_dir)
    common: dict[str, Any] = {"max_tokens": EVAL_MAX_TOKENS, "max_concurrent_rollouts": 32, "seed": seed}
    if families:
        common["families"] = families
    if eval_seed is not None:
        common["eval_seed"] = eval_seed
    greedy_env = load_env(env, {**common, "agent_temperature": 0.0})
    sampled_env = load_env(
        env,
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
    sampled_rows, greedy_rows = _episodes(out / "sampled"), _episodes(out / "greedy")
    by_item, family = _per_item(sampled_rows)
    greedy_by_item, _ = _per_item(greedy_rows)
    return StageEval(
        name,
        greedy.summary,
        sampled.summary,
        by_item,
        greedy_by_item,
        family,
        time.monotonic() - began,
        breakdown(sampled_rows),
        breakdown(greedy_rows),
    )


def _model_fingerprint(model_dir: Path) -> dict[str, Any]:
    """Which weights a model directory holds: its path and its files' sizes and mtimes (a model
    trained again into the same directory is a new fingerprint)."""
    files = sorted(p for p in model_dir.iterdir() if p.is_file())
    return {
        "model_dir": str(model_dir.resolve()),
        "files": {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in files},
    }


def _claim_eval_dir(out: Path, model_dir: Path) -> None:
    """An evaluation directory resumes episode by episode, so it must hold this model's episodes:
    ``model.json`` records whose they are, and a directory of another model (a stage trained again
    on a rerun) is started over rather than mixed. A directory without the record (written before
    it existed) is taken as this model's."""
    record = out / "model.json"
    now = _model_fingerprint(model_dir)
    if record.exists():
        try:
            old = json.loads(record.read_text())
        except ValueError:
            old = None
        if old != now:
            for sub in ("greedy", "sampled"):
                shutil.rmtree(out / sub, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(now, indent=2))


def paired(
    a: StageEval,
    b: StageEval,
    *,
    sampled: bool = True,
    families: Collection[str] | None = None,
    metric: str = "pass1",
) -> dict[str, float]:
    """``b - a`` on the same items (same seeds): the mean per-item difference of sampled pass@1
    (``metric="pass_at_k"``: whether any sampled episode passed; ``sampled=False``: greedy
    success) with a 95% normal interval over items (of ``families``, or all)."""
    xa = a.sampled_by_item if sampled else a.greedy_by_item
    xb = b.sampled_by_item if sampled else b.greedy_by_item
    items = [i for i in xa if i in xb and (families is None or a.family_of.get(i) in families)]
    if metric == "pass_at_k":
        diffs = [float(xb[i] > 0) - float(xa[i] > 0) for i in items]
    else:
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
    """GRPO's config (``model``: where the loop starts; ``warm_start``: the supervised stage;
    ``steps``: GRPO's budget)."""
    eval_n: int
    eval_k: int
    controls: list[str]
    echo: Callable[[str], None]
    eval_families: list[str] | None = None
    """Held-out items of these families only (None: every family)."""
    rft: RftSettings = field(default_factory=RftSettings)
    family: str = "arithmetic"
    began: float = field(default_factory=time.monotonic)

    @property
    def tokenizer(self) -> Path:
        return self.config.model

    @property
    def held_out_seed(self) -> int:
        return held_out_seed(self.config.seed)

    @property
    def validation_seed(self) -> int:
        return validation_seed(self.config.seed)

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
            env=self.config.env,
            eval_seed=self.held_out_seed,
            seed=self.config.seed,
        )
        self.say(
            f"{name}: sampled pass@1 {_pct(stage.sampled.pass_at_1.value)}, greedy "
            f"{_pct(stage.greedy.pass_at_1.value)} ({stage.seconds:.0f}s)"
        )
        return stage


def start_weights(name: str) -> Path:
    """``recipe``, ``embedded`` or a model directory."""
    named = {"recipe": recipe_weights, "embedded": embedded_weights}
    return named[name]() if name in named else Path(name)


def make_plan(
    output_dir: Path,
    *,
    eval_n: int,
    eval_k: int,
    steps: int,
    overrides: dict[str, Any],
    controls: list[str] | None = None,
    echo: Callable[[str], None],
    eval_all_families: bool = False,
    family: str = "arithmetic",
) -> DemoPlan:
    if family not in FAMILIES:
        raise DemoError(f"family {family!r}: use one of {', '.join(FAMILIES)}")
    spec = FAMILIES[family]
    chosen = list(spec["controls"]) if controls is None else [c for c in controls if c != "none"]
    unknown = [c for c in chosen if c not in CONTROLS]
    if unknown:
        raise DemoError(f"control {unknown[0]!r}: use any of {', '.join(CONTROLS)}, or none")
    if "set" in chosen and family != "arithmetic":
        raise DemoError(
            "the set control trains on tiny_tasks' other families: it runs with --family arithmetic only"
        )
    overrides = dict(overrides)
    given = overrides.pop("rft", None) or {}
    if not isinstance(given, dict):
        raise TrainConfigError(f"invalid rft settings: a mapping of RFT's fields, not {given!r}")
    rft_data = {**spec.get("rft", {}), **given}
    try:
        rft_settings = RftSettings.model_validate(rft_data)
    except ValueError as exc:
        raise TrainConfigError(f"invalid rft settings: {exc}") from None
    data = {
        **DEMO_DEFAULTS,
        **spec["overrides"],
        **overrides,
        "model": str(overrides.get("model") or start_weights(spec["start"])),
        "steps": steps,
        "output_dir": str(output_dir / "grpo"),
    }
    try:
        config = TrainConfig.model_validate(data)
    except ValueError as exc:
        raise TrainConfigError(f"invalid demo training config: {exc}") from None
    trained = config.env_overrides.get("families")
    families = None if eval_all_families or not isinstance(trained, list) else sorted(set(trained))
    return DemoPlan(
        output_dir,
        config,
        eval_n,
        eval_k,
        list(dict.fromkeys(chosen)),
        echo,
        families,
        rft_settings,
        family,
    )


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


@dataclass
class GrpoRun:
    checkpoint: Path
    metrics: list[dict[str, Any]]
    """every step's metric line, from the run directory (a resumed run's earlier steps included)"""
    seconds: float
    """wall time of the GRPO stage (a resumed run's: its steps' ``step_s`` summed)"""
    resumed_from: int | None = None

    def compute(self) -> dict[str, Any]:
        """What GRPO spent, counted: the budget the controls get."""
        return {
            "steps": len(self.metrics),
            "sampled_episodes": sum(int(m.get("episodes", 0)) for m in self.metrics),
            "trained_tokens": int(sum(float(m.get("trained_tokens", 0)) for m in self.metrics)),
            "updates": sum(int(m.get("updates", 0)) for m in self.metrics),
            "seconds": round(self.seconds, 1),
        }


async def grpo_stage(plan: DemoPlan, start: Path) -> GrpoRun:
    """GRPO from ``start`` for the config's steps; the last checkpoint and the metric lines."""
    from trajforge.rl.checkpoint import RunDir

    began = time.monotonic()
    cfg = plan.config.model_copy(update={"model": start, "warm_start": None})
    run_dir = RunDir(Path(cfg.output_dir))
    state = await asyncio.to_thread(run_dir.open, cfg)  # checks a run already there is this one
    if state is not None and state.final and state.step == cfg.steps:
        plan.say(f"GRPO: the finished run in {run_dir.root} ({state.step} steps, an earlier run)")
        metrics = await asyncio.to_thread(run_dir.read_metrics)
        return GrpoRun(run_dir.root / state.checkpoint, metrics, _step_seconds(metrics), state.step)
    progress = StepProgress(cfg.steps, lambda line: plan.say(f"grpo {line}"))
    plan.say(f"GRPO: {cfg.steps} steps of {cfg.episodes_per_step} episodes")
    trainer = BuiltinTrainer(cfg, on_step=progress)
    result = await trainer.run()
    # every step's line from the run directory, not only this process's: a demo rerun on the same
    # --output-dir resumes GRPO, and RFT's budget and the curve must count the steps before it
    metrics = await asyncio.to_thread(run_dir.read_metrics)
    if result.resumed_from is not None:
        plan.say(f"GRPO resumed from step {result.resumed_from}; {result.steps_done} steps run now")
    seconds = time.monotonic() - began if result.resumed_from is None else _step_seconds(metrics)
    return GrpoRun(result.final_checkpoint, metrics, seconds, result.resumed_from)


def _step_seconds(metrics: list[dict[str, Any]]) -> float:
    """A resumed run's GRPO time: its steps' ``step_s`` summed (the wall clock spans the gap)."""
    return sum(float(m.get("step_s") or 0.0) for m in metrics)


async def rft_stage(plan: DemoPlan, start: Path, budget: RftBudget) -> tuple[Path, dict[str, Any]]:
    """The RFT control from ``start`` within GRPO's counted budget (:mod:`trajforge.rl.rft`)."""
    from trajforge.rl.rft import rft

    cfg = plan.config.model_copy(update={"model": plan.config.model, "warm_start": None})
    plan.say(
        f"RFT: {plan.rft.rounds} rounds, {budget.episodes} sampled episodes and {budget.trained_tokens} "
        f"trained tokens (GRPO's); lr from {plan.rft.lrs} on {plan.rft.validation_items} validation items"
    )
    return await rft(
        cfg,
        start,
        plan.output_dir / "rft",
        budget,
        plan.rft,
        validation_seed=plan.validation_seed,
        say=plan.say,
    )


async def control_stage(plan: DemoPlan, start: Path, kind: str, tokens: int) -> tuple[Path, dict[str, Any]]:
    """Supervised updates from ``start`` until ``tokens`` trained tokens (GRPO's), batch
    :data:`SUPERVISED_BATCH`, the demonstration set's lr, one AdamW. On what (``kind``): ``set`` --
    the demo's demonstration set (:data:`WARM_START`): the very set the warm start trained on when
    it ran, else that set collected now (its ``demos`` oracle episodes from the warm start's item
    stream), in shuffled epochs; ``oracle`` -- fresh oracle demonstrations of GRPO's own families,
    :data:`ORACLE_CHUNK` at a time, each trained on once."""
    from trajforge.llm.chat_template import ChatTemplate
    from trajforge.rl.checkpoint import save_model_dir
    from trajforge.rl.fit import load_policy, resolve_precision, trainable_parameters
    from trajforge.rl.rft import supervised_until
    from trajforge.rl.warm_start import collect_demonstrations, load_demonstrations

    began = time.monotonic()
    cfg = plan.config
    device = resolve_device(cfg.device)
    precision = resolve_precision(cfg.precision, device)
    base = cfg.warm_start or WarmStart.model_validate(WARM_START)
    fixed_set: list[Any] | None = None
    if kind == "set":
        mix = {**base.env_overrides, **base.schedule()[-1].env_overrides}
        kept = load_demonstrations(start)
        fixed_set = [s for phase in kept for s in phase] if kept else None
    else:
        mix = dict(cfg.env_overrides)
    collect_set = kind == "set" and fixed_set is None
    ws = WarmStart(updates=1, batch=SUPERVISED_BATCH, lr=base.lr, decay=0.0, env_overrides=mix)
    ccfg = cfg.model_copy(update={"warm_start": ws})
    families = ", ".join(sorted(set(mix.get("families") or ["every family"])))
    if fixed_set:
        data = f"the warm start's fixed set of {len(fixed_set)} demonstrations ({families}), in epochs"
    elif collect_set:
        data = f"a fixed set of {base.demos or 100} oracle demonstrations of {families}, in epochs"
    else:
        data = f"fresh oracle demonstrations of {families}"
    plan.say(
        f"{STAGE_NAMES[kind]}: supervised updates from GRPO's start for {tokens} trained tokens on {data}"
    )

    def load() -> tuple[Any, Any, Any]:
        import torch
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(cfg.model))
        model = load_policy(cfg, start, device)
        optimizer = torch.optim.AdamW(trainable_parameters(model), lr=ws.lr, weight_decay=0.0)
        return model, tokenizer, optimizer

    model, tokenizer, optimizer = await asyncio.to_thread(load)
    template = await asyncio.to_thread(ChatTemplate.from_path, str(cfg.model))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    factory = create_sandbox_factory(SandboxConfig(kind="bwrap", command_timeout_s=30))
    losses: list[float] = []
    demos = updates = trained = chunk = oracle_episodes = 0
    try:
        if collect_set:
            got = await collect_demonstrations(
                ccfg, base.demos or 100, factory, default_registry(), template, stream="warm-start"
            )
            oracle_episodes += base.demos or 100
            if not got.samples:
                raise DemoError(f"{kind}: none of {base.demos} oracle episodes gave a demonstration")
            fixed_set = got.samples
        while trained < tokens:
            chunk += 1
            if fixed_set:
                samples, want = fixed_set, tokens - trained
            else:
                got = await collect_demonstrations(
                    ccfg, ORACLE_CHUNK, factory, default_registry(), template, stream=f"control/{chunk}"
                )
                oracle_episodes += ORACLE_CHUNK
                samples = got.samples
                demos += len(samples)
                if not samples:
                    raise DemoError(f"{kind}: none of {ORACLE_CHUNK} oracle episodes gave a demonstration")
                # each fresh demonstration once: this chunk's tokens, or what is left of the budget
                want = min(tokens - trained, sum(s.num_sampled for s in samples))
            n, done, chunk_losses = await asyncio.to_thread(
                supervised_until,
                model,
                optimizer,
                samples,
                tokens=want,
                batch=ws.batch,
                lr=ws.lr,
                micro_batch=cfg.micro_batch,
                pad_id=pad_id,
                device=device,
                precision=precision,
                seed=derive_seed(cfg.seed, f"{kind}#{chunk}"),
            )
            updates += n
            trained += done
            losses += chunk_losses
            plan.say(f"{STAGE_NAMES[kind]}: {updates} updates, {trained}/{tokens} tokens")
            if n == 0:
                break
    finally:
        await close_factory(factory)
    info = {
        "data": kind,
        "information": CONTROL_INFO[kind],
        "described": data,
        "updates": updates,
        "trained_tokens": trained,
        "target_tokens": tokens,
        "oracle_episodes": oracle_episodes,
        "sampled_episodes": 0,
        "demonstrations": len(fixed_set) if fixed_set else demos,
        "fixed_set": bool(fixed_set),
        "epochs_on_the_set": round(trained / max(1, sum(s.num_sampled for s in fixed_set)), 2)
        if fixed_set
        else None,
        "batch": ws.batch,
        "lr": ws.lr,
        "families": ws.env_overrides.get("families"),
        "loss_first": round(losses[0], 4) if losses else None,
        "loss_last": round(losses[-1], 4) if losses else None,
        "seconds": round(time.monotonic() - began, 1),
    }
    path = await asyncio.to_thread(
        save_model_dir, plan.output_dir / kind, model, tokenizer, None, CONTROL_FILE, info
    )
    return path, info


# ----------------------------------------------------------------------------- the loop


def run_demo(
    output_dir: Path,
    *,
    eval_n: int = 200,
    eval_k: int = 4,
    steps: int = DEMO_STEPS,
    overrides: dict[str, Any] | None = None,
    controls: list[str] | None = None,
    eval_all_families: bool = False,
    family: str = "arithmetic",
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    output_dir.mkdir(parents=True, exist_ok=True)
    plan = make_plan(
        output_dir,
        eval_n=eval_n,
        eval_k=eval_k,
        steps=steps,
        overrides=overrides or {},
        controls=controls,
        echo=echo,
        eval_all_families=eval_all_families,
        family=family,
    )
    return asyncio.run(closed_loop(plan))


async def closed_loop(plan: DemoPlan) -> dict[str, Any]:
    before = await plan.measure("before", plan.config.model)
    warm_dir, warm_info = await warm_stage(plan)
    warm = await plan.measure("warm start", warm_dir) if warm_info is not None else before
    grpo = await grpo_stage(plan, warm_dir)
    after = await plan.measure("GRPO", grpo.checkpoint)
    spent = grpo.compute()
    controls: list[tuple[str, StageEval, dict[str, Any]]] = []
    budget = RftBudget(spent["sampled_episodes"], spent["trained_tokens"])
    for kind in plan.controls:
        kept = finished_control(plan, kind, budget)
        if kept is not None:
            path, info = kept
            plan.say(f"{STAGE_NAMES[kind]}: the finished stage in {path} (an earlier run of this directory)")
        elif kind == "rft":
            path, info = await rft_stage(plan, warm_dir, budget)
        else:
            path, info = await control_stage(plan, warm_dir, kind, spent["trained_tokens"])
        controls.append((kind, await plan.measure(STAGE_NAMES[kind], path), info))
    report = build_report(plan, before, warm, after, controls, warm_info, grpo)
    write_report(plan, report)
    return report


def finished_control(plan: DemoPlan, kind: str, budget: RftBudget) -> tuple[Path, dict[str, Any]] | None:
    """The control ``kind`` an earlier run of this output directory finished with this budget, or
    None. A demo rerun on the same directory resumes: the evaluations resume episode by episode,
    GRPO from its last checkpoint, and a control whose model directory is complete (written whole,
    then renamed into place) for the same counted budget is measured rather than trained again."""
    from trajforge.rl.rft import INFO_FILE as RFT_INFO

    if kind == "rft":
        path, name = plan.output_dir / "rft" / "final", RFT_INFO
    else:
        path, name = plan.output_dir / kind, CONTROL_FILE
    try:
        info: dict[str, Any] = json.loads((path / name).read_text())
    except (OSError, ValueError):
        return None
    if kind == "rft":
        same = (
            info.get("budget") == {"episodes": budget.episodes, "trained_tokens": budget.trained_tokens}
            and info.get("settings") == plan.rft.model_dump(mode="json")
            and info.get("validation_seed") == plan.validation_seed
        )
    else:
        target = info.get("target_tokens")
        same = info.get("data") == kind and (
            target == budget.trained_tokens
            if target is not None
            else int(info.get("trained_tokens") or 0) >= budget.trained_tokens
        )
    return (path, info) if same else None


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
    return {
        "name": stage.name,
        "seconds": round(stage.seconds, 1),
        "families": table,
        "failures": {"sampled": stage.failures_sampled, "greedy": stage.failures_greedy},
    }


def _points(d: dict[str, float]) -> dict[str, float]:
    return {
        "points": round(100 * d["delta"], 1),
        "low": round(100 * d["low"], 1),
        "high": round(100 * d["high"], 1),
    }


def build_report(
    plan: DemoPlan,
    before: StageEval,
    warm: StageEval,
    after: StageEval,
    controls: list[tuple[str, StageEval, dict[str, Any]]],
    warm_info: dict[str, Any] | None,
    grpo: GrpoRun,
) -> dict[str, Any]:
    measured = [before, *([warm] if warm is not before else []), after, *(s for _, s, _ in controls)]
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
        for kind, stage, _ in controls:
            shares[key][f"{kind}_sampled"] = paired(warm, stage, families=fams)
            shares[key][f"{kind}_greedy"] = paired(warm, stage, sampled=False, families=fams)
            shares[key][f"grpo_minus_{kind}_sampled"] = paired(stage, after, families=fams)
            shares[key][f"grpo_minus_{kind}_greedy"] = paired(stage, after, sampled=False, families=fams)
            shares[key][f"grpo_minus_{kind}_pass_at_k"] = paired(
                stage, after, families=fams, metric="pass_at_k"
            )
    head = TRAINED if trained else "all"
    spent = grpo.compute()
    compute: dict[str, Any] = {
        "GRPO": {**spent, "oracle_episodes": 0, "information": GRPO_INFO},
    }
    for kind, _, info in controls:
        compute[STAGE_NAMES[kind]] = {
            "steps": info.get("updates"),
            "sampled_episodes": info.get("sampled_episodes", 0),
            "trained_tokens": info.get("trained_tokens"),
            "updates": info.get("updates"),
            "oracle_episodes": info.get("oracle_episodes", 0),
            "validation_episodes": info.get("validation_episodes", 0),
            "seconds": info.get("seconds"),
            "information": CONTROL_INFO[kind],
        }
    headline: dict[str, Any] = {
        "family": plan.family,
        "seed": plan.config.seed,
        "held_out_seed": plan.held_out_seed,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "seconds_total": round(plan.elapsed(), 1),
        "grpo_steps": len(grpo.metrics),
        "grpo_resumed_from": grpo.resumed_from,
        "trained_families": trained,
        "share_over": head,
        "sampled_pass1": {s.name: s.sampled.pass_at_1.value for s in measured},
        "greedy": {s.name: s.greedy.pass_at_1.value for s in measured},
        "grpo_share_sampled_points": round(100 * shares[head]["grpo_sampled"]["delta"], 1),
        "grpo_share_greedy_points": round(100 * shares[head]["grpo_greedy"]["delta"], 1),
        "grpo_over_start_sampled_points": round(100 * shares[head]["grpo_over_start_sampled"]["delta"], 1),
    }
    for kind, _, _ in controls:
        headline[f"{kind}_share_sampled_points"] = round(100 * shares[head][f"{kind}_sampled"]["delta"], 1)
        headline[f"grpo_minus_{kind}_sampled"] = _points(shares[head][f"grpo_minus_{kind}_sampled"])
        headline[f"grpo_minus_{kind}_greedy"] = _points(shares[head][f"grpo_minus_{kind}_greedy"])
        headline[f"grpo_minus_{kind}_pass_at_k"] = _points(shares[head][f"grpo_minus_{kind}_pass_at_k"])
    return {
        "headline": headline,
        "compute": compute,
        "stages": [_stage_row(s, trained) for s in measured],
        "shares": shares,
        "eval": {
            "env": plan.config.env,
            "families": plan.eval_families or "all",
            "items": plan.eval_n,
            "samples_per_item": plan.eval_k,
            "temperature": plan.config.temperature,
            "held_out_seed": plan.held_out_seed,
            "validation_seed": plan.validation_seed,
        },
        "warm_start": warm_info,
        "controls": {kind: info for kind, _, info in controls},
        "metrics": grpo.metrics,
        "train_config": plan.config.model_dump(mode="json"),
    }


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _interval(d: dict[str, float] | None) -> str:
    return f"{100 * d['delta']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]" if d else "-"


def format_table(report: dict[str, Any]) -> str:
    """The demo's closing tables: per stage, the held-out results of the target (sampled pass@1 /
    pass@k / greedy), its share over the start and GRPO's margin over it (paired), then the
    compute each stage spent and the information it used."""
    stages = report["stages"]
    k = report["eval"]["samples_per_item"]
    head_key = report["headline"]["share_over"]
    shares = report["shares"].get(head_key, {})
    kinds = {v: key for key, v in STAGE_NAMES.items()}
    head = [
        "stage",
        f"sampled p@1 / p@{k} / greedy",
        "share over start (sampled)",
        "GRPO minus it (sampled)",
        "GRPO minus it (greedy)",
    ]
    rows = [" | ".join(head), " | ".join("---" for _ in head)]
    for s in stages:
        c = s["families"].get(head_key) or s["families"]["all"]
        p1 = c["sampled_pass1"]["value"] if c["sampled_pass1"] else 0.0
        pk = c["sampled_pass_at_k"]
        if isinstance(pk, dict):  # "all": EvalSummary.pass_at_k, keyed by k (a string once in JSON)
            pk = pk.get(str(k), pk.get(k, 0.0))
        cells = [s["name"], f"{_pct(p1)} / {_pct(float(pk or 0.0))} / {_pct(c['greedy']['value'])}"]
        kind = kinds.get(s["name"])
        if s["name"] == "GRPO":
            cells += [_interval(shares.get("grpo_sampled")), "", ""]
        elif kind is not None:
            cells += [
                _interval(shares.get(f"{kind}_sampled")),
                _interval(shares.get(f"grpo_minus_{kind}_sampled")),
                _interval(shares.get(f"grpo_minus_{kind}_greedy")),
            ]
        else:
            cells += ["", "", ""]
        rows.append(" | ".join(cells))
    rows += [
        "",
        "stage | steps | sampled episodes | trained tokens | oracle episodes | seconds | information used",
        "--- | --- | --- | --- | --- | --- | ---",
    ]
    for name, c in report.get("compute", {}).items():
        rows.append(
            f"{name} | {c.get('steps')} | {c.get('sampled_episodes')} | {c.get('trained_tokens')} | "
            f"{c.get('oracle_episodes', 0)} | {c.get('seconds')} | {c.get('information')}"
        )
    return "\n".join(rows)


def write_report(plan: DemoPlan, report: dict[str, Any]) -> None:
    out = plan.output_dir
    (out / "report.json").write_text(json.dumps(report, indent=2))
    try:
        from trajforge.experiments.plot import plot_closed_loop

        plot_closed_loop(report, out / "closed_loop.png")
        plan.say(f"figure: {out / 'closed_loop.png'}")
    except ImportError:
        plan.say("matplotlib is not installed (pip install 'trajforge[rl]'): no figure")
    plan.say(f"report: {out / 'report.json'}")


TABLE_TITLE = (
    "held-out items of the target family by stage: sampled pass@1 at the training temperature / pass@k / "
    "greedy; shares are paired per-item differences of sampled pass@1, in points (95% interval over "
    "items); every control had GRPO's start and GRPO's counted compute"
)
