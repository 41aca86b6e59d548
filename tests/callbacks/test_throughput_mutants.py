"""ThroughputCallback in the hook orders the other tests leave out, worked out by hand (issue 36, mutation testing).

Lightning 2.6 calls no ``on_train_epoch_start`` for an epoch resumed from a checkpoint written inside it (or at its
last batch's end): the resumed callback goes from ``load_state_dict`` and ``on_train_start`` straight to batch ends,
so its first step reads the state the constructor left. A callback added on such a resume gets no state at all and
has no epoch clock. A fit that fails before training writes the summary of a callback that never started. The CUDA
synchronisation is seen through a fake ``torch.cuda`` (the module on ``cuda:1``), so no GPU is needed.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cropscale.callbacks import ThroughputCallback
from cropscale.callbacks import throughput as throughput_module
from cropscale.runs.schema import ThroughputSummary
from tests.callbacks.test_grad_norm_fused import ListLogger
from tests.callbacks.test_throughput_ranks import Clock, _setup, _step, _two_epochs


def _trainer(global_step=0, epoch=0):
    return SimpleNamespace(precision="32-true", log_every_n_steps=2, global_step=global_step, current_epoch=epoch,
                           world_size=1, loggers=[ListLogger()], sanity_checking=False, should_stop=False)


def _one_rank(monkeypatch, clock):
    monkeypatch.setattr(throughput_module, "perf_counter", clock)
    monkeypatch.setattr(throughput_module, "gather_vectors", lambda trainer, pl_module, values: [list(values)])


def _logged(trainer, key):
    return [(step, m[key]) for step, m in trainer.loggers[0].rows if key in m]


def test_an_epoch_resumed_inside_counts_its_first_steps_samples_once(monkeypatch):
    """A checkpoint at global step 2, inside epoch 0 (4 samples, 2 s of training, 3 s of epoch wall before it)."""
    clock = Clock()
    _one_rank(monkeypatch, clock)
    cb = ThroughputCallback(sync_cuda_at_epoch_end=False, warmup_steps=0)
    cb.load_state_dict({"total_samples": 0, "total_train_s": 0.0, "epochs": [],
                        "in_epoch": {"epoch": 0, "samples": 4, "train_s": 2.0, "val_s": 0.0, "wall_s": 3.0}})
    trainer, module = _trainer(global_step=2), SimpleNamespace(device=torch.device("cpu"))
    clock.t = 100.0
    cb.on_train_start(trainer, module)  # no on_train_epoch_start follows (Lightning's mid-epoch restart)
    _step(cb, trainer, module, clock, 1.0, 2)  # step 3 ends at 101: no predecessor, no latency
    _step(cb, trainer, module, clock, 2.0, 3)  # step 4 ends at 103: latency 2 s of 3 samples; a log step
    _step(cb, trainer, module, clock, 1.0, 2)  # step 5 ends at 104: latency 1 s of 2 samples
    clock.t = 105.0
    cb.on_train_epoch_end(trainer, module)
    # the log interval runs from the restart (100) to step 4 (103) and holds steps 3 and 4: 2 + 3 samples
    assert _logged(trainer, "perf/samples_per_s_rank") == [(4, pytest.approx(5 / 3))]
    (e,) = cb.epochs
    assert (e.samples, e.train_s, e.wall_s) == (4 + 7, pytest.approx(2.0 + 4.0), pytest.approx(3.0 + 5.0))
    assert e.samples_per_s_steady == pytest.approx((3 + 2) / (2.0 + 1.0))  # the measured steps' samples only


def test_a_callback_added_on_a_mid_epoch_resume_reports_no_times_for_that_epoch(monkeypatch):
    """No state in the checkpoint for it: no epoch clock and no log interval (both start at the next epoch)."""
    clock = Clock()
    _one_rank(monkeypatch, clock)
    cb = ThroughputCallback(sync_cuda_at_epoch_end=False, warmup_steps=0)
    trainer, module = _trainer(global_step=2), SimpleNamespace(device=torch.device("cpu"))
    clock.t = 100.0
    cb.on_train_start(trainer, module)
    for seconds in (1.0, 1.0, 2.0, 2.0):  # steps 3..6 end at 101, 102, 104, 106; log steps 4 and 6
        _step(cb, trainer, module, clock, seconds, 2)
    clock.t = 107.0
    cb.on_train_epoch_end(trainer, module)
    assert _logged(trainer, "perf/samples_per_s_rank") == []  # the log steps 4 and 6 have no interval start
    (e,) = cb.epochs
    assert (e.samples, e.samples_per_rank) == (8, [8])
    assert (e.train_s, e.train_s_per_rank, e.wall_s, e.val_s) == (None, [None], None, 0.0)
    assert (e.samples_per_s, e.samples_per_s_per_rank, e.samples_per_s_epoch_clock) == (None, [None], None)
    assert e.samples_per_s_steady == pytest.approx(6 / 5.0)  # steps 4..6: latencies 1, 2, 2 s


def test_epoch_clock_samples_per_s_is_global_samples_over_the_longest_wall(monkeypatch):
    """The two-rank epochs of test_throughput_ranks: walls 16 / 17 s (epoch 0) and 2 / 2.5 s (epoch 1)."""
    cb, trainer, module, clock, _ = _setup(monkeypatch, warmup_steps=2)
    _two_epochs(cb, trainer, module, clock)
    e0, e1 = cb.epochs
    assert e0.samples_per_s_epoch_clock == pytest.approx(12 / 17.0)
    assert e1.samples_per_s_epoch_clock == pytest.approx(18 / 2.5)
    logged = [m["perf/epoch/samples_per_s_epoch_clock"] for _, m in trainer.loggers[0].rows
              if "perf/epoch/samples_per_s_epoch_clock" in m]
    assert logged == [pytest.approx(12 / 17.0), pytest.approx(18 / 2.5)]
    assert cb.summary().samples_per_s_epoch_clock == pytest.approx(30 / 19.5)


def test_the_summary_of_a_fit_that_failed_before_training_names_no_device_dtype_or_peak():
    """run.json of a fit refused at setup holds this summary: nothing ran, so no device, dtype or peak is claimed."""
    s = ThroughputCallback(warmup_steps=3).summary()
    assert s == ThroughputSummary(warmup_steps=3)
    assert (s.device, s.dtype, s.peak_tflops, s.peak_source) == (None, None, None, None)


def test_before_the_first_epoch_end_there_is_no_peak_source(monkeypatch):
    """A fit that fails inside epoch 0 (after on_train_start): the peak is read at epoch ends only."""
    cb, *_ = _setup(monkeypatch, world_size=1)
    s = cb.summary()
    assert (s.device, s.dtype, s.peak_tflops, s.peak_source) == ("cpu", "fp32", None, None)


class FakeCuda:
    """``torch.cuda`` as seen with two GPUs: records the device of every synchronize."""

    def __init__(self, monkeypatch) -> None:
        self.synced: list[object] = []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: self.synced.append(device))


@pytest.mark.parametrize("sync", [True, False])
def test_epoch_edges_synchronise_the_modules_gpu(monkeypatch, sync):
    cuda = FakeCuda(monkeypatch)
    clock = Clock()
    _one_rank(monkeypatch, clock)
    cb = ThroughputCallback(sync_cuda_at_epoch_end=sync)
    trainer, module = _trainer(), SimpleNamespace(device=torch.device("cuda", 1))
    cb.on_train_start(trainer, module)
    cb.on_train_epoch_start(trainer, module)
    _step(cb, trainer, module, clock, 1.0, 2)
    cb.on_validation_start(trainer, module)
    cb.on_validation_end(trainer, module)
    cb.on_train_epoch_end(trainer, module)
    # epoch start, validation start and end, epoch end: the module's device (cuda:1), not the current one
    assert cuda.synced == ([torch.device("cuda", 1)] * 4 if sync else [])
    assert cb.summary().device == "NVIDIA H200"


def test_a_cpu_module_is_never_synchronised_even_with_cuda_present(monkeypatch):
    cuda = FakeCuda(monkeypatch)
    clock = Clock()
    _one_rank(monkeypatch, clock)
    cb = ThroughputCallback()
    trainer, module = _trainer(), SimpleNamespace(device=torch.device("cpu"))
    cb.on_train_start(trainer, module)
    cb.on_train_epoch_start(trainer, module)
    _step(cb, trainer, module, clock, 1.0, 2)
    cb.on_train_epoch_end(trainer, module)
    assert cuda.synced == [] and cb.summary().device == "cpu"
