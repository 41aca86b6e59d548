"""ThroughputCallback across a stop inside an epoch and its resume (issue 26): the resumed epoch keeps the train
time of its samples from before the checkpoint, so run-level samples/s stays samples / train time.

The hooks are driven by hand on a fake host clock (the module's ``perf_counter``), so every figure is worked out
by hand below.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cropscale.callbacks import ThroughputCallback
from cropscale.callbacks import throughput as throughput_module


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _batch(cb: ThroughputCallback, trainer: SimpleNamespace, module: SimpleNamespace, clock: Clock, i: int,
           seconds: float) -> None:
    """One training batch of 2 samples (one optimiser step) that takes ``seconds`` on the clock."""
    cb.on_train_batch_start(trainer, module, None, i)
    clock.t += seconds
    cb.on_before_optimizer_step(trainer, module, None)
    cb.on_train_batch_end(trainer, module, None, {"s2": torch.zeros(2, 1)}, i)
    trainer.global_step += 1


def test_a_mid_epoch_resume_counts_the_epochs_train_time_with_its_samples(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(throughput_module, "perf_counter", clock)
    trainer = SimpleNamespace(precision="32-true", log_every_n_steps=0, global_step=0, current_epoch=0,
                              world_size=1, loggers=[], sanity_checking=False)
    module = SimpleNamespace(device=torch.device("cpu"), flops_per_sample=None)
    cb = ThroughputCallback(warmup_steps=0, sync_cuda_at_epoch_end=False)
    cb.on_train_start(trainer, module)
    cb.on_train_epoch_start(trainer, module)  # epoch 0: 3 batches of 1 s
    for i in range(3):
        _batch(cb, trainer, module, clock, i, 1.0)
    clock.t += 0.5
    cb.on_train_epoch_end(trainer, module)
    trainer.current_epoch = 1
    clock.t = 4.0
    cb.on_train_epoch_start(trainer, module)  # epoch 1: 2 batches of 1 s, then the stop (0.5 s later)
    for i in range(2):
        _batch(cb, trainer, module, clock, i, 1.0)
    clock.t += 0.5
    state = cb.state_dict()

    clock.t = 100.0  # the restart, much later: the gap is no train time
    resumed = ThroughputCallback(warmup_steps=0, sync_cuda_at_epoch_end=False)
    resumed.load_state_dict(state)
    resumed.on_train_start(trainer, module)  # Lightning calls no on_train_epoch_start for a mid-epoch resume
    _batch(resumed, trainer, module, clock, 2, 2.0)  # epoch 1's last batch: 2 s
    resumed.on_train_epoch_end(trainer, module)

    e0, e1 = resumed.epochs
    assert (e0.samples, e0.train_s, e0.wall_s) == (6, pytest.approx(3.0), pytest.approx(3.5))
    # epoch 1: 4 samples in 2 s before the stop, 2 in 2 s after; wall 2.5 s before, 2 s after
    assert (e1.samples, e1.train_s, e1.wall_s) == (6, pytest.approx(4.0), pytest.approx(4.5))
    assert e1.samples_per_s == pytest.approx(6 / 4.0)
    s = resumed.summary()
    assert (s.total_samples, s.total_train_s) == (12, pytest.approx(7.0))
    assert s.samples_per_s == pytest.approx(12 / 7.0)  # before: 12 / 3 = 4.0 (epoch 1 had no train_s)


def test_a_resume_from_an_epochs_last_batch_closes_that_epoch_with_its_figures(monkeypatch):
    """Lightning 2.6 on a checkpoint at epoch 0's last batch end: on_train_start with current_epoch 1, then epoch 1
    with neither on_train_epoch_end for epoch 0 nor on_train_epoch_start for epoch 1 (issue 36)."""
    clock = Clock()
    monkeypatch.setattr(throughput_module, "perf_counter", clock)
    trainer = SimpleNamespace(precision="32-true", log_every_n_steps=0, global_step=0, current_epoch=0,
                              world_size=1, loggers=[], sanity_checking=False)
    module = SimpleNamespace(device=torch.device("cpu"), flops_per_sample=None)
    cb = ThroughputCallback(warmup_steps=0, sync_cuda_at_epoch_end=False)
    cb.on_train_start(trainer, module)
    clock.t = 1.0
    cb.on_train_epoch_start(trainer, module)  # epoch 0: 3 batches of 1 s, the checkpoint at the last one's end
    for i in range(3):
        _batch(cb, trainer, module, clock, i, 1.0)
    state = cb.state_dict()

    clock.t = 100.0
    trainer.current_epoch = 1
    resumed = ThroughputCallback(warmup_steps=0, sync_cuda_at_epoch_end=False)
    resumed.load_state_dict(state)
    resumed.on_train_start(trainer, module)
    for i in range(2):  # epoch 1: 2 batches of 1.5 s, then 0.5 s to its end
        _batch(resumed, trainer, module, clock, i, 1.5)
    clock.t += 0.5
    resumed.on_train_epoch_end(trainer, module)

    e0, e1 = resumed.epochs
    assert (e0.epoch, e0.samples, e0.train_s, e0.wall_s) == (0, 6, pytest.approx(3.0), pytest.approx(3.0))
    # before (issue 36): one record, epoch 1 with 10 samples and epoch 0's 3 s in its train time
    assert (e1.epoch, e1.samples, e1.train_s, e1.wall_s) == (1, 4, pytest.approx(3.0), pytest.approx(3.5))
    s = resumed.summary()
    assert (s.total_samples, s.total_train_s) == (10, pytest.approx(6.0))
