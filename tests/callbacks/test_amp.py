"""AMP loss-scale callback: FP16 autocast on CPU with a real ``torch.amp.GradScaler`` through Lightning's
``MixedPrecision("16-mixed", "cpu", scaler)`` plugin, with injected gradient overflows."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer
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
