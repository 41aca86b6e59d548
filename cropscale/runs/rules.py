"""The rule behind each figure read from a run, one function per figure.

The report and the study use the same rules, so that a figure means the same wherever it is printed.

Every rule works on the *measured epochs*: the training epochs with index ``>= warmup_epochs``
(:func:`measured`). The study passes its spec's ``warmup_epochs``; the report uses
:func:`default_warmup_epochs` (the first epoch left out when a run has several: it holds worker
start-up, allocator growth and the callbacks' own warm-up). Inside an epoch each callback already
leaves out its warm-up steps and the first step of the epoch.

=========================  =========================================================================
figure                     rule
=========================  =========================================================================
median / p95 step (ms)     median over measured epochs of each epoch's median (p95) of the
                           ``step`` window (StepTimingCallback; one optimizer step, all micro-
                           batches); else of ThroughputCallback's step latency
step windows (ms)          per window: median over measured epochs of the epoch medians
slowest rank (ms)          per rank the median over measured epochs of its ``step`` median
                           (gathered from every rank); the rank with the largest (:func:`slowest_rank`)
loader wait / exposed      median over measured epochs of ``data_wait`` (``comm_exposed``) median /
communication share        ``step`` median
step decomposition (%)     the same per window (:func:`step_shares`): percent of the step; medians do
                           not add up, so the windows' shares sum to about, not exactly, 100 %
samples/s (training loop)  training samples / training-loop seconds, both summed over measured epochs
                           (ThroughputCallback's ``train_s``; seconds of the slowest rank)
samples/s (epoch clock)    training samples / end-to-end epoch seconds (``wall_s``: loader start-up, first
                           fetch, barriers, validation and checkpoint writes included), both summed over
                           measured epochs
train / val / end-to-end   median over measured epochs of ``train_s`` / ``val_s`` / ``wall_s``
epoch (s)
energy (J), J/sample       GPU board energy (NVML) summed over measured epochs (validation included); per
                           training sample of those epochs; a sampled-power figure needs at least
                           :data:`MIN_POWER_SAMPLES` readings in the run, at least one per
                           :data:`MAX_POWER_SAMPLE_PERIOD_S` (MLPerf's power rules), else n/a
peak memory (GiB)          peak allocated GPU memory over the run, else the host's peak RSS
non-finite, skipped        non-finite batches summed over ranks; steps skipped by the policy plus
                           GradScaler skips
best / final macro IoU     ``run.json`` ``summary.quality`` (QualityCallback: every validation of the
                           fit, resumed runs included): the maximum over the validations whose weights
                           were finite / the last value; the best epoch is the first that reached the
                           maximum (:func:`best_and_final`). Without that record, the same of
                           TensorBoard ``val/mIoU``
diverged                   the last :data:`DIVERGENCE_WINDOW` logged training losses (TensorBoard
                           ``train/loss_step``) are all non-finite (:func:`divergence`)
optimizer updates/epoch    ``global_step / trainer.max_epochs``
not trained                more than :data:`MAX_SKIPPED_SHARE` of the optimizer steps skipped (GradScaler
                           plus policy skips), or no weight changed (``summary.trained``); run.json
                           status :data:`NOT_TRAINED` (:func:`trained`)
=========================  =========================================================================
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from cropscale.errors import CropScaleError
from cropscale.evidence import MEASURED_RUN
from cropscale.numbers import median
from cropscale.runs.schema import (
    STEP_WINDOWS,
    EnergySummary,
    QualityEpoch,
    QualitySummary,
    RunJson,
    RunSummary,
    StepTimingEpoch,
    ThroughputEpoch,
)
from cropscale.runs.tensorboard import Scalars, epoch_series


@dataclass
class Figure:
    """A reported figure: its value, evidence label, why it is n/a, and a note that qualifies it.

    ``value`` ``None`` means n/a and then ``why`` says why; ``note`` qualifies a present value (e.g.
    "host RSS"). A non-finite value becomes n/a.
    """

    value: Any = None
    evidence: str | None = MEASURED_RUN
    why: str | None = None
    note: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.value, float) and not math.isfinite(self.value):
            self.why = self.why or f"non-finite value {self.value}"
            self.value = None
        if self.value is not None:
            self.why = None
        elif self.why is None:
            self.why = "not recorded"


@dataclass(frozen=True)
class RunInputs:
    """What a figure's producer reads (:attr:`cropscale.runs.figures.FigureSpec.producer`).

    Attributes:
        summary: ``run.json`` ``summary`` (empty without ``run.json``); scalars: the TensorBoard scalars by tag;
        warmup: the epochs left out (:func:`measured`); no_json: the reason every ``run.json`` figure is n/a
        when the folder has no ``run.json``, else None; events_problem: ``events file unreadable: <file>, <error>``
        for a damaged TensorBoard events file, else None.
    """

    summary: RunSummary
    scalars: Scalars
    warmup: int
    no_json: str | None = None
    events_problem: str | None = None
    _results: dict[Callable[..., Any], Any] = field(default_factory=dict, compare=False, repr=False)

    def once(self, rule: Callable[..., Any], *args: Any) -> Any:
        """``rule(*args)``, computed once for this run: a rule that gives several figures serves each producer.

        ``args`` are this run's inputs, the same in every call for one ``rule``.
        """
        if rule not in self._results:
            self._results[rule] = rule(*args)
        return self._results[rule]


class _Epoch(Protocol):
    epoch: int


def default_warmup_epochs(epochs: int) -> int:
    """Warm-up epochs the report leaves out of a run of ``epochs`` epochs: 1 when there are several."""
    return 1 if epochs > 1 else 0


def measured(epochs: list[Any], warmup_epochs: int) -> list[Any]:
    """The epoch entries with ``epoch >= warmup_epochs`` (the measured epochs), in order."""
    return [e for e in epochs if int(e.epoch) >= warmup_epochs]


def _why_no_epoch(summary_present: bool, section: str, warmup_epochs: int, no_json: str | None) -> str:
    if no_json:
        return no_json
    if not summary_present:
        return f"run.json has no {section} summary"
    return f"no measured epoch (epoch index >= {warmup_epochs}) in the {section} summary"


class StepTime(NamedTuple):
    """A run's step time (ms): :func:`step_time`'s two figures, by name."""

    median: Figure
    p95: Figure


class SlowestRank(NamedTuple):
    """The slowest rank and its median step (ms): :func:`slowest_rank`'s two figures, by name."""

    rank: Figure
    step_ms: Figure


def step_time(summary: RunSummary, warmup_epochs: int, no_json: str | None = None) -> StepTime:
    """Median and p95 step (ms): the median over measured epochs of each epoch's statistic.

    The statistic of the ``step`` window (StepTimingCallback), else of the step latency
    (ThroughputCallback).
    """
    timing = measured(summary.step_timing.epochs, warmup_epochs) if summary.step_timing else []
    stats = [e.windows_ms["step"] for e in timing if "step" in e.windows_ms and e.windows_ms["step"].median is not None]
    source = "StepTimingCallback step window"
    if not stats:
        through = measured(summary.throughput.epochs, warmup_epochs) if summary.throughput else []
        stats = [e.step_latency_ms for e in through if e.step_latency_ms.median is not None]
        source = "ThroughputCallback step latency"
    if not stats:
        section = summary.step_timing or summary.throughput
        why = _why_no_epoch(section is not None, "step_timing or throughput", warmup_epochs, no_json)
        if section is not None and not no_json and measured(section.epochs, warmup_epochs):
            steps = getattr(summary.step_timing, "steps_total", None)
            why = (f"no measured step in the measured epochs (epoch index >= {warmup_epochs}): each callback leaves"
                   f" out its {section.warmup_steps} warm-up steps and the first step of every epoch"
                   + (f"; {steps} steps in all" if steps is not None else ""))
        return StepTime(Figure(None, why=why), Figure(None, why=why))
    note = f"{source}: median over {len(stats)} measured epoch(s) of the epoch statistics"
    p95 = median(s.p95 for s in stats)
    return StepTime(Figure(median(s.median for s in stats), note=note), Figure(p95, why="p95 not recorded", note=note))


def slowest_rank(summary: RunSummary, warmup_epochs: int, no_json: str | None = None) -> SlowestRank:
    """The slowest rank and its median step (ms): per rank, the median over measured epochs of its epoch median.

    From ``step_timing.epochs[].step_ms_per_rank.per_rank`` (StepTimingCallback gathers every rank's ``step``
    median at each epoch end); the slowest is the rank with the largest median (the lowest rank on a tie). The
    note lists every rank's median. n/a on one rank, or without per-rank medians.
    """
    timing = measured(summary.step_timing.epochs, warmup_epochs) if summary.step_timing else []
    if not timing:
        why = _why_no_epoch(summary.step_timing is not None, "step_timing", warmup_epochs, no_json)
        return SlowestRank(Figure(None, why=why), Figure(None, why=why))
    ranks = max(len(e.step_ms_per_rank.per_rank) for e in timing)
    if ranks <= 1:
        why = f"{ranks} rank(s) recorded: no other rank to compare"
        return SlowestRank(Figure(None, why=why), Figure(None, why=why))
    per_rank = [median(e.step_ms_per_rank.per_rank[r] for e in timing if r < len(e.step_ms_per_rank.per_rank))
                for r in range(ranks)]
    known = [(v, r) for r, v in enumerate(per_rank) if v is not None]
    if not known:
        why = "no per-rank step median in the measured epochs"
        return SlowestRank(Figure(None, why=why), Figure(None, why=why))
    value, rank = max(known, key=lambda vr: (vr[0], -vr[1]))
    shown = ", ".join(f"rank {r} {'n/a' if v is None else format(v, '.1f') + ' ms'}" for r, v in enumerate(per_rank))
    note = f"per rank, median over {len(timing)} measured epoch(s) of its epoch median step: {shown}"
    worst = _largest_excess(timing, rank, ranks)
    if worst is not None:
        note += f"; rank {rank}'s largest excess over the ranks' median: {worst[1]} {worst[0]:+.1f} ms"
    return SlowestRank(Figure(rank, note=note), Figure(value, note=note))


def _largest_excess(timing: list[StepTimingEpoch], rank: int, ranks: int) -> tuple[float, str] | None:
    """``(ms, window)``: the step window in which ``rank``'s median exceeds the ranks' median most.

    Per window and rank the median over ``timing`` of ``window_median_ms_per_rank``; None without those lists.
    """
    found = []
    for window in STEP_WINDOWS:
        rows = [e.window_median_ms_per_rank.get(window) or [] for e in timing]
        per_rank = [median(row[r] for row in rows if r < len(row)) for r in range(ranks)]
        mid = median(per_rank)
        if per_rank[rank] is not None and mid is not None:
            found.append((per_rank[rank] - mid, window))
    return max(found) if found else None


def host_windows(summary: RunSummary, warmup_epochs: int) -> dict[str, float]:
    """``data_wait_host`` / ``transfer_host`` (ms, host clock): the median over measured epochs of the epoch medians.

    Empty for runs recorded before StepTimingCallback kept them (``host_windows_ms`` absent).
    """
    timing = measured(summary.step_timing.epochs, warmup_epochs) if summary.step_timing else []
    out = {}
    for name in ("data_wait_host", "transfer_host"):
        value = median(e.host_windows_ms[name].median for e in timing
                       if e.host_windows_ms and name in e.host_windows_ms)
        if value is not None:
            out[name] = value
    return out


def step_windows(summary: RunSummary, windows: tuple[str, ...], warmup_epochs: int,
                 scalars: Scalars | None = None) -> tuple[dict[str, float], str | None]:
    """Step decomposition (ms per window): the median over measured epochs of the epoch medians.

    From StepTimingCallback's epoch summaries; without them, the mean of the TensorBoard
    ``perf/step/<window>_ms`` log intervals (warm-up included, said in the returned source).
    """
    timing = measured(summary.step_timing.epochs, warmup_epochs) if summary.step_timing else []
    out = {}
    for w in windows:
        value = median(e.windows_ms[w].median for e in timing if w in e.windows_ms)
        if value is not None:
            out[w] = value
    if out:
        return out, f"StepTimingCallback medians over {len(timing)} measured epoch(s) ({MEASURED_RUN})"
    means = {w: statistics.fmean(v for _, v, _ in scalars[f"perf/step/{w}_ms"])
             for w in windows if scalars and scalars.get(f"perf/step/{w}_ms")}
    if means:
        return means, f"TensorBoard perf/step/*_ms, mean of logged intervals incl. warm-up ({MEASURED_RUN})"
    return {}, None


def step_share(summary: RunSummary, window: str, warmup_epochs: int) -> float | None:
    """Median over measured epochs of ``window`` median / ``step`` median (a fraction of the step)."""
    timing: list[StepTimingEpoch] = measured(summary.step_timing.epochs, warmup_epochs) if summary.step_timing else []
    shares = []
    for e in timing:
        w, step = e.windows_ms.get(window), e.windows_ms.get("step")
        if w is not None and step is not None and w.median is not None and step.median:
            shares.append(w.median / step.median)
    return median(shares)


def step_share_figure(summary: RunSummary, window: str, warmup_epochs: int, no_json: str | None = None) -> Figure:
    """:func:`step_share` as a figure: n/a with the reason when ``run.json`` holds no such window."""
    share = step_share(summary, window, warmup_epochs)
    return Figure(share, why=no_json or f"no {window} window in run.json (StepTimingCallback)")


def step_shares(summary: RunSummary, windows: tuple[str, ...], warmup_epochs: int) -> dict[str, float]:
    """Each window's :func:`step_share` (a fraction of the step), for the windows that have one.

    The step decomposition in percent of the step that the report's figure and the end-of-fit summary
    show: per window, the median over measured epochs of (the epoch's window median / its step median).
    The denominator is the statistic of the median-step figure, so 100 % is that step; the shares
    need not sum to exactly 1 (a sum of medians is not the median of the sum).
    """
    shares = {w: step_share(summary, w, warmup_epochs) for w in windows}
    return {w: v for w, v in shares.items() if v is not None}


def samples_per_s(summary: RunSummary, warmup_epochs: int, no_json: str | None = None) -> Figure:
    """Training samples / training seconds, both summed over measured epochs (ThroughputCallback)."""
    epochs: list[ThroughputEpoch] = measured(summary.throughput.epochs, warmup_epochs) if summary.throughput else []
    rows = [e for e in epochs if e.train_s and e.samples]
    if not rows:
        return Figure(None, why=_why_no_epoch(summary.throughput is not None, "throughput", warmup_epochs, no_json))
    total = sum(e.samples for e in rows)
    seconds = sum(e.train_s for e in rows)
    return Figure(total / seconds, note=f"training samples / training seconds over {len(rows)} measured epoch(s)")


def samples_per_s_epoch_clock(summary: RunSummary, warmup_epochs: int, no_json: str | None = None) -> Figure:
    """Training samples / end-to-end epoch seconds (``wall_s``), both summed over measured epochs: the epoch clock.

    Beside :func:`samples_per_s` (the training loop's stretches): this one also holds the DataLoader start-up and
    first fetch, barriers, validation and checkpoint writes of each epoch.
    """
    epochs: list[ThroughputEpoch] = measured(summary.throughput.epochs, warmup_epochs) if summary.throughput else []
    rows = [e for e in epochs if e.wall_s and e.samples]
    if not rows:
        return Figure(None, why=_why_no_epoch(summary.throughput is not None, "throughput", warmup_epochs, no_json))
    return Figure(sum(e.samples for e in rows) / sum(e.wall_s for e in rows),
                  note=f"training samples / end-to-end epoch seconds over {len(rows)} measured epoch(s)")


def epoch_seconds(summary: RunSummary, warmup_epochs: int) -> dict[str, list[float]]:
    """The measured epochs' ``train_s``, ``val_s`` and ``wall_s`` (s), each list in epoch order."""
    epochs: list[ThroughputEpoch] = measured(summary.throughput.epochs, warmup_epochs) if summary.throughput else []
    return {key: [float(getattr(e, key)) for e in epochs if getattr(e, key) is not None]
            for key in ("train_s", "val_s", "wall_s")}


def epoch_time(summary: RunSummary, key: str, warmup_epochs: int, no_json: str | None = None) -> Figure:
    """Median over measured epochs of ``key`` (``train_s``, ``val_s`` or ``wall_s``; s)."""
    values = epoch_seconds(summary, warmup_epochs)[key]
    if not values:
        why = _why_no_epoch(summary.throughput is not None, "throughput", warmup_epochs, no_json)
        return Figure(None, why=why if summary.throughput is None or no_json else f"no {key} in the measured epochs")
    return Figure(median(values), note=f"median of {len(values)} measured epoch(s)")


MIN_POWER_SAMPLES = 60
"""Power readings a sampled-power energy figure needs in a run (MLPerf's power rules: at least 60 per run)."""
MAX_POWER_SAMPLE_PERIOD_S = 1.0
"""Longest period between power readings (s) of a sampled-power energy figure (MLPerf: at least once a second)."""
BOARD_ENERGY = "GPU board energy (NVML): no CPU, memory, network or cooling"
"""What every energy figure is, wherever it is printed."""


def sampled_power_refusal(section: EnergySummary) -> str | None:
    """Why a ``sampled-power`` energy figure is refused (too few readings, too slow), or None when it stands."""
    if section.method != "sampled-power":
        return None
    n, period = section.power_samples, section.power_sample_period_s
    rule = (f"MLPerf's power rules: at least {MIN_POWER_SAMPLES} readings per run, at least one every"
            f" {MAX_POWER_SAMPLE_PERIOD_S:g} s")
    if n is None:
        return f"sampled power without a recorded reading count ({rule})"
    if n < MIN_POWER_SAMPLES:
        return f"sampled power from only {n} readings in the run ({rule})"
    if period is None or period > MAX_POWER_SAMPLE_PERIOD_S:
        return f"sampled power read every {'?' if period is None else format(period, '.2f')} s ({rule})"
    return None


def energy(summary: RunSummary, warmup_epochs: int, no_json: str | None = None) -> tuple[Figure, Figure]:
    """GPU board energy (J) summed over measured epochs and per training sample of those epochs (NVML).

    n/a when not measured, and for a sampled-power figure that fails :func:`sampled_power_refusal`.
    """
    section = summary.energy
    if section is None or not section.available:
        why = no_json or (section.reason if section is not None else None) or "no energy summary in run.json"
        return Figure(None, why=f"not measured: {why}"), Figure(None, why=f"not measured: {why}")
    refused = sampled_power_refusal(section)
    if refused:
        return Figure(None, why=refused), Figure(None, why=refused)
    rows = [e for e in measured(section.epochs or [], warmup_epochs) if e.energy_j is not None]
    if not rows:
        why = f"no measured epoch (epoch index >= {warmup_epochs}) with an energy reading"
        return Figure(None, why=why), Figure(None, why=why)
    joules = sum(e.energy_j for e in rows)
    samples = sum(e.samples for e in rows)
    note = (f"{BOARD_ENERGY}; {section.method} over {len(rows)} measured epoch(s), validation included")
    return Figure(joules, note=note), Figure(joules / samples if samples else None, why="no samples counted",
                                             note=note)


def peak_memory(summary: RunSummary, no_json: str | None = None) -> Figure:
    """Peak allocated GPU memory (GiB) over the run, else the host's peak RSS (CPU runs)."""
    memory = summary.memory
    if memory is not None and memory.peak_allocated_gib is not None:
        return Figure(memory.peak_allocated_gib, note="peak allocated GPU memory (torch.cuda)")
    if memory is not None and memory.host_peak_rss_gib is not None:
        return Figure(memory.host_peak_rss_gib, note="host RSS of the training process (no GPU)")
    return Figure(None, why=no_json or "no memory summary in run.json")


def nonfinite_and_skipped(summary: RunSummary, no_json: str | None = None) -> tuple[Figure, Figure]:
    """Non-finite batches summed over ranks, and skipped steps (the policy's + the GradScaler's)."""
    section = summary.nonfinite
    if section is None:
        why = no_json or "no nonfinite summary in run.json"
        return Figure(None, why=why), Figure(None, why=why)
    ranks = max(1, len(section.per_rank))
    scaler = summary.loss_scale
    scaler_skips = int((scaler.skipped_steps if scaler is not None else 0) or 0)
    in_use = scaler is not None and scaler.scaler_in_use
    note = (f"{section.skipped_steps} by the non-finite policy + {scaler_skips} by the GradScaler" if in_use
            else f"{section.skipped_steps} by the non-finite policy; no GradScaler")
    return (Figure(section.nonfinite_batches, note=f"summed over {ranks} rank(s)"),
            Figure(section.skipped_steps + scaler_skips, note=note))


@dataclass
class Quality:
    """Macro IoU of a run: best value, first epoch reaching it, final value, best-so-far by epoch."""

    best: Figure
    best_epoch: Figure
    final: Figure
    by_epoch: list[tuple[int, float]]


def best_and_final(epochs: Sequence[QualityEpoch], mode: str = "max") -> tuple[float | None, int | None,
                                                                                 float | None, int | None]:
    """``(best, best_epoch, final, final_epoch)`` of a fit's validations, in the order they ran.

    The best is the maximum (``mode="min"``: minimum) of the finite values of the validations whose weights were
    not non-finite (a diverged model's score is no best), its epoch the first that reached it; the final is the
    last validation's value (None when it was not finite) and epoch.
    """
    pick = max if mode == "max" else min
    eligible = [e for e in epochs if e.value is not None and math.isfinite(e.value) and e.weights_finite is not False]
    best = pick(e.value for e in eligible) if eligible else None
    best_epoch = min(e.epoch for e in eligible if e.value == best) if eligible else None
    last = epochs[-1] if epochs else None
    final = last.value if last is not None and last.value is not None and math.isfinite(last.value) else None
    return best, best_epoch, final, (last.epoch if last is not None else None)


def _running_best(series: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    running, by_epoch = -math.inf, []
    for epoch, value in sorted(series):
        running = max(running, value)
        by_epoch.append((epoch, running))
    return by_epoch


def _recorded_quality(record: QualitySummary) -> Quality:
    """:class:`Quality` from ``run.json`` ``summary.quality`` (written by QualityCallback)."""
    if not record.epochs:
        why = ("validation not configured (run.json summary.quality)" if record.validation_configured is False
               else f"no validation ran (run.json summary.quality: {record.validations} validations)")
        return Quality(Figure(None, why=why), Figure(None, why=why), Figure(None, why=why), [])
    nonfinite = "every validation ran on non-finite weights (run.json summary.quality)"
    series = [(e.epoch, e.value) for e in record.epochs
              if e.value is not None and math.isfinite(e.value) and e.weights_finite is not False]
    return Quality(Figure(record.best, why=nonfinite), Figure(record.best_epoch, why=nonfinite),
                   Figure(record.final, why="the last validation's value is not finite"), _running_best(series))


def quality(summary: RunSummary, scalars: Scalars, events_problem: str | None = None) -> Quality:
    """Best, best epoch and final macro IoU, and the running best by epoch.

    From ``run.json`` ``summary.quality`` where the run recorded it (a damaged or missing events file then costs
    nothing but the charts); else from TensorBoard ``val/mIoU``, whose absence is said: ``events_problem`` (the
    events file that could not be read), else "validation did not run".
    """
    if summary.quality is not None:
        return _recorded_quality(summary.quality)
    series = epoch_series(scalars, "val/mIoU")
    if not series:
        why = events_problem or "no val/mIoU in the TensorBoard events (validation did not run)"
        return Quality(Figure(None, why=why), Figure(None, why=why), Figure(None, why=why), [])
    best = max(v for _, v in series)
    best_epoch = min(ep for ep, v in series if v == best)
    final = scalars["val/mIoU"][-1][1]  # by wall time
    return Quality(Figure(best), Figure(int(best_epoch)), Figure(final), _running_best(series))


def updates_per_epoch(run_json: RunJson | None) -> float | None:
    """Optimizer updates per epoch: ``global_step / trainer.max_epochs`` (None when not recorded)."""
    if run_json is None or run_json.global_step is None:
        return None
    max_epochs = run_json.trainer.get("max_epochs")
    return run_json.global_step / max_epochs if max_epochs else None


DIVERGENCE_WINDOW = 3
"""Logged training losses that must all be non-finite, at the end of the logged series, for a run to have diverged."""


@dataclass
class LossTail:
    """What the divergence rule needs of a logged loss series, kept up to date one loss at a time.

    Attributes:
        logged: losses logged so far.
        trailing: non-finite losses at the end of the series (0 when the last one is finite).
        trailing_first: the step of the first of those (None when ``trailing`` is 0).
        last_step: the step of the last logged loss.
        last_finite_step: the step of the last finite loss (None when none was finite).
    """

    logged: int = 0
    trailing: int = 0
    trailing_first: int | None = None
    last_step: int | None = None
    last_finite_step: int | None = None

    def add(self, step: int, value: float) -> None:
        """Count the loss ``value`` logged at ``step``."""
        self.logged += 1
        self.last_step = int(step)
        if math.isfinite(value):
            self.trailing, self.trailing_first, self.last_finite_step = 0, None, int(step)
        else:
            self.trailing += 1
            if self.trailing == 1:
                self.trailing_first = int(step)


@dataclass(frozen=True)
class Divergence:
    """The verdict of :func:`divergence` on a run's logged training loss.

    Attributes:
        diverged: True (diverged), False (it did not), None (no training loss logged: cannot tell).
        why: one sentence that says which losses the verdict rests on.
        trailing: non-finite logged losses at the end of the series.
        since_step: the step of the first of them (None when the last loss is finite).
        last_finite_step: the step of the last finite logged loss (None when there is none).
    """

    diverged: bool | None
    why: str
    trailing: int = 0
    since_step: int | None = None
    last_finite_step: int | None = None


def divergence(losses: Sequence[tuple[int, float]], window: int = DIVERGENCE_WINDOW,
               tag: str = "train/loss_step") -> Divergence:
    """Whether a run diverged: its last ``window`` logged training losses are all non-finite (NaN or inf).

    A run that logged fewer than ``window`` losses diverged when every one of them is non-finite. One
    non-finite batch in a finite series (bad data, an AMP overflow) is no divergence; a loss that stays
    non-finite to the end is. :class:`~cropscale.callbacks.DivergenceCallback` applies this rule online
    (through :func:`divergence_of_tail`) to stop such a run; the report and the end-of-fit summary apply
    it to the TensorBoard series.

    Args:
        losses: ``[(step, loss)]`` in logging order (e.g. TensorBoard ``train/loss_step``).
        window: how many trailing logged losses must be non-finite (>= 1).
        tag: the name of the series, for the sentence.

    Raises:
        CropScaleError: ``window < 1``.
    """
    tail = LossTail()
    for step, value in losses:
        tail.add(step, value)
    return divergence_of_tail(tail, window, tag)


def divergence_of_tail(tail: LossTail, window: int = DIVERGENCE_WINDOW, tag: str = "train/loss_step") -> Divergence:
    """The rule of :func:`divergence` on a :class:`LossTail` (the series it was built from need not be kept).

    Raises:
        CropScaleError: ``window < 1``.
    """
    if window < 1:
        raise CropScaleError(f"divergence window must be >= 1 logged losses, got {window}")
    if not tail.logged:
        return Divergence(None, f"no {tag} logged: divergence cannot be judged")
    facts = {"trailing": tail.trailing, "since_step": tail.trailing_first, "last_finite_step": tail.last_finite_step}
    if tail.trailing == 0:
        return Divergence(False, f"the last logged {tag} is finite", **facts)
    if tail.trailing < min(window, tail.logged):
        return Divergence(False, f"{tag} non-finite at the last {tail.trailing} logged step(s), fewer than the "
                                 f"{window} that make a divergence", **facts)
    where = (f"step {tail.last_step}" if tail.trailing == 1
             else f"steps {tail.trailing_first}-{tail.last_step}")
    since = (f"last finite at step {tail.last_finite_step}" if tail.last_finite_step is not None
             else "never finite")
    return Divergence(True, f"{tag} non-finite at the last {tail.trailing} logged step(s) ({where}; {since})", **facts)


MAX_SKIPPED_SHARE = 0.5
"""A run with more than this share of its optimizer steps skipped (GradScaler and policy skips) did not train.

A healthy ``16-mixed`` run skips only the steps its GradScaler needs to find its scale (a handful from the
default initial scale 65,536, then one per back-off); more than half skipped means the model learned from
fewer steps than it was given."""
NOT_TRAINED = "not-trained"
"""``run.json`` status of a fit that ran to its end but did not train (:func:`trained`); it forms no pair."""


@dataclass(frozen=True)
class Trained:
    """The verdict of :func:`trained` on a finished fit.

    Attributes:
        trained: True, False (the run did not train), None (nothing recorded to judge by).
        why: one sentence with the counts the verdict rests on.
        optimizer_steps, skipped_steps: the counts (None when not recorded).
        weights_changed: from ``summary.trained`` (None when not recorded).
    """

    trained: bool | None
    why: str
    optimizer_steps: int | None = None
    skipped_steps: int | None = None
    weights_changed: bool | None = None


def trained(summary: RunSummary, global_step: int | None = None,
            max_skipped_share: float = MAX_SKIPPED_SHARE) -> Trained:
    """Whether a fit trained: no more than ``max_skipped_share`` of its optimizer steps skipped and some weight changed.

    Skipped steps are the GradScaler's (``summary.loss_scale.skipped_steps``) plus the non-finite policy's
    (``summary.nonfinite``); optimizer steps are ``summary.trained.optimizer_steps``, else the loss-scale
    callback's ``steps``, else ``global_step`` (Lightning counts skipped steps as steps).

    Args:
        summary: ``run.json["summary"]``.
        global_step: ``run.json["global_step"]``.
        max_skipped_share: the share of skipped steps above which the run did not train (0..1).
    """
    record = summary.trained
    changed = record.weights_changed if record is not None else None
    steps = record.optimizer_steps if record is not None and record.optimizer_steps is not None else None
    scale = summary.loss_scale
    if steps is None and scale is not None and scale.steps is not None:
        steps = scale.steps
    if steps is None:
        steps = global_step
    skipped = None
    if scale is not None and scale.skipped_steps is not None:
        skipped = scale.skipped_steps
    if summary.nonfinite is not None:
        skipped = (skipped or 0) + summary.nonfinite.skipped_steps
    facts = {"optimizer_steps": steps, "skipped_steps": skipped, "weights_changed": changed}
    counts = (f"{skipped} of {steps} optimizer steps skipped" if skipped is not None and steps is not None
              else "skipped steps not recorded")
    if changed is False:
        if steps is None:
            return Trained(False, f"no weight changed (optimizer steps not recorded; {counts})", **facts)
        return Trained(False, f"no weight changed over {steps} optimizer step(s) ({counts})", **facts)
    if skipped is not None and steps and skipped > max_skipped_share * steps:
        return Trained(False, f"{counts}, more than {max_skipped_share:.0%}", **facts)
    if changed is None and (skipped is None or not steps):
        return Trained(None, f"cannot tell whether the run trained ({counts}; weight change not recorded)", **facts)
    return Trained(True, f"{counts}" + ("; the weights changed" if changed else ""), **facts)
