"""Progress display: a rich live bar on a terminal, one plain log line every few seconds otherwise.

Both read the same :class:`Snapshot`, built by the runner from the ledger's statistics, so the
display shows what is durable, not what is merely in flight. Before the first sample is done the
display shows the run's *phase* (preparing, starting the model server, preflight, first samples in
flight) instead of a frozen ``0/N``; the rate and the ETA are over the last
:data:`RATE_WINDOW_S` seconds of completions (:class:`RateWindow`), so a slow start does not make
the ETA jump for the rest of the run.
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
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
    activity: str = ""  # what the rollouts did so far, before any is done (in-process workers)

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


RATE_WINDOW_S = 60.0
RATE_MIN_SHARE = 0.1  # a rate is over at least this share of the total (and RATE_MIN_COUNT things)
RATE_MIN_COUNT = 5


class RateEstimate:
    """Things per second, and the ETA from it, over the most recent stretch that holds both at
    least ``window_s`` seconds and at least ``min_share`` of the total (``min_count`` at least).

    Why both: completions come in bursts (a batch of rollouts finishing together), so a rate over
    a fixed minute swings with each burst -- an ETA of 20m, then 4m50, then 44m in one run. Over
    a stretch that always holds a tenth of the work a burst moves it little, and it still follows
    a run that really speeds up or slows down. The rate is measured up to *now*, not the last
    completion, so a stall lowers it as it goes on; and from the first point counted (a batch
    counts from its first completion: the start-up before it is no part of the rate)."""

    def __init__(
        self,
        window_s: float = RATE_WINDOW_S,
        min_share: float = RATE_MIN_SHARE,
        min_count: int = RATE_MIN_COUNT,
    ) -> None:
        self._window = window_s
        self._min_share = min_share
        self._min_count = min_count
        self._points: deque[tuple[float, int]] = deque()

    def add(self, now: float, done: int, total: int) -> tuple[float, float | None]:
        """(rate, eta_s) with ``done`` of ``total`` at time ``now`` counted in."""
        if not self._points or done != self._points[-1][1]:
            self._points.append((now, done))
        need = max(self._min_count, math.ceil(self._min_share * total))
        while (
            len(self._points) > 2
            and now - self._points[1][0] >= self._window
            and done - self._points[1][1] >= need
        ):
            self._points.popleft()
        t0, d0 = self._points[0]
        rate = (done - d0) / (now - t0) if now - t0 >= 1.0 and done > d0 else 0.0
        remaining = total - done
        return rate, (remaining / rate if rate > 0 and remaining > 0 else None)


class RateWindow:
    """A batch's rate and ETA (:class:`RateEstimate`) from its snapshots, counted from the
    session's first completion; until there are two, the session's own average."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self._estimate = RateEstimate(window_s)

    def add(self, snap: Snapshot) -> tuple[float, float | None]:
        """(rate, eta_s) with ``snap`` counted in."""
        if snap.session_done == 0:
            return snap.rate, snap.eta_s
        rate, eta = self._estimate.add(
            snap.elapsed_s, snap.session_done, snap.session_done + snap.total - snap.done
        )
        return (rate, eta) if rate > 0 else (snap.rate, snap.eta_s)


def _eta_text(eta_s: float | None) -> str:
    if eta_s is None:
        return "-"
    minutes, seconds = divmod(int(eta_s), 60)
    return (
        f"{minutes // 60}h{minutes % 60:02d}m"
        if minutes >= 60
        else f"{minutes}m{seconds:02d}s"
        if minutes
        else f"{seconds}s"
    )


def _waiting(phase: str, snap: Snapshot) -> str:
    """Before the first sample is done: the phase, what the rollouts did so far, how long."""
    doing = f": {snap.activity}" if snap.activity else ""
    return f"{phase}{doing} ({snap.elapsed_s:.0f}s)"


def _short(n: float) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e4 else f"{n:.0f}"


def compact_text(snap: Snapshot, rate: float | None = None, eta_s: float | None = None) -> str:
    """The counts in few columns, so the bar keeps its width on an 80-column terminal."""
    if rate is None:
        rate, eta_s = snap.rate, snap.eta_s
    eta = _eta_text(eta_s)
    return (
        f"ok {snap.completed} fail {snap.failed} part {snap.partial} filt {snap.filtered} "
        f"| {rate:.1f}/s eta {eta} | tok {_short(snap.tokens)}"
    )


class ProgressSink(Protocol):
    def note(self, text: str) -> None:
        """A line worth keeping (the embedded model is used, a warning): above a live bar, whole."""

    def phase(self, text: str) -> None:
        """What the run is doing before samples complete (shown until the first one is done)."""
        ...

    def update(self, snap: Snapshot) -> None: ...

    def close(self, snap: Snapshot | None) -> None: ...


class NullProgress:
    def note(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def phase(self, text: str) -> None:
        pass

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
        self._phase = "starting"
        self._rate = RateWindow()

    def note(self, text: str) -> None:
        print(text, file=self._stream, flush=True)

    def phase(self, text: str) -> None:
        if text != self._phase:
            self._phase = text
            print(f"[{self._name}] {text}", file=self._stream, flush=True)

    def update(self, snap: Snapshot) -> None:
        rate_eta = self._rate.add(snap)
        now = time.monotonic()
        if now - self._last >= self._every:
            self._last = now
            self._emit(snap, rate_eta)

    def _emit(self, snap: Snapshot, rate_eta: tuple[float, float | None] | None = None) -> None:
        if snap.session_done == 0 and snap.done < snap.total:  # nothing finished yet: say what goes on
            text = _waiting(self._phase, snap)
        else:
            rate, eta = rate_eta or (snap.rate, snap.eta_s)
            text = (
                f"completed={snap.completed} failed={snap.failed} partial={snap.partial} "
                f"filtered={snap.filtered} rate={rate:.1f}/s eta={_eta_text(eta)} tokens={snap.tokens}"
            )
        print(f"[{self._name}] {snap.done}/{snap.total} {text}", file=self._stream, flush=True)

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
        self._started = False  # started on the first phase or update
        self._phase = "starting"
        self._rate = RateWindow()

    def _start(self) -> None:
        if not self._started:
            self._progress.start()
            self._started = True

    def note(self, text: str) -> None:
        # printed through the live display's console: above the bar, never over it
        self._progress.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def phase(self, text: str) -> None:
        self._start()
        self._phase = text
        self._progress.update(self._task, counts=text)
        self._progress.refresh()  # a new phase shows at once, not at the next tick

    def update(self, snap: Snapshot) -> None:
        self._start()
        rate, eta = self._rate.add(snap)
        waiting = snap.session_done == 0 and snap.done < snap.total
        counts = _waiting(self._phase, snap) if waiting else compact_text(snap, rate, eta)
        self._progress.update(self._task, completed=snap.done, total=snap.total, counts=counts)

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
