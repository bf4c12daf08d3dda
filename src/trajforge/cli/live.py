"""Progress of a command that works through N things (env eval's episodes, export's lines, the
report's samples): its phase, done/total, rate and ETA.

On a terminal a rich bar (stderr); otherwise -- CI, a file, a pipe -- one plain line when the phase
changes and at most one every ``every_s`` seconds, so logs stay readable, and none at all for work
done within ``quiet_s`` (a small export says only what it wrote). ``batch`` has its own
display (batch/progress.py, fed from the ledger); this one is fed by the command itself.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, TextIO

from trajforge.batch.progress import RateEstimate

Mode = Literal["auto", "rich", "plain", "none"]
BAR_WIDTH = 10


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
        clock: Callable[[], float] = time.monotonic,
        heartbeat_s: float | None = None,
    ) -> None:
        self._name, self._unit, self._every = name, unit, every_s
        self._clock = clock
        self._started = clock()
        self._lock = threading.Lock()
        self._speak_at = clock() + quiet_s
        self._stream = stream or sys.stderr
        if mode == "auto":
            mode = "rich" if self._stream.isatty() else "plain"
        self._mode = mode
        self._phase = ""
        self._estimate = RateEstimate()  # rate and ETA over a window that a burst cannot swing
        self._rate: float = 0.0
        self._eta: float | None = None
        self._last_line = 0.0
        self._done = self._total = 0
        self._note = ""
        self._bar: Any = None  # rich.progress.Progress, imported when first drawn
        self._task: Any = None
        self._words: Any = None  # the rich columns of the words, sized to the terminal as drawn
        self._note_column: Any = None
        self._beat: threading.Thread | None = None
        self._stop = threading.Event()
        if heartbeat_s is not None and self._mode == "plain":
            self._beat = threading.Thread(target=self._heartbeat, args=(heartbeat_s,), daemon=True)
            self._beat.start()

    def _heartbeat(self, every: float) -> None:
        """Plain mode, for work that reports rarely (a training step of a minute): a line when
        nothing was printed for ``every`` seconds, so a log never goes silent while work goes on."""
        while not self._stop.wait(every):
            if self._clock() - self._last_line >= every and self._phase:
                waited = self._clock() - self._started
                text = self.line() if self._total else f"{self._phase} ({waited:.0f}s)"
                self._print(f"[{self._name}] {text}")

    # ------------------------------------------------------------------ reporting
    def phase(self, text: str) -> None:
        if text == self._phase:
            return
        self._phase = text
        if self._mode == "plain" and self._clock() >= self._speak_at:
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
        now = self._clock()
        self._rate, self._eta = self._estimate.add(now, done, total)
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
        """Things per second (:class:`~trajforge.batch.progress.RateEstimate`; 0 until known)."""
        return self._rate

    def eta_s(self) -> float | None:
        return self._eta

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
            from rich.table import Column

            # The numbers keep their width (done/total, elapsed, rate and ETA); the words (the
            # phase, then the note) take what is left of the terminal, cut with an ellipsis (an
            # 80-column terminal once showed the elapsed time as "0:00:…").
            self._words = Column(no_wrap=True, overflow="ellipsis")
            self._note_column = Column(no_wrap=True, overflow="ellipsis")
            self._bar = Progress(
                TextColumn(f"[bold]{self._name}[/] {{task.fields[phase]}}", table_column=self._words),
                BarColumn(bar_width=BAR_WIDTH),
                MofNCompleteColumn(table_column=Column(no_wrap=True)),
                TimeElapsedColumn(table_column=Column(no_wrap=True)),
                TextColumn("{task.fields[figures]}", table_column=Column(no_wrap=True)),
                TextColumn("{task.fields[note]}", table_column=self._note_column),
                console=Console(file=self._stream, force_terminal=True),
                refresh_per_second=4,
            )
            self._task = self._bar.add_task(self._name, total=None, phase="", figures="", note="")
            self._bar.start()
        figures = f"{self.rate():.2f}/s eta {eta_text(self.eta_s())}"
        counts = f"{self._done}/{self._total}" if self._total else f"{self._done}/?"
        left = self._bar.console.width - (BAR_WIDTH + len(counts) + len("0:00:00") + len(figures) + 6)
        words = len(self._name) + 1 + len(self._phase)
        self._words.max_width = max(8, min(words, left))
        self._note_column.max_width = max(0, left - self._words.max_width - 1)
        self._bar.update(
            self._task,
            completed=self._done,
            total=self._total or None,
            phase=self._phase,
            figures=figures,
            note=self._note,
        )

    def close(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _print(self, text: str) -> None:
        with self._lock:  # the heartbeat prints from its own thread
            self._last_line = self._clock()
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

        transformers_off()  # type: ignore[no-untyped-call]
    if "huggingface_hub" in libraries:
        from huggingface_hub.utils.tqdm import disable_progress_bars as hub_off

        hub_off()
