"""Step-time window arithmetic without a Trainer: marks are plain floats (seconds), durations are
their differences, every expected value worked out by hand from the marks."""

from __future__ import annotations

import dataclasses

import pytest

from cropscale.callbacks import STEP_WINDOWS
from cropscale.callbacks._windows import (
    FIGURES,
    BucketMarks,
    MicroBatchMarks,
    StepMarks,
    StepWindows,
    WindowAccumulator,
    interval_union,
)
from cropscale.runs.schema import WindowStats


def seconds(a: float, b: float) -> float:
    return b - a


def _as_dict(w: StepWindows) -> dict[str, float | None]:
    return dict(zip(FIGURES, w.figures(), strict=True))


def test_names_are_defined_once_and_match_the_record():
    assert STEP_WINDOWS == ("data_wait", "transfer", "forward", "backward", "optimizer", "remainder")
    assert FIGURES == (*STEP_WINDOWS, "step", "comm", "comm_exposed")
    assert {f.name for f in dataclasses.fields(StepWindows)} | {"step"} == set(FIGURES)


def test_one_micro_batch():
    # fetch 10.0 -> 10.2, batch start 10.25, before backward 10.75, after backward 11.5, end 11.75;
    # the previous step ended at 9.9
    micro = MicroBatchMarks(10.0, 10.2, 10.25, 10.75, 11.5, 11.75)
    row = _as_dict(StepMarks([micro], prev_end=9.9).windows(seconds))
    expect = {"data_wait": 0.2, "transfer": 0.05, "forward": 0.5, "backward": 0.75, "optimizer": 0.25,
              "remainder": 0.1, "step": 1.85}
    for k, v in expect.items():
        assert row[k] == pytest.approx(v), k
    assert row["comm"] is None and row["comm_exposed"] is None


@pytest.mark.parametrize("flag", ["first_in_epoch", "after_validation"])
def test_no_remainder_after_an_epoch_start_or_a_validation_run(flag):
    micro = MicroBatchMarks(10.0, 10.2, 10.25, 10.75, 11.5, 11.75)
    w = StepMarks([micro], prev_end=9.9, **{flag: True}).windows(seconds)
    assert w.remainder is None and w.step == pytest.approx(0.2 + 0.05 + 0.5 + 0.75 + 0.25)
    assert StepMarks([micro], prev_end=None).windows(seconds).remainder is None  # no previous step


def test_gradient_accumulation_and_comm():
    m1 = MicroBatchMarks(0.0, 0.1, 0.1, 0.3, 0.5, 0.6)
    m2 = MicroBatchMarks(0.7, 0.8, 0.8, 1.0, 1.4, 1.6)
    # buckets (launch, done): [1.1, 1.2] and [1.15, 1.3] overlap -> union 0.2; [1.35, 1.45] -> 0.1
    buckets = [BucketMarks(1.1, 1.2), BucketMarks(1.15, 1.3), BucketMarks(1.35, 1.45)]
    row = _as_dict(StepMarks([m1, m2], buckets, prev_end=-0.05).windows(seconds))
    assert row["data_wait"] == pytest.approx(0.1 + 0.1)
    assert row["transfer"] == pytest.approx(0.0)
    assert row["forward"] == pytest.approx(0.2 + 0.2)
    assert row["backward"] == pytest.approx(0.2 + 0.4)
    assert row["optimizer"] == pytest.approx(0.1 + 0.2)
    assert row["remainder"] == pytest.approx(0.05 + 0.1)  # before the first fetch + between micro-batches
    assert row["step"] == pytest.approx(1.65)  # prev_end -0.05 -> end 1.6
    assert row["comm"] == pytest.approx(0.3)
    assert row["comm_exposed"] == pytest.approx(1.45 - 1.35)


def test_no_fetch_seen_starts_the_micro_batch_at_batch_start():
    # dataloader_iter-style training_step: no profiler fetch marks
    micro = MicroBatchMarks(None, None, 2.0, 2.5, 3.25, 3.5)
    w = StepMarks([micro], prev_end=1.5).windows(seconds)
    assert (w.data_wait, w.transfer) == (None, None)
    assert (w.forward, w.backward, w.optimizer, w.remainder) == (0.5, 0.75, 0.25, 0.5)
    assert w.step == 2.0  # 1.5 -> 3.5


def test_comm_exposed_is_the_tail_after_the_last_launch_and_undone_buckets_are_ignored():
    # launches 1.0 and 1.5, completions 2.0 and 1.75: union [1, 2] = 1.0; the last launch is at 1.5 and
    # the last completion at 2.0 -> 0.5 exposed; a bucket still in flight does not count
    micro = MicroBatchMarks(0.0, 0.0, 0.0, 0.5, 2.0, 2.5)
    buckets = [BucketMarks(1.0, 2.0), BucketMarks(1.5, 1.75), BucketMarks(1.9, None)]
    assert StepMarks([micro], buckets).comm(seconds) == (1.0, 0.5)
    # completed before the last launch: nothing exposed
    assert StepMarks([micro], [BucketMarks(1.0, 1.25), BucketMarks(1.5, 1.5)]).comm(seconds) == (0.25, 0.0)
    assert StepMarks([micro], [BucketMarks(1.0, None)]).comm(seconds) == (None, None)


@pytest.mark.parametrize(
    ("intervals", "covered"),
    [
        ([], 0.0),
        ([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)], 3.0),  # overlap, then a gap
        ([(0.0, 5.0), (1.0, 2.0)], 5.0),  # nested
        ([(1.0, 2.0), (0.0, 1.0)], 2.0),  # touching, unsorted
        ([(2.0, 3.0), (0.0, 0.5), (0.25, 1.0)], 2.0),
    ],
)
def test_interval_union(intervals, covered):
    assert interval_union(intervals) == covered


def test_marks_kept_and_released():
    f0, f1, s, b0, b1, e, g0, g1, g2, g3, g4, g5, prev, l1, d1 = (object() for _ in range(15))
    marks = StepMarks([MicroBatchMarks(f0, f1, s, b0, b1, e), MicroBatchMarks(g0, g1, g2, g3, g4, g5)],
                      [BucketMarks(l1, d1)], prev_end=prev)
    assert marks.completion_marks() == [d1, g5]
    # everything but the step's end, which becomes the next step's prev_end
    assert marks.spent_marks() == [f0, f1, s, b0, b1, e, g0, g1, g2, g3, g4, prev, l1, d1]
    assert StepMarks([MicroBatchMarks(batch_end=e)], [BucketMarks(l1)]).completion_marks() == [e]


def test_an_unresolved_mark_raises_out_of_windows():
    def pending(a, b):
        raise RuntimeError("event not recorded yet")

    with pytest.raises(RuntimeError, match="not recorded"):
        StepMarks([MicroBatchMarks(0.0, 1.0)]).windows(pending)


def test_window_stats_interval_means_and_epoch_statistics():
    stats = WindowAccumulator()
    stats.start_epoch()
    steps = [  # (flags, windows in s)
        ({"warmup": True}, StepWindows(forward=0.010, remainder=0.001)),
        ({"first_in_epoch": True}, StepWindows(data_wait=0.007, forward=0.002)),
        ({}, StepWindows(forward=0.001, remainder=0.001)),
        ({}, StepWindows(forward=0.003, remainder=0.001)),
        ({}, StepWindows(forward=0.005, remainder=0.001)),
        ({}, StepWindows(forward=0.100)),  # no remainder (no previous end): not in the epoch statistics
    ]
    measured = [stats.update(StepMarks([MicroBatchMarks()], **flags), w) for flags, w in steps]
    assert measured == [False, False, True, True, True, False]
    assert stats.epoch_steps == 3
    assert stats.first_batch_wait == 0.007

    means = stats.interval_means_ms()
    assert set(means) == {"data_wait", "forward", "remainder", "step"}
    assert means["data_wait"] == pytest.approx(7.0)  # one step has it
    assert means["forward"] == pytest.approx((10 + 2 + 1 + 3 + 5 + 100) / 6)
    assert means["remainder"] == pytest.approx(1.0)
    assert means["step"] == pytest.approx((11 + 9 + 2 + 4 + 6 + 100) / 6)
    assert stats.interval_means_ms() == {}  # a new interval starts

    epoch = stats.epoch_stats_ms()
    assert set(epoch) == set(FIGURES)
    # forward 1, 3, 5 ms: median 3; p95 at rank 0.95 * 2 = 1.9 -> 3 + 0.9 * (5 - 3) = 4.8
    assert epoch["forward"].median == pytest.approx(3.0) and epoch["forward"].p95 == pytest.approx(4.8)
    # step 2, 4, 6 ms: median 4, p95 4 + 0.9 * 2 = 5.8
    assert epoch["step"].median == pytest.approx(4.0) and epoch["step"].p95 == pytest.approx(5.8)
    assert epoch["step"].n == 3
    assert epoch["data_wait"] == WindowStats(None, None, 0)

    stats.start_epoch()
    assert stats.epoch_steps == 0 and stats.first_batch_wait is None
