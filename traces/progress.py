"""A progress line for long runs on stderr: work done / total, what runs now, ETA.

On a terminal it redraws one line; otherwise (a log, CI) it prints a plain line per
finished step, so the output stays readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    """`total` units of work (any unit: replay weighs a turn by its tokens)."""

    def __init__(self, total: float, steps: int, stream: TextIO | None = None, label: str = "replay") -> None:
        self.total = max(total, 1e-9)
        self.steps = steps
        self.stream = stream or sys.stderr
        self.label = label
        self.done = 0.0
        self.steps_done = 0
        self.started = time.monotonic()
        self.now = ""
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def eta(self) -> str:
        if self.done <= 0:
            return "?"
        elapsed = time.monotonic() - self.started
        return _clock(elapsed * (self.total - self.done) / self.done)

    def begin(self, what: str) -> None:
        self.now = what
        if self.tty:
            self._draw()

    def advance(self, units: float, step_done: bool = False) -> None:
        self.done = min(self.total, self.done + units)
        if step_done:
            self.steps_done += 1
            if not self.tty:
                self.stream.write(f"{self.label}: {self.steps_done}/{self.steps} turns done, "
                                  f"elapsed {_clock(time.monotonic() - self.started)}, ETA {self.eta()}\n")
                self.stream.flush()
        if self.tty:
            self._draw()

    def _draw(self) -> None:
        width = 24
        filled = int(width * self.done / self.total)
        bar = "#" * filled + "." * (width - filled)
        line = (f"\r{self.label} [{bar}] {self.steps_done}/{self.steps} turns  {self.now}  "
                f"ETA {self.eta()}")
        self.stream.write(line[:160].ljust(100))
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
