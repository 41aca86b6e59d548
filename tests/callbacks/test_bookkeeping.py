"""Bookkeeping of the timing callbacks against numbers worked out by hand (issue 27).

A fit of the toy task on a clock the test owns: ``time.perf_counter`` of the throughput and step-timing
callbacks is replaced by a counter that moves only where the test moves it. Optimizer step ``k`` (0-based
``global_step``) advances it by ``d_k = 10 ms + k ms`` inside ``training_step``; each validation run by
``VAL_S = 100 s`` inside ``validation_step``. Nothing else takes time, so each step's latency is ``d_k``
exactly, and the steps that enter the epoch statistics can be listed by hand:

- 2 epochs x 8 steps (32 samples, batch 4), validation after the 4th and the 8th step of each epoch
  (``val_check_interval=4``), ``warmup_steps=2``;
- left out: the two warm-up steps (k = 0, 1), the first step of each epoch (k = 0, 8), the first step after
  the mid-epoch validation (k = 4, 12: its latency would hold the 100 s validation);
- measured: epoch 0 k = 2, 3, 5, 6, 7; epoch 1 k = 9, 10, 11, 13, 14, 15.

The first-batch wait is checked on the real clock instead: the loader sleeps ``SLEEP_S`` before the first
sample of each epoch, and the figure must lie between that sleep and the sleep plus a generous 1.5 s.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from lightning.pytorch import Trainer
from torch.utils.data import DataLoader

from cropscale.callbacks import StepTimingCallback, ThroughputCallback
from cropscale.callbacks import step_timing as step_timing_module
from cropscale.callbacks import throughput as throughput_module
from cropscale.callbacks._clock import HostClock
from cropscale.testing.toy import ToyDataset, ToyTask

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),  # Lightning 2.6 on torch 2.13
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
]

BATCH, STEPS_PER_EPOCH, EPOCHS, WARMUP, VAL_S = 4, 8, 2, 2, 100.0
MEASURED = {0: [2, 3, 5, 6, 7], 1: [9, 10, 11, 13, 14, 15]}  # worked out in the module docstring


def d(k: int) -> float:
    """Duration of optimizer step ``k`` on the test's clock (s)."""
    return 0.010 + 0.001 * k


class Clock:
    """The test's clock (s): moves only by :meth:`advance`."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class TimedTask(ToyTask):
    """The toy task whose steps and validation runs take the test's time."""

    def __init__(self, clock: Clock, **kw) -> None:
        super().__init__(n_train=BATCH * STEPS_PER_EPOCH, batch_size=BATCH, **kw)
        self.clock = clock

    def training_step(self, batch, batch_idx):
        self.clock.advance(d(self.global_step))
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.clock.advance(VAL_S)
        return super().validation_step(batch, batch_idx)


@pytest.fixture(scope="module")
def timed_fit():
    """The fit described in the module docstring; returns (throughput, step timing) callbacks."""
    clock = Clock()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(throughput_module, "perf_counter", clock)
        mp.setattr(step_timing_module, "perf_counter", clock)
        mp.setattr(HostClock, "mark", staticmethod(clock))
        tp = ThroughputCallback(warmup_steps=WARMUP, sync_cuda_at_epoch_end=False)
        st = StepTimingCallback(warmup_steps=WARMUP)
        trainer = Trainer(accelerator="cpu", devices=1, max_epochs=EPOCHS, val_check_interval=4, limit_val_batches=1,
                          num_sanity_val_steps=0, callbacks=[tp, st], logger=False, enable_progress_bar=False,
                          enable_model_summary=False, enable_checkpointing=False)
        trainer.fit(TimedTask(clock))
    assert trainer.global_step == EPOCHS * STEPS_PER_EPOCH
    return tp, st


@pytest.mark.parametrize("epoch", [0, 1])
def test_step_latency_leaves_out_warmup_first_steps_and_the_step_after_validation(timed_fit, epoch):
    tp, _ = timed_fit
    rec = tp.epochs[epoch]
    lat_ms = [1e3 * d(k) for k in MEASURED[epoch]]
    got = (rec.step_latency_ms.n, rec.step_latency_ms.median, rec.step_latency_ms.p95)
    assert got == (len(lat_ms), pytest.approx(np.median(lat_ms)), pytest.approx(np.percentile(lat_ms, 95)))
    steady = BATCH * len(lat_ms) / sum(d(k) for k in MEASURED[epoch])
    assert rec.samples_per_s_steady == pytest.approx(steady)


@pytest.mark.parametrize("epoch", [0, 1])
def test_train_time_is_the_steps_and_validation_time_the_two_runs(timed_fit, epoch):
    tp, _ = timed_fit
    rec = tp.epochs[epoch]
    steps = range(epoch * STEPS_PER_EPOCH, (epoch + 1) * STEPS_PER_EPOCH)
    train_s = sum(d(k) for k in steps)
    assert rec.train_s == pytest.approx(train_s)
    assert rec.samples_per_s == pytest.approx(BATCH * STEPS_PER_EPOCH / train_s)
    assert rec.val_s == pytest.approx(2 * VAL_S)


@pytest.mark.parametrize("epoch", [0, 1])
def test_step_time_leaves_out_warmup_first_steps_and_the_step_after_validation(timed_fit, epoch):
    _, st = timed_fit
    rec = st.epochs[epoch]
    step_ms = [1e3 * d(k) for k in MEASURED[epoch]]
    assert rec.steps_measured == len(step_ms)
    step = rec.windows_ms["step"]
    assert (step.n, step.median, step.p95) == (
        len(step_ms), pytest.approx(np.median(step_ms)), pytest.approx(np.percentile(step_ms, 95)))
    assert rec.windows_ms["forward"].median == pytest.approx(np.median(step_ms))  # the time is in training_step


SLEEP_S = 0.3


class SlowFirstSample(ToyDataset):
    """Sleeps ``SLEEP_S`` (real time) before sample 0, the first sample of each epoch."""

    def __getitem__(self, i):
        if i == 0:
            time.sleep(SLEEP_S)
        return super().__getitem__(i)


class SlowStartTask(ToyTask):
    def train_dataloader(self):
        return DataLoader(SlowFirstSample(self.n_train, t=1, c=self.lin.in_features), batch_size=self.batch_size)


def test_first_batch_wait_is_the_loader_sleep_in_milliseconds():
    st = StepTimingCallback(warmup_steps=0)
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=2, limit_val_batches=0, num_sanity_val_steps=0,
                      callbacks=[st], logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False)
    trainer.fit(SlowStartTask(n_train=8, batch_size=4))
    for rec in st.epochs:
        (wait_ms,) = rec.first_batch_wait_ms_per_rank
        assert 1e3 * SLEEP_S <= wait_ms <= 1e3 * SLEEP_S + 1500.0, rec.epoch
        assert rec.windows_ms["data_wait"].median < 1e3 * SLEEP_S  # the other fetches do not sleep
