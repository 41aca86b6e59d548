"""The diagnosis rules on hand-built records, every expected number worked out by hand in the comments.

Ranks disagree (a waiting rank has the largest step, the culprit the least wait), epochs change (the warm-up
epoch differs wildly, so including it moves a median), and shares sit exactly on the thresholds.
"""

from __future__ import annotations

import pytest

from cropscale.diagnosis import diagnose, limit_change
from cropscale.diagnosis.steps import loader_rate
from cropscale.diagnosis.thresholds import severity
from cropscale.runs import rules
from cropscale.runs.schema import (
    STEP_WINDOWS,
    CheckpointEpoch,
    CheckpointSummary,
    Diagnosis,
    Finding,
    RankStats,
    RunJson,
    RunSummary,
    StepTimingEpoch,
    StepTimingSummary,
    ThroughputEpoch,
    ThroughputSummary,
    WindowStats,
)

NAMES = (*STEP_WINDOWS, "comm_exposed")


def _epoch(epoch: int, ranks: list[dict[str, float]], steps: int = 7) -> StepTimingEpoch:
    """One epoch: per rank its window medians (ms); ``step`` is their sum unless given."""
    per_rank = {name: [r.get(name, 0.0) for r in ranks] for name in NAMES}
    per_rank["step"] = [r.get("step", sum(r.get(w, 0.0) for w in STEP_WINDOWS)) for r in ranks]
    return StepTimingEpoch(epoch=epoch, steps_measured=steps,
                           windows_ms={k: WindowStats(median=v[0], n=steps) for k, v in per_rank.items()},
                           window_median_ms_per_rank=per_rank, step_ms_per_rank=RankStats(per_rank=per_rank["step"]))


def _run(epochs: list[list[dict[str, float]]], *, comm: bool = True, train_s: float | None = 10.0,
         walls: list[tuple[float, float]] | None = None, checkpoint: CheckpointSummary | None = None,
         config: dict | None = None) -> RunJson:
    world = len(epochs[0])
    timing = StepTimingSummary(clock="perf_counter", comm_timing={"available": comm and world > 1},
                               epochs=[_epoch(i, ranks) for i, ranks in enumerate(epochs)])
    walls = walls or [(train_s or 10.0, 0.0)] * len(epochs)
    through = ThroughputSummary(epochs=[ThroughputEpoch(epoch=i, samples=8, train_s=train_s, wall_s=w, val_s=v)
                                        for i, (w, v) in enumerate(walls)])
    return RunJson(config=config or {"data": {"batch_size": 2, "num_workers": 0}},
                   distributed={"world_size": world},
                   summary=RunSummary(step_timing=timing, throughput=through, checkpoint=checkpoint))


def _kinds(diag: Diagnosis) -> list[str]:
    return [f.kind for f in diag.findings]


# ------------------------------------------------------------------------------------------- culprit
VICTIM0 = {"data_wait": 10, "transfer": 1, "forward": 80, "backward": 420, "comm_exposed": 300, "optimizer": 5,
           "remainder": 30}  # step 546: the largest
CULPRIT1 = {"data_wait": 300, "transfer": 1, "forward": 85, "backward": 125, "comm_exposed": 5, "optimizer": 5,
            "remainder": 10}  # step 526
VICTIM2 = {"data_wait": 12, "transfer": 1, "forward": 78, "backward": 410, "comm_exposed": 295, "optimizer": 5,
           "remainder": 20}  # step 526
WILD = {"data_wait": 5000, "transfer": 1, "forward": 80, "backward": 100, "comm_exposed": 0, "optimizer": 5}


def test_the_culprit_is_the_rank_with_least_wait_and_most_own_work_not_the_largest_step():
    # own work = data + transfer + forward + (backward - exposed) + optimizer:
    #   rank 0: 10 + 1 + 80 + 120 + 5 = 216; rank 1: 300 + 1 + 85 + 120 + 5 = 511; rank 2: 12 + 1 + 78 + 115 + 5 = 211
    # wait = exposed + remainder: rank 0 330, rank 1 15, rank 2 315
    # excess = 511 - median(216, 211) = 297.5; others wait median(330, 315) - 15 = 307.5 more: 96.7 % explained
    # step = median(546, 526, 526) = 526; share 297.5 / 526 = 0.5656; bound 526 / (526 - 297.5) = 2.3020
    # part: data wait exceeds the others' median by 300 - 11 = 289 (forward 6, backward 2.5)
    run = _run([[WILD, WILD, WILD], [VICTIM0, CULPRIT1, VICTIM2], [VICTIM0, CULPRIT1, VICTIM2]])
    assert rules.slowest_rank(run.summary, 1)[0].value == 0      # the largest step is a victim's
    diag = diagnose(run)
    (straggler,) = [f for f in diag.findings if f.kind == "straggler"]
    assert (straggler.rank, straggler.part) == (1, "data_wait")
    assert straggler.share == pytest.approx(297.5 / 526)
    assert straggler.bound == pytest.approx(526 / 228.5)
    assert straggler.severity == "critical"
    assert diag.limit == "straggler"
    assert [r.own_ms for r in diag.ranks] == pytest.approx([216, 511, 211])
    assert [r.wait_ms for r in diag.ranks] == pytest.approx([330, 15, 315])
    assert "input" not in _kinds(diag)   # rank 1's data wait is its excess; every rank's is min(10, 300, 12) / step


def test_when_no_rank_explains_80_percent_of_the_waits_the_ranks_are_not_separated():
    # rank 0: own 10 + 80 + 120 + 5 = 215, wait 210 + 10 = 220, step 435
    # rank 1: own 110 + 80 + 120 + 5 = 315, wait 10 + 10 = 20, step 335
    # excess 100 explains 100 / 200 = 50 % (< 80 %) of the 200 ms the other rank waits more
    r0 = {"data_wait": 10, "forward": 80, "backward": 330, "comm_exposed": 210, "optimizer": 5, "remainder": 10}
    r1 = {"data_wait": 110, "forward": 80, "backward": 130, "comm_exposed": 10, "optimizer": 5, "remainder": 10}
    diag = diagnose(_run([[r0, r1], [r0, r1]]), warmup_epochs=0)
    assert "straggler" not in _kinds(diag)
    (found,) = [f for f in diag.findings if f.kind == "imbalance"]
    assert found.rank is None and "cannot separate" in found.line and "explains 50 %" in found.line
    assert found.share == pytest.approx(200 / 385)   # step = median(435, 335)


def test_a_rank_ahead_in_own_work_in_one_epoch_only_is_no_straggler():
    # own work: epoch 0 rank 0 216, rank 1 511; epoch 1 (roles swapped) rank 0 150 + 1 + 85 + 120 + 5 = 361,
    # rank 1 216. Medians over the epochs: rank 0 288.5, rank 1 363.5, so rank 1 has the most own work over the
    # run (excess 75 ms of a 462.25 ms step, 16 %) but it is ahead in epoch 0 only
    swapped0 = dict(CULPRIT1, data_wait=150, backward=125)
    swapped1 = dict(VICTIM0, backward=275, comm_exposed=155)
    diag = diagnose(_run([[VICTIM0, CULPRIT1], [swapped0, swapped1]]), warmup_epochs=0)
    assert "straggler" not in _kinds(diag)
    (found,) = [f for f in diag.findings if f.kind == "imbalance"]
    assert "in 1 of 2 measured epochs only" in found.line


def test_the_culprit_is_named_at_exactly_80_percent_explained():
    # rank 0 waits 100 ms more than rank 1 (exposed 100 + remainder 0 vs 0); rank 1's excess own work is 80 ms
    r0 = {"data_wait": 10, "forward": 100, "backward": 200, "comm_exposed": 100, "optimizer": 10}
    r1 = {"data_wait": 90, "forward": 100, "backward": 100, "comm_exposed": 0, "optimizer": 10}
    diag = diagnose(_run([[r0, r1]]), warmup_epochs=0)
    (found,) = [f for f in diag.findings if f.kind == "straggler"]
    assert found.rank == 1 and "to 80 %" in found.line


def test_balanced_ranks_name_no_straggler():
    r0 = {"data_wait": 10, "forward": 100, "backward": 120, "comm_exposed": 8, "optimizer": 10, "remainder": 2}
    r1 = {"data_wait": 12, "forward": 104, "backward": 117, "comm_exposed": 5, "optimizer": 10, "remainder": 3}
    diag = diagnose(_run([[r0, r1], [r0, r1]]))
    assert "straggler" not in _kinds(diag)


def test_without_comm_timing_the_culprit_is_not_judged():
    diag = diagnose(_run([[VICTIM0, CULPRIT1]], comm=False), warmup_epochs=0)
    assert "straggler" not in _kinds(diag)
    assert any("the culprit rank" in n for n in diag.not_judged)


# ------------------------------------------------------------------------------------------- step terms
def test_a_data_wait_every_rank_pays_is_the_input_pipeline_with_its_bound_and_loader_rate():
    # both ranks: data wait 50 of a 200 ms step (25 %): bound 200 / 150 = 1.3333; warm-up epoch 0 differs wildly
    r = {"data_wait": 50, "forward": 60, "backward": 80, "optimizer": 10}
    diag = diagnose(_run([[WILD, WILD], [r, r]]))
    (found,) = [f for f in diag.findings if f.kind == "input"]
    assert found.share == pytest.approx(0.25) and found.bound == pytest.approx(4 / 3) and found.severity == "critical"
    # num_workers 0, batch 2: one worker (the main process) gives 2 / 0.050 = 40 samples/s, the model consumes
    # 2 / 0.150 = 13.33 samples/s, ceil(50 / 150) = 1 worker keeps up
    values = {e.name: e.value for e in found.evidence}
    assert values["loader samples/s per worker"] == pytest.approx(40.0)
    assert values["model samples/s"] == pytest.approx(2 / 0.150)
    assert values["workers needed"] == 1
    assert diag.shares["data_wait"] == pytest.approx(0.25)
    assert found.saving_s_per_epoch == pytest.approx(0.25 * 10.0)


@pytest.mark.parametrize(("wait", "workers", "per_worker", "needed"), [
    (350.0, 0, 2 / 0.350, 3),          # ceil(350 / 150)
    (350.0, 2, 2 / (2 * 0.500), 7),    # each of 2 workers a batch per 2 steps; ceil(2 x 500 / 150) = 7
])
def test_loader_rate_per_worker_and_workers_needed(wait, workers, per_worker, needed):
    _, figures, got = loader_rate(wait, 500.0, {"data": {"batch_size": 2, "num_workers": workers}})
    values = {f.name: f.value for f in figures}
    assert values["loader samples/s per worker"] == pytest.approx(per_worker)
    assert got == needed
    assert [f.evidence for f in figures if f.name == "loader samples/s per worker"] == [
        "measured-run" if workers == 0 else "analytical-scenario"]


def test_accumulation_counts_every_micro_batch_of_the_step():
    _, figures, _ = loader_rate(100.0, 400.0, {"data": {"batch_size": 2, "num_workers": 0},
                                               "trainer": {"accumulate_grad_batches": 3}})
    assert {f.name: f.value for f in figures}["loader samples/s per worker"] == pytest.approx(6 / 0.1)


def test_shares_exactly_on_the_thresholds():
    assert [severity(x) for x in (0.0999, 0.10, 0.1999, 0.20)] == ["info", "warning", "warning", "critical"]
    at_warn = {"data_wait": 10, "forward": 40, "backward": 40, "optimizer": 10}    # 10 / 100 exactly
    below = {"data_wait": 9.99, "forward": 40, "backward": 40.01, "optimizer": 10}
    assert "input" in _kinds(diagnose(_run([[at_warn]]), warmup_epochs=0))
    assert "input" not in _kinds(diagnose(_run([[below]]), warmup_epochs=0))
    bound = {"data_wait": 2, "forward": 45, "backward": 43, "optimizer": 2, "remainder": 8}  # compute 90 / 100
    diag = diagnose(_run([[bound]]), warmup_epochs=0)
    assert diag.limit == "compute" and diag.findings[0].share == pytest.approx(0.90)
    short = {"data_wait": 2, "forward": 45, "backward": 42.99, "optimizer": 2, "remainder": 8.01}
    assert diagnose(_run([[short]]), warmup_epochs=0).limit == "none"


def test_nothing_dominant_names_the_largest_term():
    r = {"data_wait": 8, "transfer": 3, "forward": 40, "backward": 40, "optimizer": 5, "remainder": 4}
    diag = diagnose(_run([[r]]), warmup_epochs=0)
    line = diag.findings[0].line
    assert _kinds(diag) == ["none"] and "data wait 8 %" in line and "compute 85 %" in line


def test_findings_are_ordered_by_the_seconds_they_cost_per_epoch():
    # data wait 30 % of the step x 10 s training = 3 s per epoch against validation 2 s: input first ...
    r = {"data_wait": 30, "forward": 30, "backward": 30, "optimizer": 10}
    diag = diagnose(_run([[r]], walls=[(12.0, 2.0)]), warmup_epochs=0)
    assert _kinds(diag)[:2] == ["input", "validation"]
    # ... and validation first when it costs more (4 s)
    diag = diagnose(_run([[r]], walls=[(14.0, 4.0)]), warmup_epochs=0)
    assert _kinds(diag)[:2] == ["validation", "input"]


# ------------------------------------------------------------------------------------------- epochs
def test_validation_is_the_median_validation_over_the_median_epoch():
    # measured epochs 1, 2: wall 10, 12; validation 2, 4 -> 3 / 11 = 0.2727 (the median of the ratios, 0.2667, is
    # not the rule); bound 11 / 8 = 1.375; epoch 0 (warm-up) would move both medians
    r = {"forward": 50, "backward": 50}
    diag = diagnose(_run([[r], [r], [r]], walls=[(100.0, 90.0), (10.0, 2.0), (12.0, 4.0)]))
    (found,) = [f for f in diag.findings if f.kind == "validation"]
    assert found.share == pytest.approx(3 / 11) and found.bound == pytest.approx(11 / 8)
    assert found.saving_s_per_epoch == pytest.approx(3.0)


def test_checkpoint_writes_against_the_epoch_period_epochs_without_a_write_count_zero():
    # measured epochs 1-3, wall 5 s each; writes 1 s (epoch 1) and 3 s (epoch 2), both after the epoch end,
    # none in epoch 3: c = median(1, 3, 0) = 1, P = median(6, 8, 5) = 6 -> 1 / 6 = 0.1667, bound 6 / 5 = 1.2
    r = {"forward": 50, "backward": 50}
    ckpt = CheckpointSummary(saves=3, write_s=4.0, epochs=[
        CheckpointEpoch(epoch=0, saves=1, write_s=9.0, outside_wall_s=9.0),
        CheckpointEpoch(epoch=1, saves=1, write_s=1.0, outside_wall_s=1.0),
        CheckpointEpoch(epoch=2, saves=1, write_s=3.0, outside_wall_s=3.0)])
    diag = diagnose(_run([[r]] * 4, walls=[(5.0, 0.0)] * 4, checkpoint=ckpt))
    (found,) = [f for f in diag.findings if f.kind == "checkpoint"]
    assert found.share == pytest.approx(1 / 6) and found.bound == pytest.approx(1.2) and found.severity == "warning"
    # a write inside the wall time (after a mid-epoch validation) adds nothing to the period: 1 / 5
    ckpt.epochs[1].outside_wall_s = 0.0
    ckpt.epochs[2].outside_wall_s = 0.0
    (found,) = [f for f in diagnose(_run([[r]] * 4, walls=[(5.0, 0.0)] * 4, checkpoint=ckpt)).findings
                if f.kind == "checkpoint"]
    assert found.share == pytest.approx(1 / 5)


# ------------------------------------------------------------------------------------------- history
def _own(ms: float) -> dict[str, float]:
    return {"forward": ms / 2, "backward": ms / 2, "remainder": 0.0}


def test_a_rank_is_scored_against_its_own_best_epoch():
    # own work by epoch 300, 200, 210, 400: best epoch 1; score 200 / 400 = 0.5 < 0.7; first slow epoch 3
    # (200 / 210 = 0.95); bound 400 / (400 - 200) = 2
    diag = diagnose(_run([[_own(300)], [_own(200)], [_own(210)], [_own(400)]]))
    (found,) = [f for f in diag.findings if f.kind == "throttling"]
    assert found.rank == 0 and "from epoch 3" in found.line and found.bound == pytest.approx(2.0)
    assert diag.ranks[0].score == pytest.approx(0.5) and diag.ranks[0].best_epoch == 1
    assert any("NVML throttle reasons: none recorded" in n for n in diag.not_judged)


def test_a_score_of_exactly_0_7_is_not_a_slowdown():
    diag = diagnose(_run([[_own(70)], [_own(100)]]), warmup_epochs=0)
    assert diag.ranks[0].score == pytest.approx(0.7) and "throttling" not in _kinds(diag)


def test_one_rank_that_slows_is_named_but_every_rank_slowing_names_none():
    one = _run([[_own(200), _own(200)], [_own(200), _own(205)], [_own(210), _own(420)]])
    assert [(f.kind, f.rank) for f in diagnose(one).findings if f.kind == "throttling"] == [("throttling", 1)]
    both = _run([[_own(200), _own(200)], [_own(200), _own(205)], [_own(410), _own(420)]])
    diag = diagnose(both)
    assert "throttling" not in _kinds(diag) and [r.score for r in diag.ranks] == pytest.approx([200 / 410, 200 / 420])


def test_epochs_with_too_few_measured_steps_are_not_scored():
    run = _run([[_own(100)], [_own(200)]])
    run.summary.step_timing.epochs[0].steps_measured = 2          # below MIN_MEASURED_STEPS: not the best epoch
    assert diagnose(run, warmup_epochs=0).ranks[0].best_epoch == 1


# ------------------------------------------------------------------------------------------- across runs
def test_limit_change_names_the_new_limit_and_the_share_that_moved():
    base = Diagnosis(limit="none", shares={"data_wait": 0.03}, findings=[Finding(kind="none")])
    other = Diagnosis(limit="input", shares={"data_wait": 0.31}, findings=[Finding(kind="input", base="step")])
    assert limit_change(base, other, 2) == ("at 2 devices input pipeline becomes the step's limit (was nothing"
                                            " dominant) (data wait 3 % -> 31 %)")
    same = Diagnosis(limit="none", shares={"data_wait": 0.05}, findings=[Finding(kind="none")])
    assert limit_change(base, same, 4).startswith("at 4 devices the step's limit stays nothing dominant")


def test_a_slowing_rank_is_named_even_when_the_other_ranks_own_work_wanders():
    # a real 2-process CPU run (RankSlowsDown on rank 1 from epoch 2): rank 0 own 768, 394, 515 (its CPU share
    # changed), rank 1 920, 1419, 1517. Rank 1: score 920 / 1517 = 0.61; relative score in the last epoch (the best
    # rank's own work over its own) 515 / 1517 = 0.34: named. Rank 0: score 394 / 515 = 0.77: not named.
    # (Against the other ranks' *scores* instead, 0.61 / 0.77 = 0.79 would have named nobody.)
    run = _run([[_own(900), _own(900)], [_own(768), _own(920)], [_own(394), _own(1419)], [_own(515), _own(1517)]])
    run.summary.step_timing.epochs[0].steps_measured = 1
    diag = diagnose(run)
    assert [(f.kind, f.rank) for f in diag.findings if f.kind == "throttling"] == [("throttling", 1)]
    assert [r.score for r in diag.ranks] == pytest.approx([394 / 515, 920 / 1517])


def test_a_compute_share_above_the_step_claims_no_speed_up_below_one():
    # window medians need not add up to the median step: forward 40 + backward 55 + optimizer 6 = 101 of a 100 ms
    # step. Removing what is left cannot make the step slower: the bound is "nothing left", never 100 / 101 = 0.99x
    over = {"data_wait": 1, "forward": 40, "backward": 55, "optimizer": 6, "step": 100}
    diag = diagnose(_run([[over]]), warmup_epochs=0)
    (found,) = [f for f in diag.findings if f.kind == "compute"]
    assert found.share == pytest.approx(1.01)
    assert "0.99x" not in found.line and "nothing is left to remove outside the compute" in found.line
    # at 90 % the bound is 1 / 0.9 = 1.11x
    under = {"data_wait": 2, "forward": 45, "backward": 43, "optimizer": 2, "remainder": 8}
    (found,) = [f for f in diagnose(_run([[under]]), warmup_epochs=0).findings if f.kind == "compute"]
    assert "what is left to remove gives at most 1.11x" in found.line
