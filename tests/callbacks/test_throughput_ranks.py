"""ThroughputCallback's epoch figures with two ranks that disagree, worked out by hand (issue 36).

The hooks are driven by hand on a fake host clock; the epoch-end gather hands back this rank's row and a second
rank's row made by hand. The ranks differ (rank 0 trains more samples, rank 1 is slower in epoch 0 and faster in
epoch 1), so sum / mean / max / rank 0 give different answers; a validation run sits inside epoch 0, and the
warm-up is 2 steps, so which steps' latencies count shows. A real 2-process run: test_ranks_disagree_ddp.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cropscale.callbacks import ThroughputCallback
from cropscale.callbacks import throughput as throughput_module
from cropscale.env import peaks
from tests.callbacks.test_grad_norm_fused import ListLogger

# rank 1's rows: [samples, train_s, val_s, wall_s, samples of the measured steps, their summed latency]
RANK1 = {0: [4.0, 12.0, 6.0, 17.0, 1.0, 5.0], 1: [9.0, 1.2, 0.0, 2.5, 6.0, 1.0]}


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Barrier:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def barrier(self, name: str) -> None:
        self.calls.append(name)


def _setup(monkeypatch, world_size=2, **kwargs):
    clock = Clock()
    monkeypatch.setattr(throughput_module, "perf_counter", clock)
    sent = []

    def two_ranks(trainer, pl_module, values):
        assert pl_module is module  # the gather runs on the module's device
        sent.append(list(values))
        return [list(values), RANK1[trainer.current_epoch][:len(values)]] if world_size == 2 else [list(values)]

    trainer = SimpleNamespace(precision="32-true", log_every_n_steps=2, global_step=0, current_epoch=0,
                              world_size=world_size, loggers=[ListLogger()], sanity_checking=False, strategy=Barrier(),
                              should_stop=False)
    module = SimpleNamespace(device=torch.device("cpu"), flops_per_sample=None, flops_by_class=None)
    monkeypatch.setattr(throughput_module, "gather_vectors", two_ranks)
    cb = ThroughputCallback(sync_cuda_at_epoch_end=False, **kwargs)
    cb.on_train_start(trainer, module)
    return cb, trainer, module, clock, sent


def _step(cb, trainer, module, clock, seconds, samples, gap=0.0):
    """One optimizer step (one micro-batch of ``samples``), ``gap`` s after the last, taking ``seconds``."""
    clock.t += gap
    cb.on_train_batch_start(trainer, module, None, 0)
    clock.t += seconds
    cb.on_before_optimizer_step(trainer, module, None)
    trainer.global_step += 1
    cb.on_train_batch_end(trainer, module, None, {"s2": torch.zeros(samples, 1)}, 0)


def _two_epochs(cb, trainer, module, clock):
    cb.on_train_epoch_start(trainer, module)  # epoch 0 at t = 0
    _step(cb, trainer, module, clock, 1.0, 2)  # ends 1.0
    _step(cb, trainer, module, clock, 2.0, 2)  # ends 3.0
    cb.on_validation_start(trainer, module)  # 5 s of validation
    clock.t += 5.0
    cb.on_validation_end(trainer, module)  # t = 8.0
    _step(cb, trainer, module, clock, 3.0, 2, gap=0.5)  # the next fetch (0.5 s) is no train time: ends 11.5
    _step(cb, trainer, module, clock, 4.0, 2)  # ends 15.5
    clock.t = 16.0
    cb.on_train_epoch_end(trainer, module)
    trainer.current_epoch, clock.t = 1, 20.0
    cb.on_train_epoch_start(trainer, module)
    for _ in range(3):
        _step(cb, trainer, module, clock, 0.5, 3)  # ends 20.5, 21.0, 21.5
    clock.t = 22.0
    cb.on_train_epoch_end(trainer, module)


def test_epoch_figures_over_two_ranks_that_disagree(monkeypatch):
    cb, trainer, module, clock, sent = _setup(monkeypatch, warmup_steps=2)
    _two_epochs(cb, trainer, module, clock)
    # what this rank sent: samples, train time (steps only), validation, wall, measured-step samples, their latency
    # epoch 0: latencies of steps after the warm-up (2) and not first after a validation: step 4 only (4.0 s)
    assert sent == [[8.0, 10.0, 5.0, 16.0, 2.0, 4.0], [9.0, 1.5, 0.0, 2.0, 6.0, 1.0]]
    e0, e1 = cb.epochs
    assert (e0.epoch, e0.samples, e0.samples_per_rank) == (0, 12, [8, 4])  # summed, not averaged nor rank 0's
    assert e0.train_s == 12.0 and e0.train_s_per_rank == [10.0, 12.0]  # the slowest rank's train time
    assert e0.samples_per_s == pytest.approx(12 / 12.0)
    assert e0.samples_per_s_per_rank == [pytest.approx(0.8), pytest.approx(4 / 12)]
    assert e0.samples_per_s_steady == pytest.approx((2 + 1) / 5.0)  # measured samples over the slowest latency sum
    assert (e0.val_s, e0.wall_s) == (6.0, 17.0)  # the longest rank's
    assert (e0.step_latency_ms.n, e0.step_latency_ms.median) == (1, pytest.approx(4000.0))
    # epoch 1: rank 0 is now the slowest; latencies of steps 6 and 7 (the first of an epoch has no predecessor)
    assert (e1.epoch, e1.samples, e1.samples_per_rank, e1.train_s) == (1, 18, [9, 9], 1.5)
    assert e1.samples_per_s == pytest.approx(18 / 1.5) and e1.samples_per_s_steady == pytest.approx(12 / 1.0)
    assert (e1.val_s, e1.wall_s, e1.step_latency_ms.n) == (0.0, 2.5, 2)
    s = cb.summary()
    assert (s.total_samples, s.total_train_s) == (30, pytest.approx(13.5))
    assert s.samples_per_s == pytest.approx(30 / 13.5)
    # every rank waits at a barrier where a training stretch starts: epoch 0 start, after validation, epoch 1 start
    assert trainer.strategy.calls == ["ThroughputCallback.training_stretch"] * 3


def test_per_rank_samples_per_s_is_logged_per_interval_and_epoch_figures_at_its_end(monkeypatch):
    cb, trainer, module, clock, _ = _setup(monkeypatch, warmup_steps=2)
    _two_epochs(cb, trainer, module, clock)
    rows = trainer.loggers[0].rows
    rank = [(step, m["perf/samples_per_s_rank"]) for step, m in rows if "perf/samples_per_s_rank" in m]
    # log steps 2, 4, 6: 4 samples in 3 s; 4 samples since the validation's end (8.0) to 15.5; 6 samples in 1 s
    assert rank == [(2, pytest.approx(4 / 3.0)), (4, pytest.approx(4 / 7.5)), (6, pytest.approx(6.0))]
    epoch = [m for _, m in rows if "perf/epoch/samples_per_s" in m]
    assert [(m["perf/epoch/samples_per_s"], m["perf/epoch/train_s"], m["perf/epoch/val_s"], m["perf/epoch/wall_s"])
            for m in epoch] == [(pytest.approx(1.0), 12.0, 6.0, 17.0), (pytest.approx(12.0), 1.5, 0.0, 2.5)]
    assert epoch[0]["perf/epoch/samples_per_s_steady"] == pytest.approx(0.6)
    assert epoch[0]["perf/epoch/step_latency_ms_median"] == epoch[0]["perf/epoch/step_latency_ms_p95"] == 4000.0


@pytest.mark.parametrize(("warmup", "n0", "n1"), [(0, 2, 2), (1, 2, 2), (2, 1, 2), (3, 1, 2), (4, 0, 2), (5, 0, 2),
                                                  (6, 0, 1), (7, 0, 0)])
def test_warmup_leaves_out_exactly_that_many_steps_of_the_fit(monkeypatch, warmup, n0, n1):
    """Steps 1-4 in epoch 0 (step 3 first after validation), 5-7 in epoch 1 (step 5 first of its epoch): a step
    counts when it is past the warm-up and has a predecessor in the same training stretch."""
    cb, trainer, module, clock, sent = _setup(monkeypatch, warmup_steps=warmup)
    _two_epochs(cb, trainer, module, clock)
    assert [e.step_latency_ms.n for e in cb.epochs] == [n0, n1]
    assert [row[5] is None for row in sent] == [n0 == 0, n1 == 0]  # no measured step: no latency sum sent


def test_accumulated_micro_batches_make_one_step_with_all_their_samples(monkeypatch):
    cb, trainer, module, clock, sent = _setup(monkeypatch, world_size=1, warmup_steps=0)
    cb.on_train_epoch_start(trainer, module)
    for _ in range(2):  # 2 optimizer steps of 3 micro-batches (2 + 1 + 1 samples), 1 s each micro-batch
        for last, n in ((False, 2), (False, 1), (True, 1)):
            cb.on_train_batch_start(trainer, module, None, 0)
            clock.t += 1.0
            if last:
                cb.on_before_optimizer_step(trainer, module, None)
                trainer.global_step += 1
            cb.on_train_batch_end(trainer, module, None, {"s2": torch.zeros(n, 1)}, 0)
    cb.on_train_epoch_end(trainer, module)
    # 8 samples in 6 s; one latency (step 2 after step 1: 3 s) with its 4 samples
    assert sent == [[8.0, 6.0, 0.0, 6.0, 4.0, 3.0]]
    assert cb.epochs[0].samples_per_s_steady == pytest.approx(4 / 3.0) and trainer.strategy.calls == []
    assert [m["perf/samples_per_s_rank"] for _, m in trainer.loggers[0].rows if "perf/samples_per_s_rank" in m] == [
        pytest.approx(8 / 6.0)]  # log step 2 (every 2 optimizer steps): 8 samples in 6 s


def test_flops_tflops_and_mfu_per_gpu_over_the_slowest_rank(monkeypatch):
    cb, trainer, module, clock, _ = _setup(monkeypatch, warmup_steps=0, flops_per_sample=100.0, peak_tflops=1e-9)
    _two_epochs(cb, trainer, module, clock)
    e0 = cb.epochs[0]
    tflops = 100.0 * 12 / 12.0 / 2 / 1e12  # FLOPs of all samples / slowest train time / 2 GPUs
    assert e0.flops_per_sample == 100.0 and e0.tflops_per_s_per_gpu == pytest.approx(tflops)
    assert (e0.peak_tflops, e0.mfu) == (1e-9, pytest.approx(tflops / 1e-9))
    s = cb.summary()
    assert (s.peak_source, s.flops_source, s.mfu_reason) == ("peak_tflops", "constructor", None)


def test_flops_from_the_module_and_the_reasons_when_mfu_is_missing(monkeypatch):
    cb, trainer, module, clock, _ = _setup(monkeypatch, warmup_steps=0)
    module.flops_per_sample = "36"  # a number the module holds (read at each epoch end)
    _two_epochs(cb, trainer, module, clock)
    s = cb.summary()
    assert cb.epochs[0].flops_per_sample == 36.0 and s.flops_source == "pl_module.flops_per_sample"
    # 32-true on this CPU: convolutions may run in TF32 (cuDNN's switch), matmuls in FP32, and no FLOPs split
    assert s.mfu_reason.startswith("the operator classes run in different dtypes (convolution tf32, matmul fp32")
    assert s.peak_tflops is None and s.peak_source is None
    cb2, trainer2, module2, clock2, _ = _setup(monkeypatch, warmup_steps=0)
    module2.flops_per_sample = "many"
    _two_epochs(cb2, trainer2, module2, clock2)
    s2 = cb2.summary()
    assert s2.flops_source is None and cb2.epochs[0].tflops_per_s_per_gpu is None
    assert s2.mfu_reason == ("no FLOPs per sample: pass ThroughputCallback(flops_per_sample=...) or set "
                             "pl_module.flops_per_sample")


def test_the_attainable_peak_of_the_classes_dtypes_on_a_known_gpu(monkeypatch):
    monkeypatch.setattr(throughput_module, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    split = {"convolution": 3.0, "matmul": 1.0, "attention": 0.0}
    cb, trainer, module, clock, _ = _setup(monkeypatch, warmup_steps=0, flops_per_sample=10.0, flops_by_class=split)
    _two_epochs(cb, trainer, module, clock)
    s = cb.summary()
    conv, mm = peaks.peak_tflops("NVIDIA H100 80GB HBM3", "tf32"), peaks.peak_tflops("NVIDIA H100 80GB HBM3", "fp32")
    expected = 4.0 / (3.0 / conv + 1.0 / mm)  # sum f / sum f / P over the classes with FLOPs
    assert (s.peak_source, s.mfu_reason) == ("attainable", None) and s.peak_tflops == pytest.approx(expected)
    assert s.flops_by_class == split and cb.epochs[0].mfu == pytest.approx(cb.epochs[0].tflops_per_s_per_gpu / expected)
    # the same device with every class in one dtype and no split: the table's peak for that dtype
    cb2, trainer2, module2, clock2, _ = _setup(monkeypatch, warmup_steps=0, flops_per_sample=10.0)
    trainer2.precision = "bf16-mixed"
    cb2.on_train_start(trainer2, module2)
    _two_epochs(cb2, trainer2, module2, clock2)
    s2 = cb2.summary()
    assert (s2.peak_source, s2.peak_tflops, s2.dtype) == ("table", peaks.peak_tflops("NVIDIA H100 80GB HBM3", "bf16"),
                                                          "bf16")


def test_no_peak_for_the_device_names_the_device_and_dtypes(monkeypatch):
    cb, trainer, module, clock, _ = _setup(monkeypatch, warmup_steps=0, flops_per_sample=10.0,
                                           flops_by_class={"convolution": 2.0, "matmul": 5.0, "attention": 0.0})
    _two_epochs(cb, trainer, module, clock)
    assert cb.summary().mfu_reason == ("no dense peak for device 'cpu' and dtype(s) fp32, tf32: pass "
                                       "ThroughputCallback(peak_tflops=...)")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"flops_per_sample": 0}, "ThroughputCallback(flops_per_sample=0): must be > 0"),
    ({"peak_tflops": -1.0}, "ThroughputCallback(peak_tflops=-1.0): must be > 0"),
    ({"warmup_steps": -1}, "ThroughputCallback(warmup_steps=-1): must be >= 0"),
    ({"flops_by_class": {"convolution": -1.0}}, "ThroughputCallback(flops_by_class={'convolution': -1.0}): give "
                                               "FLOPs >= 0 for the classes convolution, matmul, attention"),
    ({"flops_by_class": {"pooling": 1.0}}, "ThroughputCallback(flops_by_class={'pooling': 1.0}): give "
                                          "FLOPs >= 0 for the classes convolution, matmul, attention"),
])
def test_bad_arguments_name_the_call(kwargs, message):
    from cropscale.errors import CropScaleError

    with pytest.raises(CropScaleError) as info:
        ThroughputCallback(**kwargs)
    assert str(info.value) == message


def test_boundary_arguments_are_accepted():
    cb = ThroughputCallback(warmup_steps=0, flops_by_class={"convolution": 0.0, "matmul": 1.0})
    assert cb.warmup_steps == 0 and cb.flops_by_class == {"convolution": 0.0, "matmul": 1.0}


def test_defaults_and_the_summary_before_any_epoch():
    cb = ThroughputCallback()
    assert (cb.warmup_steps, cb.sync_cuda_at_epoch_end, cb.flops_per_sample, cb.peak_tflops) == (5, True, None, None)
    s = cb.summary()
    assert (s.total_samples, s.total_train_s, s.samples_per_s, s.warmup_steps, s.epochs) == (0, 0.0, None, 5, [])
    cb.load_state_dict({})  # a checkpoint of an older version
    assert (cb.total_samples, cb.total_train_s, cb.epochs) == (0, 0.0, [])


def test_an_epoch_without_a_batch_and_a_rank_without_samples(monkeypatch):
    cb, trainer, module, clock, sent = _setup(monkeypatch, world_size=1, warmup_steps=0, flops_per_sample=10.0)
    cb.on_train_epoch_start(trainer, module)
    clock.t = 1.0
    cb.on_train_epoch_end(trainer, module)
    (e,) = cb.epochs
    assert (e.samples, e.train_s, e.samples_per_s, e.samples_per_s_per_rank, e.wall_s) == (0, None, None, [None], 1.0)
    assert cb.total_train_s == 0.0 and cb.summary().mfu_reason == "no training samples measured"
    RANK1[5] = [0.0, 2.0, 0.0, 3.0, 0.0, None]  # epoch 5: rank 1 trained no sample (uneven shards)
    cb2, trainer2, module2, clock2, _ = _setup(monkeypatch, warmup_steps=0)
    trainer2.current_epoch = 5
    cb2.on_train_epoch_start(trainer2, module2)
    _step(cb2, trainer2, module2, clock2, 1.0, 2)
    cb2.on_train_epoch_end(trainer2, module2)
    del RANK1[5]
    assert cb2.epochs[0].samples_per_rank == [2, 0] and cb2.epochs[0].samples == 2


def test_batches_of_unknown_size_count_no_sample_and_give_no_flops_figure(monkeypatch):
    cb, trainer, module, clock, sent = _setup(monkeypatch, world_size=1, warmup_steps=0, flops_per_sample=10.0)
    cb.on_train_epoch_start(trainer, module)
    for _ in range(2):
        cb.on_train_batch_start(trainer, module, None, 0)
        clock.t += 1.0
        cb.on_before_optimizer_step(trainer, module, None)
        cb.on_train_batch_end(trainer, module, None, {"a": "text"}, 0)  # no tensor: size unknown
    cb.on_train_epoch_end(trainer, module)
    assert sent[0][:2] == [0.0, 2.0] and cb.epochs[0].tflops_per_s_per_gpu is None
    assert cb.summary().mfu_reason == "no training samples measured"


def test_a_log_step_at_the_clock_of_the_last_log_writes_nothing(monkeypatch):
    cb, trainer, module, clock, _ = _setup(monkeypatch, world_size=1, warmup_steps=0)
    trainer.log_every_n_steps = 1
    cb.on_train_start(trainer, module)  # every step a log step
    cb.on_train_epoch_start(trainer, module)
    _step(cb, trainer, module, clock, 0.0, 2)  # the clock has not moved since the epoch start
    assert not [m for _, m in trainer.loggers[0].rows if "perf/samples_per_s_rank" in m]


def test_one_process_tflops_are_not_divided(monkeypatch):
    cb, trainer, module, clock, _ = _setup(monkeypatch, world_size=1, warmup_steps=0, flops_per_sample=0.5)
    _two_epochs(cb, trainer, module, clock)
    e0 = cb.epochs[0]
    assert e0.train_s == 10.0 and e0.tflops_per_s_per_gpu == 0.5 * 8 / 10.0 / 1 / 1e12  # the documented formula
    rows = [m for _, m in trainer.loggers[0].rows if "perf/epoch/tflops_per_s" in m]
    assert rows[0]["perf/epoch/tflops_per_s"] == e0.tflops_per_s_per_gpu and "perf/epoch/mfu" not in rows[0]
    cb2, trainer2, module2, clock2, _ = _setup(monkeypatch, world_size=1, warmup_steps=0, peak_tflops=1e-9,
                                               flops_per_sample=10.0)
    _two_epochs(cb2, trainer2, module2, clock2)
    rows = [m for _, m in trainer2.loggers[0].rows if "perf/epoch/mfu" in m]
    assert rows[0]["perf/epoch/mfu"] == pytest.approx(10.0 * 8 / 10.0 / 1e12 / 1e-9)


def test_flops_that_the_module_does_not_hold_or_holds_as_zero(monkeypatch):
    for module_flops in (None, 0.0):
        cb, trainer, module, clock, _ = _setup(monkeypatch, world_size=1, warmup_steps=0)
        if module_flops is None:
            del module.flops_per_sample
        else:
            module.flops_per_sample = module_flops
        _two_epochs(cb, trainer, module, clock)
        assert cb.epochs[0].flops_per_sample is None
        assert cb.summary().mfu_reason.startswith("no FLOPs per sample")


def test_the_peak_uses_the_dtypes_of_the_classes_with_flops_only(monkeypatch):
    cb, trainer, module, clock, _ = _setup(monkeypatch, world_size=1, warmup_steps=0, flops_per_sample=10.0,
                                           flops_by_class={"convolution": 0.0, "matmul": 5.0})
    _two_epochs(cb, trainer, module, clock)
    s = cb.summary()
    assert s.flops_by_class == {"convolution": 0.0, "matmul": 5.0, "attention": 0.0}  # a missing class has none
    assert s.mfu_reason.endswith("dtype(s) fp32: pass ThroughputCallback(peak_tflops=...)")  # not the idle tf32
    assert (s.peak_source, s.peak_tflops, s.device) == (None, None, "cpu")
    cb2, trainer2, module2, clock2, _ = _setup(monkeypatch, world_size=1, warmup_steps=0, flops_per_sample=10.0,
                                               flops_by_class={"convolution": 0.5, "matmul": 5.0})
    _two_epochs(cb2, trainer2, module2, clock2)
    assert cb2.summary().mfu_reason.endswith("dtype(s) fp32, tf32: pass ThroughputCallback(peak_tflops=...)")


def test_one_dtype_without_a_table_peak_has_no_source(monkeypatch):
    cb, trainer, module, clock, _ = _setup(monkeypatch, world_size=1, warmup_steps=0, flops_per_sample=10.0)
    trainer.precision = "bf16-mixed"
    cb.on_train_start(trainer, module)
    _two_epochs(cb, trainer, module, clock)
    s = cb.summary()
    assert (s.peak_source, s.peak_tflops, s.dtype) == (None, None, "bf16")
    assert s.mfu_reason == "no dense peak for device 'cpu' and dtype(s) bf16: pass ThroughputCallback(peak_tflops=...)"


def test_the_reason_when_the_classes_run_in_different_dtypes(monkeypatch):
    cb, trainer, module, clock, _ = _setup(monkeypatch, world_size=1, warmup_steps=0, flops_per_sample=10.0)
    _two_epochs(cb, trainer, module, clock)
    assert cb.summary().mfu_reason == (
        "the operator classes run in different dtypes (convolution tf32, matmul fp32, attention fp32) and their FLOPs "
        "split is unknown: pass ThroughputCallback(flops_by_class=...) or set pl_module.flops_by_class")


def test_a_resumed_epoch_keeps_its_validation_time_and_a_second_checkpoint_keeps_the_first(monkeypatch):
    cb, trainer, module, clock, _ = _setup(monkeypatch, world_size=1, warmup_steps=0)
    cb.on_train_epoch_start(trainer, module)  # epoch 0 from t = 0
    _step(cb, trainer, module, clock, 1.0, 2)
    cb.on_validation_start(trainer, module)
    clock.t += 2.0
    cb.on_validation_end(trainer, module)
    _step(cb, trainer, module, clock, 1.0, 2)  # t = 4
    state = cb.state_dict()
    assert state["in_epoch"] == {"epoch": 0, "samples": 4, "train_s": 2.0, "val_s": 2.0, "wall_s": 4.0}
    again = ThroughputCallback(warmup_steps=0, sync_cuda_at_epoch_end=False)
    again.load_state_dict(state)  # resumed, then checkpointed again before its first batch (a second preemption)
    assert again.state_dict()["in_epoch"] == {"epoch": 0, "samples": 4, "train_s": 2.0, "val_s": 2.0, "wall_s": None}
    resumed = ThroughputCallback(warmup_steps=0, sync_cuda_at_epoch_end=False)
    resumed.load_state_dict(again.state_dict())
    clock.t = 50.0
    resumed.on_train_start(trainer, module)
    resumed.on_train_epoch_start(trainer, module)  # were it called for the resumed epoch: the same figures
    _step(resumed, trainer, module, clock, 1.0, 2)
    resumed.on_train_epoch_end(trainer, module)
    (e,) = resumed.epochs
    assert (e.samples, e.train_s, e.val_s) == (6, pytest.approx(3.0), pytest.approx(2.0))
    fresh = ThroughputCallback(warmup_steps=0, sync_cuda_at_epoch_end=False)
    fresh.load_state_dict(state)
    fresh.on_train_start(trainer, module)
    trainer.current_epoch = 1  # the checkpoint's epoch is over: a new epoch starts from nothing
    fresh.on_train_epoch_start(trainer, module)
    _step(fresh, trainer, module, clock, 1.0, 2)
    fresh.on_train_epoch_end(trainer, module)
    assert (fresh.epochs[0].epoch, fresh.epochs[0].samples, fresh.epochs[0].val_s) == (1, 2, 0.0)


def test_a_resume_from_the_start_of_an_epoch_has_no_train_time_yet(monkeypatch):
    cb, trainer, module, clock, _ = _setup(monkeypatch, world_size=1, warmup_steps=0)
    cb.load_state_dict({"in_epoch": {"epoch": 0, "samples": 0, "train_s": None, "val_s": None, "wall_s": 0.5}})
    cb.on_train_start(trainer, module)
    _step(cb, trainer, module, clock, 1.0, 2)
    cb.on_train_epoch_end(trainer, module)
    assert (cb.epochs[0].train_s, cb.epochs[0].val_s, cb.epochs[0].wall_s) == (1.0, 0.0, pytest.approx(1.5))


def test_two_validations_in_an_epoch_add_up_and_a_finished_epoch_leaves_no_in_epoch_state(monkeypatch):
    cb, trainer, module, clock, sent = _setup(monkeypatch, world_size=1, warmup_steps=0)
    cb.on_train_epoch_start(trainer, module)
    for val in (2.0, 3.0):  # val_check_interval 0.5: a validation after each half of the epoch
        _step(cb, trainer, module, clock, 1.0, 2)
        cb.on_validation_start(trainer, module)
        clock.t += val
        cb.on_validation_end(trainer, module)
    cb.on_train_epoch_end(trainer, module)
    assert sent[0][:4] == [4.0, 2.0, 5.0, 7.0] and cb.epochs[0].val_s == 5.0
    assert "in_epoch" not in cb.state_dict()  # a checkpoint at the epoch end: nothing to resume inside it


def test_a_rank_without_a_wall_clock_is_left_out_of_the_longest_wall_and_validation(monkeypatch):
    RANK1[6] = [2.0, 1.0, 9.0, None, 0.0, None]
    try:
        cb, trainer, module, clock, _ = _setup(monkeypatch, warmup_steps=0)
        trainer.current_epoch = 6
        cb.on_train_epoch_start(trainer, module)
        _step(cb, trainer, module, clock, 1.0, 2)
        clock.t = 2.0
        cb.on_train_epoch_end(trainer, module)
    finally:
        del RANK1[6]
    (e,) = cb.epochs
    assert (e.wall_s, e.val_s, e.samples) == (2.0, 9.0, 4)
