"""The convergence note and samples to target compared as MLPerf Training compares runs (issue 38).

Trimming, infinite non-reaching runs and the runs-per-CV bands are worked by hand from the MLPerf Training rules
(5 or 10 runs with the fastest and slowest dropped, 40 with 4 + 4 dropped for UNet3D; a non-converging run counts as
infinitely slow); the one-sided tests are checked against statsmodels' ``ttest_ind`` (pooled and unequal variances).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from statsmodels.stats.weightstats import CompareMeans, DescrStatsW

from cropscale.report.convergence import (
    FEWER,
    MORE,
    compare_to_target,
    convergence_note,
    olympic,
    runs_needed,
    still_improving,
    to_target,
    trim_count,
)
from cropscale.report.equivalence import INCONCLUSIVE
from cropscale.runs.record import RunRecord
from cropscale.runs.schema import EnergyEpoch, EnergySummary, RunJson, RunSummary, ThroughputEpoch, ThroughputSummary

INF = math.inf


# ------------------------------------------------------------------ still improving
def test_still_improving_over_the_last_epochs_hand_worked():
    assert still_improving([(0, 0.10), (1, 0.15), (2, 0.16)], 0.01) is True  # 0.16 - 0.10 = 0.06
    assert still_improving([(0, 0.30), (1, 0.305), (2, 0.309)], 0.01) is False  # 0.009
    # exactly min_delta (binary-exact numbers) counts as still improving: >=, not >
    assert still_improving([(0, 0.5), (1, 0.5), (2, 0.515625)], 0.015625) is True
    # the window is the last `patience` epochs: an early rise does not count
    assert still_improving([(0, 0.0), (1, 0.4), (2, 0.4), (3, 0.4)], 0.01) is False
    assert still_improving([(0, 0.1), (1, 0.2)], 0.01) is None  # 2 points: cannot judge 2 epochs back
    assert still_improving([(0, 0.1), (1, 0.2)], 0.01, patience=1) is True


def test_two_small_gains_add_up_unlike_an_epoch_by_epoch_rule():
    """Lightning's EarlyStopping (min_delta 0.01, patience 2) would call this plateaued (each gain 0.006 < 0.01);
    the window's gain 0.012 says still improving: the cautious side for an 'equivalent' claim."""
    assert still_improving([(0, 0.300), (1, 0.306), (2, 0.312)], 0.01) is True


def _curve(*best: float) -> RunRecord:
    return RunRecord(name="r", kind="run", path="r", evidence="measured-run",
                     iou_by_epoch=[(e, v) for e, v in enumerate(best)])


def test_the_note_uses_half_the_margin_and_counts_runs_too_short_to_judge():
    # margin 0.02 -> min_delta 0.01: a gain of 0.015 over the last 2 epochs is still improving (a full-margin
    # threshold would call it plateaued); 0.005 is not
    base = [_curve(0.300, 0.310, 0.315), _curve(0.300, 0.303, 0.305)]
    note = convergence_note("FP32", base, "BF16", [_curve(0.4, 0.4, 0.4)], margin=0.02)
    assert (note.base.improving, note.base.plateaued, note.other.plateaued) == (1, 1, 1)
    assert note.min_delta == 0.01 and note.at_budget and note.budget == "at this budget (3 epochs)"
    assert note.text().startswith("convergence: FP32 1 of 2 run(s) still improving, BF16 0 of 1 run(s) still")
    flat = convergence_note("FP32", base[1:], "BF16", [_curve(0.4, 0.4, 0.4)], margin=0.02)
    assert not flat.at_budget and flat.text().startswith("convergence: every run of both sides plateaued")
    short = convergence_note("FP32", base[1:], "BF16", [_curve(0.4, 0.4)], margin=0.02)  # 2 epochs: cannot judge
    assert short.other.unknown == 1 and short.at_budget and "1 too short to judge" in short.text()


# ------------------------------------------------------------------ MLPerf's trimming and every run counted
@pytest.mark.parametrize("runs,trim", [(2, 0), (4, 0), (5, 1), (10, 1), (19, 1), (20, 2), (40, 4)])
def test_trim_counts_follow_mlperf(runs, trim):
    assert trim_count(runs) == trim


def test_olympic_mean_drops_the_fastest_and_slowest_of_five():
    side = olympic([10.0, 20.0, 30.0, 40.0, 1000.0])
    assert side.kept == [20.0, 30.0, 40.0] and side.mean == 30.0 and side.trimmed == 1
    assert olympic([10.0, 20.0, 30.0, 1000.0]).mean == 265.0  # 4 runs: nothing dropped


def test_a_run_that_does_not_reach_is_counted_not_dropped():
    # 5 runs: the one that never reaches is the slowest and trimming drops it (MLPerf allows one)
    one = compare_to_target([64, 64, 96, 96, 128], [64, 96, 96, 128, INF])
    assert one.other.mean == pytest.approx((96 + 96 + 128) / 3) and one.other.not_reached == 1
    assert "1 of 5 other run(s) not reaching it" in one.sides_text()
    # two that never reach: one is left after trimming, the side has no finite mean
    two = compare_to_target([64, 64, 96, 96, 128], [64, 96, 96, INF, INF])
    assert two.verdict == "not reached" and two.ratio is None and "infinitely slow" in two.why
    # below 5 runs nothing is trimmed: a single non-reaching run leaves no mean (the old median of the
    # runs that reached would have said 64)
    few = compare_to_target([64, 96], [64, INF])
    assert few.verdict == "not reached" and few.other.mean == INF


def test_one_sided_student_when_spreads_are_similar_hand_checked_with_statsmodels():
    base, other = [96.0, 128.0, 96.0, 128.0, 112.0, 100.0], [64.0, 96.0, 80.0, 72.0, 88.0, 64.0]
    c = compare_to_target(base, other)
    kb, ko = np.array(sorted(base)[1:-1]), np.array(sorted(other)[1:-1])  # 6 runs: fastest and slowest dropped
    cm = CompareMeans(DescrStatsW(ko), DescrStatsW(kb))
    assert "Student" in c.method  # sd ratio within 1/2..2
    assert c.p_fewer == pytest.approx(cm.ttest_ind(alternative="smaller", usevar="pooled")[1])
    assert c.p_more == pytest.approx(cm.ttest_ind(alternative="larger", usevar="pooled")[1])
    assert c.verdict == FEWER and c.ratio == pytest.approx(ko.mean() / kb.mean())
    assert compare_to_target(other, base).verdict == MORE


def test_one_sided_welch_when_spreads_differ_more_than_mlperf_allows():
    base, other = [100.0, 101.0, 99.0, 100.0], [90.0, 60.0, 120.0, 70.0]  # sd ratio about 30
    c = compare_to_target(base, other)
    cm = CompareMeans(DescrStatsW(np.array(other)), DescrStatsW(np.array(base)))
    assert "Welch" in c.method
    assert c.p_fewer == pytest.approx(cm.ttest_ind(alternative="smaller", usevar="unequal")[1])
    assert c.p_fewer != pytest.approx(cm.ttest_ind(alternative="smaller", usevar="pooled")[1])
    assert c.verdict == INCONCLUSIVE  # p about 0.13 with df about 3


def test_mlperf_similar_variances_is_a_strict_range():
    """sd ratio exactly 2 or 1/2 lies outside MLPerf's 1/2 < s1/s2 < 2: Welch's test, not Student's."""
    for base, other in (([1.0, 3.0], [1.0, 5.0]), ([1.0, 5.0], [1.0, 3.0])):  # sd sqrt(2) and 2 sqrt(2)
        assert "Welch" in compare_to_target(base, other).method
    assert "Student" in compare_to_target([1.0, 3.0], [1.0, 4.5]).method  # ratio 1.75


def test_no_spread_is_no_test_and_the_runs_needed_from_the_cv():
    same = compare_to_target([64, 64], [32, 32])
    assert same.verdict == INCONCLUSIVE and same.p_fewer is None and "no spread observed in 2 / 2 runs" in same.why
    assert same.ratio == 0.5 and same.cv == 0.0 and same.runs == 5
    # cv of [60, 80] = sd 14.142 / mean 70 = 20.2 %: about 40 runs per side
    wide = compare_to_target([60, 80], [64, 64])
    assert wide.cv == pytest.approx(math.sqrt(200) / 70) and wide.runs == 40
    assert "CV 20.2 %: about 40 runs per side (MLPerf's bands), ran 2 / 2" in wide.runs_text()


@pytest.mark.parametrize("cv,runs", [(0.0, 5), (0.01, 5), (0.049, 5), (0.05, 10), (0.09, 10), (0.0999, 10),
                                     (0.10, 40), (0.20, 40)])
def test_runs_needed_bands(cv, runs):
    assert runs_needed(cv) == runs


# ------------------------------------------------------------------ one run to target
def _record(best_by_epoch, walls, samples, joules=None, updates=4.0) -> RunRecord:
    epochs = [ThroughputEpoch(epoch=i, samples=s, train_s=w - 1.0, val_s=1.0, wall_s=w)
              for i, (w, s) in enumerate(zip(walls, samples, strict=True))]
    energy = (EnergySummary(available=True, epochs=[EnergyEpoch(epoch=i, energy_j=j) for i, j in enumerate(joules)])
              if joules else EnergySummary(available=False, reason="no GPU"))
    run_json = RunJson(status="finished", summary=RunSummary(throughput=ThroughputSummary(epochs=epochs),
                                                             energy=energy))
    return RunRecord(name="r", kind="run", path="r", evidence="measured-run", iou_by_epoch=list(best_by_epoch),
                     run_json=run_json, updates_per_epoch=updates)


def test_time_steps_samples_joules_to_target_hand_worked():
    rec = _record([(0, 0.30), (1, 0.46), (2, 0.50)], walls=[12.0, 13.0, 11.0], samples=[32, 32, 32],
                  joules=[100.0, 110.0, 90.0])
    t = to_target(rec, 0.45)  # first reached after epoch 1's validation
    assert t.reached and t.epoch == 1
    assert (t.seconds, t.steps, t.samples, t.joules) == (25.0, 8.0, 64, 210.0)
    assert t.value("samples") == 64
    miss = to_target(rec, 0.51)
    assert not miss.reached and miss.why == "not reached" and miss.seconds is None and miss.value("samples") == INF
    cpu = to_target(_record([(0, 0.5)], walls=[9.0], samples=[16]), 0.4)
    assert cpu.seconds == 9.0 and cpu.joules is None and "NVML" in cpu.why
