"""Comparisons that carry their uncertainty: the one decision rule, quality differences over seeds, speed-ups over runs.

Layer 5 (numpy, scipy): the statistics the report and the study share, fed plain numbers or run records. Every verdict
of the package comes from :func:`decide` (quality in the report and the study, the batch sweep's "holds to G").

**The level.** Every verdict is a one-sided test at :data:`ALPHA` = 0.05, read off one two-sided
:data:`CONFIDENCE` = 90 % t-interval (``1 - 2 alpha``): ``equivalent`` is two one-sided tests (TOST, Schuirmann 1987)
at alpha = 0.05, i.e. the 90 % interval inside ``(-m, +m)``; ``worse`` / ``better`` is the one-sided test at alpha =
0.05 that the difference lies beyond ``-m`` / ``+m``, i.e. the 90 % interval entirely beyond it. The boundaries are
strict: an interval that touches the margin decides nothing (the test's p-value is then exactly alpha).

**Quality** (:func:`difference_interval`, :func:`quality_verdict`): the difference ``other - base`` of a macro IoU
(0..1) over the seeds of two configurations: *paired* by seed (``scipy.stats.ttest_rel``) when both sides ran the same
seeds (at least 2), else *Welch* (``scipy.stats.ttest_ind(equal_var=False)``, at least 2 seeds per side; never
Student's pooled variance, which is wrong when seed counts and spreads differ). A t-interval, not a bootstrap: with
the 2 to 5 seeds a study affords a bootstrap resamples a handful of distinct means and its interval is too narrow.
Zero observed spread (identical differences, or identical values on both sides) gives **no** interval: zero spread in
``k`` seeds is not zero spread, so the verdict is ``inconclusive`` ("no spread observed in k seeds"). One seed on a
side: ``inconclusive``. An inconclusive verdict names the seeds per side that would decide at the observed spread
(:func:`seeds_needed`).

**Speed** (:func:`ratio_interval`, :func:`run_rate`): the run is the unit. Each run's rate is the geometric mean of
its measured epochs' training-loop samples/s; the speed-up ``other / base`` is the ratio of the geometric means over
runs, with the exponentiated Welch t-interval of the mean log rate difference over runs. Epochs of one run share the
machine's state, so pooling them as repeats would make the interval too narrow (pseudo-replication); their spread is
reported beside it as the *within-run epoch spread* (:func:`run_rate`). One run on a side: no interval ("one run").

Every figure here is ``measured-run``: intervals and differences of measured runs
(:func:`cropscale.evidence.derived_label`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from cropscale.errors import CropScaleError
from cropscale.runs.record import RunRecord

DEFAULT_MARGIN = 0.02
"""Equivalence margin of macro IoU (absolute, 0..1): 2 points, about the seed spread of a 2-seed CPU run."""
ALPHA = 0.05
"""Level of every one-sided test behind a verdict (TOST for ``equivalent``, one test for ``worse`` / ``better``)."""
CONFIDENCE = 1.0 - 2.0 * ALPHA
"""Two-sided level of the interval a verdict is read from: 0.90 (a one-sided bound at 1 - alpha on each end)."""
NO_SPREAD = 1e-12
"""Values closer than this (IoU, log rate) count as equal: no spread observed, no interval."""
MAX_SEEDS = 1000
"""Above this many seeds per side :func:`seeds_needed` gives up (``None``)."""

EQUIVALENT, WORSE, BETTER, INCONCLUSIVE = "equivalent", "worse", "better", "inconclusive"
"""The verdicts."""


def level_text(confidence: float = CONFIDENCE) -> str:
    """``90 % CI`` for :data:`CONFIDENCE`: how every printed interval names its level."""
    return f"{100 * confidence:g} % CI"


@dataclass
class Interval:
    """An estimate with its two-sided interval.

    Attributes:
        estimate: the difference (or ratio) estimated; None when there is none (``why`` says so).
        low, high: the interval; None when it cannot be given (``why`` says why: one seed or run on a side, or no
            spread observed).
        method: e.g. ``paired t over 3 seeds (df 2)``, ``Welch t over 2 / 3 seeds (df 2.4)``.
        n_base, n_other: values on each side (seeds, or runs).
        spread: the standard deviation the interval came from (of the paired differences, or pooled), or None.
        paired: True for a paired interval.
        why: why ``low`` / ``high`` are None.
        confidence: the two-sided level of ``low`` / ``high``.
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
    confidence: float = CONFIDENCE

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


def _finite_map(values: Mapping[object, float | None]) -> dict[object, float]:
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(float(v))}


def difference_interval(base: Mapping[object, float | None], other: Mapping[object, float | None],
                        confidence: float = CONFIDENCE) -> Interval:
    """``mean(other) - mean(base)`` with its t-interval; ``base`` / ``other``: seed -> value (e.g. best macro IoU).

    Paired by seed (``scipy.stats.ttest_rel``) when both sides hold the same seeds, at least 2; otherwise Welch
    (``scipy.stats.ttest_ind(equal_var=False)``) over the finite values of each side. No interval (``low`` /
    ``high`` None, ``why`` says so) with one value on a side, or when no spread is observed (the paired differences
    all equal; or, unpaired, every value of each side equal).

    Raises:
        CropScaleError: a confidence outside (0, 1).
    """
    level = _check_level(confidence)
    a_map, b_map = _finite_map(base), _finite_map(other)
    a, b = np.array(list(a_map.values())), np.array(list(b_map.values()))
    if not len(a) or not len(b):
        return Interval(None, n_base=len(a), n_other=len(b), why="no value on one side", confidence=level)
    estimate = float(b.mean() - a.mean())
    if set(a_map) == set(b_map) and len(a_map) >= 2:
        seeds = sorted(a_map, key=str)
        d = np.array([b_map[s] for s in seeds]) - np.array([a_map[s] for s in seeds])
        method = f"paired t over {len(d)} seeds (df {len(d) - 1})"
        if np.ptp(d) < NO_SPREAD:
            return Interval(estimate, method=method, n_base=len(d), n_other=len(d), spread=0.0, paired=True,
                            why=f"no spread observed in {len(d)} seeds", confidence=level)
        ci = stats.ttest_rel(_ordered(b_map, seeds), _ordered(a_map, seeds)).confidence_interval(level)
        return Interval(estimate, float(ci.low), float(ci.high), method, len(d), len(d), float(d.std(ddof=1)), True,
                        confidence=level)
    if len(a) < 2 or len(b) < 2:
        return Interval(estimate, n_base=len(a), n_other=len(b), method="none", confidence=level,
                        why=f"{min(len(a), len(b))} seed on a side: no spread to form an interval")
    if np.ptp(a) < NO_SPREAD and np.ptp(b) < NO_SPREAD:
        return Interval(estimate, method="Welch t", n_base=len(a), n_other=len(b), spread=0.0, confidence=level,
                        why=f"no spread observed in {len(a)} / {len(b)} seeds")
    result = stats.ttest_ind(b, a, equal_var=False)
    ci = result.confidence_interval(level)
    spread = float(math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2.0))
    return Interval(estimate, float(ci.low), float(ci.high), f"Welch t over {len(a)} / {len(b)} seeds"
                    f" (df {float(result.df):.1f})", len(a), len(b), spread, confidence=level)


def _ordered(values: Mapping[object, float], keys: Sequence[object]) -> np.ndarray:
    """``values`` in the order of ``keys`` (the pairing of a paired interval)."""
    return np.array([values[k] for k in keys])


def decide(interval: Interval, margin: float) -> str:
    """The one decision rule: ``equivalent | worse | better | inconclusive`` of an interval against ``+-margin``.

    ``worse``: ``high < -margin``; ``better``: ``low > +margin``; ``equivalent``: ``-margin < low`` and
    ``high < +margin``; anything else, and always an interval that is not there (one seed or run on a side, no
    spread observed), ``inconclusive``. Strict inequalities: the tests' p-value is exactly alpha where a bound
    touches the margin, and a test decides only below alpha. Read at the (1 - 2 alpha) level of the interval, each
    is a one-sided test at alpha (TOST for ``equivalent``).
    """
    if interval.low is None or interval.high is None:
        return INCONCLUSIVE
    if interval.high < -margin:
        return WORSE
    if interval.low > margin:
        return BETTER
    if -margin < interval.low and interval.high < margin:
        return EQUIVALENT
    return INCONCLUSIVE


def seeds_needed(spread: float | None, estimate: float, margin: float, paired: bool,
                 confidence: float = CONFIDENCE, start: int = 2) -> int | None:
    """Seeds per side for which the t-interval at the observed ``spread`` would decide against ``margin``.

    The half-width must fall below ``| |estimate| - margin |``: ``t_{k-1} s / sqrt(k)`` (paired, ``s`` the sd of the
    differences) or ``t_{2k-2} s sqrt(2 / k)`` (Welch with ``k`` per side, ``s`` the pooled sd), ``t`` at
    ``(1 + confidence) / 2``. None when it cannot be said (no spread known, the estimate on the margin, more than
    :data:`MAX_SEEDS`).
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
    """A quality comparison: the difference, its interval, the margin and the verdict of :func:`decide`.

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

    def test_text(self) -> str:
        """The test the verdict rests on, with its alpha: ``TOST alpha = 0.05`` for ``equivalent`` ..."""
        if self.verdict == EQUIVALENT:
            return f"TOST alpha = {ALPHA:g}"
        if self.verdict in (WORSE, BETTER):
            return f"one-sided t alpha = {ALPHA:g}"
        return f"alpha = {ALPHA:g} per side"

    def text(self) -> str:
        """E.g. ``equivalent (+0.0040, 90 % CI -0.0110..+0.0190 within +-0.02, TOST alpha = 0.05, paired t ...)``."""
        i = self.interval
        if i.estimate is None:
            return f"{INCONCLUSIVE} ({i.why})"
        if i.low is None:
            more = "no spread known to size it" if i.spread == 0.0 else "at least 2 per side"
            return (f"{INCONCLUSIVE} ({i.estimate:+.4f}, no CI: {i.why}; margin +-{self.margin:g},"
                    f" alpha = {ALPHA:g} per side; seeds that would decide: {more})")
        where = {EQUIVALENT: "within", WORSE: "below", BETTER: "above"}.get(self.verdict, "crosses")
        bound = f"-{self.margin:g}" if self.verdict == WORSE else f"+{self.margin:g}" if self.verdict == BETTER \
            else f"+-{self.margin:g}"
        text = (f"{self.verdict} ({i.estimate:+.4f}, {level_text(i.confidence)} {i.low:+.4f}..{i.high:+.4f} {where}"
                f" {bound}, {self.test_text()}, {i.method}")
        if self.verdict == INCONCLUSIVE:
            more = (f"about {self.seeds_needed} per side" if self.seeds_needed is not None
                    else "none at this estimate (on the margin)" if abs(abs(i.estimate) - self.margin) < NO_SPREAD
                    else f"more than {MAX_SEEDS} per side")
            text += f"; seeds that would decide: {more}"
        return text + ")"


def quality_verdict(base: Mapping[object, float | None], other: Mapping[object, float | None],
                    margin: float = DEFAULT_MARGIN, figure: str = "best macro IoU",
                    confidence: float = CONFIDENCE) -> QualityVerdict:
    """The verdict of ``other`` against ``base`` (seed -> macro IoU) at the equivalence ``margin`` (:func:`decide`).

    Raises:
        CropScaleError: a negative or non-finite margin, a confidence outside (0, 1).
    """
    if not math.isfinite(margin) or margin < 0:
        raise CropScaleError(f"equivalence margin must be a finite macro IoU >= 0, got {margin!r}")
    interval = difference_interval(base, other, confidence)
    verdict = decide(interval, margin)
    if verdict != INCONCLUSIVE:
        return QualityVerdict(figure, interval, margin, verdict)
    if interval.low is None:
        return QualityVerdict(figure, interval, margin, verdict, None, interval.why)
    k = seeds_needed(interval.spread, interval.estimate, margin, interval.paired, confidence,
                     start=max(interval.n_base, interval.n_other) + 1)
    return QualityVerdict(figure, interval, margin, verdict, k, "the interval crosses the margin")


# ------------------------------------------------------------------------------------------- speed
def ratio_interval(base_rates: Sequence[float | None], other_rates: Sequence[float | None],
                   confidence: float = CONFIDENCE, unit: str = "runs") -> Interval:
    """Speed-up ``other / base`` of rates (samples/s, one per run) with a Welch t-interval of the mean log difference.

    ``estimate = exp(mean log other - mean log base)`` (the ratio of geometric means); the interval is the
    exponentiated ``scipy.stats.ttest_ind(log other, log base, equal_var=False)`` interval. Non-positive and
    non-finite rates are dropped. One rate on a side: the estimate without an interval ("one run"); no spread
    observed on either side: no interval either.

    Raises:
        CropScaleError: a confidence outside (0, 1).
    """
    level = _check_level(confidence)
    a, b = _finite(base_rates), _finite(other_rates)
    a, b = np.log(a[a > 0]), np.log(b[b > 0])
    if not len(a) or not len(b):
        return Interval(None, n_base=len(a), n_other=len(b), why="no rate on one side", confidence=level)
    estimate = float(math.exp(b.mean() - a.mean()))
    one = unit.removesuffix("s")
    if len(a) < 2 or len(b) < 2:
        sides = "one " + one + (" per side" if len(a) == len(b) == 1 else " on a side")
        return Interval(estimate, n_base=len(a), n_other=len(b), method="none", confidence=level, why=sides)
    if np.ptp(a) < NO_SPREAD and np.ptp(b) < NO_SPREAD:
        return Interval(estimate, method="Welch t on log rates", n_base=len(a), n_other=len(b), spread=0.0,
                        confidence=level, why=f"no spread observed in {len(a)} / {len(b)} {unit}")
    result = stats.ttest_ind(b, a, equal_var=False)
    ci = result.confidence_interval(level)
    return Interval(estimate, float(math.exp(ci.low)), float(math.exp(ci.high)),
                    f"Welch t on log rates over {len(a)} / {len(b)} {unit} (df {float(result.df):.1f})", len(a),
                    len(b), confidence=level)


def mean_interval(values: Sequence[float | None], confidence: float = 0.95) -> tuple[float, float]:
    """The t-interval of the mean of ``values`` (one per run; at least 2 finite values; equal values give ``(v, v)``).

    Raises:
        CropScaleError: fewer than 2 finite values; a confidence outside (0, 1).
    """
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
                    interval.n_base, interval.n_other, interval.spread, interval.paired, interval.why,
                    interval.confidence)


TRAINING_LOOP = "training-loop samples/s"
"""The rate every speed-up is of: training samples / the training loop's seconds (``samples_per_s``)."""


def format_ratio(interval: Interval, what: str = TRAINING_LOOP) -> str:
    """E.g. ``1.41x training-loop samples/s (90 % CI 1.36..1.46, ...)``; ``(..., includes 1: no speed-up shown)``."""
    if interval.estimate is None:
        return f"speed-up n/a ({interval.why})"
    head = f"{interval.estimate:.2f}x {what}"
    if interval.low is None:
        return f"{head} (no interval: {interval.why})"
    inside = ", includes 1: no speed-up shown" if interval.includes(1.0) else ""
    return (f"{head} ({level_text(interval.confidence)} {interval.low:.2f}..{interval.high:.2f}, alpha = {ALPHA:g}"
            f" per side, {interval.method}{inside})")


@dataclass(frozen=True)
class RunRate:
    """One run's rate: the geometric mean of its measured epochs' training-loop samples/s.

    Attributes:
        rate: samples/s (None without a measured epoch); epochs: how many it is over.
        epoch_spread: the within-run epoch spread, the sample sd of the epochs' log rates (about the coefficient of
            variation; None below 2 epochs): how much the epochs of one run vary, not a repeat of the run.
    """

    rate: float | None
    epochs: int = 0
    epoch_spread: float | None = None


def run_rate(record: RunRecord) -> RunRate:
    """:class:`RunRate` of a run from ``run.json``'s throughput epochs (``samples / train_s`` per measured epoch)."""
    if record.run_json is None or record.run_json.summary.throughput is None:
        return RunRate(None)
    rates = [e.samples / e.train_s for e in record.run_json.summary.throughput.epochs
             if e.epoch >= record.warmup_epochs and e.train_s and e.samples]
    if not rates:
        return RunRate(None)
    logs = np.log(np.array(rates))
    spread = float(logs.std(ddof=1)) if len(logs) > 1 else None
    return RunRate(float(math.exp(logs.mean())), len(rates), spread)


def speedup_interval(base: Sequence[RunRecord], other: Sequence[RunRecord],
                     confidence: float = CONFIDENCE) -> tuple[Interval, str]:
    """The speed-up of ``other`` over ``base`` with the run as the unit, and the within-run epoch spread as text.

    :func:`ratio_interval` of the runs' :func:`run_rate`; the text gives, per side, the median over runs of the
    within-run epoch spread (e.g. ``within-run epoch spread 3.1 % / 2.4 %``), or says it is not known.
    """
    rates = [[run_rate(r) for r in side] for side in (base, other)]
    interval = ratio_interval([r.rate for r in rates[0]], [r.rate for r in rates[1]], confidence)
    spreads = []
    for side in rates:
        known = [r.epoch_spread for r in side if r.epoch_spread is not None]
        spreads.append(f"{100 * float(np.median(known)):.1f} %" if known else "n/a")
    return interval, f"within-run epoch spread {spreads[0]} / {spreads[1]} (sd of log epoch rates, median over runs)"
