"""The one decision rule and the intervals it reads (issues 30 and 38), against independent computations.

Hand-worked numbers use printed t quantiles (one-sided 0.95, i.e. two-sided 90 %): t_{0.95,1} = 6.313752,
t_{0.95,2} = 2.919986, t_{0.95,3} = 2.353363, t_{0.95,4} = 2.131847, t_{0.95,10} = 1.812461,
t_{0.95,12} = 1.782288. The cross-checks compare with statsmodels (``ttost_paired``, ``ttost_ind`` with
``usevar='unequal'`` and ``'pooled'``, ``DescrStatsW.tconfint_mean``, ``CompareMeans.tconfint_diff``), an
implementation independent of cropscale's scipy calls, on cases built to tell the methods apart.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from statsmodels.stats.weightstats import CompareMeans, DescrStatsW, ttost_ind, ttost_paired

from cropscale.report.equivalence import (
    ALPHA,
    BETTER,
    CONFIDENCE,
    EQUIVALENT,
    INCONCLUSIVE,
    WORSE,
    Interval,
    decide,
    difference_interval,
    format_ratio,
    quality_verdict,
    ratio_interval,
    run_rate,
    seeds_needed,
    speedup_interval,
)
from cropscale.runs.record import RunRecord
from cropscale.runs.schema import RunJson, RunSummary, ThroughputEpoch, ThroughputSummary

T95 = {1: 6.313752, 2: 2.919986, 3: 2.353363, 4: 2.131847, 10: 1.812461, 12: 1.782288}
BASE = {0: 0.50, 1: 0.52, 2: 0.54}


def test_the_level_is_alpha_005_per_side():
    assert (ALPHA, CONFIDENCE) == (0.05, pytest.approx(0.90))


def test_paired_interval_by_seed_hand_worked():
    # d = [0.01, 0.00, 0.02]: mean 0.01, sd 0.01, half-width t_{0.95,2} x 0.01 / sqrt(3) = 0.016859
    other = {0: 0.51, 1: 0.52, 2: 0.56}
    i = difference_interval(BASE, other)
    half = T95[2] * 0.01 / math.sqrt(3)
    assert i.paired and i.estimate == pytest.approx(0.01) and i.confidence == pytest.approx(0.90)
    assert (i.low, i.high) == (pytest.approx(0.01 - half, abs=1e-6), pytest.approx(0.01 + half, abs=1e-6))
    v = quality_verdict(BASE, other, margin=0.02)
    assert v.verdict == INCONCLUSIVE  # -0.0069..+0.0269 crosses +0.02
    # room 0.02 - 0.01 = 0.01: t_{0.95,k-1} 0.01 / sqrt(k) < 0.01 first at k = 5 (t_4 = 2.132 < sqrt 5 = 2.236;
    # k = 4: t_3 = 2.353 > 2)
    assert v.seeds_needed == 5
    assert "90 % CI -0.0069..+0.0269 crosses +-0.02" in v.text() and "about 5 per side" in v.text()
    assert quality_verdict(BASE, other, margin=0.05).verdict == EQUIVALENT  # within -0.05..+0.05


def test_a_constant_shift_is_no_spread_and_no_verdict():
    """Identical differences in every seed give a zero-width t-interval: no spread observed, inconclusive."""
    other = {0: 0.51, 1: 0.53, 2: 0.55}  # d = 0.01 in every seed (up to rounding below NO_SPREAD)
    for base, oth in ((BASE, other), (BASE, dict(BASE))):
        v = quality_verdict(base, oth, margin=0.02)
        assert v.verdict == INCONCLUSIVE and v.interval.low is None and v.seeds_needed is None
        assert "no spread observed in 3 seeds" in v.text()
    same = quality_verdict({0: 0.4, 1: 0.4}, {2: 0.4, 3: 0.4}, margin=0.02)  # Welch, both sides constant
    assert same.verdict == INCONCLUSIVE and "no spread observed in 2 / 2 seeds" in same.text()


def test_one_seed_per_side_is_inconclusive_never_a_verdict():
    for other in ({0: 0.50}, {0: 0.90}, {0: 0.10}):
        v = quality_verdict({0: 0.50}, other, margin=0.02)
        assert v.verdict == INCONCLUSIVE and v.interval.low is None
        assert "at least 2 per side" in v.text()


def test_worse_and_its_mirror_better_hand_worked():
    # d = [-0.06, -0.05, -0.07]: mean -0.06, sd 0.01 -> -0.0769..-0.0431, all below -0.02
    other = {0: 0.44, 1: 0.47, 2: 0.47}
    v = quality_verdict(BASE, other, margin=0.02)
    half = T95[2] * 0.01 / math.sqrt(3)
    assert v.verdict == WORSE and v.interval.high == pytest.approx(-0.06 + half, abs=1e-6)
    assert "below -0.02, one-sided t alpha = 0.05" in v.text()
    assert quality_verdict(other, BASE, margin=0.02).verdict == BETTER


def test_welch_when_the_seeds_differ_hand_worked():
    # means 0.52 and 0.62, each variance 0.0008: se = sqrt(0.0004 + 0.0004), Welch df = 2
    i = difference_interval({0: 0.50, 1: 0.54}, {2: 0.60, 3: 0.64})
    half = T95[2] * math.sqrt(0.0008)
    assert not i.paired and "Welch" in i.method and "(df 2.0)" in i.method
    assert i.estimate == pytest.approx(0.10)
    assert (i.low, i.high) == (pytest.approx(0.10 - half, abs=1e-6), pytest.approx(0.10 + half, abs=1e-6))


@pytest.mark.parametrize("low,high,verdict", [
    (-0.24, 0.24, EQUIVALENT), (-0.25, 0.0, INCONCLUSIVE), (0.0, 0.25, INCONCLUSIVE),  # touching: p = alpha
    (-0.50, -0.26, WORSE), (-0.50, -0.25, INCONCLUSIVE), (0.26, 0.50, BETTER), (0.25, 0.50, INCONCLUSIVE),
    (-0.30, 0.30, INCONCLUSIVE), (-0.30, -0.10, INCONCLUSIVE), (0.10, 0.30, INCONCLUSIVE),
    (None, None, INCONCLUSIVE),
])
def test_decide_at_exact_boundaries(low, high, verdict):
    """Bounds exactly on the margin (0.25, exact in binary) decide nothing: the tests' p-value is exactly alpha."""
    assert decide(Interval(0.0, low, high), 0.25) == verdict


def test_a_difference_exactly_at_the_margin_cannot_be_decided_by_more_seeds():
    # d = [0.125, 0.375, 0.25] (exact in binary): mean 0.25 = the margin
    base, other = {0: 0.5, 1: 0.5, 2: 0.5}, {0: 0.625, 1: 0.875, 2: 0.75}
    v = quality_verdict(base, other, margin=0.25)
    assert v.interval.estimate == 0.25 and v.verdict == INCONCLUSIVE and v.seeds_needed is None
    assert "none at this estimate (on the margin)" in v.text()
    p_tost = ttost_paired(np.array([0.625, 0.875, 0.75]), np.array([0.5, 0.5, 0.5]), -0.25, 0.25)[0]
    assert p_tost >= 0.5  # statsmodels: the upper test's t is 0, p = 0.5


def test_seeds_needed_welch_hand_worked():
    # pooled sd 0.02, estimate 0, margin 0.02 -> room 0.02: t_{0.95,2k-2} 0.02 sqrt(2/k) < 0.02 needs
    # t_{0.95,2k-2} < sqrt(k/2): k = 6 -> t_10 = 1.812 > 1.732; k = 7 -> t_12 = 1.782 < 1.871: 7 per side
    assert seeds_needed(0.02, 0.0, 0.02, paired=False) == 7
    assert seeds_needed(None, 0.0, 0.02, paired=False) is None
    assert seeds_needed(0.02, 0.02, 0.02, paired=False) is None  # on the margin


# ------------------------------------------------------------------ cross-checks against statsmodels
def _sm_interval(base, other, paired, usevar="unequal"):
    a, b = np.array(base), np.array(other)
    if paired:
        return DescrStatsW(b - a).tconfint_mean(alpha=2 * ALPHA)
    return CompareMeans(DescrStatsW(b), DescrStatsW(a)).tconfint_diff(alpha=2 * ALPHA, usevar=usevar)


def _sm_verdict(base, other, paired, margin, usevar="unequal"):
    """The verdict by statsmodels' tests alone: TOST for equivalent, one one-sided test each for worse / better."""
    a, b = np.array(base), np.array(other)
    if paired:
        p_tost = ttost_paired(b, a, -margin, margin)[0]
        d = DescrStatsW(b - a)
        p_worse = d.ttest_mean(-margin, alternative="smaller")[1]
        p_better = d.ttest_mean(margin, alternative="larger")[1]
    else:
        p_tost = ttost_ind(b, a, -margin, margin, usevar=usevar)[0]
        cm = CompareMeans(DescrStatsW(b), DescrStatsW(a))
        p_worse = cm.ttest_ind(alternative="smaller", usevar=usevar, value=-margin)[1]
        p_better = cm.ttest_ind(alternative="larger", usevar=usevar, value=margin)[1]
    return (EQUIVALENT if p_tost < ALPHA else WORSE if p_worse < ALPHA else BETTER if p_better < ALPHA
            else INCONCLUSIVE)


CROSS_CHECKS = {
    # name: (base, other, paired, margin, cropscale's verdict, pooled (Student) verdict where it differs)
    "Welch equivalent, Student not (2 tight vs 9 wider seeds)":
        ([0.50, 0.501], [0.495, 0.525, 0.51, 0.50, 0.52, 0.515, 0.505, 0.51, 0.52], False, 0.02, EQUIVALENT,
         INCONCLUSIVE),
    "Student too narrow (2 wide vs 9 tight seeds)":
        ([0.49, 0.51], [0.50, 0.501, 0.499, 0.5005, 0.4995, 0.502, 0.498, 0.5, 0.5], False, 0.02, INCONCLUSIVE,
         EQUIVALENT),
    "a side without spread": ([0.50, 0.50, 0.50], [0.505, 0.51, 0.515, 0.512], False, 0.02, EQUIVALENT, None),
    "negative difference": ([0.50, 0.52, 0.51], [0.45, 0.46, 0.47, 0.44], False, 0.02, WORSE, None),
    "positive difference": ([0.45, 0.46, 0.47, 0.44], [0.50, 0.52, 0.51], False, 0.02, BETTER, None),
    "paired, crossing the margin": ([0.50, 0.52, 0.54], [0.51, 0.52, 0.56], True, 0.02, INCONCLUSIVE, None),
    "paired, within a wider margin": ([0.50, 0.52, 0.54], [0.51, 0.52, 0.56], True, 0.05, EQUIVALENT, None),
    "paired, negative": ([0.50, 0.52, 0.54], [0.44, 0.47, 0.47], True, 0.02, WORSE, None),
    "paired, at the margin": ([0.5, 0.5, 0.5], [0.625, 0.875, 0.75], True, 0.25, INCONCLUSIVE, None),
}


@pytest.mark.parametrize("name", list(CROSS_CHECKS))
def test_intervals_and_verdicts_agree_with_statsmodels(name):
    base, other, paired, margin, verdict, pooled = CROSS_CHECKS[name]
    keys = (range(len(base)), range(len(other))) if paired else (range(len(base)), range(100, 100 + len(other)))
    v = quality_verdict(dict(zip(keys[0], base, strict=True)), dict(zip(keys[1], other, strict=True)), margin)
    low, high = _sm_interval(base, other, paired)
    assert v.interval.paired is paired
    assert (v.interval.low, v.interval.high) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12))
    assert v.verdict == verdict == _sm_verdict(base, other, paired, margin)
    if pooled is not None:  # the case tells Welch from Student: the pooled test decides otherwise
        assert _sm_verdict(base, other, paired, margin, usevar="pooled") == pooled != verdict
        student = _sm_interval(base, other, paired, usevar="pooled")
        assert abs(student[0] - v.interval.low) > 1e-3


# ------------------------------------------------------------------ laws for all inputs
SEEDS = st.lists(st.floats(0.0, 1.0, allow_nan=False, width=32), min_size=2, max_size=6)


@settings(max_examples=60, deadline=None)
@given(a=SEEDS, b=SEEDS, margin=st.floats(0.001, 0.2))
def test_swapping_base_and_other_flips_the_sign_and_keeps_the_width(a, b, margin):
    base, other = dict(enumerate(a)), {10 + i: v for i, v in enumerate(b)}
    ab, ba = difference_interval(base, other), difference_interval(other, base)
    assert ab.estimate == pytest.approx(-ba.estimate, abs=1e-12)
    if ab.low is None:
        assert ba.low is None
        return
    assert (ab.low, ab.high) == (pytest.approx(-ba.high, abs=1e-9), pytest.approx(-ba.low, abs=1e-9))
    mirror = {WORSE: BETTER, BETTER: WORSE, EQUIVALENT: EQUIVALENT, INCONCLUSIVE: INCONCLUSIVE}
    assert mirror[decide(ab, margin)] == decide(ba, margin) or min(abs(abs(ab.low) - margin),
                                                                   abs(abs(ab.high) - margin)) < 1e-9


@settings(max_examples=60, deadline=None)
@given(a=SEEDS, b=SEEDS, shift=st.floats(-0.3, 0.3), paired=st.booleans())
def test_adding_a_constant_to_every_run_changes_no_difference(a, b, shift, paired):
    n = min(len(a), len(b)) if paired else None
    a, b = (a[:n], b[:n]) if paired else (a, b)
    base, other = dict(enumerate(a)), {(i if paired else 10 + i): v for i, v in enumerate(b)}
    plain = difference_interval(base, other)
    moved = difference_interval({k: v + shift for k, v in base.items()}, {k: v + shift for k, v in other.items()})
    assert moved.estimate == pytest.approx(plain.estimate, abs=1e-9) and moved.paired == plain.paired
    if plain.low is not None and moved.low is not None:
        assert (moved.low, moved.high) == (pytest.approx(plain.low, abs=1e-6), pytest.approx(plain.high, abs=1e-6))


@settings(max_examples=60, deadline=None)
@given(a=st.lists(st.floats(1.0, 100.0), min_size=2, max_size=5), b=st.lists(st.floats(1.0, 100.0), min_size=2,
                                                                                  max_size=5),
       scale=st.floats(0.1, 10.0))
def test_speedup_swaps_to_its_reciprocal_and_ignores_a_common_scale(a, b, scale):
    ab, ba = ratio_interval(a, b), ratio_interval(b, a)
    assert ab.estimate * ba.estimate == pytest.approx(1.0)
    scaled = ratio_interval([x * scale for x in a], [x * scale for x in b])
    assert scaled.estimate == pytest.approx(ab.estimate)
    if ab.low is not None:
        assert ab.low * ba.high == pytest.approx(1.0) and ab.high * ba.low == pytest.approx(1.0)
        assert (scaled.low, scaled.high) == (pytest.approx(ab.low, rel=1e-6), pytest.approx(ab.high, rel=1e-6))


# ------------------------------------------------------------------ speed: the run is the unit
def test_speedup_interval_on_log_rates_hand_worked():
    # one rate per run. log rates: base [0, 0.02], other [ln 1.5, ln 1.5 + 0.02]: variances 0.0002, se sqrt(0.0002)
    i = ratio_interval([1.0, math.exp(0.02)], [1.5, 1.5 * math.exp(0.02)])
    half = T95[2] * math.sqrt(0.0002)
    assert i.estimate == pytest.approx(1.5)
    assert (i.low, i.high) == (pytest.approx(1.5 * math.exp(-half), rel=1e-6), pytest.approx(1.5 * math.exp(half),
                                                                                           rel=1e-6))
    assert format_ratio(i).startswith(f"1.50x training-loop samples/s (90 % CI {1.5 * math.exp(-half):.2f}.."
                                      f"{1.5 * math.exp(half):.2f}, alpha = 0.05 per side, Welch t on log rates over"
                                      " 2 / 2 runs")
    noisy = ratio_interval([1.0, 1.2], [1.05, 1.25])
    assert noisy.includes(1.0) and "includes 1: no speed-up shown" in format_ratio(noisy)
    single = ratio_interval([1.0], [1.5])
    assert single.low is None
    assert format_ratio(single) == "1.50x training-loop samples/s (no interval: one run per side)"
    assert ratio_interval([1.0], [1.5, 1.6]).why == "one run on a side"


def test_rates_that_are_no_rate_are_dropped():
    clean = ratio_interval([2.0, 2.2], [3.0, 3.1])
    dirty = ratio_interval([0.0, -1.0, None, float("nan"), 2.0, 2.2, float("inf")], [3.0, None, 3.1])
    assert (dirty.estimate, dirty.low, dirty.high, dirty.n_base) == (clean.estimate, clean.low, clean.high, 2)


def _run(rates: list[float], warmup: int = 1) -> RunRecord:
    """A run whose epochs have these training-loop rates (samples/s): 32 samples each."""
    epochs = [ThroughputEpoch(epoch=i, samples=32, train_s=32 / q) for i, q in enumerate(rates)]
    run_json = RunJson(status="finished", summary=RunSummary(throughput=ThroughputSummary(epochs=epochs)))
    return RunRecord(name="r", kind="run", path="r", evidence="measured-run", run_json=run_json,
                     warmup_epochs=warmup)


def test_run_rate_is_the_geometric_mean_of_the_measured_epochs():
    r = run_rate(_run([99.0, 10.0, 20.0]))  # epoch 0 left out as warm-up
    assert r.rate == pytest.approx(math.sqrt(200.0)) and r.epochs == 2
    assert r.epoch_spread == pytest.approx(math.log(2.0) / math.sqrt(2.0))  # sd of (ln 10, ln 20)
    assert run_rate(_run([99.0, 10.0])).epoch_spread is None


def test_epochs_are_not_repeats_the_interval_is_over_runs():
    """Two runs per side of 6 nearly equal epochs each: pooling 12 epochs per side would give a narrow interval;
    over runs (2 per side, df about 2) it is wide. statsmodels on the runs' log geometric means agrees."""
    base = [_run([1.0] + [10.0 * (1 + 1e-3 * k) for k in range(5)]), _run([1.0] + [12.0] * 5)]
    other = [_run([1.0] + [11.0] * 5), _run([1.0] + [14.0 * (1 - 1e-3 * k) for k in range(5)])]
    interval, spread = speedup_interval(base, other)
    assert (interval.n_base, interval.n_other) == (2, 2)
    logs = [np.log([run_rate(r).rate for r in side]) for side in (base, other)]
    low, high = CompareMeans(DescrStatsW(logs[1]), DescrStatsW(logs[0])).tconfint_diff(alpha=0.1, usevar="unequal")
    assert (interval.low, interval.high) == (pytest.approx(math.exp(low)), pytest.approx(math.exp(high)))
    epochs = [np.log([32 / e.train_s for r in side for e in r.run_json.summary.throughput.epochs if e.epoch])
              for side in (base, other)]
    pooled = CompareMeans(DescrStatsW(epochs[1]), DescrStatsW(epochs[0])).tconfint_diff(alpha=0.1, usevar="unequal")
    assert math.exp(pooled[1]) - math.exp(pooled[0]) < 0.5 * (interval.high - interval.low)  # what pooling hid
    assert spread.startswith("within-run epoch spread 0.1 % / 0.1 %")
    one, _ = speedup_interval(base[:1], other[:1])
    assert one.low is None and "one run per side" in format_ratio(one)
