"""The verdict statistics on the cases where the right formula and a plausible wrong one disagree (issue 36).

Written against the mutants mutmut left alive in ``cropscale/report/equivalence.py``: unequal seed counts and
spreads, a side with one value or without spread, bounds and half-widths exactly on a boundary, the level at its
limits, negative differences, ratios below and above 1, and every field of the :class:`Interval` each path returns.
Expected numbers come from statsmodels (``DescrStatsW.tconfint_mean``, ``CompareMeans.tconfint_diff``) or by hand
from printed t quantiles (one-sided 0.95: t_1 = 6.313752, t_2 = 2.919986, t_3 = 2.353363, t_4 = 2.131847,
t_5 = 2.015048, t_6 = 1.943180, t_8 = 1.859548; one-sided 0.90: t_2 = 1.885618, t_3 = 1.637744).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from statsmodels.stats.weightstats import CompareMeans, DescrStatsW

from cropscale.errors import CropScaleError
from cropscale.report.equivalence import (
    BETTER,
    EQUIVALENT,
    INCONCLUSIVE,
    MAX_SEEDS,
    WORSE,
    Interval,
    QualityVerdict,
    decide,
    difference_interval,
    format_ratio,
    mean_interval,
    quality_verdict,
    ratio_interval,
    run_rate,
    scaled,
    seeds_needed,
    speedup_interval,
)
from cropscale.runs.record import RunRecord
from cropscale.runs.schema import RunJson, RunSummary, ThroughputEpoch, ThroughputSummary

T95 = {1: 6.313752, 2: 2.919986, 3: 2.353363, 4: 2.131847, 5: 2.015048, 6: 1.943180, 8: 1.859548}


def _rest(i: Interval) -> dict:
    """Every field of ``i`` but the three numbers (compared with a tolerance)."""
    d = dataclasses.asdict(i)
    return {k: v for k, v in d.items() if k not in ("estimate", "low", "high")}


def _welch(base, other, alpha):
    return CompareMeans(DescrStatsW(np.array(other)), DescrStatsW(np.array(base))).tconfint_diff(
        alpha=alpha, usevar="unequal")


# ------------------------------------------------------------------------------------- Interval.includes
def test_includes_both_ends_and_none_without_either_bound():
    i = Interval(0.5, 0.25, 0.75)
    assert (i.includes(0.25), i.includes(0.75), i.includes(0.5)) == (True, True, True)  # closed at both ends
    assert (i.includes(0.2499), i.includes(0.7501)) == (False, False)
    assert Interval(0.5, None, 0.75).includes(0.5) is None  # one bound missing is no interval
    assert Interval(0.5, 0.25, None).includes(0.5) is None


# ------------------------------------------------------------------------------------- the level
@pytest.mark.parametrize("confidence", [0.0, 1.0, 1.5, -0.1, 2.0])
def test_a_level_outside_the_open_unit_interval_is_refused_by_name(confidence):
    base, other = {0: 0.5, 1: 0.52, 2: 0.53}, {0: 0.51, 1: 0.55, 2: 0.54}
    calls = [lambda: difference_interval(base, other, confidence), lambda: quality_verdict(base, other, 0.02,
             confidence=confidence), lambda: ratio_interval([1.0, 1.1], [1.2, 1.4], confidence),
             lambda: seeds_needed(0.01, 0.0, 0.02, True, confidence), lambda: mean_interval([1.0, 2.0], confidence)]
    for call in calls:
        with pytest.raises(CropScaleError, match=r"confidence must lie in \(0, 1\), got " + repr(confidence)):
            call()


def test_a_level_near_its_limits_still_gives_the_statsmodels_interval():
    base, other = [0.50, 0.52, 0.55], [0.51, 0.58, 0.60, 0.62]
    for confidence in (0.01, 0.999):
        i = difference_interval(dict(enumerate(base)), {10 + k: v for k, v in enumerate(other)}, confidence)
        low, high = _welch(base, other, 1 - confidence)
        assert (i.low, i.high, i.confidence) == (pytest.approx(low), pytest.approx(high), confidence)


# ------------------------------------------------------------------------------------- difference_interval
def test_no_value_on_one_side_every_field():
    for base, other, n in (({0: None, 1: float("nan")}, {0: 0.5, 1: 0.6}, (0, 2)),
                           ({0: 0.5, 1: 0.6, 2: 0.7}, {}, (3, 0))):
        i = difference_interval(base, other, 0.8)
        assert i == Interval(None, n_base=n[0], n_other=n[1], why="no value on one side", confidence=0.8)


def test_missing_values_are_dropped_not_read():
    """None, nan and inf are not values: the interval is that of the finite ones (statsmodels, Welch)."""
    base = {0: 0.50, 1: None, 2: 0.53, 3: float("nan"), 4: 0.51}
    other = {10: 0.55, 11: float("inf"), 12: 0.60, 13: None}
    i = difference_interval(base, other)
    low, high = _welch([0.50, 0.53, 0.51], [0.55, 0.60], 0.1)
    assert (i.n_base, i.n_other, i.paired) == (3, 2, False)
    assert (i.low, i.high) == (pytest.approx(low), pytest.approx(high))


def test_paired_with_seeds_of_mixed_types_pairs_by_seed():
    """Seed keys need not be comparable (``0`` and ``"b"``): the pairing is by key, the interval statsmodels'."""
    base = {0: 0.50, "b": 0.60, 2: 0.55}
    other = {"b": 0.64, 2: 0.56, 0: 0.53}  # d: 0 -> 0.03, b -> 0.04, 2 -> 0.01
    i = difference_interval(base, other)
    low, high = DescrStatsW(np.array([0.03, 0.04, 0.01])).tconfint_mean(alpha=0.1)
    assert i.paired and (i.low, i.high) == (pytest.approx(low), pytest.approx(high))
    assert i.spread == pytest.approx(np.std([0.03, 0.04, 0.01], ddof=1))


def test_paired_without_spread_every_field():
    base, other = {0: 0.5, 1: 0.25, 2: 0.75}, {0: 0.625, 1: 0.375, 2: 0.875}  # d = 0.125 in every seed, exact
    i = difference_interval(base, other, 0.8)
    assert i == Interval(0.125, method="paired t over 3 seeds (df 2)", n_base=3, n_other=3, spread=0.0, paired=True,
                         why="no spread observed in 3 seeds", confidence=0.8)


def test_a_spread_exactly_at_the_no_spread_threshold_is_a_spread():
    """``NO_SPREAD`` = 1e-12 counts values *closer than* it as equal; a range of exactly 1e-12 gives an interval."""
    paired = difference_interval({0: 0.0, 1: 0.0}, {0: 0.0, 1: 1e-12})  # d = [0, 1e-12], range 1e-12 exactly
    assert paired.low is not None and paired.paired
    low, high = DescrStatsW(np.array([0.0, 1e-12])).tconfint_mean(alpha=0.1)
    assert (paired.low, paired.high) == (pytest.approx(low, abs=1e-20), pytest.approx(high, abs=1e-20))
    for base, other in (([0.0, 1e-12], [0.5, 0.5]), ([0.5, 0.5], [0.0, 1e-12])):  # one side's range exactly 1e-12
        i = difference_interval(dict(enumerate(base)), {10 + k: v for k, v in enumerate(other)})
        assert i.low is not None and i.why is None


def test_one_seed_on_one_side_every_field():
    """One value on one side (3 on the other, with spread) is no interval: Welch would need 2 per side."""
    i = difference_interval({0: 0.5}, {1: 0.5, 2: 0.6, 3: 0.7}, 0.8)
    assert i == Interval(pytest.approx(0.1), n_base=1, n_other=3, method="none", confidence=0.8,
                         why="1 seed on a side: no spread to form an interval")
    j = difference_interval({1: 0.5, 2: 0.6, 3: 0.7}, {0: 0.5}, 0.8)
    assert (j.n_base, j.n_other, j.low, j.why) == (3, 1, None, "1 seed on a side: no spread to form an interval")


def test_welch_without_spread_every_field():
    i = difference_interval({0: 0.5, 1: 0.5, 2: 0.5}, {3: 0.75, 4: 0.75}, 0.8)
    assert i == Interval(0.25, method="Welch t", n_base=3, n_other=2, spread=0.0, confidence=0.8,
                         why="no spread observed in 3 / 2 seeds")


def test_welch_with_unequal_seeds_and_spreads_every_field():
    """2 vs 4 seeds, variances 0.0002 and 0.00126667: the interval is statsmodels' Welch, the spread the root mean
    of the two sample variances (ddof 1), the level the one asked for."""
    base, other = [0.50, 0.52], [0.55, 0.60, 0.62, 0.63]
    i = difference_interval(dict(enumerate(base)), {10 + k: v for k, v in enumerate(other)}, 0.8)
    low, high = _welch(base, other, 0.2)
    va, vb = 0.0002, (0.05 ** 2 + 0.0 ** 2 + 0.02 ** 2 + 0.03 ** 2) / 3  # deviations from 0.51 and 0.6
    assert (i.estimate, i.low, i.high) == (pytest.approx(0.09), pytest.approx(low), pytest.approx(high))
    assert i.spread == pytest.approx(math.sqrt((va + vb) / 2))
    df = (va / 2 + vb / 4) ** 2 / ((va / 2) ** 2 / 1 + (vb / 4) ** 2 / 3)  # Welch-Satterthwaite
    assert _rest(i) == {"method": f"Welch t over 2 / 4 seeds (df {df:.1f})", "n_base": 2, "n_other": 4,
                        "spread": i.spread, "paired": False, "why": None, "confidence": 0.8}


def test_paired_interval_at_a_level_asked_for():
    base, other = {0: 0.50, 1: 0.52, 2: 0.54}, {0: 0.51, 1: 0.52, 2: 0.56}
    i = difference_interval(base, other, 0.8)
    low, high = DescrStatsW(np.array([0.01, 0.0, 0.02])).tconfint_mean(alpha=0.2)
    assert (i.low, i.high, i.confidence) == (pytest.approx(low), pytest.approx(high), 0.8)


# ------------------------------------------------------------------------------------- decide
def test_decide_with_one_bound_missing_is_inconclusive():
    for low, high in ((None, 0.5), (-0.5, None), (None, -0.5), (0.5, None)):
        assert decide(Interval(0.0, low, high), 0.1) == INCONCLUSIVE


# ------------------------------------------------------------------------------------- seeds_needed
def test_seeds_needed_paired_degrees_of_freedom_hand_worked():
    # sd 1, room 2: k = 2 -> t_1 / sqrt 2 = 4.46 > 2; k = 3 -> t_2 / sqrt 3 = 1.686 < 2: 3 (df k + 1 would say 2)
    assert seeds_needed(1.0, 0.0, 2.0, paired=True) == 3
    # the same room from a negative estimate beyond the margin: | |-3| - 1 | = 2
    assert seeds_needed(1.0, -3.0, 1.0, paired=True) == 3
    # k = 2 already decides: t_1 0.001 / sqrt 2 = 0.0045 < 0.02 (a search starting at 3 would say 3)
    assert seeds_needed(0.001, 0.0, 0.02, paired=True) == 2
    assert seeds_needed(0.001, -0.1, 0.02, paired=False) == 2


def test_seeds_needed_welch_degrees_of_freedom_hand_worked():
    # sd 1, Welch half-width t_{2k-2} sqrt(2/k): k=2 2.920, k=3 t_4 0.8165 = 1.741, k=4 t_6 0.7071 = 1.374
    assert seeds_needed(1.0, 0.0, 2.5, paired=False) == 3  # df 2k+2 or 3k-2 would decide at k = 2 (1.943, 2.132)
    assert seeds_needed(1.0, 0.0, 1.8, paired=False) == 3  # df 2k-3: k = 3 gives t_3 0.8165 = 1.922 > 1.8 -> 4
    assert seeds_needed(1.0, 4.0, 2.2, paired=False) == 3  # room |4 - 2.2| = 1.8, the estimate beyond the margin


def test_seeds_needed_without_spread_or_room_is_none():
    for spread in (0.0, -0.01, None):
        assert seeds_needed(spread, 0.0, 0.02, paired=True) is None
    assert seeds_needed(0.01, -0.02, 0.02, paired=False) is None  # on the margin: no number of seeds decides


def test_seeds_needed_a_half_width_equal_to_the_room_does_not_decide():
    """Strict: at ``half == room`` a bound touches the margin (p = alpha) and decides nothing; the next k does."""
    half2 = T95[1] * 1.0 / math.sqrt(2)
    exact = float(np.float64(6.313751514675037) * 1.0 / math.sqrt(2))  # the k = 2 half-width, t_1 to double
    assert exact == pytest.approx(half2, rel=1e-6)
    assert seeds_needed(1.0, exact, 0.0, paired=True) == 3  # margin 0: the room is the estimate itself


def test_seeds_needed_up_to_and_not_beyond_max_seeds():
    from scipy import stats

    def half(k):  # paired half-width at sd 1, the 95 % one-sided t quantile
        return stats.t.ppf(0.95, k - 1) / math.sqrt(k)

    assert seeds_needed(1.0, 0.0, (half(MAX_SEEDS - 1) + half(MAX_SEEDS)) / 2, paired=True) == MAX_SEEDS
    assert seeds_needed(1.0, 0.0, (half(MAX_SEEDS) + half(MAX_SEEDS + 1)) / 2, paired=True) is None


# ------------------------------------------------------------------------------------- quality_verdict
@pytest.mark.parametrize("margin", [float("nan"), float("inf"), -0.01, -float("inf")])
def test_a_margin_that_is_no_macro_iou_is_refused_by_name(margin):
    with pytest.raises(CropScaleError, match=r"equivalence margin must be a finite macro IoU >= 0, got "):
        quality_verdict({0: 0.5, 1: 0.6}, {0: 0.5, 1: 0.7}, margin)


def test_a_zero_margin_is_allowed_and_only_decides_worse_or_better():
    v = quality_verdict({0: 0.50, 1: 0.52, 2: 0.54}, {0: 0.60, 1: 0.63, 2: 0.62}, margin=0.0)
    assert v.verdict == BETTER and v.figure == "best macro IoU"


def test_figure_and_reason_on_every_path():
    decided = quality_verdict({0: 0.50, 1: 0.52, 2: 0.54}, {0: 0.44, 1: 0.47, 2: 0.47}, 0.02, figure="f1")
    one = quality_verdict({0: 0.5}, {1: 0.5, 2: 0.6}, 0.02, figure="f2")
    crossing = quality_verdict({0: 0.50, 1: 0.52, 2: 0.54}, {0: 0.51, 1: 0.52, 2: 0.56}, 0.02, figure="f3")
    assert (decided.figure, decided.verdict, decided.reason) == ("f1", WORSE, None)
    assert (one.figure, one.verdict, one.reason) == ("f2", INCONCLUSIVE, "1 seed on a side: no spread to form an"
                                                     " interval")
    assert (crossing.figure, crossing.verdict, crossing.reason) == ("f3", INCONCLUSIVE,
                                                                    "the interval crosses the margin")
    assert quality_verdict({0: 0.5}, {1: 0.5, 2: 0.6}).figure == "best macro IoU"


def test_quality_verdict_at_a_level_asked_for_sizes_the_seeds_at_that_level():
    """d = [0, 0.01, 0.02] (sd 0.01), margin 0.02, room 0.01. At 80 %: 0.01 +- t_{0.90,2} 0.01/sqrt 3 = 0.0109
    crosses +0.02; k = 4 gives t_{0.90,3} 0.01 / 2 = 0.0082 < 0.01: 4 seeds. At 90 % it would be 5."""
    base, other = {0: 0.50, 1: 0.50, 2: 0.50}, {0: 0.50, 1: 0.51, 2: 0.52}
    v = quality_verdict(base, other, 0.02, confidence=0.8)
    low, high = DescrStatsW(np.array([0.0, 0.01, 0.02])).tconfint_mean(alpha=0.2)
    assert (v.interval.low, v.interval.high, v.interval.confidence) == (pytest.approx(low), pytest.approx(high), 0.8)
    assert (v.verdict, v.seeds_needed) == (INCONCLUSIVE, 4)
    assert quality_verdict(base, other, 0.02).seeds_needed == 5


def test_seeds_needed_starts_one_past_the_seeds_run_paired():
    """d = [-0.004, 0.006, 0.016] (mean 0.006, sd 0.01), margin 0.02, room 0.014: at k = 3 the half-width
    t_2 0.01/sqrt 3 = 0.0169 crosses; k = 4: t_3 0.01 / 2 = 0.0118 < 0.014: 4 per side, the first count above 3."""
    base, other = {0: 0.5, 1: 0.5, 2: 0.5}, {0: 0.496, 1: 0.506, 2: 0.516}
    v = quality_verdict(base, other, 0.02)
    assert (v.verdict, v.seeds_needed, v.interval.paired) == (INCONCLUSIVE, 4, True)


def test_seeds_needed_welch_starts_past_the_larger_side():
    """2 vs 6 seeds, both variances 0.0002, difference 0: Welch's interval (df about 1.6) crosses +-0.02, while the
    k-per-side formula at the pooled sd 0.01414 would already decide at k = 4 (t_6 0.01414 sqrt(1/2) = 0.0194).
    The figure asks for more seeds than were run: from 7 per side, where the formula holds at once."""
    base = {0: 0.50, 1: 0.52}
    dev = math.sqrt(0.0002 * 5 / 6)  # six values 0.51 +- dev: sample variance 0.0002
    other = {10 + k: 0.51 + (dev if k % 2 else -dev) for k in range(6)}
    v = quality_verdict(base, other, 0.02)
    low, high = _welch(list(base.values()), list(other.values()), 0.1)
    assert (v.interval.low, v.interval.high) == (pytest.approx(low), pytest.approx(high))
    assert v.interval.spread == pytest.approx(math.sqrt(0.0002)) and not v.interval.paired
    assert T95[6] * math.sqrt(0.0002) * math.sqrt(2 / 4) < 0.02 < T95[4] * math.sqrt(0.0002) * math.sqrt(2 / 3)
    assert (v.verdict, v.seeds_needed) == (INCONCLUSIVE, 7)


def test_seeds_needed_of_a_welch_interval_uses_the_welch_formula():
    """2 vs 3 seeds, variances 0.0002 / 0.0009, difference 0.0: pooled sd sqrt((0.0002 + 0.0009) / 2) = 0.023452,
    room 0.02. Welch formula t_{2k-2} s sqrt(2/k): k = 7 -> t_12 = 1.7823, 0.02234; k = 8 -> t_14 = 1.7613, 0.02065;
    k = 9 -> t_16 = 1.7459, 0.01930 < 0.02: 9 per side. The paired formula t_{k-1} s / sqrt k would say 6
    (k = 5: t_4 s / sqrt 5 = 0.02236; k = 6: t_5 s / sqrt 6 = 0.01929)."""
    base, other = {0: 0.49, 1: 0.51}, {10: 0.47, 11: 0.50, 12: 0.53}
    v = quality_verdict(base, other, 0.02)
    assert v.interval.spread == pytest.approx(math.sqrt(0.00055)) and v.verdict == INCONCLUSIVE
    assert v.seeds_needed == 9


# ------------------------------------------------------------------------------------- QualityVerdict.text
def test_text_of_each_verdict_in_full():
    i = Interval(0.004, -0.011, 0.019, "paired t over 3 seeds (df 2)", 3, 3, 0.01, True)
    assert QualityVerdict("f", i, 0.02, EQUIVALENT).text() == (
        "equivalent (+0.0040, 90 % CI -0.0110..+0.0190 within +-0.02, TOST alpha = 0.05, paired t over 3 seeds"
        " (df 2))")
    up = Interval(0.06, 0.043, 0.077, "m", 3, 3, 0.01, True)
    assert QualityVerdict("f", up, 0.02, BETTER).text() == (
        "better (+0.0600, 90 % CI +0.0430..+0.0770 above +0.02, one-sided t alpha = 0.05, m)")
    down = Interval(-0.06, -0.077, -0.043, "m", 3, 3, 0.01, True)
    assert QualityVerdict("f", down, 0.02, WORSE).text() == (
        "worse (-0.0600, 90 % CI -0.0770..-0.0430 below -0.02, one-sided t alpha = 0.05, m)")
    cross = Interval(0.01, -0.007, 0.027, "m", 3, 3, 0.01, True, confidence=0.8)
    assert QualityVerdict("f", cross, 0.02, INCONCLUSIVE, 5).text() == (
        "inconclusive (+0.0100, 80 % CI -0.0070..+0.0270 crosses +-0.02, alpha = 0.05 per side, m;"
        " seeds that would decide: about 5 per side)")


def test_text_without_a_figure_to_size_the_seeds():
    wide = Interval(0.03, -0.5, 0.6, "m", 3, 3, 1.0, True)  # seeds_needed None, not on the margin: too many
    assert QualityVerdict("f", wide, 0.02, INCONCLUSIVE).text().endswith(
        "; seeds that would decide: more than 1000 per side)")
    tiny = Interval(1e-12, -0.5, 0.6, "m", 3, 3, 1.0, True)  # |1e-12| - 0 is 1e-12: not closer than NO_SPREAD
    assert QualityVerdict("f", tiny, 0.0, INCONCLUSIVE).text().endswith("seeds that would decide: more than 1000"
                                                                        " per side)")
    on = Interval(-0.02, -0.05, 0.01, "m", 3, 3, 0.01, True)
    assert QualityVerdict("f", on, 0.02, INCONCLUSIVE).text().endswith(
        "; seeds that would decide: none at this estimate (on the margin))")


def test_text_without_an_interval_in_full():
    one = quality_verdict({0: 0.50}, {0: 0.60})
    assert one.text() == ("inconclusive (+0.1000, no CI: 1 seed on a side: no spread to form an interval;"
                          " margin +-0.02, alpha = 0.05 per side; seeds that would decide: at least 2 per side)")
    flat = quality_verdict({0: 0.5, 1: 0.5}, {2: 0.75, 3: 0.75})
    assert flat.text() == ("inconclusive (+0.2500, no CI: no spread observed in 2 / 2 seeds; margin +-0.02,"
                           " alpha = 0.05 per side; seeds that would decide: no spread known to size it)")
    spread_one = QualityVerdict("f", Interval(0.1, spread=1.0, why="w"), 0.02, INCONCLUSIVE)
    assert spread_one.text().endswith("seeds that would decide: at least 2 per side)")
    assert quality_verdict({0: None}, {0: 0.6}).text() == "inconclusive (no value on one side)"


# ------------------------------------------------------------------------------------- ratio_interval
def test_ratio_no_rate_on_one_side_every_field():
    for base, other, n in (([0.0, -1.0, None], [2.0, 3.0], (0, 2)), ([2.0, 3.0, 4.0], [0.0, float("nan")], (3, 0))):
        assert ratio_interval(base, other, 0.8) == Interval(None, n_base=n[0], n_other=n[1],
                                                            why="no rate on one side", confidence=0.8)


def test_a_zero_rate_on_the_other_side_is_dropped():
    clean = ratio_interval([2.0, 2.2], [3.0, 3.1])
    dirty = ratio_interval([2.0, 2.2], [0.0, 3.0, 3.1])
    assert (dirty.estimate, dirty.low, dirty.high, dirty.n_other) == (clean.estimate, clean.low, clean.high, 2)


def test_ratio_one_run_every_field():
    assert ratio_interval([2.0], [3.0, 3.3], 0.8) == Interval(pytest.approx(math.sqrt(9.9) / 2), n_base=1, n_other=2,
                                                              method="none", confidence=0.8, why="one run on a side")
    assert ratio_interval([2.0], [3.0], unit="seeds").why == "one seed per side"


def test_ratio_without_spread_every_field():
    i = ratio_interval([2.0, 2.0], [3.0, 3.0, 3.0], 0.8, unit="seeds")
    assert i == Interval(pytest.approx(1.5), method="Welch t on log rates", n_base=2, n_other=3, spread=0.0,
                         confidence=0.8, why="no spread observed in 2 / 3 seeds")


@pytest.mark.parametrize("base,other", [([2.0, 2.0, 2.0], [1.0, 1.2, 1.1]), ([1.0, 1.2, 1.1], [3.0, 3.0])])
def test_ratio_with_one_side_constant_still_has_an_interval(base, other):
    """A side without spread is fine when the other has some (Welch): a speed-up < 1 and one > 1, statsmodels."""
    i = ratio_interval(base, other, 0.8)
    low, high = _welch(np.log(base), np.log(other), 0.2)
    assert (i.low, i.high) == (pytest.approx(math.exp(low)), pytest.approx(math.exp(high)))
    assert i.confidence == 0.8 and i.why is None and (i.estimate < 1) == (other[0] < base[0])
    assert i.method.startswith(f"Welch t on log rates over {len(base)} / {len(other)} runs (df ")


# ------------------------------------------------------------------------------------- mean_interval
def test_mean_interval_against_statsmodels():
    x = [10.0, 12.0, 17.0]
    assert mean_interval(x) == pytest.approx(DescrStatsW(np.array(x)).tconfint_mean(alpha=0.05))
    assert mean_interval([None, 10.0, float("nan"), 12.0, 17.0], 0.8) == pytest.approx(
        DescrStatsW(np.array(x)).tconfint_mean(alpha=0.2))
    # two values whose population sd is exactly 1: an interval, not the no-spread answer: 1 +- t_{0.975,1} = 12.706
    assert mean_interval([0.0, 2.0]) == pytest.approx((1 - 12.706205, 1 + 12.706205))


def test_mean_interval_needs_two_values_and_equal_values_give_a_point():
    for values in ([1.0], [1.0, None, float("nan")], []):
        with pytest.raises(CropScaleError, match="an interval of the mean needs at least 2 values, got 1|got 0"):
            mean_interval(values)
    assert mean_interval([3.5, 3.5, 3.5]) == (3.5, 3.5)


# ------------------------------------------------------------------------------------- scaled
def test_scaled_multiplies_the_numbers_and_keeps_every_other_field():
    i = Interval(2.0, 1.5, 2.5, "Welch t on log rates over 2 / 3 runs (df 2.1)", 2, 3, 0.1, True, "w", 0.8)
    assert scaled(i, 0.5) == Interval(1.0, 0.75, 1.25, "Welch t on log rates over 2 / 3 runs (df 2.1)", 2, 3, 0.1,
                                      True, "w", 0.8)
    assert scaled(Interval(2.0, why="one run on a side"), 0.25) == Interval(0.5, why="one run on a side")


# ------------------------------------------------------------------------------------- format_ratio
def test_format_ratio_in_full_with_and_without_1_inside():
    clear = Interval(0.8, 0.7, 0.9, "m", 2, 2)
    assert format_ratio(clear) == "0.80x training-loop samples/s (90 % CI 0.70..0.90, alpha = 0.05 per side, m)"
    at_one = Interval(1.2, 1.0, 1.4, "m", 2, 2)  # a bound exactly at 1 includes 1
    assert format_ratio(at_one, "x/s") == ("1.20x x/s (90 % CI 1.00..1.40, alpha = 0.05 per side, m, includes 1: no"
                                           " speed-up shown)")


# ------------------------------------------------------------------------------------- run_rate, speedup_interval
def _run(rates: list[float] | None, warmup: int = 0) -> RunRecord:
    """A run whose epochs have these training-loop rates (samples/s, 32 samples each); None: no run.json."""
    run_json = None if rates is None else RunJson(status="finished", summary=RunSummary(throughput=ThroughputSummary(
        epochs=[ThroughputEpoch(epoch=i, samples=32, train_s=32 / q) for i, q in enumerate(rates)])))
    return RunRecord(name="r", kind="run", path="r", evidence="measured-run", run_json=run_json, warmup_epochs=warmup)


def test_run_rate_without_run_json_or_throughput():
    assert run_rate(_run(None)) == run_rate(_run([])) == type(run_rate(_run(None)))(None)
    bare = RunRecord(name="r", kind="run", path="r", evidence="measured-run",
                     run_json=RunJson(status="finished", summary=RunSummary(throughput=None)))
    assert run_rate(bare).rate is None


def test_speedup_spread_text_is_the_median_per_side_in_percent():
    """Within-run spreads (sd of log epoch rates): base runs 0.5, 0.1, 0.3 -> median 30.0 %; other 0.2 -> 20.0 %."""
    def two_epochs(sd):  # log rates mu +- sd / sqrt 2: sample sd exactly sd
        h = sd / math.sqrt(2)
        return _run([10 * math.exp(-h), 10 * math.exp(h)])

    base = [two_epochs(0.5), two_epochs(0.1), two_epochs(0.3)]
    other = [two_epochs(0.2), two_epochs(0.2)]
    interval, text = speedup_interval(base, other, 0.8)
    assert text == "within-run epoch spread 30.0 % / 20.0 % (sd of log epoch rates, median over runs)"
    assert interval.confidence == 0.8
    _, half = speedup_interval([two_epochs(0.5)], [_run([10.0])])
    assert half.startswith("within-run epoch spread 50.0 % / n/a (")


@settings(max_examples=40, deadline=None)
@given(a=st.lists(st.floats(0.1, 100.0), min_size=2, max_size=5), b=st.lists(st.floats(0.1, 100.0), min_size=2,
                                                                                 max_size=5),
       scale=st.floats(0.1, 10.0))
def test_ratio_interval_matches_statsmodels_on_logs_and_scales_with_one_side(a, b, scale):
    """For all rates: the interval is statsmodels' Welch interval of the log rates, exponentiated; scaling only
    ``other`` by ``c`` scales the estimate and both bounds by ``c``."""
    i = ratio_interval(a, b)
    la, lb = np.log(a), np.log(b)
    assert i.estimate == pytest.approx(math.exp(lb.mean() - la.mean()), rel=1e-9)
    if i.low is None:
        assert np.ptp(la) < 1e-12 and np.ptp(lb) < 1e-12
        return
    low, high = _welch(la, lb, 0.1)
    assert (i.low, i.high) == (pytest.approx(math.exp(low), rel=1e-6), pytest.approx(math.exp(high), rel=1e-6))
    j = ratio_interval(a, [x * scale for x in b])
    assert (j.estimate, j.low, j.high) == (pytest.approx(i.estimate * scale, rel=1e-6),
                                           pytest.approx(i.low * scale, rel=1e-6),
                                           pytest.approx(i.high * scale, rel=1e-6))
