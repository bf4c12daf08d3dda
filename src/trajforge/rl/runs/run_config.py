"""A training run for the run manager: ``trajforge rl train`` as one process of a run.

The trainer's settings are :class:`trajforge.rl.config.TrainConfig` (validated by it, here and
again by the trainer); they travel as the run's ``train.yaml`` (``--config``), so what ran is on
disk next to its results. The trainer writes into ``RUN/trainer/`` (its own ``config.json``,
``state.json``, ``metrics.jsonl``, ``checkpoints/``), apart from the manager's files; the run is
ready when the trainer's first metrics line (its first batch) is written.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from pydantic import ValidationError

from trajforge.rl.config import TrainConfig, TrainConfigError
from trajforge.rl.runs.schema import ProcessSpec, ReadyCheck, RunSpec

_CLI = "from trajforge.cli.main import main; main()"
TRAINER_DIR = "trainer"
TRAIN_FILE = "train.yaml"
_PLACEHOLDER_DIR = "/nonexistent/run-dir"  # output_dir is the run's; set when the run starts


def trajforge_command() -> list[str]:
    """``trajforge`` as a child command of this interpreter (no reliance on PATH)."""
    return [sys.executable, "-c", _CLI]


def validate_train(fields: dict[str, Any]) -> TrainConfig:
    """``fields`` (TrainConfig fields but ``output_dir``) as a validated config; raises
    ``TrainConfigError`` naming each bad field."""
    try:
        return TrainConfig.model_validate({**fields, "output_dir": _PLACEHOLDER_DIR})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors()
        )
        raise TrainConfigError(problems) from None


def train_run_spec(
    fields: dict[str, Any],
    *,
    command: list[str] | None = None,
    ready_timeout_s: float = 900.0,
    secret_env: list[str] | None = None,
) -> RunSpec:
    """The run: ``trajforge rl train ENV --model-path M --config RUN/train.yaml --output-dir RUN
    --run-name trainer``
    (``command`` replaces ``trajforge rl train``)."""
    cfg = validate_train(fields)
    data = cfg.model_dump(mode="json", exclude={"output_dir"})
    argv = [
        *(command or [*trajforge_command(), "rl", "train"]),
        cfg.env,
        "--model-path",
        str(cfg.model),
        "--config",
        f"{{run_dir}}/{TRAIN_FILE}",
        "--output-dir",
        "{run_dir}",
        "--run-name",
        TRAINER_DIR,
    ]
    return RunSpec(
        kind="train",
        config={"train": data},
        files={TRAIN_FILE: yaml.safe_dump(data, sort_keys=False)},
        metrics_file=f"{TRAINER_DIR}/metrics.jsonl",
        checkpoints_dir=f"{TRAINER_DIR}/checkpoints",
        processes=[
            ProcessSpec(
                name="trainer",
                argv=argv,
                secret_env=secret_env or [],
                ready=ReadyCheck(
                    kind="file_line", path=f"{TRAINER_DIR}/metrics.jsonl", timeout_s=ready_timeout_s
                ),
                main=True,
            )
        ],
    )
