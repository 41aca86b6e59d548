"""Per-epoch records after a resume from a checkpoint written inside an epoch or at its last batch (issue 36).

Lightning 2.6 (checked with a printing callback on a 2-batch epoch): resuming from a checkpoint written after
batch 0 of epoch 0 calls ``on_train_start`` (``current_epoch`` 0), then batch 1, then ``on_train_epoch_end`` of
epoch 0, with no ``on_train_epoch_start`` for it; resuming from the checkpoint written at epoch 0's last batch end
calls ``on_train_start`` with ``current_epoch`` 1 and runs epoch 1 with neither ``on_train_epoch_end`` for epoch 0
nor ``on_train_epoch_start`` for epoch 1.

Real one-process fits of the toy task: 8 samples in 2 batches of 4 per epoch, so every epoch trains 8 samples
(batches x batch size, worked out by hand) in the uninterrupted run and in the resumed one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from cropscale.callbacks import EnergyCallback, ThroughputCallback
from cropscale.env import nvml
from cropscale.testing.toy import ToyTask
from tests.callbacks.test_fit import CountingNvml, _fake_open

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
]

TASK = {"n_train": 8, "batch_size": 4}  # 2 batches of 4 samples per epoch


def _fit(root: Path, callbacks: list, max_epochs: int, ckpt_path: str | None = None, save_every_step: bool = False):
    cbs = list(callbacks)
    if save_every_step:
        cbs.append(ModelCheckpoint(dirpath=str(root / "ckpt"), every_n_train_steps=1, save_top_k=-1,
                                   filename="{epoch}-{step}"))
    Trainer(accelerator="cpu", devices=1, max_epochs=max_epochs, callbacks=cbs, logger=False, log_every_n_steps=1000,
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=save_every_step,
            num_sanity_val_steps=0).fit(ToyTask(**TASK), ckpt_path=ckpt_path)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Epoch 0 of a fit with both callbacks, a checkpoint after each of its 2 steps: {step: path}."""
    root = tmp_path_factory.mktemp("ckpts")
    torch.manual_seed(0)
    mp = pytest.MonkeyPatch()
    mp.setattr(nvml, "open_device_for", _fake_open(CountingNvml()))
    try:
        _fit(root, [ThroughputCallback(warmup_steps=0), EnergyCallback()], max_epochs=1, save_every_step=True)
    finally:
        mp.undo()
    return {1: str(root / "ckpt" / "epoch=0-step=1.ckpt"), 2: str(root / "ckpt" / "epoch=0-step=2.ckpt")}


def test_the_uninterrupted_run_trains_8_samples_per_epoch(tmp_path):
    th = ThroughputCallback(warmup_steps=0)
    _fit(tmp_path, [th], max_epochs=2)
    assert [(e.epoch, e.samples) for e in th.epochs] == [(0, 8), (1, 8)]


@pytest.mark.parametrize("step", [1, 2], ids=["inside-epoch-0", "at-epoch-0s-last-batch"])
def test_throughput_records_each_epochs_samples_under_its_own_epoch_after_a_resume(tmp_path, checkpoints, step):
    th = ThroughputCallback(warmup_steps=0)
    _fit(tmp_path, [th], max_epochs=2, ckpt_path=checkpoints[step])
    # epoch 0: 4 samples per step before the checkpoint (rank 0's count in it), the rest after the restart
    assert [(e.epoch, e.samples, e.samples_per_rank) for e in th.epochs] == [(0, 8, [8]), (1, 8, [8])]
    assert all(e.train_s and e.train_s > 0 and e.wall_s and e.wall_s >= e.train_s for e in th.epochs)
    s = th.summary()
    assert s.total_samples == 16
    assert s.total_train_s == pytest.approx(sum(e.train_s for e in th.epochs))


def test_energy_an_epoch_resumed_inside_has_its_window_from_the_restart(tmp_path, monkeypatch, checkpoints):
    # reads (5 J each): probe 5, fit start 10, [no epoch 0 start], epoch 0 end 15, epoch 1 start 20 / end 25,
    # fit end 30
    monkeypatch.setattr(nvml, "open_device_for", _fake_open(CountingNvml()))
    en = EnergyCallback()
    _fit(tmp_path, [en], max_epochs=2, ckpt_path=checkpoints[1])
    s = en.summary()
    assert s.available is True, s.reason
    # epoch 0 after the restart: 1 batch of 4 samples, 10 -> 15 J; epoch 1 whole: 8 samples, 20 -> 25 J
    assert [(e.epoch, e.energy_j, e.samples) for e in s.epochs] == [(0, 5.0, 4), (1, 5.0, 8)]
    assert (s.total_energy_j, s.total_samples, s.training.energy_j) == (10.0, 12, 20.0)
    assert s.j_per_sample == pytest.approx(10.0 / 12)


def test_energy_an_epoch_started_by_the_restart_is_measured_from_it(tmp_path, monkeypatch, checkpoints):
    # the checkpoint at epoch 0's last batch: Lightning goes on with epoch 1 and calls neither its start nor epoch
    # 0's end. Reads: probe 5, fit start 10, epoch 1 end 15, fit end 20
    monkeypatch.setattr(nvml, "open_device_for", _fake_open(CountingNvml()))
    en = EnergyCallback()
    _fit(tmp_path, [en], max_epochs=2, ckpt_path=checkpoints[2])
    s = en.summary()
    assert s.available is True, s.reason
    assert [(e.epoch, e.energy_j, e.samples) for e in s.epochs] == [(1, 5.0, 8)]
    assert (s.total_energy_j, s.total_samples, s.training.energy_j) == (5.0, 8, 10.0)
