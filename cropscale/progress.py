"""Progress of a long command on stderr: configuration i of n, steps, an estimate of the time left.

Commands keep stdout for their results (tables, JSON paths); what a person watches while they wait
goes to stderr through :class:`Progress`::

    progress = Progress(total=4, label="benchmark")
    progress.note("bf16-mixed on this CPU is slow (no bfloat16 units)")
    for name in configurations:
        progress.start(name, steps=40)
        for i in range(40):
            ...
            progress.step(i + 1)
        progress.finish()

prints lines such as ``benchmark: [2/4] BF16 batch 4: step 12/40, about 3 min 10 s left``. The time
left is the mean duration of the finished configurations times those still to run, plus the rest of
the current one extrapolated from its own step rate (``None`` until one step or one configuration is
done). Step lines are printed at most once every ``min_interval`` seconds.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress", "format_duration"]


def format_duration(seconds: float) -> str:
    """``seconds`` as ``"42 s"``, ``"3 min 10 s"`` or ``"1 h 05 min"`` (rounded to the second).

    Raises:
        ValueError: ``seconds`` is negative or not finite.
    """
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"a duration must be finite and >= 0, got {seconds}")
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


class Progress:
    """Progress lines on ``stream`` (stderr by default) for ``total`` configurations of a command.

    Args:
        total: number of configurations the command will run (>= 0).
        label: prefix of every line (the command's name).
        stream: where to write; ``None`` means ``sys.stderr`` at the time of each write.
        clock: monotonic clock in seconds (tests pass a fake one).
        min_interval: least time in seconds between two step lines of one configuration.

    Raises:
        ValueError: ``total`` < 0 or ``min_interval`` < 0.
    """

    def __init__(self, total: int, label: str, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, min_interval: float = 2.0) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        if min_interval < 0:
            raise ValueError(f"min_interval must be >= 0, got {min_interval}")
        self.total = int(total)
        self.label = label
        self._stream = stream
        self._clock = clock
        self.min_interval = float(min_interval)
        self.index = 0
        self.durations: list[float] = []
        self._name = ""
        self._steps: int | None = None
        self._done = 0
        self._started: float | None = None
        self._last_line: float | None = None

    # ------------------------------------------------------------------ output
    def _write(self, text: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        print(f"{self.label}: {text}", file=stream, flush=True)

    def note(self, text: str) -> None:
        """Print one line ``label: text`` (a warning said up front, a skipped configuration)."""
        self._write(text)

    # ------------------------------------------------------------------ items
    def start(self, name: str, steps: int | None = None) -> None:
        """Begin the next configuration, ``name``, of ``steps`` steps (``None``: not counted in steps)."""
        self.index += 1
        self._name, self._steps, self._done = name, steps, 0
        self._started = self._last_line = self._clock()
        left = self.eta_s()
        tail = f", about {format_duration(left)} left" if left is not None else ""
        self._write(f"[{self.index}/{self.total}] {name}{f' ({steps} steps)' if steps else ''}{tail}")

    def step(self, done: int) -> None:
        """``done`` steps of the current configuration are finished; prints a line when due."""
        self._done = int(done)
        now = self._clock()
        if self._last_line is not None and now - self._last_line < self.min_interval:
            return
        self._last_line = now
        left = self.eta_s()
        steps = f"step {done}/{self._steps}" if self._steps else f"step {done}"
        tail = f", about {format_duration(left)} left" if left is not None else ""
        self._write(f"[{self.index}/{self.total}] {self._name}: {steps}{tail}")

    def finish(self) -> float:
        """End the current configuration; returns its duration in seconds."""
        if self._started is None:
            raise RuntimeError("Progress.finish() without start()")
        took = self._clock() - self._started
        self.durations.append(took)
        self._started = None
        return took

    def eta_s(self) -> float | None:
        """Estimated seconds left for every configuration not finished yet, or ``None`` without a basis.

        The current configuration's rest is extrapolated from its steps done so far (when counted in
        steps); each configuration not started yet counts the mean duration of the finished ones (or,
        before any has finished, the current one's extrapolated total).
        """
        current_left = current_total = None
        if self._started is not None and self._steps and self._done > 0:
            elapsed = self._clock() - self._started
            current_total = elapsed / self._done * self._steps
            current_left = max(current_total - elapsed, 0.0)
        per_item = sum(self.durations) / len(self.durations) if self.durations else current_total
        not_started = self.total - self.index if self._started is not None else self.total - len(self.durations)
        if per_item is None:
            return None
        if self._started is not None and current_left is None:
            current_left = max(per_item - (self._clock() - self._started), 0.0)
        return (current_left or 0.0) + max(not_started, 0) * per_item
