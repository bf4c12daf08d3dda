"""Which kind of run a directory holds, told from its files: every command that reads runs asks here
first, so each takes any run folder trajforge writes and says plainly when one is not its kind.

The kinds and the files that tell them (written by the modules named; repeated here, not
imported, so that this module stays on the ground floor with the readers of run files):

* ``batch`` (``trajforge batch``): ``run.json`` with the factory's ``config`` and its ``tools``,
  ``ledger.sqlite``, ``trajectories.jsonl``/``filtered.jsonl``/``failed.jsonl``;
* ``env eval`` (``trajforge env eval``, and each stage of ``rl demo``): ``run.json`` naming the
  ``env``, ``episodes.jsonl``;
* ``rl train`` (``trajforge rl train``; ``rl.checkpoint.RunDir``): ``config.json`` (a
  ``TrainConfig``), ``state.json`` (``{"step", "checkpoint", ...}``), ``metrics.jsonl``,
  ``checkpoints/``;
* ``rl demo`` (``trajforge rl demo``): its stages as runs of their own (``eval-*`` env eval runs,
  ``grpo`` and ``control`` training runs) and, once it finished, ``report.json``;
* ``rl run`` (``trajforge rl start``, the run manager; ``rl.runs.schema``): ``state.json`` with the
  run's ``processes``, ``config.yaml``; its trainer's own run in ``trainer/``.

Both ``rl train`` and ``rl run`` directories hold a ``state.json``; what is in it tells them apart.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any, Literal

import orjson

RunKind = Literal["batch", "env eval", "rl train", "rl demo", "rl run"]
RUN_KINDS: tuple[RunKind, ...] = ("batch", "env eval", "rl train", "rl demo", "rl run")
KIND_TEXT: dict[RunKind, str] = {
    "batch": "a batch run (`trajforge batch`)",
    "env eval": "an env eval run (`trajforge env eval`)",
    "rl train": "an rl train run (`trajforge rl train`)",
    "rl demo": "an rl demo run (`trajforge rl demo`)",
    "rl run": "a managed rl run (`trajforge rl start`)",
}
BATCH_FILES = ("trajectories.jsonl", "filtered.jsonl", "failed.jsonl", "ledger.sqlite")
EPISODES_FILE = "episodes.jsonl"


def _json(path: Path) -> dict[str, Any] | None:
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def is_managed_state(data: Any) -> bool:
    """Whether a ``state.json``'s content is the run manager's (``rl.runs.schema.RunState``)."""
    return isinstance(data, dict) and isinstance(data.get("processes"), list) and "kind" in data


def run_kind(path: Path) -> RunKind | None:
    """The kind of run ``path`` holds, or None when it holds none trajforge writes."""
    if not path.is_dir():
        return None
    state = _json(path / "state.json")
    if is_managed_state(state):
        return "rl run"
    if state is not None and "step" in state:
        return "rl train"
    config = _json(path / "config.json")
    if config is not None and "env" in config and "group_size" in config:
        return "rl train"  # before its first checkpoint
    run = _json(path / "run.json")
    if run is not None:
        if isinstance(run.get("env"), str) and "config" in run and "tools" not in run:
            return "env eval"
        if "config" in run or "tools" in run:
            return "batch"
    if (path / EPISODES_FILE).is_file():
        return "env eval"
    if any((path / name).exists() for name in BATCH_FILES):
        return "batch"
    report = _json(path / "report.json")
    if (report is not None and "train_config" in report) or demo_stages(path):
        return "rl demo"
    return None


def demo_stages(path: Path) -> list[Path]:
    """The runs an ``rl demo`` directory holds, one per stage: its evaluations (``eval-NAME``, an
    env eval run for the greedy and one for the sampled episodes) and its trainings."""
    try:
        children = sorted(p for p in path.iterdir() if p.is_dir())
    except OSError:
        return []
    return [
        p
        for p in children
        if (p.name.startswith("eval-") and eval_runs(p))
        or (p.name in ("grpo", "control", "warm") and (p / "config.json").exists())
    ]


def eval_runs(stage: Path) -> list[Path]:
    """The env eval runs of one ``rl demo`` evaluation stage (itself, or its greedy/sampled runs)."""
    if (stage / EPISODES_FILE).is_file():
        return [stage]
    try:
        return sorted(p for p in stage.iterdir() if (p / EPISODES_FILE).is_file())
    except OSError:
        return []


def runs_in(folder: Path) -> list[tuple[Path, RunKind]]:
    """Every run directly under ``folder`` (a ``--output-dir``), by name; other entries ignored."""
    try:
        children = sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError:
        return []
    return [(p, kind) for p in children if (kind := run_kind(p)) is not None]


def _hint(path: Path, kind: RunKind) -> str:
    if kind == "rl demo":
        stages = [str(r) for p in demo_stages(path) if p.name.startswith("eval-") for r in eval_runs(p)]
        if stages:
            return f"its evaluations are env eval runs: {', '.join(stages)}"
        return "`trajforge rl status` reads it"
    if kind == "rl run":
        return f"its trainer's run is {path / 'trainer'}; `trajforge rl status` reads it"
    if kind == "rl train":
        return "`trajforge rl status` and `rl results` read it"
    if kind == "env eval":
        return "`trajforge export`, `report` and `env rescore` read it"
    return "`trajforge export` and `report` read it"


def kind_problem(path: Path, accepts: Collection[str], what: str) -> str | None:
    """None when ``path`` is a run of a kind in ``accepts``; else one line for the user saying what
    ``path`` is and what reads it. ``what`` names what the command wanted ("a run to export")."""
    if not path.exists():
        return f"{path} does not exist; {what}"
    if not path.is_dir():
        return f"{path} is a file, not a run directory; {what}"
    kind = run_kind(path)
    wanted = " or ".join(KIND_TEXT[k].split(" (")[0] for k in RUN_KINDS if k in accepts)
    if kind is None:
        return (
            f"{path} is not a run directory trajforge wrote (no run.json, episodes.jsonl, state.json "
            f"or config.json in it); {what}: {wanted}"
        )
    if kind in accepts:
        return None
    return f"{path} is {KIND_TEXT[kind]}, not {wanted}; {_hint(path, kind)}"
