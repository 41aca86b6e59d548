"""Quality equivalence, speed-up intervals and time to target against hand-worked numbers (issue 30).

t quantiles from a printed table: t_{0.975, 2} = 4.302653 (two-sided 95 %, 2 degrees of freedom).
"""

from __future__ import annotations

import math

import pytest

from cropscale.report.equivalence import (
    BETTER,
    EQUIVALENT,
    INCONCLUSIVE,
    WORSE,
    difference_interval,
    format_ratio,
    quality_verdict,
    ratio_interval,
    seeds_needed,
    time_to_target,
)
from cropscale.runs.record import RunRecord
from cropscale.runs.schema import EnergyEpoch, EnergySummary, RunJson, RunSummary, ThroughputEpoch, ThroughputSummary

T_975_DF2 = 4.302653

BASE = {0: 0.50, 1: 0.52, 2: 0.54}


def test_paired_interval_by_seed_hand_worked():
    # d = [0.01, 0.00, 0.02]: mean 0.01, sd 0.01, half-width 4.302653 x 0.01 / sqrt(3) = 0.024841
    other = {0: 0.51, 1: 0.52, 2: 0.56}
    i = difference_interval(BASE, other)
    half = T_975_DF2 * 0.01 / math.sqrt(3)
    assert i.paired and i.estimate == pytest.approx(0.01)
    assert (i.low, i.high) == (pytest.approx(0.01 - half, abs=1e-6), pytest.approx(0.01 + half, abs=1e-6))
    v = quality_verdict(BASE, other, margin=0.02)
    assert v.verdict == INCONCLUSIVE  # -0.0148..+0.0348 crosses +0.02
    # room = 0.02 - 0.01 = 0.01: t_{k-1} 0.01 / sqrt(k) < 0.01 first at k = 7 (t_6 = 2.447 < sqrt 7 = 2.646;
    # k = 6: t_5 = 2.571 > sqrt 6 = 2.449)
    assert v.seeds_needed == 7
    assert "need more seeds: about 7 per side" in v.text()
    assert quality_verdict(BASE, other, margin=0.05).verdict == EQUIVALENT  # within -0.05..+0.05


def test_one_seed_per_side_is_inconclusive_never_a_verdict():
    for other in ({0: 0.50}, {0: 0.90}, {0: 0.10}):
        v = quality_verdict({0: 0.50}, other, margin=0.02)
        assert v.verdict == INCONCLUSIVE and v.interval.low is None
        assert "at least 2 per side" in v.text()


def test_identical_runs_are_equivalent():
    runs = {0: 0.41, 1: 0.47, 2: 0.44}
    v = quality_verdict(runs, dict(runs), margin=0.02)
    assert v.verdict == EQUIVALENT
    assert (v.interval.estimate, v.interval.low, v.interval.high) == (0.0, 0.0, 0.0)


def test_a_shift_larger_than_the_margin_is_worse_and_the_mirror_better():
    # d = [-0.06, -0.05, -0.07]: mean -0.06, sd 0.01 -> -0.0848..-0.0352, all below -0.02
    other = {0: 0.44, 1: 0.47, 2: 0.47}
    v = quality_verdict(BASE, other, margin=0.02)
    half = T_975_DF2 * 0.01 / math.sqrt(3)
    assert v.verdict == WORSE
    assert v.interval.high == pytest.approx(-0.06 + half, abs=1e-6)
    assert quality_verdict(other, BASE, margin=0.02).verdict == BETTER


def test_welch_when_the_seeds_differ_hand_worked():
    # means 0.52 and 0.62, each variance 0.0008: se = sqrt(0.0004 + 0.0004), Welch df = 2
    i = difference_interval({0: 0.50, 1: 0.54}, {2: 0.60, 3: 0.64})
    half = T_975_DF2 * math.sqrt(0.0008)
    assert not i.paired and "Welch" in i.method
    assert i.estimate == pytest.approx(0.10)
    assert (i.low, i.high) == (pytest.approx(0.10 - half, abs=1e-6), pytest.approx(0.10 + half, abs=1e-6))


def test_seeds_needed_welch_hand_worked():
    # pooled sd 0.02, estimate 0, margin 0.02 -> room 0.02: t_{2k-2} 0.02 sqrt(2/k) < 0.02 needs
    # t_{2k-2} < sqrt(k/2): k = 7 -> t_12 = 2.179 > 1.871; k = 8 -> t_14 = 2.145 > 2.000;
    # k = 9 -> t_16 = 2.1199 < 2.1213: 9 seeds per side
    assert seeds_needed(0.02, 0.0, 0.02, paired=False) == 9
    assert seeds_needed(None, 0.0, 0.02, paired=False) is None


def test_speedup_interval_on_log_rates_hand_worked():
    # log rates: base [0, 0.02], other [ln 1.5, ln 1.5 + 0.02]: variances 0.0002, se = sqrt(0.0002), df 2
    i = ratio_interval([1.0, math.exp(0.02)], [1.5, 1.5 * math.exp(0.02)])
    half = T_975_DF2 * math.sqrt(0.0002)
    assert i.estimate == pytest.approx(1.5)
    assert (i.low, i.high) == (pytest.approx(1.5 * math.exp(-half), rel=1e-6), pytest.approx(1.5 * math.exp(half),
                                                                                           rel=1e-6))
    assert format_ratio(i) == f"1.50x samples/s ({1.5 * math.exp(-half):.2f}..{1.5 * math.exp(half):.2f})"
    noisy = ratio_interval([1.0, 1.2], [1.05, 1.25])
    assert noisy.includes(1.0) and "includes 1" in format_ratio(noisy)
    single = ratio_interval([1.0], [1.5])
    assert single.low is None and "no interval" in format_ratio(single)


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
    t = time_to_target(rec, 0.45)  # first reached after epoch 1's validation
    assert t.reached and t.epoch == 1
    assert (t.seconds, t.steps, t.samples, t.joules) == (25.0, 8.0, 64, 210.0)
    miss = time_to_target(rec, 0.51)
    assert not miss.reached and miss.why == "not reached" and miss.seconds is None
    cpu = time_to_target(_record([(0, 0.5)], walls=[9.0], samples=[16]), 0.4)
    assert cpu.seconds == 9.0 and cpu.joules is None and "NVML" in cpu.why
