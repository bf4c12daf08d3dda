"""Progress you can watch: one line per training step, and no third-party progress bars.

``rl train`` and ``rl demo`` print :class:`StepProgress`'s line as each step's metrics arrive
(from the builtin trainer's ``on_step`` hook or TRL's ``on_log``), so a run of minutes shows it
is alive and how long is left. A value a trainer did not compute (TRL logs no KL without a
reference model) prints as ``-``, never as a made-up 0.

transformers, datasets and TRL draw their own tqdm bars and print log dicts; they would
interleave with these lines and with a JSON result, so :func:`quiet_third_party` turns them off
for the duration of a run and restores what was there.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any


def _num(value: Any, fmt: str) -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return format(value, fmt)


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{sec:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def step_line(line: dict[str, Any], total: int, step_s: float | None, eta_s: float | None) -> str:
    """``step 3/20 reward 0.412 pass 0.250 kl 0.0012 clip 0.031 4.1s/step eta 1m10s``."""
    kl = line.get("kl_ref", line.get("kl"))
    parts = [
        f"step {line.get('step', '?')}/{total}",
        f"reward {_num(line.get('reward_mean'), '.3f')}",
        f"pass {_num(line.get('pass_rate'), '.3f')}",
        f"kl {_num(kl, '.4f')}",
        f"clip {_num(line.get('clip_fraction'), '.3f')}",
        f"{_num(step_s, '.1f')}s/step",
        f"eta {_duration(eta_s) if eta_s is not None else '-'}",
    ]
    return " ".join(parts)


class StepProgress:
    """Call with each step's metric line; echoes one line with step time and ETA.

    Step time is the wall time between this step's line and the previous one (the first: since
    the object was made, which includes loading and any warm start, so it is not used for the
    ETA once a later step gives a cleaner figure); the ETA counts the steps left to ``total`` (a
    resumed run's too). ``deadline`` (a ``time.monotonic()``
    value): a time budget that will stop the run first (``rl demo``) caps the ETA."""

    def __init__(self, total: int, echo: Callable[[str], None], *, deadline: float | None = None) -> None:
        self.total = total
        self.echo = echo
        self.deadline = deadline
        self._last = time.monotonic()
        self._times: list[float] = []

    def __call__(self, line: dict[str, Any]) -> None:
        now = time.monotonic()
        elapsed, self._last = now - self._last, now
        self._times.append(elapsed)
        steady = self._times[1:] or self._times
        per_step = sum(steady) / len(steady)
        step = int(line.get("step", 0) or 0)
        eta = max(0, self.total - step) * per_step
        if self.deadline is not None:
            eta = max(0.0, min(eta, self.deadline - now))
        self.echo(step_line(line, self.total, elapsed, eta))


@contextlib.contextmanager
def quiet_third_party() -> Iterator[None]:
    """transformers' and datasets' progress bars off (and transformers' logging at error level)
    for the block; their previous settings afterwards."""
    restore: list[Callable[[], None]] = []
    try:
        from transformers.utils import logging as hf_logging

        if hf_logging.is_progress_bar_enabled():
            hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
            restore.append(hf_logging.enable_progress_bar)
        level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
        restore.append(lambda: hf_logging.set_verbosity(level))
    except ImportError:
        pass
    try:
        from datasets.utils import logging as ds_logging

        if ds_logging.is_progress_bar_enabled():
            ds_logging.disable_progress_bar()
            restore.append(ds_logging.enable_progress_bar)
    except ImportError:
        pass
    try:
        yield
    finally:
        for undo in reversed(restore):
            undo()
