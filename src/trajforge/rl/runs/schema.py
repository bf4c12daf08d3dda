"""A managed run's files on disk: what each holds, read and validated; no process is touched here.

``RUNS_DIR/ID/`` holds ``config.yaml`` (the :class:`RunSpec`, secrets by *name* only),
``state.json`` (:class:`RunState`: every process's pid, start time, group, status and reason),
``NAME.log`` and ``NAME.exit.json`` per process, the trainer's ``metrics.jsonl`` and
``checkpoints/``. The process control that writes them is :mod:`trajforge.rl.runs.manager`; a
reader (``rl status``, the RL agent's tools, a report) needs only this module.

The other runs an ``--output-dir`` holds (``rl train`` and ``rl demo`` runs, whose own
``state.json`` is the trainer's; ``env eval`` and ``batch`` runs) are told apart by
:mod:`trajforge.record.runs`, and read here as far as ``rl list``/``status``/``results`` show them
(:func:`overview`, :func:`train_results`, :func:`demo_results`): never as a :class:`RunState`.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trajforge.record.runs import RunKind, demo_stages, is_managed_state
from trajforge.rl.runs import procs
from trajforge.trajectory.save import read_complete_objects

STATE_FILE = "state.json"
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_DIR = "checkpoints"
LOCK_FILE = ".lock"
READY_PREFIX = "trajforge serve: listening on "  # trajforge.serve.config.READY_PREFIX
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
# Ids and names are matched whole (fullmatch): ``re.match("^...$")`` takes "run-1\n" ($ matches
# before a final newline), a directory name ending in a newline.
NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
PLACEHOLDER = re.compile(r"\{([a-z][a-z0-9_-]*)\.url\}")

ProcessStatus = Literal["pending", "starting", "running", "exited", "failed", "stopped", "vanished"]
RunStatus = Literal["starting", "running", "finished", "failed", "stopping", "stopped"]
ENDED: frozenset[str] = frozenset({"exited", "failed", "stopped", "vanished"})


class RunError(ValueError):
    """A run that does not exist or a spec that cannot start; the message says what to do."""


class ReadyCheck(BaseModel):
    """When a started process counts as ready."""

    model_config = ConfigDict(allow_inf_nan=False)  # a finite deadline

    kind: Literal["http", "file_line", "started"] = Field(
        "started",
        description="http: GET url+path answers 200 (url: given, or the address the process prints as "
        "'trajforge serve: listening on URL'); file_line: the file at path (relative to the run "
        "directory) has a first complete line; started: running is enough",
    )
    path: str = Field("/health", description="http: the health path; file_line: the file")
    url: str | None = Field(None, description="http: base URL (default: the address the process prints)")
    timeout_s: float = Field(900.0, gt=0, description="not ready by then: the run fails and is stopped")


class ProcessSpec(BaseModel):
    """One process of a run. ``argv`` may name ``{run_dir}`` and ``{NAME.url}`` (the ready URL of
    an earlier process of the run)."""

    name: str
    argv: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict, description="non-secret environment additions")
    secret_env: list[str] = Field(
        default_factory=list,
        description="names of environment variables passed from the manager's environment (API keys)",
    )
    ready: ReadyCheck = Field(default_factory=ReadyCheck)
    main: bool = Field(False, description="the run ends when this one ends (default: the last process)")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not NAME.fullmatch(value):
            raise ValueError(f"process name {value!r} must be lowercase letters, digits, - or _")
        return value

    @field_validator("env")
    @classmethod
    def _no_secrets_in_env(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if SECRET_NAME.search(k)]
        if bad:
            raise ValueError(
                f"{', '.join(bad)} look like secrets: name them in secret_env (the value is read from "
                "the environment at start and never written down) instead of env"
            )
        return value


class RunSpec(BaseModel):
    model_config = ConfigDict(validate_assignment=True)  # `spec.run_id = ...` is checked too

    kind: str = Field("run", description="what the run is (train, eval, ...): part of its id")
    config: dict[str, Any] = Field(default_factory=dict, description="written to config.yaml")
    processes: list[ProcessSpec] = Field(min_length=1, description="started in order, each once ready")
    run_id: str | None = None
    files: dict[str, str] = Field(
        default_factory=dict, description="files written into the run directory before start (name -> text)"
    )
    metrics_file: str = Field(METRICS_FILE, description="the metrics file, relative to the run directory")
    checkpoints_dir: str = Field(
        CHECKPOINTS_DIR, description="where checkpoints go, relative to the run directory"
    )

    @model_validator(mode="after")
    def _check(self) -> RunSpec:
        names = [p.name for p in self.processes]
        if len(set(names)) != len(names):
            raise ValueError(f"process names must be unique, got {names}")
        if sum(p.main for p in self.processes) > 1:
            raise ValueError("at most one process is main")
        for name in [*self.files, self.metrics_file, self.checkpoints_dir]:
            if name.startswith("/") or ".." in Path(name).parts or name in {STATE_FILE, CONFIG_FILE}:
                raise ValueError(f"{name!r}: run files are relative paths inside the run directory")
        if self.run_id is not None and not RUN_ID.fullmatch(self.run_id):
            raise ValueError(
                f"run id {self.run_id!r}: 1-100 letters, digits, '.', '_' and '-', starting with a letter or digit"
            )
        if not NAME.fullmatch(self.kind):
            raise ValueError(
                f"run kind {self.kind!r} must be lowercase letters, digits, - or _ (it is part of the id)"
            )
        return self


class ProcessState(BaseModel):
    name: str
    argv: list[str]
    main: bool = False
    secret_env: list[str] = Field(default_factory=list)
    status: ProcessStatus = "pending"
    pid: int | None = None
    start_ticks: int | None = None
    pgid: int | None = None
    log: str = ""
    url: str | None = None
    started_at: float | None = None
    ready_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    stop_signal: str | None = Field(None, description="what the manager sent: SIGTERM, then SIGKILL")
    reason: str | None = None

    @property
    def ended(self) -> bool:
        return self.status in ENDED


class RunState(BaseModel):
    id: str
    kind: str
    dir: str
    status: RunStatus = "starting"
    reason: str | None = None
    created_at: float = Field(default_factory=time.time)
    ended_at: float | None = None
    stop_requested: bool = False
    starter_pid: int = Field(default_factory=os.getpid, description="the manager process that started it")
    starter_ticks: int | None = Field(default_factory=lambda: procs.start_ticks(os.getpid()))
    metrics_file: str = METRICS_FILE
    processes: list[ProcessState] = Field(default_factory=list)

    def process(self, name: str) -> ProcessState:
        for proc in self.processes:
            if proc.name == name:
                return proc
        raise RunError(f"run {self.id} has no process {name!r} (it has {', '.join(self.names())})")

    def names(self) -> list[str]:
        return [p.name for p in self.processes]

    @property
    def main(self) -> ProcessState:
        return next((p for p in self.processes if p.main), self.processes[-1])

    @property
    def ended(self) -> bool:
        return self.status in {"finished", "failed", "stopped"}


class MetricSummary(BaseModel):
    first: float
    last: float
    min: float
    max: float
    mean: float


class RunResults(BaseModel):
    run_id: str
    status: str = Field(description="a managed run's RunStatus; finished/incomplete for other runs")
    reason: str | None
    metric_lines: int
    last: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, MetricSummary] = Field(default_factory=dict)
    checkpoints: list[str] = Field(default_factory=list)
    logs: dict[str, str] = Field(default_factory=dict)


def log_tail(path: Path, lines: int = 20, max_bytes: int = 64_000) -> str:
    """The last ``lines`` lines of a log (read from its end, so a huge log costs nothing)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return "(no log)"
    text = data.decode("utf-8", "replace").rstrip("\n")
    return "\n".join(text.splitlines()[-lines:]) if text else "(log is empty)"


def printed_address(log: Path) -> str | None:
    """The address a ``trajforge serve`` (or anything speaking its start-up line) printed."""
    try:
        text = log.read_bytes()[: 1 << 20].decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        if line.startswith(READY_PREFIX):
            return line[len(READY_PREFIX) :].split()[0]
    return None


def read_exit(path: Path) -> tuple[int | None, str | None]:
    try:
        data = orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None, None
    return data.get("exit_code"), data.get("signal_name")


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The complete lines of a metrics file (a line being written is not read yet)."""
    return read_complete_objects(path)


def find_checkpoints(run_dir: Path) -> list[Path]:
    """Directories holding model weights (``*.safetensors``, ``*.bin``, ``*.pt``) under the run,
    oldest first."""
    found: set[Path] = set()
    for pattern in ("*.safetensors", "*.bin", "*.pt"):
        for depth in ("", "*/", "*/*/", "*/*/*/"):
            for f in run_dir.glob(depth + pattern):
                if f.is_file():
                    found.add(f.parent)
    return sorted(found, key=lambda p: (p.stat().st_mtime_ns, str(p)))


def metric_summaries(rows: list[dict[str, Any]]) -> dict[str, MetricSummary]:
    """first/last/min/max/mean of every numeric field of metrics lines."""
    series: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                series.setdefault(key, []).append(float(value))
    return {
        k: MetricSummary(first=v[0], last=v[-1], min=min(v), max=max(v), mean=sum(v) / len(v))
        for k, v in series.items()
    }


def is_managed_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` is the run manager's (its ``state.json`` a :class:`RunState`), not an
    ``rl train`` run's, whose ``state.json`` is the trainer's resume point."""
    try:
        return is_managed_state(orjson.loads((run_dir / STATE_FILE).read_bytes()))
    except (OSError, orjson.JSONDecodeError):
        return False


class RunOverview(BaseModel):
    """One line about any run under ``--output-dir`` (``rl list``/``status``/``results``)."""

    id: str
    kind: str = Field(description="batch, env eval, rl train, rl demo, or rl run (KIND) for a managed run")
    status: str
    created_at: float | None = None
    detail: str = Field("", description="the figure that says how far it got")
    dir: str


def _json_object(path: Path) -> dict[str, Any]:
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _created(path: Path) -> float | None:
    try:
        return min(p.stat().st_mtime for p in [path, *path.iterdir()])
    except (OSError, ValueError):
        return None


def managed_overview(state: RunState) -> RunOverview:
    reason = (state.reason or "").splitlines()[0][:80] if state.reason else ""
    return RunOverview(
        id=state.id,
        kind=f"rl run ({state.kind})",
        status=state.status,
        created_at=state.created_at,
        detail=reason,
        dir=state.dir,
    )


def _train_detail(path: Path) -> tuple[str, str]:
    state = _json_object(path / STATE_FILE)
    config = _json_object(path / "config.json")
    rows = read_metrics(path / METRICS_FILE)
    steps = config.get("steps")
    step = state.get("step", rows[-1].get("step", 0) if rows else 0)
    status = "finished" if state.get("final") else "incomplete"
    figures = [f"step {step}/{steps}" if steps else f"step {step}"]
    last = rows[-1] if rows else {}
    for key in ("reward_mean", "pass_rate"):
        if isinstance(last.get(key), int | float):
            figures.append(f"{key} {last[key]:.3f}")
    return status, ", ".join(figures)


def overview(path: Path, kind: RunKind) -> RunOverview:
    """What a run that is not managed shows in ``rl list`` (a managed one: :func:`managed_overview`)."""
    status, detail = "incomplete", ""
    if kind == "rl train":
        status, detail = _train_detail(path)
    elif kind == "rl demo":
        report = _json_object(path / "report.json")
        status = "finished" if report else "incomplete"
        detail = "stages: " + (", ".join(p.name for p in demo_stages(path)) or "none yet")
    elif kind == "env eval":
        summary = _json_object(path / "summary.json")
        progress = _json_object(path / "status.json")
        status = "finished" if summary else "incomplete"
        done, total = progress.get("finished"), progress.get("total")
        detail = f"{done}/{total} episodes" if done is not None else ""
        for key, label in (("mean_reward", "mean reward"), ("pass_at_1", "pass@1")):
            figure = summary.get(key)  # {"value", "low", "high"} (envs.summary)
            if isinstance(figure, dict) and isinstance(figure.get("value"), int | float):
                detail += f", {label} {figure['value']:.3f}"
    elif kind == "batch":
        stats = _json_object(path / "statistics.json")
        done, total = stats.get("total_done"), stats.get("total_prompts")
        status = "finished" if stats.get("finished") else "incomplete"
        detail = f"{done}/{total} prompts done" if done is not None else ""
    return RunOverview(
        id=path.name, kind=kind, status=status, created_at=_created(path), detail=detail, dir=str(path)
    )


def train_results(path: Path) -> RunResults:
    """An ``rl train`` run's results, as a managed run's read (its metrics and checkpoints)."""
    rows = read_metrics(path / METRICS_FILE)
    status, detail = _train_detail(path)
    return RunResults(
        run_id=path.name,
        status=status,
        reason=detail,
        metric_lines=len(rows),
        last=rows[-1] if rows else {},
        metrics=metric_summaries(rows),
        checkpoints=[str(p) for p in find_checkpoints(path)],
        logs={p.stem: str(p) for p in sorted(path.glob("*.log"))},
    )


def demo_results(path: Path) -> RunResults:
    """An ``rl demo`` run's results: its report's headline figures (none before it finished)."""
    report = _json_object(path / "report.json")
    headline = report.get("headline")
    last = (
        {k: v for k, v in headline.items() if isinstance(v, int | float)}
        if isinstance(headline, dict)
        else {}
    )
    stages = ", ".join(p.name for p in demo_stages(path)) or "none yet"
    return RunResults(
        run_id=path.name,
        status="finished" if report else "incomplete",
        reason=f"stages: {stages}" + ("" if report else "; no report.json yet"),
        metric_lines=1 if last else 0,
        last=last,
        metrics=metric_summaries([last]) if last else {},
        checkpoints=[str(p) for p in find_checkpoints(path)],
    )
