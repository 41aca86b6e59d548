"""AMP loss-scale callback: FP16 autocast on CPU with a real ``torch.amp.GradScaler`` through Lightning's
``MixedPrecision("16-mixed", "cpu", scaler)`` plugin, with injected gradient overflows."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins import MixedPrecision

from cropscale.callbacks import GradNormCallback, LossScaleCallback, NonFiniteCallback
from cropscale.testing.toy import ToyTask

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),  # Lightning 2.6 on torch 2.13
    pytest.mark.filterwarnings("ignore:NonFiniteCallback"),  # the warning the injected NaNs are meant to raise
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
]


def fp16_trainer(root, callbacks, scaler, steps=10, **kw):
    return Trainer(
        accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=steps, callbacks=callbacks,
        plugins=[MixedPrecision("16-mixed", "cpu", scaler)], logger=TensorBoardLogger(str(root), name="amp"),
        log_every_n_steps=4, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        num_sanity_val_steps=0, limit_val_batches=0, **kw,
    )


def make_scaler():
    return torch.amp.GradScaler("cpu", init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)


def test_injected_overflows_give_exact_backoffs_and_skips(tmp_path):
    """Overflows at global steps 3 and 7 of 10. GradScaler semantics (growth after 3 clean steps):
    steps 0-2 clean -> growth at step 2 (2048); step 3 overflow -> back-off (1024); steps 4-6 clean ->
    growth at step 6 (2048); step 7 overflow -> 1024; steps 8-9 clean. So 2 back-offs, 2 skipped
    steps, 2 growths, final scale 1024."""
    torch.manual_seed(0)
    amp, gn = LossScaleCallback(), GradNormCallback()
    scaler = make_scaler()
    task = ToyTask(n_train=40, overflow_steps={3, 7}, step_lr_scheduler=True)
    trainer = fp16_trainer(tmp_path, [amp, gn], scaler)
    trainer.fit(task)
    c = amp.counts
    assert c["steps"] == 10
    assert c["backoff_events"] == 2
    assert c["skipped_steps"] == 2
    assert c["overflow_skips"] == 2 and c["nonfinite_loss_skips"] == 0
    assert c["growth_events"] == 2
    assert c["lr_scheduler_steps_on_skipped"] == 2  # one step-interval scheduler stepped on each skip
    s = amp.summary()
    assert s.scaler_in_use is True and s.initial_scale == 1024.0 and s.final_scale == 1024.0
    assert s.final_scale == scaler.get_scale()
    assert (s.growth_factor, s.backoff_factor, s.growth_interval) == (2.0, 0.5, 3)
    assert s.epochs[0].skipped_steps == 2
    # the gradient norm of the two skipped steps is inf after unscaling: counted apart
    assert gn.nonfinite_steps == 2 and gn.steps == 10


def test_nonfinite_loss_under_fp16_is_not_an_overflow(tmp_path):
    """A NaN sample makes the loss NaN: the scaler skips and backs off, but the callback files it
    under ``nonfinite_loss_skips``; NonFiniteCallback records the batch."""
    torch.manual_seed(0)
    amp, nf = LossScaleCallback(), NonFiniteCallback(policy="skip")
    # batch 2 (patch ids 1008..1011) holds the NaN sample 1009
    task = ToyTask(n_train=24, nan_patch_ids={1009})
    fp16_trainer(tmp_path, [amp, nf], make_scaler(), steps=6).fit(task)
    assert amp.counts["skipped_steps"] == 1
    assert amp.counts["nonfinite_loss_skips"] == 1 and amp.counts["overflow_skips"] == 0
    assert nf.nonfinite_batches == 1 and nf.skipped_steps == 1
    rec = nf.records[0]
    assert rec.patch_id == [1008, 1009, 1010, 1011] and rec.loss_finite is False
    assert rec.grads_finite is None  # under a GradScaler gradients are the scaler's business
    assert rec.nonfinite_input_patch_id == [1009]


@pytest.mark.parametrize("precision", ["bf16-mixed", "32-true"])
def test_no_scaler_is_recorded(tmp_path, precision):
    amp = LossScaleCallback()
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=2, precision=precision,
                      callbacks=[amp], logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, limit_val_batches=0)
    trainer.fit(ToyTask())
    s = amp.summary()
    assert s.scaler_in_use is False and s.precision == precision
    assert "no GradScaler in use" in s.reason
    assert amp.counts["steps"] == 0


class LossSpy(Callback):
    """Per micro-batch: is the loss ``on_before_backward`` receives finite (scaled under fp16), and is the loss
    ``training_step`` returned finite (``outputs["loss"]``, unscaled)."""

    def __init__(self):
        self.scaled_finite, self.loss_finite = [], []

    def on_before_backward(self, trainer, pl_module, loss):
        self.scaled_finite.append(bool(torch.isfinite(loss)))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.loss_finite.append(bool(torch.isfinite(outputs["loss"])))


@pytest.mark.parametrize("policy", ["raise", "log"])
def test_finite_loss_that_overflows_only_once_scaled_is_an_amp_overflow(tmp_path, policy):
    """Issue 12, item 2: at step 2 the loss is multiplied by 1e38 (about 1e35, finite in FP32); times the scale
    65536 it is inf. That is an AMP overflow (a back-off and a skipped step), never a non-finite batch:
    ``policy="raise"`` must not raise, and ``policy="log"`` (which reads the loss in ``on_train_batch_end``,
    not through the scaler tap) records nothing."""
    torch.manual_seed(0)
    amp, nf, spy = LossScaleCallback(), NonFiniteCallback(policy=policy), LossSpy()
    scaler = torch.amp.GradScaler("cpu", init_scale=65536.0, growth_interval=1000)
    task = ToyTask(n_train=24, loss_factors={2: 1e38})
    fp16_trainer(tmp_path, [spy, amp, nf], scaler, steps=6).fit(task)
    # the premise, checked independently: finite loss, non-finite scaled loss, at step 2 only
    assert spy.loss_finite == [True] * 6
    assert spy.scaled_finite == [True, True, False, True, True, True]
    assert nf.nonfinite_batches == 0 and nf.skipped_steps == 0
    c = amp.counts
    assert (c["skipped_steps"], c["overflow_skips"], c["nonfinite_loss_skips"]) == (1, 1, 0)
    assert scaler.get_scale() == 32768.0  # one back-off by 0.5


def _scheduler_steps_after(global_steps, frequency):
    """Lightning 2.6 steps an ``interval: step`` scheduler after the optimizer step whose batch index b (0-based,
    no accumulation: b = global step within the epoch) has (b + 1) % frequency == 0."""
    return [s for s in global_steps if (s + 1) % frequency == 0]


@pytest.mark.parametrize("frequency", [1, 2])
def test_scheduler_drift_counts_what_the_scheduler_did(tmp_path, frequency):
    """Issue 12, item 3: overflows at steps 2, 4 and 5 of 10, scheduler ``frequency`` 1 or 2. With frequency 2
    it stepped after step 5 only of the three (b + 1 even): a drift of 1, not 3."""
    torch.manual_seed(0)
    amp = LossScaleCallback()
    overflow = {2, 4, 5}
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000)
    task = ToyTask(n_train=40, overflow_steps=overflow, step_lr_scheduler=True, lr_scheduler_frequency=frequency)
    trainer = fp16_trainer(tmp_path, [amp], scaler)
    trainer.fit(task)
    assert amp.counts["skipped_steps"] == 3
    expected = len(_scheduler_steps_after(sorted(overflow), frequency))
    assert expected == (3 if frequency == 1 else 1)
    assert amp.counts["lr_scheduler_steps_on_skipped"] == expected
    assert amp.summary().epochs[0].lr_scheduler_steps_on_skipped == expected
    sched = trainer.lr_scheduler_configs[0].scheduler
    assert sched.last_epoch == len(_scheduler_steps_after(range(10), frequency))  # the rule above, checked
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(trainer.log_dir)
    ea.Reload()
    assert ea.Scalars("amp/lr_scheduler_steps_on_skipped")[-1].value == expected
