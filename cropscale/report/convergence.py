"""How far training got: the convergence note on a quality verdict, and samples to a target compared as MLPerf does.

Layer 5 (numpy, scipy), fed run records or plain numbers; every figure ``measured-run``.

**Convergence note** (:func:`still_improving`, :func:`convergence_note`): a run is *still improving* when its
best-so-far validation macro IoU rose by at least ``min_delta`` over its last :data:`PATIENCE` epochs (the best at
the last epoch minus the best ``PATIENCE`` epochs before it); ``min_delta`` is half the equivalence margin, so a run
that would cross the margin within a few more such windows counts. This is Lightning's ``EarlyStopping`` rule
(``patience``, ``min_delta``) on the window's whole gain rather than epoch by epoch, which calls more runs
"still improving" (two gains just under ``min_delta`` add up), the cautious side for a claim. A run with fewer
than ``PATIENCE + 1`` validated epochs cannot be judged and counts as not shown to have plateaued. A verdict where
any run of either side is still improving (or cannot be judged) holds *at this budget* (the epochs run) only.

**Samples to target** (:func:`to_target`, :func:`compare_to_target`), as MLPerf Training compares runs to a quality
target: per run (the training samples, or wall seconds, until the best-so-far validation macro IoU first reaches the
target, counted at the validation that reached it); every run counts, a run that never reaches the target as
infinitely slow (MLPerf scores a non-converging run as infinite time); with at least :data:`MIN_RUNS_TO_TRIM` runs the
fastest and slowest ``max(1, n // 10)`` are dropped (MLPerf: 1 of 5 or 10 runs at each end, 4 of 40 for UNet3D), and
a side with an infinite value left after trimming has no mean ("not reached"). The two sides' trimmed means are
compared with one-sided two-sample t-tests at alpha = 0.05 (each direction; MLPerf's reference-convergence check is
a one-sided Student t-test at p = 0.05 under "similar variances", 1/2 < s1/s2 < 2; outside that ratio Welch's test).
The runs per side a decision needs follow from the measured coefficient of variation of samples to target
(:func:`runs_needed`: MLPerf's run counts, 5 / 10 / 40, by the bands CV < 5 %, 5-10 %, >= 10 %).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from cropscale.report.equivalence import ALPHA, INCONCLUSIVE
from cropscale.runs.record import RunRecord

PATIENCE = 2
"""Epochs over which a run's best-so-far macro IoU must rise by ``min_delta`` to count as still improving."""
MIN_RUNS_TO_TRIM = 5
"""Runs per side from which the fastest and slowest are dropped (MLPerf's smallest run count, 5)."""
SIMILAR_SD = (0.5, 2.0)
"""MLPerf's "similar variances" range of the sd ratio, inside which its pooled Student t-test applies."""
RUNS_BY_CV = ((0.05, 5), (0.10, 10), (math.inf, 40))
"""``(CV below, runs per side)``: about 5 runs at a CV of samples to target of 1-4 %, 10 at 5-9 %, 40 at about 20 %
(MLPerf Training's run counts: 5 or 10 per benchmark, 40 for UNet3D "due to large variance")."""
FEWER, MORE = "fewer", "more"
"""Samples-to-target verdicts besides ``inconclusive``: the other side needs fewer / more."""


# ------------------------------------------------------------------------------------- convergence
def still_improving(by_epoch: Sequence[tuple[int, float]], min_delta: float, patience: int = PATIENCE) -> bool | None:
    """Whether the best-so-far series ``[(epoch, best so far)]`` rose by ``>= min_delta`` over its last epochs.

    The best at the last point minus the best ``patience`` points before it; None with fewer than ``patience + 1``
    points (cannot be judged).
    """
    if len(by_epoch) < patience + 1:
        return None
    return by_epoch[-1][1] - by_epoch[-1 - patience][1] >= min_delta


@dataclass
class SideConvergence:
    """One side's runs: how many are still improving, have plateaued, cannot be judged; the most epochs validated."""

    label: str
    improving: int = 0
    plateaued: int = 0
    unknown: int = 0
    epochs: int = 0

    def text(self) -> str:
        """``FP32 2 of 2 run(s) still improving``."""
        runs = self.improving + self.plateaued + self.unknown
        text = f"{self.label} {self.improving} of {runs} run(s) still improving"
        return text + (f", {self.unknown} too short to judge" if self.unknown else "")


@dataclass
class ConvergenceNote:
    """The convergence note of a comparison (rule in the module docstring)."""

    base: SideConvergence
    other: SideConvergence
    min_delta: float
    patience: int = PATIENCE

    @property
    def at_budget(self) -> bool:
        """True when a run of either side is still improving or cannot be judged: the verdict holds at this budget."""
        return any(s.improving or s.unknown for s in (self.base, self.other))

    @property
    def budget(self) -> str:
        """``at this budget (3 epochs)``."""
        return f"at this budget ({max(self.base.epochs, self.other.epochs)} epochs)"

    def text(self) -> str:
        """E.g. ``convergence: FP32 2 of 2 run(s) still improving, AMP BF16 0 of 2 ... (rule): at this budget``."""
        rule = (f"still improving = best-so-far val macro IoU rose >= {self.min_delta:g} over the last"
                f" {self.patience} epochs")
        if not self.at_budget:
            return f"convergence: every run of both sides plateaued ({rule})"
        return f"convergence: {self.base.text()}, {self.other.text()} ({rule}): {self.budget}"


def _side(label: str, runs: Sequence[RunRecord], min_delta: float, patience: int) -> SideConvergence:
    side = SideConvergence(label)
    for r in runs:
        state = still_improving(r.iou_by_epoch, min_delta, patience)
        side.epochs = max(side.epochs, len(r.iou_by_epoch))
        if state is None:
            side.unknown += 1
        elif state:
            side.improving += 1
        else:
            side.plateaued += 1
    return side


def convergence_note(base_label: str, base: Sequence[RunRecord], other_label: str, other: Sequence[RunRecord],
                     margin: float, patience: int = PATIENCE) -> ConvergenceNote:
    """The :class:`ConvergenceNote` of two sides' runs; ``min_delta`` is half the equivalence ``margin``."""
    min_delta = margin / 2.0
    return ConvergenceNote(_side(base_label, base, min_delta, patience), _side(other_label, other, min_delta, patience),
                           min_delta, patience)


# ------------------------------------------------------------------------------ one run to target
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

    def value(self, figure: str) -> float | None:
        """``figure`` (``samples``, ``seconds``) for the MLPerf comparison: infinite when not reached."""
        return math.inf if not self.reached else getattr(self, figure)


def to_target(record: RunRecord, target: float) -> ToTarget:
    """:class:`ToTarget` of one run from its TensorBoard ``val/mIoU`` and ``run.json`` per-epoch records."""
    reached = next((ep for ep, best in record.iou_by_epoch if best >= target), None)
    if reached is None:
        why = "not reached" if record.iou_by_epoch else "no val/mIoU in the TensorBoard events"
        return ToTarget(target, False, why=why)
    out = ToTarget(target, True, epoch=reached)
    tp = record.run_json.summary.throughput if record.run_json is not None else None
    upto = [e for e in tp.epochs if e.epoch <= reached] if tp is not None else []
    if len(upto) != reached + 1:
        out.why = "run.json lacks the per-epoch records up to that epoch"
        return out
    out.samples = int(sum(e.samples for e in upto))
    if record.updates_per_epoch is not None:
        out.steps = record.updates_per_epoch * (reached + 1)
    if any(e.wall_s is None for e in upto):
        out.why = "run.json lacks the per-epoch wall times up to that epoch"
        return out
    out.seconds = float(sum(e.wall_s for e in upto))
    energy = record.run_json.summary.energy
    rows = [e for e in (energy.epochs or []) if e.epoch <= reached] if energy is not None and energy.available else []
    if len(rows) == reached + 1 and all(e.energy_j is not None for e in rows):
        out.joules = float(sum(e.energy_j for e in rows))
    else:
        out.why = "joules: no NVML energy reading (not a GPU run)" if not rows else "joules: an epoch lacks energy"
    return out


# --------------------------------------------------------------------------- MLPerf's comparison
def trim_count(runs: int) -> int:
    """Runs dropped at each end: none below :data:`MIN_RUNS_TO_TRIM`, else ``max(1, runs // 10)``."""
    return 0 if runs < MIN_RUNS_TO_TRIM else max(1, runs // 10)


def runs_needed(cv: float) -> int:
    """Runs per side for a coefficient of variation ``cv`` (a fraction) of samples to target (:data:`RUNS_BY_CV`)."""
    return next(n for below, n in RUNS_BY_CV if cv < below)


@dataclass
class TargetSide:
    """One side's per-run values (``inf``: not reached), those kept after trimming, and their statistics."""

    values: list[float]
    kept: list[float] = field(default_factory=list)
    trimmed: int = 0

    @property
    def not_reached(self) -> int:
        """Runs that did not reach the target."""
        return sum(1 for v in self.values if math.isinf(v))

    @property
    def mean(self) -> float | None:
        """The trimmed (olympic) mean; ``inf`` when a run left after trimming did not reach; None without runs."""
        return float(np.mean(self.kept)) if self.kept else None

    @property
    def cv(self) -> float | None:
        """Sample sd / mean of the runs that reached (at least 2), before trimming; None otherwise."""
        hit = [v for v in self.values if math.isfinite(v)]
        return float(np.std(hit, ddof=1) / np.mean(hit)) if len(hit) >= 2 and np.mean(hit) > 0 else None


def olympic(values: Sequence[float]) -> TargetSide:
    """The side's values with the fastest and slowest :func:`trim_count` runs dropped (``inf`` sorts slowest)."""
    ordered = sorted(float(v) for v in values)
    k = trim_count(len(ordered))
    return TargetSide(list(values), ordered[k:len(ordered) - k] if k else ordered, k)


@dataclass
class TargetComparison:
    """Samples (or seconds) to a target, other against base, compared as MLPerf compares runs (module docstring).

    Attributes:
        figure: ``samples`` or ``seconds``; base, other: :class:`TargetSide`.
        ratio: other's trimmed mean / base's (None when a side has no finite mean).
        verdict: ``fewer | more | inconclusive`` (a one-sided test at alpha decides), or ``not reached``.
        method: the test (``one-sided Student t (pooled, sd ratio 0.8)`` ...); p_fewer, p_more: its p-values.
        cv: the larger side's coefficient of variation; runs: what :func:`runs_needed` gives for it.
        why: why there is no test.
    """

    figure: str
    base: TargetSide
    other: TargetSide
    ratio: float | None = None
    verdict: str = INCONCLUSIVE
    method: str = ""
    p_fewer: float | None = None
    p_more: float | None = None
    cv: float | None = None
    runs: int | None = None
    why: str | None = None

    def sides_text(self, unit: str = "") -> str:
        """``olympic means 64 / 80 samples over 2 / 2 runs (none trimmed)``."""
        def mean(side: TargetSide) -> str:
            m = side.mean
            return "not reached" if m is None or math.isinf(m) else f"{m:.4g}"
        trimmed = (f"{self.base.trimmed} / {self.other.trimmed} trimmed at each end" if self.base.trimmed
                   or self.other.trimmed else "none trimmed")
        missing = [f"{s.not_reached} of {len(s.values)} {name} run(s) not reaching it"
                   for name, s in (("base", self.base), ("other", self.other)) if s.not_reached]
        return (f"olympic means {mean(self.base)} / {mean(self.other)} {unit or self.figure} over"
                f" {len(self.base.values)} / {len(self.other.values)} runs ({trimmed}"
                + "".join(f"; {m}" for m in missing) + ")")

    def runs_text(self) -> str:
        """``CV 12.5 %: about 40 runs per side (MLPerf's bands), ran 2 / 2``."""
        if self.cv is None:
            return "runs needed: n/a (fewer than 2 runs reaching the target on both sides)"
        if self.cv == 0.0:
            return (f"CV 0 % (no spread observed): at least {self.runs} runs per side (MLPerf's smallest count), ran"
                    f" {len(self.base.values)} / {len(self.other.values)}")
        return (f"CV {100 * self.cv:.1f} %: about {self.runs} runs per side (MLPerf's bands), ran"
                f" {len(self.base.values)} / {len(self.other.values)}")

    def text(self) -> str:
        """The verdict with its test, alpha and p-values, or why there is none."""
        ratio = f"{self.ratio:.2f}x, " if self.ratio is not None else ""
        if self.p_fewer is None:
            return f"{ratio}{self.verdict} ({self.why})"
        return (f"{ratio}{self.verdict} ({self.method}, alpha = {ALPHA:g}: p = {self.p_fewer:.3g} for fewer,"
                f" {self.p_more:.3g} for more)")


def _test(base: np.ndarray, other: np.ndarray) -> tuple[str, float, float]:
    sd_a, sd_b = float(np.std(base, ddof=1)), float(np.std(other, ddof=1))
    ratio = sd_b / sd_a if sd_a > 0 else math.inf
    pooled = SIMILAR_SD[0] < ratio < SIMILAR_SD[1]
    method = (f"one-sided Student t (pooled: sd ratio {ratio:.2g} within MLPerf's 1/2..2)" if pooled
              else f"one-sided Welch t (sd ratio {ratio:.2g} outside 1/2..2)")
    less = stats.ttest_ind(other, base, equal_var=pooled, alternative="less").pvalue
    greater = stats.ttest_ind(other, base, equal_var=pooled, alternative="greater").pvalue
    return method, float(less), float(greater)


def compare_to_target(base: Sequence[float], other: Sequence[float], figure: str = "samples") -> TargetComparison:
    """Compare per-run values to a target (``inf``: the run did not reach it) as MLPerf does (module docstring).

    ``fewer`` when the one-sided test that other's mean is below base's gives ``p < alpha``, ``more`` for the
    other direction, else ``inconclusive``; ``not reached`` when a side's trimmed runs include one that did not
    reach; no test with fewer than 2 kept runs on a side or no spread observed on either.
    """
    out = TargetComparison(figure, olympic(base), olympic(other))
    cvs = [cv for cv in (out.base.cv, out.other.cv) if cv is not None]
    if cvs:
        out.cv = max(cvs)
        out.runs = runs_needed(out.cv)
    means = (out.base.mean, out.other.mean)
    if any(m is None or math.isinf(m) for m in means):
        out.verdict = "not reached"
        sides = [n for n, m in zip(("base", "other"), means, strict=True) if m is None or math.isinf(m)]
        out.why = (f"{' and '.join(sides)}: a run that did not reach the target is left after trimming; MLPerf"
                   " counts it as infinitely slow")
        return out
    out.ratio = means[1] / means[0] if means[0] else None
    a, b = np.array(out.base.kept), np.array(out.other.kept)
    if len(a) < 2 or len(b) < 2:
        out.why = f"{min(len(a), len(b))} run on a side: no test"
        return out
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        out.why = f"no spread observed in {len(a)} / {len(b)} runs: no test"
        return out
    out.method, out.p_fewer, out.p_more = _test(a, b)
    out.verdict = FEWER if out.p_fewer < ALPHA else MORE if out.p_more < ALPHA else INCONCLUSIVE
    return out
