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


def test_two_throughputs_named_apart_hand_worked():
    """The training loop's samples/s (train_s) and the epoch clock's (wall_s) over the same measured epochs."""
    s = _summary()
    assert rules.samples_per_s(s, 1).value == pytest.approx(160 / 32)
    assert rules.samples_per_s_epoch_clock(s, 1).value == pytest.approx(160 / 42)  # wall 24 + 18
    assert rules.samples_per_s_epoch_clock(s, 0).value == pytest.approx(260 / 101)
    assert "end-to-end epoch seconds" in rules.samples_per_s_epoch_clock(s, 1).note
    assert "no throughput summary" in rules.samples_per_s_epoch_clock(RunSummary(), 1).why


@pytest.mark.parametrize("samples,period,stands", [
    (60, 1.0, True),     # MLPerf's bounds, exactly: at least 60 readings, at least one a second
    (59, 0.1, False),    # one reading short
    (600, 1.01, False),  # read less than once a second
    (None, 0.1, False),  # count not recorded
])
def test_a_sampled_power_figure_needs_60_readings_at_least_once_a_second(samples, period, stands):
    data = _summary().to_json()
    data["energy"].update(method="sampled-power", power_samples=samples, power_sample_period_s=period)
    joules, per_sample = rules.energy(RunSummary.from_json(data), 1)
    assert (joules.value is not None, per_sample.value is not None) == (stands, stands)
    if not stands:
        assert "MLPerf's power rules: at least 60 readings per run, at least one every 1 s" in joules.why
    counter = rules.energy(_summary(), 1)[0]  # the energy counter needs no readings count
    assert counter.value == 480.0 and counter.note.startswith("GPU board energy (NVML): no CPU, memory")


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


NAN, INF = float("nan"), float("inf")


def test_divergence_needs_the_last_window_of_logged_losses_non_finite():
    finite_then_nan = [(2, 2.1), (4, 1.9), (6, NAN), (8, INF), (10, NAN)]
    verdict = rules.divergence(finite_then_nan, window=3)
    assert verdict.diverged is True
    assert (verdict.trailing, verdict.since_step, verdict.last_finite_step) == (3, 6, 4)
    assert verdict.why == "train/loss_step non-finite at the last 3 logged step(s) (steps 6-10; last finite at step 4)"
    # two trailing non-finite losses are not three
    short_tail = rules.divergence(finite_then_nan[:2] + finite_then_nan[3:], window=3)
    assert short_tail.diverged is False and (short_tail.trailing, short_tail.since_step) == (2, 8)
    assert "fewer than the 3" in short_tail.why
    # one bad batch in the middle of a finite series is no divergence
    blip = rules.divergence([(1, 2.0), (2, NAN), (3, 1.8), (4, 1.7)], window=3)
    assert blip.diverged is False and blip.trailing == 0 and blip.last_finite_step == 4


def test_divergence_of_short_and_empty_series():
    both_nan = rules.divergence([(1, NAN), (2, NAN)], window=3)  # every logged loss non-finite
    assert both_nan.diverged is True and both_nan.last_finite_step is None and "never finite" in both_nan.why
    assert rules.divergence([(1, 2.0), (2, NAN)], window=3).diverged is False
    empty = rules.divergence([], window=3)
    assert empty.diverged is None and "cannot be judged" in empty.why
    one = rules.divergence([(5, NAN)], window=1)
    assert one.why == "train/loss_step non-finite at the last 1 logged step(s) (step 5; never finite)"
    with pytest.raises(Exception, match="window must be >= 1"):
        rules.divergence([(1, 1.0)], window=0)


def test_loss_tail_counts_as_the_series_grows():
    tail = rules.LossTail()
    for step, value in [(1, 1.0), (2, NAN), (3, 0.5), (4, INF), (5, NAN)]:
        tail.add(step, value)
    assert (tail.logged, tail.trailing, tail.trailing_first, tail.last_step, tail.last_finite_step) == (5, 2, 4, 5, 3)


def _ranks(per_epoch: list[list[float | None]]) -> RunSummary:
    return RunSummary.from_json({"step_timing": {"epochs": [
        {"epoch": e, "step_ms_per_rank": {"per_rank": ranks}} for e, ranks in enumerate(per_epoch)]}})


def test_slowest_rank_is_the_rank_with_the_largest_median_over_measured_epochs():
    # epoch 0 is the warm-up; rank 0: median(110, 120) = 115 ms, rank 1: median(105, 130) = 117.5 ms
    rank, step = rules.slowest_rank(_ranks([[100.0, 150.0], [110.0, 105.0], [120.0, 130.0]]), warmup_epochs=1)
    assert rank.value == 1 and step.value == pytest.approx(117.5)
    assert "rank 0 115.0 ms, rank 1 117.5 ms" in step.note
    # all epochs: rank 0 median(100, 110, 120) = 110, rank 1 median(150, 105, 130) = 130
    rank0, step0 = rules.slowest_rank(_ranks([[100.0, 150.0], [110.0, 105.0], [120.0, 130.0]]), warmup_epochs=0)
    assert (rank0.value, step0.value) == (1, 130.0)


def test_slowest_rank_is_na_with_the_reason():
    one, _ = rules.slowest_rank(_ranks([[100.0], [90.0]]), warmup_epochs=1)
    assert one.value is None and "1 rank" in one.why
    none, _ = rules.slowest_rank(RunSummary(), warmup_epochs=0)
    assert none.value is None and "step_timing" in none.why
    gap, _ = rules.slowest_rank(_ranks([[None, None], [None, None]]), warmup_epochs=1)
    assert gap.value is None and "no per-rank step median" in gap.why


def test_slowest_rank_note_names_the_window_where_it_loses_most():
    summary = RunSummary.from_json({"step_timing": {"epochs": [
        {"epoch": e, "step_ms_per_rank": {"per_rank": step},
         "window_median_ms_per_rank": {"data_wait": wait, "forward": fwd, "step": step}}
        for e, (step, wait, fwd) in enumerate([([9.0, 9.0], [9.0, 9.0], [9.0, 9.0]),
                                                ([60.0, 70.0], [1.0, 10.0], [50.0, 52.0]),
                                                ([60.0, 74.0], [1.0, 12.0], [50.0, 54.0])])]}})
    rank, step = rules.slowest_rank(summary, warmup_epochs=1)
    # rank 1: step median(70, 74) = 72; data_wait: rank 0 1, rank 1 11, ranks' median 6 -> +5.0;
    # forward: 50 and 53, median 51.5 -> +1.5; so data_wait is where rank 1 loses most
    assert rank.value == 1 and step.value == 72.0
    assert step.note.endswith("; rank 1's largest excess over the ranks' median: data_wait +5.0 ms")
