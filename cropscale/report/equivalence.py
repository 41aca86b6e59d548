"""Comparisons that carry their uncertainty: quality equivalence over seeds, speed-up intervals, time to a target.

Layer 1 (numpy, scipy): the statistics the report and the study share, fed plain numbers or run records.

**Quality** (:func:`difference_interval`, :func:`quality_verdict`): the difference ``other - base`` of a
macro IoU (0..1) over the seeds of two configurations, with a two-sided ``confidence`` t-interval from
scipy: *paired* by seed (``scipy.stats.ttest_rel``) when both sides ran the same seeds (at least 2), else
*Welch* (``scipy.stats.ttest_ind(equal_var=False)``, at least 2 seeds per side). A t-interval, not a
bootstrap: with the 2 to 5 seeds a study affords, a bootstrap resamples from at most a handful of distinct
means and its percentile interval is too narrow (2 seeds: 3 distinct resampled means), while the t-interval
widens with the few degrees of freedom as it should (exact for normal seed-to-seed noise). Identical values
on both sides give the degenerate interval ``[d, d]`` (no spread, nothing to widen).

The verdict against the equivalence margin ``m`` (:data:`DEFAULT_MARGIN`, absolute macro IoU):
``equivalent`` when the interval lies within ``[-m, +m]`` (two one-sided tests at the same level),
``worse`` when it lies below ``-m``, ``better`` when above ``+m``, else ``inconclusive`` with the seeds per
side that would make the interval decide (:func:`seeds_needed`, at the observed spread). One seed on a side:
``inconclusive``, never a verdict.

**Speed** (:func:`ratio_interval`): the speed-up ``Q_other / Q_base`` of training samples/s with a
t-interval of the mean log rate difference (Welch) over the repeats, the measured epochs of every seed's run
(each epoch's samples / training seconds), exponentiated: a geometric-mean ratio; its interval may include 1,
and :func:`format_ratio` says so.

**Time to quality** (:func:`time_to_target`): wall time, optimizer steps, samples and GPU joules since fit
start until the best-so-far validation macro IoU first reaches a target (default
:data:`cropscale.numbers.TARGET_FRACTION` of
the baseline configuration's mean best macro IoU), or "not reached".

Every figure here is ``measured-run``: intervals and differences of measured runs
(:func:`cropscale.evidence.derived_label`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from cropscale.errors import CropScaleError
from cropscale.evidence import MEASURED_RUN
from cropscale.numbers import TARGET_FRACTION
from cropscale.report.tables import TableRow
from cropscale.runs.record import RunRecord
from cropscale.runs.rules import Figure
from cropscale.runs.tensorboard import epoch_series, load_scalars

DEFAULT_MARGIN = 0.02
"""Equivalence margin of macro IoU (absolute, 0..1): 2 points, about the seed spread of a 2-seed CPU run."""
CONFIDENCE = 0.95
"""Two-sided confidence level of every interval."""
NO_SPREAD = 1e-12
"""Values closer than this (IoU, log rate) count as equal: a degenerate interval instead of scipy's nan."""
MAX_SEEDS = 1000
"""Above this many seeds per side :func:`seeds_needed` gives up (``None``)."""

EQUIVALENT, WORSE, BETTER, INCONCLUSIVE = "equivalent", "worse", "better", "inconclusive"
"""The verdicts."""


@dataclass
class Interval:
    """An estimate with its two-sided interval.

    Attributes:
        estimate: the difference (or ratio) estimated; None when there is none (``why`` says so).
        low, high: the interval; None when it cannot be given (fewer than 2 values on a side).
        method: ``paired t``, ``Welch t`` or ``Welch t on log rates``, with the degrees of freedom.
        n_base, n_other: values on each side (seeds, or epochs x seeds).
        spread: the standard deviation the interval came from (of the paired differences, or pooled), or None.
        why: why ``low`` / ``high`` are None.
    """

    estimate: float | None
    low: float | None = None
    high: float | None = None
    method: str = ""
    n_base: int = 0
    n_other: int = 0
    spread: float | None = None
    paired: bool = False
    why: str | None = None

    def includes(self, value: float) -> bool | None:
        """True when ``value`` lies in ``[low, high]``; None without an interval."""
        if self.low is None or self.high is None:
            return None
        return self.low <= value <= self.high


def _check_level(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise CropScaleError(f"confidence must lie in (0, 1), got {confidence!r}")
    return float(confidence)


def _finite(values: Sequence[float | None]) -> np.ndarray:
    return np.array([float(v) for v in values if v is not None and math.isfinite(float(v))], dtype=float)


def difference_interval(base: Mapping[object, float | None], other: Mapping[object, float | None],
                        confidence: float = CONFIDENCE) -> Interval:
    """``mean(other) - mean(base)`` with its t-interval; ``base`` / ``other``: seed -> value (e.g. best macro IoU).

    Paired by seed (``scipy.stats.ttest_rel``) when both sides hold the same seeds, at least 2; otherwise Welch
    (``scipy.stats.ttest_ind(equal_var=False)``) over the finite values of each side.

    Raises:
        CropScaleError: a confidence outside (0, 1).
    """
    level = _check_level(confidence)
    a_map = {k: float(v) for k, v in base.items() if v is not None and math.isfinite(float(v))}
    b_map = {k: float(v) for k, v in other.items() if v is not None and math.isfinite(float(v))}
    a, b = np.array(list(a_map.values())), np.array(list(b_map.values()))
    if not len(a) or not len(b):
        return Interval(None, n_base=len(a), n_other=len(b), why="no value on one side")
    estimate = float(b.mean() - a.mean())
    if set(a_map) == set(b_map) and len(a_map) >= 2:
        seeds = sorted(a_map, key=str)
        x, y = np.array([a_map[s] for s in seeds]), np.array([b_map[s] for s in seeds])
        d = y - x
        method = f"paired t over {len(d)} seeds (df {len(d) - 1})"
        spread = float(d.std(ddof=1))
        if np.ptp(d) < NO_SPREAD:
            return Interval(estimate, estimate, estimate, method + ", no spread", len(x), len(y), 0.0, True)
        ci = stats.ttest_rel(y, x).confidence_interval(level)
        return Interval(estimate, float(ci.low), float(ci.high), method, len(x), len(y), spread, True)
    if len(a) < 2 or len(b) < 2:
        return Interval(estimate, n_base=len(a), n_other=len(b), method="none",
                        why=f"{min(len(a), len(b))} seed on a side: no spread to form an interval")
    spread = float(math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2.0))
    if np.ptp(a) < NO_SPREAD and np.ptp(b) < NO_SPREAD:
        return Interval(estimate, estimate, estimate, "Welch t, no spread", len(a), len(b), 0.0)
    result = stats.ttest_ind(b, a, equal_var=False)
    ci = result.confidence_interval(level)
    return Interval(estimate, float(ci.low), float(ci.high), f"Welch t (df {float(result.df):.1f})", len(a),
                    len(b), spread)


def seeds_needed(spread: float | None, estimate: float, margin: float, paired: bool,
                 confidence: float = CONFIDENCE, start: int = 2) -> int | None:
    """Seeds per side for which the t-interval at the observed ``spread`` would decide against ``margin``.

    The half-width must fall below ``| |estimate| - margin |``: ``t_{k-1} s / sqrt(k)`` (paired, ``s`` the sd
    of the differences) or ``t_{2k-2} s sqrt(2 / k)`` (Welch with ``k`` per side, ``s`` the pooled sd).
    None when it cannot be said (no spread known, the estimate on the margin, more than :data:`MAX_SEEDS`).
    """
    room = abs(abs(estimate) - margin)
    if spread is None or spread <= 0 or room <= 0:
        return None
    q = 0.5 + _check_level(confidence) / 2
    for k in range(max(2, start), MAX_SEEDS + 1):
        half = (stats.t.ppf(q, k - 1) * spread / math.sqrt(k) if paired
                else stats.t.ppf(q, 2 * k - 2) * spread * math.sqrt(2.0 / k))
        if half < room:
            return k
    return None


@dataclass
class QualityVerdict:
    """A quality comparison: the difference, its interval, the margin and the verdict.

    Attributes:
        figure: what was compared (``best macro IoU`` ...).
        interval: :class:`Interval` of ``other - base``.
        margin: the equivalence margin (absolute macro IoU).
        verdict: ``equivalent | worse | better | inconclusive``.
        seeds_needed: for ``inconclusive``, the seeds per side that would decide at the observed spread.
        reason: why inconclusive.
    """

    figure: str
    interval: Interval
    margin: float
    verdict: str
    seeds_needed: int | None = None
    reason: str | None = None

    def text(self) -> str:
        """E.g. ``equivalent (+0.0040, 95 % CI -0.0110..+0.0190, margin 0.02, paired t over 3 seeds (df 2))``."""
        i = self.interval
        if i.estimate is None:
            return f"{INCONCLUSIVE}: {i.why}"
        ci = (f"{100 * CONFIDENCE:g} % CI {i.low:+.4f}..{i.high:+.4f}" if i.low is not None
              else f"no CI: {i.why}")
        head = self.verdict
        if self.verdict == INCONCLUSIVE:
            more = (f"about {self.seeds_needed} per side" if self.seeds_needed is not None
                    else "at least 2 per side" if i.low is None else "many more")
            head = f"inconclusive (need more seeds: {more})"
        detail = f", {i.method}" if i.low is not None else ""
        return f"{head} ({i.estimate:+.4f}, {ci}, margin {self.margin:g}{detail})"


def quality_verdict(base: Mapping[object, float | None], other: Mapping[object, float | None],
                    margin: float = DEFAULT_MARGIN, figure: str = "best macro IoU",
                    confidence: float = CONFIDENCE) -> QualityVerdict:
    """The verdict of ``other`` against ``base`` (seed -> macro IoU) at the equivalence ``margin``.

    ``equivalent``: the interval within ``[-margin, +margin]``; ``worse``: entirely below ``-margin``;
    ``better``: entirely above ``+margin``; ``inconclusive``: anything else, and always with one seed on a side.

    Raises:
        CropScaleError: a negative or non-finite margin, a confidence outside (0, 1).
    """
    if not math.isfinite(margin) or margin < 0:
        raise CropScaleError(f"equivalence margin must be a finite macro IoU >= 0, got {margin!r}")
    interval = difference_interval(base, other, confidence)
    if interval.low is None or interval.high is None:
        return QualityVerdict(figure, interval, margin, INCONCLUSIVE, None, interval.why)
    if interval.high < -margin:
        verdict = WORSE
    elif interval.low > margin:
        verdict = BETTER
    elif -margin <= interval.low and interval.high <= margin:
        verdict = EQUIVALENT
    else:
        k = seeds_needed(interval.spread, interval.estimate, margin, interval.paired, confidence,
                         start=max(interval.n_base, interval.n_other) + 1)
        return QualityVerdict(figure, interval, margin, INCONCLUSIVE, k, "the interval crosses the margin")
    return QualityVerdict(figure, interval, margin, verdict)


# ------------------------------------------------------------------------------------------- speed
def ratio_interval(base_rates: Sequence[float | None], other_rates: Sequence[float | None],
                   confidence: float = CONFIDENCE) -> Interval:
    """Speed-up ``other / base`` of rates (samples/s) with a Welch t-interval of the mean log difference.

    ``estimate = exp(mean log other - mean log base)`` (the geometric-mean ratio); the interval is the
    exponentiated ``scipy.stats.ttest_ind(log other, log base, equal_var=False)`` interval. Non-positive and
    non-finite rates are dropped. Fewer than 2 rates on a side: the estimate without an interval.
    """
    level = _check_level(confidence)
    a, b = _finite(base_rates), _finite(other_rates)
    a, b = np.log(a[a > 0]), np.log(b[b > 0])
    if not len(a) or not len(b):
        return Interval(None, n_base=len(a), n_other=len(b), why="no rate on one side")
    estimate = float(math.exp(b.mean() - a.mean()))
    if len(a) < 2 or len(b) < 2:
        return Interval(estimate, n_base=len(a), n_other=len(b), method="none",
                        why="one measured epoch of one run on a side: no dispersion")
    if np.ptp(a) < NO_SPREAD and np.ptp(b) < NO_SPREAD:  # equal up to rounding: scipy would warn and say nan
        return Interval(estimate, estimate, estimate, "no spread", len(a), len(b), 0.0)
    result = stats.ttest_ind(b, a, equal_var=False)
    ci = result.confidence_interval(level)
    return Interval(estimate, float(math.exp(ci.low)), float(math.exp(ci.high)),
                    f"Welch t on log rates (df {float(result.df):.1f})", len(a), len(b))


def mean_interval(values: Sequence[float | None], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The t-interval of the mean of ``values`` (at least 2 finite values; equal values give ``(v, v)``)."""
    x = _finite(values)
    if len(x) < 2:
        raise CropScaleError(f"an interval of the mean needs at least 2 values, got {len(x)}")
    if x.std() == 0.0:
        return float(x[0]), float(x[0])
    ci = stats.ttest_1samp(x, 0.0).confidence_interval(_check_level(confidence))
    return float(ci.low), float(ci.high)


def scaled(interval: Interval, factor: float) -> Interval:
    """``interval`` with estimate and bounds multiplied by ``factor`` (efficiency = speed-up / N)."""
    mul = (lambda v: None if v is None else v * factor)  # noqa: E731
    return Interval(mul(interval.estimate), mul(interval.low), mul(interval.high), interval.method,
                    interval.n_base, interval.n_other, interval.spread, interval.paired, interval.why)


def format_ratio(interval: Interval, what: str = "samples/s") -> str:
    """E.g. ``1.41x samples/s (1.36..1.46)``; ``(0.95..1.08, includes 1)``; ``(no interval: ...)``."""
    if interval.estimate is None:
        return f"speed-up n/a ({interval.why})"
    head = f"{interval.estimate:.2f}x {what}"
    if interval.low is None:
        return f"{head} (no interval: {interval.why})"
    inside = ", includes 1: no speed-up shown" if interval.includes(1.0) else ""
    return f"{head} ({interval.low:.2f}..{interval.high:.2f}{inside})"


def epoch_rates(record: RunRecord) -> list[float]:
    """Training samples/s of each measured epoch of a run (samples / training seconds), the repeats of speed."""
    if record.run_json is None or record.run_json.summary.throughput is None:
        return []
    epochs = record.run_json.summary.throughput.epochs
    return [e.samples / e.train_s for e in epochs if e.epoch >= record.warmup_epochs and e.train_s and e.samples]


# ---------------------------------------------------------------------------------- time to target
@dataclass
class ToTarget:
    """Cost since fit start until the best-so-far validation macro IoU first reached ``target``.

    Attributes:
        target: macro IoU (0..1).
        reached: False = "not reached" within the run (the other figures None).
        epoch: the epoch whose validation first reached it.
        seconds: end-to-end wall time of the epochs up to it (training + validation, s).
        steps: optimizer updates up to it; samples: training samples up to it.
        joules: GPU board energy up to it (NVML; None off a GPU).
        why: why a figure is None.
    """

    target: float
    reached: bool
    epoch: int | None = None
    seconds: float | None = None
    steps: float | None = None
    samples: int | None = None
    joules: float | None = None
    why: str | None = None


def time_to_target(record: RunRecord, target: float) -> ToTarget:
    """:class:`ToTarget` of one run from its TensorBoard ``val/mIoU`` and ``run.json`` per-epoch records."""
    reached = next((ep for ep, best in record.iou_by_epoch if best >= target), None)
    if reached is None:
        why = "not reached" if record.iou_by_epoch else "no val/mIoU in the TensorBoard events"
        return ToTarget(target, False, why=why)
    out = ToTarget(target, True, epoch=reached)
    tp = record.run_json.summary.throughput if record.run_json is not None else None
    upto = [e for e in tp.epochs if e.epoch <= reached] if tp is not None else []
    if len(upto) != reached + 1 or any(e.wall_s is None for e in upto):
        out.why = "run.json lacks the per-epoch wall times up to that epoch"
        return out
    out.seconds = float(sum(e.wall_s for e in upto))
    out.samples = int(sum(e.samples for e in upto))
    if record.updates_per_epoch is not None:
        out.steps = record.updates_per_epoch * (reached + 1)
    energy = record.run_json.summary.energy
    rows = [e for e in (energy.epochs or []) if e.epoch <= reached] if energy is not None and energy.available else []
    if len(rows) == reached + 1 and all(e.energy_j is not None for e in rows):
        out.joules = float(sum(e.energy_j for e in rows))
    else:
        out.why = "joules: no NVML energy reading (not a GPU run)" if not rows else "joules: an epoch lacks energy"
    return out


def class_final_iou(record: RunRecord) -> dict[str, float]:
    """Final validation IoU per class, ``val_class/IoU_<index>_<name>`` -> value (TensorBoard)."""
    tags = [t for t in record.scalar_tags if t.startswith("val_class/IoU_")]
    if not tags or record.kind != "run":
        return {}
    scalars = load_scalars(record.path)
    out = {}
    for tag in tags:
        series = epoch_series(scalars, tag)
        if series:
            out[tag.removeprefix("val_class/IoU_")] = float(max(series)[1])  # the last epoch's value
    return out


# ---------------------------------------------------------------------------------- a comparison
@dataclass
class Comparison:
    """Two configurations compared over their seeds: quality verdicts, speed-up interval, time to a target.

    Attributes:
        kind: ``precision``, ``devices`` or ``global batch``; label: e.g. ``AMP BF16 vs FP32``.
        base, other: the configurations' display labels; base_runs / other_runs: the run names.
        best, final: :class:`QualityVerdict` of best and final macro IoU.
        classes: verdicts of the classes whose final IoU moves by more than the margin.
        speedup, efficiency: :class:`Interval` (efficiency = speed-up / N for a device comparison, else None).
        target: the macro IoU target; time_ratio: median time to target other / base (None: not reached).
        to_target_base / to_target_other: per run.
    """

    kind: str
    label: str
    base: str
    other: str
    base_runs: list[str]
    other_runs: list[str]
    best: QualityVerdict
    final: QualityVerdict
    speedup: Interval
    devices: int = 1
    efficiency: Interval | None = None
    classes: list[tuple[str, QualityVerdict]] = field(default_factory=list)
    target: float | None = None
    target_fraction: float = TARGET_FRACTION
    time_ratio: float | None = None
    to_target_base: list[ToTarget] = field(default_factory=list)
    to_target_other: list[ToTarget] = field(default_factory=list)

    def time_text(self) -> str:
        """E.g. ``0.70x time to 0.95 of FP32's best`` or ``time to 0.95 of FP32's best: not reached by ...``."""
        what = f"time to {self.target_fraction:g} of {self.base}'s best"
        if self.target is None:
            return f"{what}: n/a (no best macro IoU of the base)"
        missing = [side for side, runs in (("base", self.to_target_base), ("other", self.to_target_other))
                   if not any(t.reached and t.seconds is not None for t in runs)]
        if missing:
            return f"{what} ({self.target:.4f}): not reached by {' and '.join(missing)}"
        return f"{self.time_ratio:.2f}x {what} ({self.target:.4f})"

    def target_detail(self) -> str:
        """Median time, optimizer steps, samples and GPU joules to the target per side, or "not reached"."""
        def side(name: str, runs: Sequence[ToTarget]) -> str:
            hit = [t for t in runs if t.reached and t.seconds is not None]
            if not hit:
                return f"{name}: not reached ({len(runs)} run(s))"
            parts = [f"{_median([t.seconds for t in hit]):.1f} s"]
            steps = [t.steps for t in hit if t.steps is not None]
            parts += [f"{_median(steps):g} steps"] if steps else []
            parts.append(f"{_median([float(t.samples) for t in hit]):g} samples")
            joules = [t.joules for t in hit if t.joules is not None]
            parts.append(f"{_median(joules):.0f} J" if joules else "J n/a (no GPU energy)")
            return f"{name}: " + ", ".join(parts) + f" (median of {len(hit)} of {len(runs)} run(s) reaching it)"
        if self.target is None:
            return "no target: the base has no best macro IoU"
        return (f"target macro IoU {self.target:.4f}; " + side(self.base, self.to_target_base) + "; "
                + side(self.other, self.to_target_other))

    def line(self) -> str:
        """The verdict line, e.g. ``AMP BF16 vs FP32: equivalent quality (+0.004, ...), 1.41x samples/s (...), ...``."""
        q = self.best.text()
        q = q.replace(self.best.verdict, f"{self.best.verdict} quality", 1) if self.best.verdict != INCONCLUSIVE \
            else "quality " + q
        eff = ""
        if self.efficiency is not None and self.efficiency.estimate is not None:
            e = self.efficiency
            eff = (f", efficiency {e.estimate:.2f}" + (f" ({e.low:.2f}..{e.high:.2f})" if e.low is not None else ""))
        return f"{self.label}: {q}, {format_ratio(self.speedup)}{eff}, {self.time_text()}"


def _median(values: Sequence[float]) -> float | None:
    return float(np.median(values)) if values else None


def compare_runs(kind: str, base_label: str, other_label: str, base: Sequence[tuple[object, RunRecord]],
                 other: Sequence[tuple[object, RunRecord]], margin: float = DEFAULT_MARGIN,
                 target_fraction: float = TARGET_FRACTION, devices: int = 1) -> Comparison:
    """Compare two configurations given as ``(seed, run)`` lists (seeds may be None: Welch then).

    Raises:
        CropScaleError: a margin or target fraction out of range.
    """
    if not 0.0 < target_fraction <= 1.0:
        raise CropScaleError(f"target fraction must lie in (0, 1], got {target_fraction!r}")

    def by_seed(side, key):
        return {(s if s is not None else f"run{i}"): r.value(key) for i, (s, r) in enumerate(side)}

    best = quality_verdict(by_seed(base, "best_miou"), by_seed(other, "best_miou"), margin)
    final = quality_verdict(by_seed(base, "final_miou"), by_seed(other, "final_miou"), margin, "final macro IoU")
    speed = ratio_interval([q for _, r in base for q in epoch_rates(r)], [q for _, r in other for q in epoch_rates(r)])
    out = Comparison(kind, f"{other_label} vs {base_label}", base_label, other_label, [r.name for _, r in base],
                     [r.name for _, r in other], best, final, speed, devices, target_fraction=target_fraction)
    if devices > 1:
        out.efficiency = scaled(speed, 1.0 / devices)
    base_classes = [(s, class_final_iou(r)) for s, r in base]
    other_classes = [(s, class_final_iou(r)) for s, r in other]
    names = sorted({c for _, d in base_classes for c in d} & {c for _, d in other_classes for c in d})
    for c in names:
        v = quality_verdict({s: d.get(c) for s, d in base_classes}, {s: d.get(c) for s, d in other_classes}, margin,
                            f"final IoU of class {c}")
        if v.interval.estimate is not None and abs(v.interval.estimate) > margin:
            out.classes.append((c, v))
    best_base = [r.value("best_miou") for _, r in base if r.value("best_miou") is not None]
    if best_base:
        out.target = target_fraction * float(np.mean(best_base))
        out.to_target_base = [time_to_target(r, out.target) for _, r in base]
        out.to_target_other = [time_to_target(r, out.target) for _, r in other]
        tb = _median([t.seconds for t in out.to_target_base if t.reached and t.seconds is not None])
        to = _median([t.seconds for t in out.to_target_other if t.reached and t.seconds is not None])
        if tb and to is not None:
            out.time_ratio = to / tb
    return out


# ------------------------------------------------------------------------------------ the table
def _ci(i: Interval, fmt: str) -> str:
    if i.low is None:
        return f"n/a ({i.why})"
    return f"{format(i.low, fmt)}..{format(i.high, fmt)}"


def verdict_row(c: Comparison) -> TableRow:
    """One row of the verdict table (:data:`cropscale.runs.figures.VERDICTS`) of a comparison.

    Every figure ``measured-run``; the speed-up is ``speedup_vs_base`` (the comparison's base configuration).
    """
    speed_ci = _ci(c.speedup, ".2f") + (" (includes 1)" if c.speedup.includes(1.0) else "")
    values = {
        "label": c.label, "compared": c.kind, "seeds": f"{c.best.interval.n_base} / {c.best.interval.n_other}",
        "best_ci": _ci(c.best.interval, "+.4f"), "best_verdict": c.best.text().split(" (")[0],
        "final_verdict": c.final.text().split(" (")[0], "speedup_vs_base_ci": speed_ci,
        "classes": "; ".join(f"{name}: {v.interval.estimate:+.3f} {v.text().split(' (')[0]}" for name, v in c.classes)
        or "none",
    }
    eff = (Figure(c.efficiency.estimate, MEASURED_RUN, note=f"speed-up / {c.devices} devices")
           if c.efficiency is not None else Figure(None, MEASURED_RUN, "not a device comparison"))
    figures = {
        "best_diff": Figure(c.best.interval.estimate, MEASURED_RUN, c.best.interval.why,
                            note=f"{c.best.interval.method}; margin {c.best.margin:g}"),
        "final_diff": Figure(c.final.interval.estimate, MEASURED_RUN, c.final.interval.why),
        "speedup_vs_base": Figure(c.speedup.estimate, MEASURED_RUN, c.speedup.why,
                          note="geometric-mean ratio of per-epoch training samples/s (epochs x seeds)"),
        "efficiency": eff,
        "time_ratio": Figure(c.time_ratio, MEASURED_RUN, f"{c.time_text()}; {c.target_detail()}",
                             note=f"{c.time_text()}; {c.target_detail()}"),
    }
    return TableRow(values=values, figures=figures, evidence=MEASURED_RUN)


def verdict_intro(margin: float, target_fraction: float) -> str:
    """The paragraph above a verdict table: the methods, the margin, the target."""
    return (f"Quality: best (and final) validation macro IoU of the other configuration minus the base, over seeds;"
            f" {100 * CONFIDENCE:g} % t-interval, paired by seed when both ran the same seeds, Welch otherwise"
            f" (a bootstrap is too narrow with 2-5 seeds). Equivalence margin {margin:g} macro IoU: equivalent ="
            " the interval within +-margin, worse / better = entirely beyond it, else inconclusive with the seeds"
            " per side that would decide at the observed spread; one seed on a side is always inconclusive."
            " Speed-up: geometric-mean ratio of per-epoch training samples/s (measured epochs x seeds) with a"
            " Welch t-interval on log rates; an interval that includes 1 shows no speed-up. Time to target:"
            f" median end-to-end wall time until the best-so-far macro IoU first reached {target_fraction:g} x the"
            " base's mean best, other over base.")
