"""The figure rules' corners that mutation testing found unguarded (issue 36): each case hand-worked.

Every reason a figure is n/a is compared in full, every count with a value worked out here, and the cases are
built so that the plausible wrong rule gives another answer (a throughput-only run, ranks that tie, a rank
missing from an epoch, a GradScaler that skipped steps beside the policy's).
"""

from __future__ import annotations

import pytest

from cropscale.runs import rules
from cropscale.runs.schema import (
    EnergySummary,
    LossScaleSummary,
    MemorySummary,
    NonFiniteSummary,
    QualityEpoch,
    QualitySummary,
    RankCounts,
    RunJson,
    RunSummary,
    TrainedSummary,
)


def test_one_epoch_is_measured_whole_and_two_lose_the_first():
    assert [rules.default_warmup_epochs(n) for n in (0, 1, 2, 5)] == [0, 0, 1, 1]


def _timing(epochs: list[dict], **extra) -> dict:
    return {"step_timing": {"warmup_steps": 2, "epochs": epochs, **extra}}


def test_step_time_falls_back_to_the_throughput_latency_when_no_step_window_has_a_median():
    # step_timing holds an epoch whose step window has no median, and one with no step window at all:
    # neither counts, so the figure is ThroughputCallback's step latency: median(12, 18) = 15, p95 median(20, 30)
    summary = RunSummary.from_json({
        **_timing([{"epoch": 1, "windows_ms": {"step": {"median": None}}},
                   {"epoch": 2, "windows_ms": {"data_wait": {"median": 3.0}}}]),
        "throughput": {"epochs": [{"epoch": 1, "step_latency_ms": {"median": 12.0, "p95": 20.0}},
                                  {"epoch": 2, "step_latency_ms": {"median": 18.0, "p95": 30.0}}]}})
    median, p95 = rules.step_time(summary, warmup_epochs=1)
    assert (median.value, p95.value) == (15.0, 25.0)
    assert median.note == "ThroughputCallback step latency: median over 2 measured epoch(s) of the epoch statistics"
    only_throughput = RunSummary.from_json({"throughput": {"epochs": [
        {"epoch": 0, "step_latency_ms": {"median": 7.0, "p95": 9.0}}]}})
    assert rules.step_time(only_throughput, 0).median.value == 7.0


def test_step_time_without_a_measured_step_names_the_steps_in_all():
    epochs = [{"epoch": e, "windows_ms": {"data_wait": {"median": 1.0}}} for e in (0, 1)]
    median, p95 = rules.step_time(RunSummary.from_json(_timing(epochs, steps_total=30)), warmup_epochs=1)
    why = ("no measured step in the measured epochs (epoch index >= 1): each callback leaves out its 2 warm-up steps"
           " and the first step of every epoch; 30 steps in all")
    assert median.value is None and p95.value is None and median.why == why and p95.why == why


def test_slowest_rank_reasons_ties_and_ranks_missing_from_an_epoch():
    def ranks(per_epoch):
        return RunSummary.from_json(_timing([{"epoch": e, "step_ms_per_rank": {"per_rank": r}}
                                             for e, r in enumerate(per_epoch)]))

    one_rank, one_step = rules.slowest_rank(ranks([[90.0], [80.0]]), warmup_epochs=0)
    assert one_rank.why == one_step.why == "1 rank(s) recorded: no other rank to compare"
    gap_rank, gap_step = rules.slowest_rank(ranks([[None, None], [None, None]]), warmup_epochs=0)
    assert gap_rank.why == gap_step.why == "no per-rank step median in the measured epochs"
    # ranks 0 and 2 tie at 50 ms: the lowest rank is the slowest
    rank, step = rules.slowest_rank(ranks([[50.0, 40.0, 50.0]]), warmup_epochs=0)
    assert (rank.value, step.value) == (0, 50.0)
    # epoch 1 gathered rank 0 only: rank 1's median is over epoch 0 alone (80 > median(60, 70) = 65)
    rank, step = rules.slowest_rank(ranks([[60.0, 80.0], [70.0]]), warmup_epochs=0)
    assert (rank.value, step.value) == (1, 80.0)
    # rank 1 has no finite median in any measured epoch: shown as n/a beside rank 0's
    rank, step = rules.slowest_rank(ranks([[60.0, None], [70.0, None]]), warmup_epochs=0)
    assert rank.value == 0 and step.value == 65.0
    assert step.note == "per rank, median over 2 measured epoch(s) of its epoch median step: rank 0 65.0 ms, rank 1 n/a"


def test_host_windows_are_the_median_over_measured_epochs():
    epochs = [{"epoch": e, "host_windows_ms": {"data_wait_host": {"median": w}, "transfer_host": {"median": t}}}
              for e, (w, t) in enumerate([(100.0, 100.0), (2.0, 0.5), (4.0, 1.5)])]
    assert rules.host_windows(RunSummary.from_json(_timing(epochs)), 1) == {"data_wait_host": 3.0, "transfer_host": 1.0}
    assert rules.host_windows(RunSummary(), 1) == {}


def _throughput(*epochs: dict) -> RunSummary:
    return RunSummary.from_json({"throughput": {"epochs": list(epochs)}})


def test_throughput_figures_without_a_measured_epoch_say_which():
    summary = _throughput({"epoch": 0, "samples": 10, "train_s": 1.0, "wall_s": 2.0},
                          {"epoch": 1, "samples": 10, "train_s": 1.0, "wall_s": 2.0, "val_s": None})
    assert rules.samples_per_s(summary, 3).why == "no measured epoch (epoch index >= 3) in the throughput summary"
    assert rules.samples_per_s(RunSummary(), 3).why == "run.json has no throughput summary"
    assert rules.epoch_time(RunSummary(), "train_s", 1).why == "run.json has no throughput summary"
    assert rules.epoch_time(RunSummary(), "train_s", 1, no_json="no run.json").why == "no run.json"
    assert rules.epoch_time(summary, "val_s", 1).why == "no val_s in the measured epochs"
    wall = rules.epoch_time(summary, "wall_s", 0)
    assert wall.value == 2.0 and wall.note == "median of 2 measured epoch(s)"


def _energy(**fields) -> RunSummary:
    return RunSummary(energy=EnergySummary(**fields))


@pytest.mark.parametrize("period,shown", [(1.01, "1.01"), (None, "?")])
def test_a_slow_or_unknown_power_period_is_named(period, shown):
    summary = _energy(available=True, method="sampled-power", power_samples=600, power_sample_period_s=period,
                      epochs=[])
    joules, per_sample = rules.energy(summary, 0)
    why = (f"sampled power read every {shown} s (MLPerf's power rules: at least 60 readings per run, at least one"
           " every 1 s)")
    assert joules.why == why and per_sample.why == why and per_sample.value is None


def test_energy_not_measured_says_why():
    assert rules.energy(RunSummary(), 0)[0].why == "not measured: no energy summary in run.json"
    assert rules.energy(RunSummary(), 0, no_json="no run.json")[1].why == "not measured: no run.json"
    off = _energy(available=False, reason="NVML not available")
    assert [f.why for f in rules.energy(off, 0)] == ["not measured: NVML not available"] * 2
    assert rules.energy(_energy(available=False), 0)[0].why == "not measured: no energy summary in run.json"


def test_peak_memory_names_its_source():
    gpu = rules.peak_memory(RunSummary(memory=MemorySummary(peak_allocated_gib=3.5, host_peak_rss_gib=9.0)))
    assert (gpu.value, gpu.note) == (3.5, "peak allocated GPU memory (torch.cuda)")
    host = rules.peak_memory(RunSummary(memory=MemorySummary(host_peak_rss_gib=9.0)))
    assert (host.value, host.note) == (9.0, "host RSS of the training process (no GPU)")
    assert rules.peak_memory(RunSummary()).why == "no memory summary in run.json"
    assert rules.peak_memory(RunSummary(), no_json="no run.json").why == "no run.json"


def test_skipped_steps_add_the_policy_and_the_gradscaler():
    policy = NonFiniteSummary(per_rank=[RankCounts(nonfinite_batches=2, skipped_steps=3),
                                        RankCounts(nonfinite_batches=1, skipped_steps=0)])
    bad, skipped = rules.nonfinite_and_skipped(
        RunSummary(nonfinite=policy, loss_scale=LossScaleSummary(scaler_in_use=True, skipped_steps=2)))
    assert (bad.value, bad.note) == (3, "summed over 2 rank(s)")
    assert (skipped.value, skipped.note) == (5, "3 by the non-finite policy + 2 by the GradScaler")
    _, alone = rules.nonfinite_and_skipped(RunSummary(nonfinite=policy))
    assert (alone.value, alone.note) == (3, "3 by the non-finite policy; no GradScaler")
    _, idle = rules.nonfinite_and_skipped(RunSummary(nonfinite=policy, loss_scale=LossScaleSummary()))
    assert (idle.value, idle.note) == (3, "3 by the non-finite policy; no GradScaler")
    assert [f.why for f in rules.nonfinite_and_skipped(RunSummary())] == ["no nonfinite summary in run.json"] * 2


def test_quality_without_validation_says_why_for_every_figure():
    q = rules.quality(RunSummary(), {})
    why = "no val/mIoU in the TensorBoard events (validation did not run)"
    assert (q.best.why, q.best_epoch.why, q.final.why, q.by_epoch) == (why, why, why, [])
    broken = rules.quality(RunSummary(), {}, events_problem="events file unreadable: x, truncated")
    assert broken.best.why == broken.final.why == "events file unreadable: x, truncated"


def test_updates_per_epoch_is_global_step_over_max_epochs():
    assert rules.updates_per_epoch(RunJson(global_step=24, trainer={"max_epochs": 3})) == 8.0
    assert rules.updates_per_epoch(RunJson(global_step=24, trainer={})) is None
    assert rules.updates_per_epoch(RunJson(global_step=24, trainer={"max_epochs": 0})) is None
    assert rules.updates_per_epoch(RunJson(trainer={"max_epochs": 3})) is None


def test_trained_counts_the_loss_scale_steps_without_a_trained_record():
    # no summary.trained, no global_step: the optimizer steps are the loss-scale callback's 10; 6 > 0.5 x 10
    v = rules.trained(RunSummary(loss_scale=LossScaleSummary(scaler_in_use=True, steps=10, skipped_steps=6)))
    assert v.trained is False and v.why == "6 of 10 optimizer steps skipped, more than 50%"
    assert (v.optimizer_steps, v.skipped_steps, v.weights_changed) == (10, 6, None)
    ok = rules.trained(RunSummary(loss_scale=LossScaleSummary(scaler_in_use=True, steps=10, skipped_steps=1)))
    assert ok.trained is True and ok.why == "1 of 10 optimizer steps skipped"
    moved = rules.trained(RunSummary(loss_scale=LossScaleSummary(scaler_in_use=True, steps=10, skipped_steps=7),
                                     trained=TrainedSummary(weights_changed=True, optimizer_steps=12)))
    assert (moved.trained, moved.optimizer_steps, moved.skipped_steps, moved.weights_changed) == (False, 12, 7, True)


def _q(epoch, value, finite=True):
    return QualityEpoch(epoch=epoch, global_step=2 * (epoch + 1), value=value, weights_finite=finite)


def test_best_and_final_of_validations_worked_by_hand():
    # max 0.5 first reached at epoch 1 (epoch 2 ties it later); the final is the last one, 0.4 at epoch 3;
    # epoch 4's 0.9 ran on non-finite weights: no best, yet it is not the last here
    epochs = [_q(0, 0.3), _q(1, 0.5), _q(2, 0.5), _q(4, 0.9, finite=False), _q(3, 0.4)]
    assert rules.best_and_final(epochs) == (0.5, 1, 0.4, 3)
    assert rules.best_and_final(epochs, mode="min") == (0.3, 0, 0.4, 3)          # a loss: the minimum
    # the last validation not finite: no final value, but its epoch
    assert rules.best_and_final([_q(0, 0.3), _q(1, float("nan"))]) == (0.3, 0, None, 1)
    assert rules.best_and_final([_q(0, 0.3), _q(1, None)]) == (0.3, 0, None, 1)
    assert rules.best_and_final([]) == (None, None, None, None)


def test_recorded_quality_without_a_validation_says_why_for_every_figure():
    for record, why in [
        (QualitySummary(validation_configured=False), "validation not configured (run.json summary.quality)"),
        (QualitySummary(validation_configured=True, validations=0),
         "no validation ran (run.json summary.quality: 0 validations)"),
    ]:
        q = rules.quality(RunSummary(quality=record), {})
        assert (q.best.value, q.best_epoch.value, q.final.value) == (None, None, None)
        assert (q.best.why, q.best_epoch.why, q.final.why, q.by_epoch) == (why, why, why, [])


def test_recorded_quality_reads_the_record_and_its_running_best():
    # the record's best / best epoch / final are read as written (not recomputed: 0.7 at epoch 1 here, the
    # record says so); the running best skips the non-finite-weights validation and the NaN one
    record = QualitySummary(validation_configured=True, validations=4, best=0.7, best_epoch=1, final=0.6,
                            final_epoch=3, epochs=[_q(0, 0.2), _q(1, 0.7), _q(2, 0.95, finite=False), _q(3, 0.6)])
    q = rules.quality(RunSummary(quality=record), {"val/mIoU": [(0.0, 0, 0.1)]})  # the record wins over events
    assert (q.best.value, q.best_epoch.value, q.final.value) == (0.7, 1, 0.6)
    assert q.by_epoch == [(0, 0.2), (1, 0.7), (3, 0.7)]
    # validations ran, but every one on non-finite weights and the last one's value is NaN
    bad = QualitySummary(validation_configured=True, validations=2, best=None, best_epoch=None, final=None,
                         final_epoch=1, epochs=[_q(0, 0.4, finite=False), _q(1, float("nan"), finite=False)])
    q = rules.quality(RunSummary(quality=bad), {})
    why = "every validation ran on non-finite weights (run.json summary.quality)"
    assert (q.best.value, q.best.why, q.best_epoch.value, q.best_epoch.why) == (None, why, None, why)
    assert (q.final.value, q.final.why) == (None, "the last validation's value is not finite")
    assert q.by_epoch == []
