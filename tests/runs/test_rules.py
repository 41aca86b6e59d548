"""The figure rules, with hand-worked numbers: every figure over the measured epochs only."""

from __future__ import annotations

import pytest

from cropscale.runs import rules
from cropscale.runs.schema import RunSummary


def _summary() -> RunSummary:
    step = [(40.0, 44.0), (30.0, 33.0), (20.0, 22.0)]  # epoch 0 is the warm-up epoch
    return RunSummary.from_json({
        "step_timing": {"warmup_steps": 2, "steps_total": 30, "epochs": [
            {"epoch": e, "windows_ms": {"step": {"median": m, "p95": p, "n": 8},
                                        "data_wait": {"median": m / 10}, "forward": {"median": m / 2}}}
            for e, (m, p) in enumerate(step)]},
        "throughput": {"epochs": [
            {"epoch": 0, "samples": 100, "train_s": 50.0, "val_s": 9.0, "wall_s": 59.0},
            {"epoch": 1, "samples": 100, "train_s": 20.0, "val_s": 4.0, "wall_s": 24.0},
            {"epoch": 2, "samples": 60, "train_s": 12.0, "val_s": 6.0, "wall_s": 18.0}]},
        "energy": {"available": True, "method": "counter", "epochs": [
            {"epoch": 0, "energy_j": 900.0, "samples": 100}, {"epoch": 1, "energy_j": 300.0, "samples": 100},
            {"epoch": 2, "energy_j": 180.0, "samples": 60}]},
    })


def test_step_time_is_the_median_over_measured_epochs():
    median, p95 = rules.step_time(_summary(), warmup_epochs=1)
    assert median.value == 25.0 and p95.value == pytest.approx(27.5)  # median(30, 20), median(33, 22)
    median0, _ = rules.step_time(_summary(), warmup_epochs=0)
    assert median0.value == 30.0  # median(40, 30, 20)


def test_samples_per_s_sums_samples_and_seconds_of_measured_epochs():
    assert rules.samples_per_s(_summary(), 1).value == pytest.approx(160 / 32)
    assert rules.samples_per_s(_summary(), 0).value == pytest.approx(260 / 82)
    assert rules.samples_per_s(_summary(), 3).value is None


def test_epoch_times_windows_shares_and_energy():
    s = _summary()
    assert rules.epoch_time(s, "val_s", 1).value == 5.0  # median(4, 6)
    assert rules.epoch_seconds(s, 1) == {"train_s": [20.0, 12.0], "val_s": [4.0, 6.0], "wall_s": [24.0, 18.0]}
    windows, source = rules.step_windows(s, ("data_wait", "forward", "backward"), 1)
    assert windows == {"data_wait": 2.5, "forward": 12.5} and "2 measured epoch" in source
    assert rules.step_share(s, "data_wait", 1) == pytest.approx(0.1)
    joules, per_sample = rules.energy(s, 1)
    assert joules.value == 480.0 and per_sample.value == pytest.approx(480 / 160)


def test_a_missing_figure_says_why():
    empty = RunSummary()
    median, _ = rules.step_time(empty, 1)
    assert median.value is None and "no step_timing or throughput summary" in median.why
    assert "no throughput summary" in rules.samples_per_s(empty, 1).why
    assert "not measured" in rules.energy(empty, 1)[0].why
    assert rules.Figure(float("nan")).value is None
