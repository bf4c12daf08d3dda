"""Progress of a command that works through N things (env eval's episodes, export's lines, the
report's samples): its phase, done/total, rate and ETA.

On a terminal a rich bar (stderr); otherwise -- CI, a file, a pipe -- one plain line when the phase
changes and at most one every ``every_s`` seconds, so logs stay readable, and none at all for work
done within ``quiet_s`` (a small export says only what it wrote). ``batch`` has its own
display (batch/progress.py, fed from the ledger); this one is fed by the command itself.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any, Literal, TextIO

Mode = Literal["auto", "rich", "plain", "none"]
WINDOW_S = 60.0  # the rate is over this many seconds, so a slow start does not skew the ETA


def eta_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    if minutes >= 60:
        return f"{minutes // 60}h{minutes % 60:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class LiveProgress:
    """``phase(text)`` before (and between) counted work, ``advance(done, total)`` while it goes,
    ``close()`` at the end (also as a context manager)."""

    def __init__(
        self,
        name: str,
        *,
        unit: str = "items",
        mode: Mode = "auto",
        stream: TextIO | None = None,
        every_s: float = 5.0,
        quiet_s: float = 2.0,
    ) -> None:
        self._name, self._unit, self._every = name, unit, every_s
        self._speak_at = time.monotonic() + quiet_s
        self._stream = stream or sys.stderr
        if mode == "auto":
            mode = "rich" if self._stream.isatty() else "plain"
        self._mode = mode
        self._phase = ""
        self._points: deque[tuple[float, int]] = deque()
        self._last_line = 0.0
        self._done = self._total = 0
        self._note = ""
        self._bar: Any = None  # rich.progress.Progress, imported when first drawn
        self._task: Any = None

    # ------------------------------------------------------------------ reporting
    def phase(self, text: str) -> None:
        if text == self._phase:
            return
        self._phase = text
        if self._mode == "plain" and time.monotonic() >= self._speak_at:
            self._print(f"[{self._name}] {text}")
        self._draw()
        if self._bar is not None:
            self._bar.refresh()  # a new phase shows at once, not at the next tick

    def note(self, text: str) -> None:
        """A line worth keeping (a server started, a warning): printed above the bar."""
        if self._mode == "none":
            return
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            self._print(text)

    def advance(self, done: int, total: int, note: str = "") -> None:
        """``done`` of ``total`` finished (``note``: a running figure, e.g. the mean reward)."""
        now = time.monotonic()
        if not self._points or done != self._points[-1][1]:
            self._points.append((now, done))
        while len(self._points) > 2 and now - self._points[1][0] >= WINDOW_S:
            self._points.popleft()
        self._done, self._total, self._note = done, total, note
        due = now - self._last_line >= self._every or 0 < total <= done
        if self._mode == "plain" and now >= self._speak_at and due:
            self._last_line = now
            self._print(f"[{self._name}] {self.line()}")
        self._draw()

    def step(self, phase: str, done: int, total: int) -> None:
        """``phase`` and ``advance`` in one call: the ``progress`` callback of export and report."""
        self.phase(phase)
        self.advance(done, total)

    def rate(self) -> float:
        """Things per second over the window (0 until two points)."""
        if len(self._points) < 2:
            return 0.0
        (t0, d0), (t1, d1) = self._points[0], self._points[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0

    def eta_s(self) -> float | None:
        rate, left = self.rate(), self._total - self._done
        return left / rate if rate > 0 and left > 0 else None

    def line(self) -> str:
        note = self._note
        return (
            f"{self._phase}: {self._done}/{self._total} {self._unit} | {self.rate():.2f}/s "
            f"eta {eta_text(self.eta_s())}" + (f" | {note}" if note else "")
        )

    # ------------------------------------------------------------------ rich
    def _draw(self) -> None:
        if self._mode != "rich":
            return
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn(f"[bold]{self._name}[/] {{task.fields[phase]}}"),
                BarColumn(bar_width=24),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[figures]}"),
                console=Console(file=self._stream, force_terminal=True),
                refresh_per_second=4,
            )
            self._task = self._bar.add_task(self._name, total=None, phase="", figures="")
            self._bar.start()
        figures = f"{self.rate():.2f}/s eta {eta_text(self.eta_s())}"
        note = self._note
        self._bar.update(
            self._task,
            completed=self._done,
            total=self._total or None,
            phase=self._phase,
            figures=figures + (f" | {note}" if note else ""),
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _print(self, text: str) -> None:
        print(text, file=self._stream, flush=True)

    def __enter__(self) -> LiveProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def silence_library_bars(*libraries: str) -> None:
    """Turn off the tqdm bars of ``datasets`` / ``transformers`` / ``huggingface_hub`` (through
    their own switches): a command shows its own progress, and a second bar on stderr garbles it."""
    if "datasets" in libraries:
        from datasets.utils.logging import disable_progress_bar as datasets_off

        datasets_off()
    if "transformers" in libraries:
        from transformers.utils.logging import disable_progress_bar as transformers_off

        transformers_off()
    if "huggingface_hub" in libraries:
        from huggingface_hub.utils import disable_progress_bars as hub_off

        hub_off()
