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
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins import MixedPrecision

from cropscale.callbacks import (
    EnergyCallback,
    GradNormCallback,
    LossScaleCallback,
    MemoryCallback,
    NonFiniteCallback,
    StepTimingCallback,
    ThroughputCallback,
)
from cropscale.callbacks.base import resumed_epoch
from cropscale.env import nvml
from cropscale.testing.toy import ToyTask
from tests.callbacks.test_fit import CountingNvml, _fake_open

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
]

TASK = {"n_train": 8, "batch_size": 4}  # 2 batches of 4 samples per epoch


def _fit(root: Path, callbacks: list, max_epochs: int, ckpt_path: str | None = None, save_every_step: bool = False,
         amp: bool = False, **task):
    cbs = list(callbacks)
    if save_every_step:
        cbs.append(ModelCheckpoint(dirpath=str(root / "ckpt"), every_n_train_steps=1, save_top_k=-1,
                                   filename="{epoch}-{step}"))
    # amp: 16-mixed with a real GradScaler on CPU (configs/precision/amp_fp16_cpu.yaml)
    plugins = [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))] if amp else None
    Trainer(accelerator="cpu", devices=1, max_epochs=max_epochs, callbacks=cbs, logger=False, log_every_n_steps=1000,
            plugins=plugins,
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=save_every_step,
            num_sanity_val_steps=0).fit(ToyTask(**{**TASK, **task}), ckpt_path=ckpt_path)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Epoch 0 of a fit with the per-epoch callbacks, a checkpoint after each of its 2 steps: {step: path}."""
    root = tmp_path_factory.mktemp("ckpts")
    torch.manual_seed(0)
    mp = pytest.MonkeyPatch()
    mp.setattr(nvml, "open_device_for", _fake_open(CountingNvml()))
    try:
        _fit(root, [ThroughputCallback(warmup_steps=0), EnergyCallback(), GradNormCallback(), MemoryCallback(),
                    NonFiniteCallback()], max_epochs=1, save_every_step=True)
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


def _uninterrupted(root: Path, callback, **task):
    torch.manual_seed(0)  # the fixture's seed: the same weights and batches as the run the checkpoints come from
    _fit(root, [callback], max_epochs=2, **task)
    return callback


@pytest.mark.parametrize("step", [1, 2], ids=["inside-epoch-0", "at-epoch-0s-last-batch"])
def test_grad_norm_records_each_epochs_steps_under_its_own_epoch_after_a_resume(tmp_path, checkpoints, step):
    gn = GradNormCallback()
    _fit(tmp_path, [gn], max_epochs=2, ckpt_path=checkpoints[step])
    # 2 optimizer steps per epoch (2 batches, no accumulation), counted by hand
    assert [(e.epoch, e.steps) for e in gn.epochs] == [(0, 2), (1, 2)]
    assert gn.summary().steps == 4
    if step == 1:
        return  # Lightning restarts the (not stateful) loader: epoch 0's second step after the restart sees batch 0
    # epoch 0 wholly before the checkpoint, epoch 1 from its first batch: the uninterrupted run's norms
    whole = _uninterrupted(tmp_path / "whole", GradNormCallback())
    assert [(e.epoch, e.steps) for e in whole.epochs] == [(0, 2), (1, 2)]
    for got, want in zip(gn.epochs, whole.epochs, strict=True):
        assert got.grad_norm_max == pytest.approx(want.grad_norm_max, rel=1e-6)
        assert got.grad_norm_median == pytest.approx(want.grad_norm_median, rel=1e-6)


def _saved_state(ckpt: str, name: str) -> dict:
    """The state a callback class ``name`` saved in the checkpoint file (read with torch, not the callback)."""
    states = torch.load(ckpt, weights_only=False)["callbacks"]
    (state,) = [v for k, v in states.items() if k.startswith(name)]
    return state


@pytest.mark.parametrize("step", [1, 2], ids=["inside-epoch-0", "at-epoch-0s-last-batch"])
def test_memory_keeps_a_record_per_epoch_after_a_resume(tmp_path, checkpoints, step):
    mem = MemoryCallback()
    _fit(tmp_path, [mem], max_epochs=2, ckpt_path=checkpoints[step])
    assert [e.epoch for e in mem.epochs] == [0, 1]
    if step == 2:  # epoch 0 wholly before the checkpoint: its record is the host RSS the checkpoint saved
        saved = _saved_state(checkpoints[2], "MemoryCallback")["in_epoch"]
        assert mem.epochs[0].per_rank["host_rss_gib"] == [saved["host_rss_gib"]]
        assert mem.epochs[0].host_peak_rss_gib == saved["host_peak_rss_gib"]


TIMING_TASK = {"n_train": 12}  # 3 batches of 4 per epoch: the epoch's steps 1 and 2 are measured, step 0 is its first


@pytest.fixture(scope="module")
def timing_checkpoints(tmp_path_factory):
    """Epoch 0 of a 3-batch fit with StepTimingCallback(warmup_steps=0), a checkpoint after each step."""
    root = tmp_path_factory.mktemp("timing_ckpts")
    torch.manual_seed(0)
    _fit(root, [StepTimingCallback(warmup_steps=0)], max_epochs=1, save_every_step=True, **TIMING_TASK)
    return {s: str(root / "ckpt" / f"epoch=0-step={s}.ckpt") for s in (2, 3)}


def test_step_timing_the_uninterrupted_run_measures_2_steps_per_epoch(tmp_path):
    st = StepTimingCallback(warmup_steps=0)
    _fit(tmp_path, [st], max_epochs=2, **TIMING_TASK)
    # by hand: 3 steps per epoch, the first of each left out
    assert [(e.epoch, e.steps_measured) for e in st.epochs] == [(0, 2), (1, 2)]


@pytest.mark.parametrize(("step", "want"), [(2, [(0, 1), (1, 2)]), (3, [(0, 2), (1, 2)])],
                         ids=["inside-epoch-0", "at-epoch-0s-last-batch"])
def test_step_timing_records_each_epochs_measured_steps_under_its_own_epoch_after_a_resume(
        tmp_path, timing_checkpoints, step, want):
    st = StepTimingCallback(warmup_steps=0)
    _fit(tmp_path, [st], max_epochs=2, ckpt_path=timing_checkpoints[step], **TIMING_TASK)
    # by hand: epoch 0's step 1 (and step 2 from the last-batch checkpoint) measured before the checkpoint; the first
    # step after the restart has no previous step end in the process (no remainder) and is left out like an epoch's
    # first; epoch 1 as in the uninterrupted run
    assert [(e.epoch, e.steps_measured) for e in st.epochs] == want
    assert st.summary().steps_measured == sum(n for _, n in want)
    assert all(e.windows_ms["step"].n == e.steps_measured for e in st.epochs)
    # epoch 0's figures: the step times the checkpoint saved, their median worked out with numpy
    saved = _saved_state(timing_checkpoints[step], "StepTimingCallback")["in_epoch"]
    six = [saved["windows"].index(w) for w in ("data_wait", "transfer", "forward", "backward", "optimizer",
                                                "remainder")]
    steps_ms = [1e3 * sum(row[i] for i in six) for row in saved["steps"]]  # a step: its six windows (s), summed
    assert len(steps_ms) == want[0][1]
    assert st.epochs[0].windows_ms["step"].median == pytest.approx(float(np.median(steps_ms)), rel=1e-9)


@pytest.mark.parametrize("step", [1, 2], ids=["inside-epoch-0", "at-epoch-0s-last-batch"])
def test_nonfinite_records_a_batch_under_its_own_epoch_after_a_resume(tmp_path, checkpoints, step):
    # a NaN gradient at optimizer step 3: epoch 1's second batch (2 steps per epoch), the fit's last step
    nf = NonFiniteCallback()
    _fit(tmp_path, [nf], max_epochs=2, ckpt_path=checkpoints[step], nan_grad_steps=[3])
    assert [(r.global_step, r.epoch) for r in nf.records] == [(3, 1)]


OVERFLOW = {"overflow_steps": [1]}  # epoch 0's last step overflows under fp16: the scaler skips it and backs off


@pytest.fixture(scope="module")
def amp_checkpoints(tmp_path_factory):
    """Epoch 0 of a 16-mixed fit (real GradScaler) overflowing at its step 1, a checkpoint after each step."""
    root = tmp_path_factory.mktemp("amp_ckpts")
    torch.manual_seed(0)
    _fit(root, [LossScaleCallback()], max_epochs=1, save_every_step=True, amp=True, **OVERFLOW)
    return {1: str(root / "ckpt" / "epoch=0-step=1.ckpt"), 2: str(root / "ckpt" / "epoch=0-step=2.ckpt")}


@pytest.mark.parametrize("step", [1, 2], ids=["inside-epoch-0", "at-epoch-0s-last-batch"])
def test_loss_scale_counts_each_epochs_steps_under_its_own_epoch_after_a_resume(tmp_path, amp_checkpoints, step):
    ls = LossScaleCallback()
    _fit(tmp_path, [ls], max_epochs=2, ckpt_path=amp_checkpoints[step], amp=True, **OVERFLOW)
    # by hand: 2 optimizer steps per epoch; epoch 0's second one skipped with one back-off, epoch 1 clean
    assert [(e.epoch, e.steps, e.skipped_steps, e.backoff_events) for e in ls.epochs] == [(0, 2, 1, 1), (1, 2, 0, 0)]
    assert (ls.counts["steps"], ls.counts["skipped_steps"], ls.counts["backoff_events"]) == (4, 1, 1)


def test_resumed_epoch_continues_this_epoch_closes_an_earlier_one_and_ignores_a_later_one():
    trainer = SimpleNamespace(current_epoch=3)
    assert resumed_epoch({"epoch": 3}, trainer) == ({"epoch": 3}, False)   # a checkpoint inside epoch 3
    assert resumed_epoch({"epoch": 2}, trainer) == ({"epoch": 2}, True)    # at epoch 2's last batch end
    assert resumed_epoch({"epoch": 4}, trainer) == (None, False)
    for nothing in (None, {}, {"x": 1}):
        assert resumed_epoch(nothing, trainer) == (None, False)
