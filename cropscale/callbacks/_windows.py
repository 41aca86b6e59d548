"""Step-time window arithmetic: boundary marks of one optimizer step -> window durations -> statistics.

The durations feed interval means (log steps) and epoch statistics. No torch and no Lightning:
:class:`~cropscale.callbacks.StepTimingCallback` records the marks in its hooks and hands them here.

A *mark* is whatever the step-timing clock returns (a ``perf_counter`` float, a CUDA event); the
arithmetic only ever asks ``seconds(start, end)`` for the time between two marks, so it runs on
plain floats in tests. Durations are in seconds; the statistics are in milliseconds.

Windows of one micro-batch, from its marks (see :class:`MicroBatchMarks`)::

    fetch_start -> fetch_end -> batch_start -> backward_start -> backward_end -> batch_end
    |  data_wait  |  transfer  |   forward    |    backward    |   optimizer   |

and ``remainder``: from the previous optimizer step's ``batch_end`` to this step's first fetch,
plus the gaps between its micro-batches. A step sums each window over its micro-batches;
``step`` is the sum of the six windows; ``comm`` is the union of the DDP bucket intervals
(launch -> done) and ``comm_exposed`` the part after the last bucket was launched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from cropscale.runs.schema import COMM_FIGURES, STEP_WINDOWS, WindowStats

__all__ = [
    "COMM_FIGURES",
    "FIGURES",
    "STEP_WINDOWS",
    "BucketMarks",
    "MicroBatchMarks",
    "StepMarks",
    "StepWindows",
    "WindowAccumulator",
    "interval_union",
]

FIGURES: tuple[str, ...] = (*STEP_WINDOWS, "step", *COMM_FIGURES)
"""Every figure of a step, in the order of ``run.json["summary"]["step_timing"]["windows"]``."""

Seconds = Callable[[Any, Any], float]
"""``seconds(start_mark, end_mark) -> float``: the clock's duration between two marks (s)."""


@dataclass(slots=True)
class MicroBatchMarks:
    """Boundary marks of one micro-batch (``None``: not seen).

    Attributes:
        fetch_start, fetch_end: start and stop of the profiler action ``train_dataloader_next``.
        batch_start: ``on_train_batch_start``.
        backward_start: the first ``on_before_backward`` of the micro-batch.
        backward_end: the last ``on_after_backward`` of the micro-batch.
        batch_end: ``on_train_batch_end``.
    """

    fetch_start: Any = None
    fetch_end: Any = None
    batch_start: Any = None
    backward_start: Any = None
    backward_end: Any = None
    batch_end: Any = None

    @property
    def start(self) -> Any:
        """Where the micro-batch begins: its fetch start, else (no fetch seen) its batch start."""
        return self.fetch_start if self.fetch_start is not None else self.batch_start

    def marks(self) -> list[Any]:
        """The six marks, in time order (``None`` included)."""
        return [self.fetch_start, self.fetch_end, self.batch_start, self.backward_start, self.backward_end,
                self.batch_end]

    def windows(self, seconds: Seconds) -> list[float | None]:
        """``[data_wait, transfer, forward, backward, optimizer]`` of this micro-batch, in seconds.

        A window is ``None`` where one of its bounding marks is missing.

        Args:
            seconds: the clock's duration between two marks (s).
        """
        m = self.marks()
        return [seconds(a, b) if a is not None and b is not None else None for a, b in zip(m, m[1:], strict=False)]


@dataclass(slots=True)
class BucketMarks:
    """One DDP gradient bucket: marks at its all-reduce launch and completion (``None`` until done)."""

    launch: Any
    done: Any = None


@dataclass(frozen=True)
class StepWindows:
    """The window durations of one optimizer step, in seconds (``None``: not measured).

    ``remainder`` is ``None`` for the first step of an epoch and the first step after a validation
    run (the gap before it holds worker start-up or validation); ``comm`` and ``comm_exposed`` are
    ``None`` without a timed all-reduce.
    """

    data_wait: float | None = None
    transfer: float | None = None
    forward: float | None = None
    backward: float | None = None
    optimizer: float | None = None
    remainder: float | None = None
    comm: float | None = None
    comm_exposed: float | None = None

    @property
    def step(self) -> float | None:
        """Sum of the six step windows that were measured (s); ``None`` when none was."""
        parts = [v for v in (self.data_wait, self.transfer, self.forward, self.backward, self.optimizer,
                             self.remainder) if v is not None]
        return sum(parts) if parts else None

    def figures(self) -> list[float | None]:
        """Every figure in :data:`FIGURES` order (s)."""
        return [getattr(self, name) for name in FIGURES]


def interval_union(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by the union of ``[a, b]`` intervals (overlaps counted once); 0 for none."""
    if not intervals:
        return 0.0
    iv = sorted(intervals)
    busy, cur_a, cur_b = 0.0, iv[0][0], iv[0][1]
    for a, b in iv[1:]:
        if a > cur_b:
            busy += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    return busy + (cur_b - cur_a)


@dataclass(slots=True)
class StepMarks:
    """The marks of one optimizer step and what the statistics need to know about it.

    Attributes:
        micros: the micro-batches of the step (one without gradient accumulation), in order.
        buckets: the DDP gradient buckets all-reduced during the step, in launch order.
        prev_end: ``batch_end`` of the previous optimizer step of the epoch (``None`` for the first).
        warmup: the step is inside the warm-up (left out of the epoch statistics).
        first_in_epoch: the first step of its epoch (no remainder; its data wait holds worker start-up).
        after_validation: the first step after a validation run (no remainder).
        step, epoch: the step's index (``trainer.global_step`` while its micro-batches ran, 0 for the first; the
            step Lightning logs its ``train/loss_step`` at) and its epoch (for the trace).
        samples: samples in the batch, when known (for the trace).
    """

    micros: list[MicroBatchMarks]
    buckets: list[BucketMarks] = field(default_factory=list)
    prev_end: Any = None
    warmup: bool = False
    first_in_epoch: bool = False
    after_validation: bool = False
    step: int = 0
    epoch: int = 0
    samples: int | None = None

    @property
    def excluded(self) -> bool:
        """Left out of the epoch statistics (warm-up, first of epoch, first after validation)."""
        return self.warmup or self.first_in_epoch or self.after_validation

    def completion_marks(self) -> list[Any]:
        """The marks that complete last: the last bucket's completion (when done), then the step's end."""
        out = []
        if self.buckets and self.buckets[-1].done is not None:
            out.append(self.buckets[-1].done)
        out.append(self.micros[-1].batch_end)
        return out

    def spent_marks(self) -> list[Any]:
        """Every mark of the step except its end (which becomes the next step's ``prev_end``)."""
        out = [m for micro in self.micros for m in micro.marks()][:-1]
        if self.prev_end is not None:
            out.append(self.prev_end)
        for bucket in self.buckets:
            out.extend((bucket.launch, bucket.done))
        return out

    def remainder(self, seconds: Seconds) -> float | None:
        """Time outside the micro-batches (s): before the first fetch and between micro-batches.

        ``None`` for the first step of an epoch, the first after validation, or without a previous end.
        """
        first_start = self.micros[0].start
        if self.prev_end is None or self.first_in_epoch or self.after_validation or first_start is None:
            return None
        rem = seconds(self.prev_end, first_start)
        for a, b in zip(self.micros[:-1], self.micros[1:], strict=False):
            if a.batch_end is not None and b.start is not None:
                rem += seconds(a.batch_end, b.start)
        return rem

    def comm(self, seconds: Seconds) -> tuple[float | None, float | None]:
        """``(comm, comm_exposed)`` in s from the completed buckets; ``(None, None)`` without any.

        ``comm`` is the union of the bucket intervals; ``comm_exposed`` is ``max(done) - max(launch)``
        (at least 0): the all-reduce time left after the last bucket was launched.
        """
        done = [(b.launch, b.done) for b in self.buckets if b.launch is not None and b.done is not None]
        if not done:
            return None, None
        base = done[0][0]
        iv = [(seconds(base, a), seconds(base, b)) for a, b in done]
        exposed = max(0.0, max(b for _, b in iv) - max(a for a, _ in iv))
        return interval_union(iv), exposed

    def windows(self, seconds: Seconds) -> StepWindows:
        """The durations of this step; each window summed over the micro-batches.

        Raises:
            whatever ``seconds`` raises for a mark that is not resolved yet (``RuntimeError`` for a
            pending CUDA event).
        """
        sums: list[float | None] = [None] * 5
        for micro in self.micros:
            for k, value in enumerate(micro.windows(seconds)):
                if value is not None:
                    sums[k] = value + (sums[k] or 0.0)
        comm, exposed = self.comm(seconds)
        return StepWindows(*sums, remainder=self.remainder(seconds), comm=comm, comm_exposed=exposed)


class WindowAccumulator:
    """Interval means and epoch statistics of resolved steps (the statistics as ``run.json`` records).

    :meth:`update` per step, :meth:`interval_means_ms` at log steps, :meth:`epoch_stats_ms` at epoch
    ends, :meth:`start_epoch` when an epoch begins.

    Attributes:
        first_batch_wait: ``data_wait`` (s) of the first step of the current epoch, once resolved.
    """

    def __init__(self) -> None:
        self._interval: list[list[float | None]] = []
        self._epoch: list[StepWindows] = []
        self.first_batch_wait: float | None = None

    def start_epoch(self) -> None:
        """Forget the previous epoch's steps and first-batch wait (the interval carries over)."""
        self._epoch = []
        self.first_batch_wait = None

    @property
    def epoch_steps(self) -> int:
        """Steps in the epoch statistics so far."""
        return len(self._epoch)

    def update(self, marks: StepMarks, windows: StepWindows) -> bool:
        """Add one resolved step; True when it enters the epoch statistics.

        A step enters them when it is not excluded (see :attr:`StepMarks.excluded`) and has a remainder.

        Args:
            marks: the step's marks (for its warm-up / first-of-epoch / after-validation flags).
            windows: the step's durations, from :meth:`StepMarks.windows`.
        """
        self._interval.append(windows.figures())
        if marks.first_in_epoch and self.first_batch_wait is None:
            self.first_batch_wait = windows.data_wait
        if not marks.excluded and windows.remainder is not None:
            self._epoch.append(windows)
            return True
        return False

    def epoch_state(self) -> dict[str, Any]:
        """The epoch's measured steps so far and its first-batch wait, for a checkpoint (plain lists, seconds).

        Returns:
            ``{"windows": [name of each StepWindows field], "steps": [n_steps][len(windows)] seconds or None,
            "first_batch_wait": s or None}``: the raw durations, so that :meth:`epoch_stats_ms` after
            :meth:`restore_epoch` gives the same medians and p95.
        """
        names = [f.name for f in fields(StepWindows)]
        return {"windows": names, "steps": [[getattr(w, n) for n in names] for w in self._epoch],
                "first_batch_wait": self.first_batch_wait}

    def restore_epoch(self, state: dict[str, Any]) -> None:
        """Start the epoch with the steps of :meth:`epoch_state` (read by window name) before the ones to come."""
        names = list(state["windows"])
        self._epoch = [StepWindows(**dict(zip(names, row, strict=True))) for row in state["steps"]]
        self.first_batch_wait = state.get("first_batch_wait")

    def interval_means_ms(self) -> dict[str, float]:
        """Mean of each figure over the steps since the last call (ms), and start a new interval.

        Warm-up steps are included; figures without a value are left out.
        """
        rows, self._interval = self._interval, []
        out: dict[str, float] = {}
        for i, name in enumerate(FIGURES):
            vals = [r[i] for r in rows if r[i] is not None]
            if vals:
                out[name] = 1e3 * sum(vals) / len(vals)
        return out

    def epoch_stats_ms(self) -> dict[str, WindowStats]:
        """``{figure: WindowStats(median, p95, n)}`` over the epoch's measured steps, in ms.

        Each step's figure is read by name from its :class:`StepWindows`.
        """
        out = {}
        for name in FIGURES:
            values = [getattr(w, name) for w in self._epoch]
            out[name] = WindowStats.of([v for v in values if v is not None], scale=1e3)
        return out

