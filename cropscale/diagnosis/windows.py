"""What the diagnosis reads of a run's step timing: per rank, per window, the median over the measured epochs.

Every rank's epoch medians come from ``summary.step_timing.epochs[].window_median_ms_per_rank`` (gathered from all
ranks at each epoch end by :class:`~cropscale.callbacks.StepTimingCallback`); a run recorded before those lists
existed has rank 0's ``windows_ms`` only. Per rank and window the figure is the median over the measured epochs
(the rule of :mod:`cropscale.runs.rules`) of that rank's epoch medians.

A rank's **own work** is what it computes or loads itself: data wait + transfer + forward + (backward - exposed
communication) + optimizer. Its **wait** is the time it spends waiting for the other ranks: the exposed part of
the gradient all-reduce (``comm_exposed``, from the DDP communication hook) and the loop remainder, which under
DDP holds Lightning's per-step SIGTERM broadcast from rank 0 (a rank waits there for rank 0). Medians of different
windows do not add up exactly; the rules compare like with like.
"""

from __future__ import annotations

from dataclasses import dataclass

from cropscale.diagnosis.thresholds import MIN_MEASURED_STEPS
from cropscale.numbers import median
from cropscale.runs.rules import measured
from cropscale.runs.schema import RunSummary, StepTimingEpoch

OWN_WINDOWS: tuple[str, ...] = ("data_wait", "transfer", "forward", "backward_own", "optimizer")
"""The windows of a rank's own work (``backward_own`` = backward - comm_exposed)."""
WAIT_WINDOWS: tuple[str, ...] = ("comm_exposed", "remainder")
"""The windows in which a rank waits for the others under DDP."""
_FIGURES = ("data_wait", "transfer", "forward", "backward", "optimizer", "remainder", "step", "comm_exposed")


def _epoch_rows(epoch: StepTimingEpoch) -> dict[str, list[float | None]]:
    """``{figure: [per rank]}`` of one epoch (rank 0's ``windows_ms`` when no per-rank lists were gathered)."""
    per_rank = epoch.window_median_ms_per_rank
    if per_rank and per_rank.get("step"):
        return {f: list(per_rank.get(f) or []) for f in _FIGURES}
    return {f: [epoch.windows_ms[f].median if f in epoch.windows_ms else None] for f in _FIGURES}


def _with_derived(ms: dict[str, list[float | None]], ranks: int) -> dict[str, list[float | None]]:
    """Add ``backward_own``, ``own`` and ``wait`` (ms) to per-rank figures."""

    def at(name: str, r: int) -> float | None:
        row = ms.get(name) or []
        return row[r] if r < len(row) else None

    backward_own, own, wait = [], [], []
    for r in range(ranks):
        back = at("backward", r)
        exposed = at("comm_exposed", r) or 0.0
        b_own = None if back is None else max(0.0, back - exposed)
        backward_own.append(b_own)
        parts = [at("data_wait", r), at("transfer", r), at("forward", r), b_own, at("optimizer", r)]
        own.append(sum(p for p in parts if p is not None) if any(p is not None for p in parts) else None)
        waits = [at(name, r) for name in WAIT_WINDOWS]
        wait.append(sum(w for w in waits if w is not None) if any(w is not None for w in waits) else None)
    return {**ms, "backward_own": backward_own, "own": own, "wait": wait}


@dataclass(frozen=True)
class RankWindows:
    """Per-rank step figures of a run (ms): ``ms[figure][rank]``, medians over the measured epochs.

    Figures: the step windows, ``step``, ``comm_exposed``, and the derived ``backward_own``, ``own`` and ``wait``
    (module docstring).

    Attributes:
        ranks: the world size recorded.
        epochs: measured epochs the medians are over.
        steps: measured steps in them (rank 0's counts, summed).
        comm_timed: the gradient all-reduce was timed (DDP communication hook).
    """

    ms: dict[str, list[float | None]]
    ranks: int
    epochs: int
    steps: int
    comm_timed: bool

    def at(self, figure: str, rank: int) -> float | None:
        """``ms[figure][rank]`` (None when not recorded)."""
        row = self.ms.get(figure) or []
        return row[rank] if rank < len(row) else None

    def share(self, figure: str, rank: int) -> float | None:
        """``figure`` of ``rank`` as a fraction of that rank's step (None without both)."""
        value, step = self.at(figure, rank), self.at("step", rank)
        return value / step if value is not None and step else None


def rank_windows(summary: RunSummary, warmup_epochs: int) -> RankWindows | None:
    """The per-rank figures over the measured epochs; None without step timing or a measured epoch."""
    timing = summary.step_timing
    epochs = measured(timing.epochs, warmup_epochs) if timing is not None else []
    if timing is None or not epochs:
        return None
    rows = [_epoch_rows(e) for e in epochs]
    ranks = max(len(r["step"]) for r in rows)
    ms = {f: [median(row[f][r] for row in rows if r < len(row[f])) for r in range(ranks)] for f in _FIGURES}
    return RankWindows(ms=_with_derived(ms, ranks), ranks=ranks, epochs=len(epochs),
                       steps=sum(e.steps_measured for e in epochs),
                       comm_timed=bool(timing.comm_timing.get("available")))


def own_by_epoch(summary: RunSummary) -> tuple[list[int], list[list[float | None]], list[list[float | None]]]:
    """Every recorded epoch's own work and step per rank: ``(epoch indices, own[rank][i], step[rank][i])`` (ms).

    All epochs, warm-up included: a rank is scored against its own best epoch, and the best is a minimum, which a
    slow warm-up epoch cannot become unless every later epoch is slower still. An epoch with fewer than
    :data:`~cropscale.diagnosis.thresholds.MIN_MEASURED_STEPS` measured steps has ``None`` (one step's noise).
    """
    timing = summary.step_timing
    if timing is None or not timing.epochs:
        return [], [], []
    rows = [_epoch_rows(e) for e in timing.epochs]
    ranks = max(len(r["step"]) for r in rows)
    derived = [_with_derived(row, ranks) if e.steps_measured >= MIN_MEASURED_STEPS
               else {"own": [None] * ranks, "step": [None] * ranks} for row, e in zip(rows, timing.epochs, strict=True)]
    own = [[d["own"][r] for d in derived] for r in range(ranks)]
    step = [[d["step"][r] if r < len(d["step"]) else None for d in derived] for r in range(ranks)]
    return [int(e.epoch) for e in timing.epochs], own, step


def measured_own(summary: RunSummary, warmup_epochs: int) -> list[list[float | None]]:
    """``[rank][measured epoch]``: the own work (ms) of every rank in each measured epoch (see :func:`own_by_epoch`)."""
    epochs, own, _ = own_by_epoch(summary)
    keep = [i for i, e in enumerate(epochs) if e >= warmup_epochs]
    return [[series[i] for i in keep] for series in own]


def window_growth(summary: RunSummary, rank: int, first: int, last: int) -> str | None:
    """The own window of ``rank`` that grew most between epoch positions ``first`` and ``last`` (None: unknown)."""
    timing = summary.step_timing
    if timing is None:
        return None
    rows = [_epoch_rows(timing.epochs[i]) for i in (first, last)]
    rows = [_with_derived(row, len(row["step"])) for row in rows]

    def at(row: dict[str, list[float | None]], w: str) -> float | None:
        return row[w][rank] if rank < len(row[w]) else None

    growth = [(at(rows[1], w) - at(rows[0], w), w) for w in OWN_WINDOWS
              if at(rows[0], w) is not None and at(rows[1], w) is not None]
    return max(growth)[1] if growth else None
