"""``trajforge rl train`` and ``trajforge rl demo``.

``train`` turns its flags and ``--config FILE`` into one :class:`~trajforge.rl.config.TrainConfig`
(flags win) and runs the chosen trainer; the output directory is resumable (run the same
command again after a crash). ``demo`` is the closed loop of issue 12: evaluate the embedded
policy on held-out ``tiny_tasks`` items through ``trajforge serve``, train it with GRPO, serve
the new checkpoint, evaluate again, write the figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import typer

from trajforge.cli import complete
from trajforge.cli.errors import fail
from trajforge.cli.vocab import renamed

# Old spellings, kept for one release (docs/cli.md).
TRAIN_RENAMES = {"--model": "--model-path"}
DEMO_RENAMES = {"--model": "--model-path", "--eval-n": "--max-samples"}
DEFAULT_RUN_NAME = "rl"  # with the default --output-dir: runs/rl, TrainConfig's own default


def register(rl_app: typer.Typer) -> None:
    rl_app.command("train", cls=renamed(TRAIN_RENAMES))(train_cmd)
    rl_app.command("demo", cls=renamed(DEMO_RENAMES))(demo_cmd)


def run_dir(output_dir: Path | None, run_name: str | None, default_name: str) -> Path | None:
    """OUTPUT_DIR/RUN_NAME, as in every command that makes a run directory (None: neither given).

    Until the next release, ``--output-dir DIR`` alone that already holds a run (the old meaning:
    the run directory itself) resumes it, with a note."""
    if output_dir is None and run_name is None:
        return None
    if run_name is None and output_dir is not None and (output_dir / "state.json").is_file():
        typer.echo(
            f"note: {output_dir} is a run directory; --output-dir is now its parent: "
            f"use --output-dir {output_dir.parent} --run-name {output_dir.name} (docs/cli.md)",
            err=True,
        )
        return output_dir
    if run_name is not None and (not run_name or "/" in run_name or run_name in {".", ".."}):
        raise fail(f"--run-name {run_name!r} must be a plain directory name")
    return (output_dir or Path("runs")) / (run_name or default_name)


def train_cmd(
    env: str = typer.Argument(
        ..., help="Env name or path/to/file.py:ClassName.", autocompletion=complete.env_names
    ),
    model: Path | None = typer.Option(
        None, "--model-path", help="Local model directory to start from (default: the embedded policy)."
    ),
    trainer: str | None = typer.Option(None, "--trainer", help="builtin (default) or trl."),
    steps: int | None = typer.Option(None, "--steps", min=1, help="Optimizer steps."),
    group_size: int | None = typer.Option(None, "--group-size", min=2, help="Rollouts per item."),
    groups_per_step: int | None = typer.Option(None, "--groups", min=1, help="Items per step."),
    lr: float | None = typer.Option(None, "--lr", help="Learning rate."),
    kl_coef: float | None = typer.Option(None, "--kl", help="KL-to-reference weight (0 = none)."),
    max_staleness: int | None = typer.Option(
        None, "--max-staleness", min=0, help="Steps rollouts may lag the trained weights."
    ),
    temperature: float | None = typer.Option(None, "--temperature", help="Rollout temperature."),
    guide: str | None = typer.Option(
        None,
        "--guide",
        help="none (default) or oracle: groups with no success get the env's reference solution.",
    ),
    warm_start_updates: int | None = typer.Option(
        None,
        "--warm-start-updates",
        min=0,
        help="Supervised updates on the env's oracle trajectories before GRPO (0 = none; other "
        "warm_start settings from --config).",
    ),
    device: str | None = typer.Option(None, "--device", help="auto (default), cpu, cuda, cuda:N."),
    config: Path | None = typer.Option(None, "--config", help="YAML/JSON file of TrainConfig fields."),
    output_dir: Path | None = typer.Option(
        None, "--output-dir", help="Parent of the run directory (default: runs)."
    ),
    run_name: str | None = typer.Option(
        None,
        "--run-name",
        help="Run directory name (default: rl); OUTPUT_DIR/RUN_NAME is resumable: run the same command again.",
    ),
    seed: int | None = typer.Option(None, "--seed", help="Seeds items, rollouts and torch."),
    records: Path | None = typer.Option(
        None,
        "--records",
        help="Train on this run directory's records (batch --env --tokenizer) instead of rollouts.",
    ),
    progress: str = typer.Option(
        "auto",
        "--progress",
        help="auto|rich|plain|none (auto: rich on a terminal, plain lines otherwise)",
        autocompletion=complete.progress_modes,
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON.", metavar=""),
) -> None:
    """Train a policy with GRPO on ENV's rollouts (checkpoints + metrics.jsonl; resumable)."""
    from trajforge.endpoint import embedded_weights
    from trajforge.extras import missing_ml
    from trajforge.rl.config import TrainConfigError, build_config, load_config_file

    problem = missing_ml("trajforge rl train")
    if problem:
        raise fail(problem)
    if progress not in ("auto", "rich", "plain", "none"):
        raise fail(f"--progress takes auto, rich, plain or none; got {progress!r}")
    if records is not None:
        from trajforge.record.runs import kind_problem

        why = kind_problem(records, ("batch", "env eval"), "--records trains on the records of")
        if why is not None:
            raise fail(why)
    try:
        file_data = load_config_file(config) if config else {}
        if model is None and "model" not in file_data:
            model = embedded_weights()
        if warm_start_updates is not None:
            file_data["warm_start"] = (
                {**(file_data.get("warm_start") or {}), "updates": warm_start_updates}
                if warm_start_updates
                else None
            )
        cfg = build_config(
            file_data,
            {
                "env": env,
                "model": model,
                "trainer": trainer,
                "steps": steps,
                "group_size": group_size,
                "groups_per_step": groups_per_step,
                "lr": lr,
                "kl_coef": kl_coef,
                "max_staleness": max_staleness,
                "temperature": temperature,
                "guide": guide,
                "device": device,
                "output_dir": run_dir(output_dir, run_name, DEFAULT_RUN_NAME),
                "seed": seed,
                "records": records,
            },
        )
        where = cfg.output_dir
        if where.exists():  # a resume: never a trainer's files in another kind of run
            from trajforge.record.runs import kind_problem, run_kind

            if run_kind(where) not in (None, "rl train"):
                raise fail(
                    kind_problem(where, ("rl train",), "choose another --run-name / --output-dir") or ""
                )
        result = _train(cfg, progress)
    except (TrainConfigError, FileNotFoundError) as exc:
        raise fail(str(exc)) from None
    summary = {
        "trainer": cfg.trainer,
        "output_dir": str(cfg.output_dir),
        "steps_done": result.steps_done,
        "resumed_from": result.resumed_from,
        "final_checkpoint": str(result.final_checkpoint),
        "last": result.metrics[-1] if result.metrics else None,
    }
    if json_out:
        typer.echo(json.dumps(summary, indent=2, default=str))
        return
    typer.echo(f"final checkpoint: {result.final_checkpoint}")
    typer.echo(f"metrics: {cfg.output_dir / 'metrics.jsonl'}")


def _train(cfg: object, mode: str) -> Any:
    """Run the chosen trainer with a live display on stderr: the phase and its elapsed time from
    the start (loading the policy, starting its server and the first step's rollouts take a
    minute on a CPU, and once printed nothing), then one line per step (rl/progress.py:
    reward, pass rate, KL, clipping, s/step, ETA) with the bar's done/total, rate and ETA."""
    from trajforge.cli.live import LiveProgress, Mode
    from trajforge.rl.config import TrainConfig
    from trajforge.rl.progress import StepProgress, quiet_third_party

    assert isinstance(cfg, TrainConfig)
    live = LiveProgress(
        "rl train",
        unit="steps",
        mode=cast("Mode", mode),  # checked against the four modes by the command
        every_s=float("inf"),
        quiet_s=0,
        heartbeat_s=5.0,
    )
    lines = StepProgress(cfg.steps, live.note)
    start = "resuming" if (cfg.output_dir / "state.json").exists() else "starting"
    live.phase(f"{start}: loading the policy, its server, then step 1's rollouts")

    def progress(line: dict[str, Any]) -> None:
        lines(line)
        live.phase("training")
        live.advance(int(line.get("step", 0) or 0), cfg.steps)

    with live, quiet_third_party():
        if cfg.records is not None:
            from trajforge.rl.offline import train_on_records

            return train_on_records(cfg, on_step=progress)
        if cfg.trainer == "trl":
            from trajforge.rl.trl_trainer import train_trl

            return train_trl(cfg, on_step=progress)
        from trajforge.rl.builtin import train_builtin

        return train_builtin(cfg, on_step=progress)


def demo_cmd(
    output_dir: Path = typer.Option(Path("runs"), "--output-dir", help="Parent of the run directory."),
    run_name: str = typer.Option("rl-demo", "--run-name", help="Run directory name."),
    eval_n: int = typer.Option(200, "--max-samples", min=1, help="Held-out items evaluated at each stage."),
    eval_k: int = typer.Option(
        4, "--eval-k", min=1, help="Sampled episodes per held-out item (pass@1 at T, and pass@k)."
    ),
    steps: int = typer.Option(
        32,
        "--steps",
        min=1,
        help="GRPO's steps: its budget, which every control gets too (counted, not timed).",
    ),
    config: Path | None = typer.Option(
        None, "--config", help="YAML/JSON TrainConfig fields (and rft) to override."
    ),
    family: str = typer.Option(
        "arithmetic",
        "--family",
        help="Target family: arithmetic or write_file (tiny_tasks; experiments.closed_loop.FAMILIES).",
    ),
    model: str | None = typer.Option(
        None,
        "--model-path",
        help="Weights to start from: recipe, embedded or a model directory (default: the family's: "
        "recipe for arithmetic, embedded for write_file).",
    ),
    guide: str | None = typer.Option(
        None, "--guide", help="none (the demo's default) or oracle (TrainConfig.guide); overrides --config."
    ),
    warm: bool | None = typer.Option(
        None,
        "--warm-start/--no-warm-start",
        help="Supervised updates on the demonstration set (experiments.closed_loop.WARM_START, or a warm_start in "
        "--config) before GRPO; default: only when --config has a warm_start (the demo's GRPO starts "
        "from the starting weights: a warm start on the other families drives its target to 0%).",
    ),
    control: list[str] | None = typer.Option(
        None,
        "--control",
        help="A control, repeatable: rft (rejection-sampling fine-tuning: the checker on its own "
        "samples), set (SFT on the other families' demonstrations: a forgetting control), oracle "
        "(SFT on oracle demonstrations of the target), none; default: the family's (arithmetic: all three).",
    ),
    seed: int | None = typer.Option(
        None,
        "--seed",
        help="The run's seed (TrainConfig.seed): training items, samples, the held-out and validation items.",
    ),
    eval_all: bool = typer.Option(
        False,
        "--eval-all-families",
        help="Evaluate held-out items of every family (default: the families GRPO trains on).",
        metavar="",
    ),
) -> None:
    """The closed loop: evaluate, GRPO, and the controls (RFT, SFT on the demonstration set, SFT
    on oracle demonstrations) from the same start with GRPO's counted compute, each evaluated greedy
    and sampled on the same held-out items; prints the tables at the end."""
    from trajforge.experiments.closed_loop import (
        TABLE_TITLE,
        WARM_START,
        DemoError,
        format_table,
        run_demo,
        start_weights,
    )
    from trajforge.rl.config import TrainConfigError, load_config_file
    from trajforge.rl.progress import quiet_third_party

    try:
        overrides = load_config_file(config) if config else {}
        if guide is not None:
            overrides["guide"] = guide
        if seed is not None:
            overrides["seed"] = seed
        if warm is False:
            overrides["warm_start"] = None
        elif warm and not overrides.get("warm_start"):
            overrides["warm_start"] = WARM_START
        if model is not None:
            overrides["model"] = str(start_weights(model))
        with quiet_third_party():
            report = run_demo(
                run_dir(output_dir, run_name, "rl-demo") or output_dir / run_name,
                eval_n=eval_n,
                eval_k=eval_k,
                steps=steps,
                overrides=overrides,
                controls=control,
                eval_all_families=eval_all,
                family=family,
                echo=typer.echo,
            )
    except (TrainConfigError, DemoError, FileNotFoundError) as exc:
        raise fail(str(exc)) from None
    typer.echo(json.dumps(report["headline"], indent=2))
    typer.echo(f"\n{TABLE_TITLE}\n{format_table(report)}")
