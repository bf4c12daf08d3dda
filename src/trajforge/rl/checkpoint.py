"""A training run's directory: config, checkpoints, ``state.json`` and ``metrics.jsonl``.

Layout::

    OUTPUT_DIR/config.json            the TrainConfig the run started with
    OUTPUT_DIR/state.json             {"step", "checkpoint", ...}: the last *resumable* checkpoint
    OUTPUT_DIR/metrics.jsonl          one line per step
    OUTPUT_DIR/checkpoints/step-000N/ weights + tokenizer (a servable model directory), and for
                                      resumable ones optimizer.pt
    OUTPUT_DIR/warm_start/            the supervised warm start's model and warm_start.json, when
                                      the run has one (GRPO starts from it)

Crash safety: a checkpoint is written to a temporary directory and renamed into place, then
``state.json`` is replaced atomically, so ``state.json`` only ever names a complete checkpoint.
On resume, metric lines of steps after that checkpoint (logged by the run that crashed) are
dropped, so ``metrics.jsonl`` has each step once.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from trajforge.rl.config import RESUME_KEYS, TrainConfig, TrainConfigError

CONFIG_FILE = "config.json"
STATE_FILE = "state.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
OPTIMIZER_FILE = "optimizer.pt"
WARM_START_DIR = "warm_start"


def step_dir(root: Path, step: int) -> Path:
    return root / CHECKPOINTS / f"step-{step:05d}"


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


def save_model_dir(
    final: Path,
    model: Any,
    tokenizer: Any,
    optimizer: Any | None,
    info_file: str,
    info: dict[str, Any],
    extra: dict[str, bytes] | None = None,
    *,
    merged: bool = True,
) -> Path:
    """Write a servable model directory (weights, tokenizer, optimizer state when given,
    ``info_file`` and the ``extra`` files) next to ``final`` and rename it into place: ``final``
    exists only complete. A LoRA policy writes its adapters (``adapter/``) and, when ``merged``,
    the merged weights as a plain checkpoint (:func:`trajforge.rl.fit.save_policy`)."""
    import torch

    from trajforge.rl.fit import save_policy

    tmp = final.with_name(final.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_policy(model, tmp, merged=merged)
    tokenizer.save_pretrained(str(tmp))
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
    (tmp / info_file).write_text(json.dumps(info, indent=2))
    for name, data in (extra or {}).items():
        (tmp / name).write_bytes(data)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


@dataclass
class RunState:
    step: int
    checkpoint: str
    server_version: int = 0
    final: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "checkpoint": self.checkpoint,
            "server_version": self.server_version,
            "final": self.final,
        }


class RunDir:
    """Reads and writes one training run's directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    # -- config ---------------------------------------------------------------------------

    def open(self, config: TrainConfig) -> RunState | None:
        """Create the directory for ``config``, or check it continues the run already there;
        returns the state to resume from (None = a fresh run)."""
        self.root.mkdir(parents=True, exist_ok=True)
        cfg_path = self.root / CONFIG_FILE
        state = self.read_state()
        if cfg_path.exists() and state is not None:
            old = json.loads(cfg_path.read_text())
            new = config.model_dump(mode="json")
            diff = [k for k in RESUME_KEYS if old.get(k) != new.get(k)]
            if diff:
                raise TrainConfigError(
                    f"{self.root} holds a run with different {', '.join(diff)} "
                    f"({', '.join(f'{k}={old.get(k)!r}' for k in diff)}); resume it with the same "
                    "settings or pick another --output-dir"
                )
        _atomic_write(cfg_path, json.dumps(config.model_dump(mode="json"), indent=2).encode())
        if state is not None:
            self.truncate_metrics(state.step)
        return state

    def read_state(self) -> RunState | None:
        path = self.root / STATE_FILE
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        state = RunState(
            step=int(data["step"]),
            checkpoint=str(data["checkpoint"]),
            server_version=int(data.get("server_version", 0)),
            final=bool(data.get("final", False)),
        )
        if not (self.root / state.checkpoint / "config.json").is_file():
            raise TrainConfigError(
                f"{self.root / STATE_FILE} names checkpoint {state.checkpoint}, which is missing; "
                "the run directory was edited by hand -- remove state.json to start over"
            )
        return state

    def write_state(self, state: RunState) -> None:
        _atomic_write(self.root / STATE_FILE, json.dumps(state.to_json(), indent=2).encode())

    # -- checkpoints ------------------------------------------------------------------------

    def save(
        self,
        step: int,
        model: Any,
        tokenizer: Any,
        optimizer: Any | None,
        extra: dict[str, Any],
        *,
        merged: bool = True,
    ) -> Path:
        """Write ``checkpoints/step-N`` (weights + tokenizer, and optimizer state when given;
        a LoRA policy's adapters, and its merged weights when ``merged``)."""
        return save_model_dir(
            step_dir(self.root, step),
            model,
            tokenizer,
            optimizer,
            "trainer_step.json",
            {"step": step, **extra},
            merged=merged,
        )

    @property
    def warm_start_dir(self) -> Path:
        """Where the warm start's model goes (:mod:`trajforge.rl.warm_start`); complete once it exists."""
        return self.root / WARM_START_DIR

    def relative(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def prune(self, keep: int, protect: set[Path]) -> None:
        """Remove all but the newest ``keep`` step checkpoints (never one in ``protect``)."""
        base = self.root / CHECKPOINTS
        if not base.is_dir():
            return
        dirs = sorted(p for p in base.iterdir() if p.is_dir() and p.name.startswith("step-"))
        protected = {p.resolve() for p in protect}
        for old in dirs[:-keep]:
            if old.resolve() not in protected:
                shutil.rmtree(old, ignore_errors=True)

    # -- metrics ----------------------------------------------------------------------------

    def append_metrics(self, line: dict[str, Any]) -> None:
        with (self.root / METRICS_FILE).open("ab") as fh:
            fh.write(orjson.dumps(line, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())

    def read_metrics(self) -> list[dict[str, Any]]:
        path = self.root / METRICS_FILE
        if not path.exists():
            return []
        out = []
        for raw in path.read_bytes().splitlines():
            try:
                out.append(orjson.loads(raw))
            except orjson.JSONDecodeError:
                break  # a torn last line from a crash
        return out

    def truncate_metrics(self, step: int) -> None:
        kept = [m for m in self.read_metrics() if int(m.get("step", 0)) <= step]
        _atomic_write(self.root / METRICS_FILE, b"".join(orjson.dumps(m) + b"\n" for m in kept))
