"""cropscale.hangs.judge: the hang watch's decision on fake reports (plain numbers, no Trainer).

The expected bounds are worked out by hand in each test from the rule ``max(floor, factor x the longest
stillness of the same kind so far)``; the times are binary fractions, so a stillness lands exactly on a bound.
"""

from __future__ import annotations

import math

import pytest

from cropscale.errors import ConfigError
from cropscale.hangs.judge import PAUSE, STEP, HangBound, HangJudge, Progress

BOUND = HangBound(floor_s=10.0, pause_floor_s=100.0, factor=10.0)


def _p(rank: int, t: int, phase: str = "training", beat: int = 0, **kw) -> Progress:
    """A report at training position ``t`` (the other position counters 0)."""
    return Progress(rank=rank, position=(t, 0, 0, 0, 0), phase=phase, beat=beat, **kw)


def _start(judge: HangJudge, now: float, t0: int, t1: int, phase0: str = "training", phase1: str = "training",
           **kw) -> None:
    assert judge.observe(now, {0: _p(0, t0, phase0, **kw), 1: _p(1, t1, phase1, **kw)}) is None


def test_a_stillness_exactly_at_the_floor_is_named_and_just_below_is_not():
    judge = HangJudge(2, BOUND)
    _start(judge, 0.0, 8, 8)
    _start(judge, 0.5, 10, 8)  # rank 0 moved: the episode of 0.5 s is the longest ordinary stillness
    assert judge.longest[STEP] == 0.5
    # bound: max(10, 10 x 0.5 = 5) = 10 s from the last move at 0.5 s
    assert judge.observe(10.4375, {}) is None
    hang = judge.observe(10.5, {})
    assert hang is not None and hang.still_s == 10.0 and hang.bound_s == 10.0 and hang.kind == STEP
    assert hang.hung == (1,) and hang.separated  # rank 1 is behind (8 < 10)


def test_the_bound_follows_the_longest_ordinary_stillness_measured():
    judge = HangJudge(2, BOUND)
    _start(judge, 0.0, 4, 4)
    _start(judge, 4.0, 6, 6)  # a 4-s step: bound max(10, 10 x 4) = 40 s
    _start(judge, 4.5, 8, 8)  # a shorter one does not lower it
    assert judge.longest[STEP] == 4.0
    assert judge.observe(4.5 + 39.75, {}) is None
    hang = judge.observe(4.5 + 40.0, {})
    assert hang is not None and hang.bound_s == 40.0
    assert hang.rule == "max(floor 10 s, 10 x 4 s, the longest stillness of ordinary steps so far)"


def test_a_validation_pause_longer_than_the_step_bound_is_not_flagged():
    judge = HangJudge(2, BOUND)
    _start(judge, 0.0, 8, 8)
    _start(judge, 1.0, 12, 12, "validation", "validation")  # both moved into validation: a pause episode
    for now in (11.0, 51.0, 100.9375):  # past the step bound (10 s), below the pause floor (100 s)
        assert judge.observe(now, {}) is None
    hang = judge.observe(101.0, {})
    assert hang is not None and hang.kind == PAUSE and hang.bound_s == 100.0
    assert not hang.separated and hang.hung == (0, 1)  # both equally far, neither said where: cannot tell


def test_a_long_checkpoint_write_raises_the_pause_bound_for_the_next_pause():
    judge = HangJudge(2, BOUND)
    _start(judge, 0.0, 8, 8, "epoch end", "epoch end")
    _start(judge, 64.0, 9, 8, "epoch start", "epoch end")  # a 64-s write, under the pause floor: not named
    _start(judge, 64.5, 9, 9, "epoch start", "epoch start")
    assert judge.longest[PAUSE] == 64.0
    # next pause bound: max(100, 10 x 64) = 640 s
    assert judge.observe(64.5 + 639.5, {}) is None
    hang = judge.observe(64.5 + 640.0, {})
    assert hang is not None and hang.bound_s == 640.0 and hang.kind == PAUSE


def test_the_kind_is_the_phase_of_the_rank_furthest_behind():
    """Rank 1 hangs in its last training step; rank 0 runs ahead into validation and waits there: the step
    bound applies (rank 1's remaining work is at most a step), not the pause bound of rank 0's phase."""
    judge = HangJudge(2, BOUND)
    _start(judge, 0.0, 7, 8)
    _start(judge, 1.0, 12, 8, "validation", "training")
    hang = judge.observe(11.0, {})
    assert hang is not None and hang.kind == STEP and hang.hung == (1,)
    # the other way round (the rank behind in a pause) waits for the pause bound
    judge = HangJudge(2, BOUND)
    _start(judge, 0.0, 7, 8)
    _start(judge, 1.0, 12, 8, "training", "epoch end")
    assert judge.observe(11.0, {}) is None and judge.observe(101.0, {}) is not None


def test_among_ranks_equally_behind_the_one_in_its_own_code_is_named():
    judge = HangJudge(3, BOUND)
    reports = {0: _p(0, 9, where="in a collective: broadcast", in_collective=True),
               1: _p(1, 9, where="in its own code at x.py:3 in f", in_collective=False),
               2: _p(2, 9, where="in backward", in_collective=True)}
    assert judge.observe(0.0, reports) is None
    hang = judge.observe(10.0, reports)
    assert hang is not None and hang.hung == (1,) and hang.separated
    line = hang.describe()
    assert line.startswith("DDP rank 1 hangs: no rank has reached its next step for 10 s (bound 10 s for an"
                           " ordinary step: max(floor 10 s, 10 x 0 s, ")
    assert "rank 1 at epoch 0, batch 0 done, global step 0, training, in its own code at x.py:3 in f" in line


def test_every_rank_at_the_same_point_in_collectives_cannot_be_told_apart():
    judge = HangJudge(2, BOUND)
    reports = {r: _p(r, 9, where="in a collective: all_reduce", in_collective=True) for r in (0, 1)}
    judge.observe(0.0, reports)
    hang = judge.observe(10.0, reports)
    assert hang.hung == (0, 1) and not hang.separated
    assert hang.describe().startswith("DDP ranks 0, 1 hang (every rank stopped at the same point, none in its own"
                                      " code: the evidence cannot tell which rank hangs): ")


def test_a_rank_that_never_reported_is_named_under_the_pause_bound():
    judge = HangJudge(2, BOUND)
    judge.observe(0.0, {0: _p(0, 4)})
    assert judge.observe(99.0, {0: _p(0, 4)}) is None  # a rank not yet started is a pause (its start-up)
    hang = judge.observe(100.0, {})
    assert hang.hung == (1,) and hang.kind == PAUSE
    assert "rank 1 never reported its progress" in hang.describe()


def test_a_stopped_heartbeat_is_said_and_a_moving_one_is_not():
    judge = HangJudge(2, BOUND, beat_s=1.0)
    judge.observe(0.0, {0: _p(0, 9, beat=1), 1: _p(1, 8, beat=1)})
    hang = None
    for i in range(2, 12):  # rank 0 keeps beating, rank 1's beat stays at 1
        hang = judge.observe(float(i - 1), {0: _p(0, 9, beat=i), 1: _p(1, 8, beat=1)}) or hang
    assert hang is not None and hang.still_s == 10.0
    state0, state1 = hang.ranks
    assert state0.heartbeat and not state1.heartbeat
    assert state0.still_s == 10.0 and state1.still_s == 10.0
    assert "(its heartbeat stopped too" in state1.describe() and "heartbeat" not in state0.describe()


def test_a_report_survives_its_text_and_garbage_does_not_parse():
    p = Progress(rank=3, position=(1, 2, 0, 4, 5), epoch=5, batch=2, stage="in its step", global_step=11,
                 phase="validation", where="in backward", in_collective=True, beat=7)
    assert Progress.from_text(p.to_text()) == p
    assert Progress.from_text(p.to_text().encode()) == p
    for bad in ("", "{}", "[1]", '{"rank": 1}', "not json"):
        assert Progress.from_text(bad) is None


@pytest.mark.parametrize("kwargs,name", [({"floor_s": 0}, "floor_s"), ({"pause_floor_s": -1}, "pause_floor_s"),
                                         ({"factor": math.nan}, "factor"), ({"floor_s": "60"}, "floor_s")])
def test_the_bound_refuses_a_non_positive_setting(kwargs, name):
    with pytest.raises(ConfigError, match=rf"^HangWatch\({name}=.*\): must be a positive number$"):
        HangBound(**kwargs)
