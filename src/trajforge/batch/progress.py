"""Progress display: a rich live bar on a terminal, one plain log line every few seconds otherwise.

Both read the same :class:`Snapshot`, built by the runner from the ledger's statistics, so the
display shows what is durable, not what is merely in flight.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Protocol, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


@dataclass(slots=True)
class Snapshot:
    total: int
    completed: int
    failed: int
    partial: int
    filtered: int
    session_done: int
    elapsed_s: float
    tokens: int

    @property
    def done(self) -> int:
        return self.completed + self.failed + self.partial + self.filtered

    @property
    def rate(self) -> float:
        return self.session_done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        remaining = self.total - self.done
        return remaining / self.rate if self.rate > 0 and remaining > 0 else None

    def counts_text(self) -> str:
        eta = f"{self.eta_s:.0f}s" if self.eta_s is not None else "-"
        return (
            f"completed={self.completed} failed={self.failed} partial={self.partial} "
            f"filtered={self.filtered} rate={self.rate:.1f}/s eta={eta} tokens={self.tokens}"
        )


def _short(n: float) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e4 else f"{n:.0f}"


def compact_text(snap: Snapshot) -> str:
    """The counts in few columns, so the bar keeps its width on an 80-column terminal."""
    eta = f"{snap.eta_s:.0f}s" if snap.eta_s is not None else "-"
    return (
        f"ok {snap.completed} fail {snap.failed} part {snap.partial} filt {snap.filtered} "
        f"| {snap.rate:.1f}/s eta {eta} | tok {_short(snap.tokens)}"
    )


class ProgressSink(Protocol):
    def update(self, snap: Snapshot) -> None: ...

    def close(self, snap: Snapshot | None) -> None: ...


class NullProgress:
    def update(self, snap: Snapshot) -> None:
        pass

    def close(self, snap: Snapshot | None) -> None:
        pass


class PlainProgress:
    """Log lines for CI and files: one every ``every_s`` seconds and one at the end."""

    def __init__(self, name: str, stream: TextIO | None = None, every_s: float = 5.0) -> None:
        self._name = name
        self._stream = stream or sys.stderr
        self._every = every_s
        self._last = 0.0

    def update(self, snap: Snapshot) -> None:
        now = time.monotonic()
        if now - self._last >= self._every:
            self._last = now
            self._emit(snap)

    def _emit(self, snap: Snapshot) -> None:
        print(f"[{self._name}] {snap.done}/{snap.total} {snap.counts_text()}", file=self._stream, flush=True)

    def close(self, snap: Snapshot | None) -> None:
        if snap is not None:
            self._emit(snap)


class RichProgress:
    """A live bar with done/total, per-status counts, throughput, ETA and tokens."""

    def __init__(self, name: str, total: int, console: Console | None = None) -> None:
        self._progress = Progress(
            TextColumn(f"[bold]{name}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[counts]}"),
            console=console or Console(stderr=True),
            refresh_per_second=4,
        )
        self._task = self._progress.add_task(name, total=total, counts="starting")
        self._started = False  # started on the first update: a failed preflight shows no bar

    def update(self, snap: Snapshot) -> None:
        if not self._started:
            self._progress.start()
            self._started = True
        self._progress.update(self._task, completed=snap.done, total=snap.total, counts=compact_text(snap))

    def close(self, snap: Snapshot | None) -> None:
        if snap is not None:
            self.update(snap)
        if self._started:
            self._progress.stop()


def make_progress(mode: str, name: str, total: int) -> ProgressSink:
    """``auto`` picks rich when stderr is a terminal, plain log lines otherwise."""
    if mode == "none":
        return NullProgress()
    if mode == "rich" or (mode == "auto" and sys.stderr.isatty()):
        return RichProgress(name, total)
    return PlainProgress(name)
