"""``model.schedule_by_updates`` (issue 37): the LR warm-up follows the optimizer updates that ran.

A real ``16-mixed`` GradScaler on CPU (``init_scale`` 1e6: the first steps overflow and are skipped while it backs
off) with the tiny CropMappingNet on the bundled sample, gradient clipping as in ``configs/default.yaml``. The
expected LR of each step is worked out by hand from the skips seen on the scaler's own scale (a step whose
``update()`` lowered the scale was skipped): by default Lightning's scheduler advances at every step, skipped or
not; with the option it advances only at the updates.
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.plugins import MixedPrecision

from cropscale import CropScaleError
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.model.task import CropMappingTask

pytestmark = [pytest.mark.filterwarnings("ignore:.*LeafSpec"), pytest.mark.filterwarnings("ignore:.*lr_scheduler"),
              pytest.mark.filterwarnings("ignore:The number of training batches"),
              pytest.mark.filterwarnings("ignore:.*does not have many workers")]

SMALL = {"s2_dim": 16, "s2_depth": 1, "s2_heads": 2, "s1_dim": 8, "s1_heads": 2, "width": 8, "fpn_dim": 16,
         "head_dim": 8, "decoder_dim": 8, "hr_dim": 4}
WARMUP, LR = 6, 1e-3


class Recorder(Callback):
    """Per optimizer step: was it skipped (the scaler's scale went down), and the LR after it."""

    def __init__(self) -> None:
        self.skipped: list[bool] = []
        self.lrs: list[float] = []
        self._scale = None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._scale = trainer.precision_plugin.scaler.get_scale()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.skipped.append(trainer.precision_plugin.scaler.get_scale() < self._scale)
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def _fit(flanders_root, by_updates: bool) -> tuple[Recorder, Trainer]:
    torch.manual_seed(0)
    dm = PastisHDDataModule(str(flanders_root), batch_size=1, samples_per_patch=4, t2=4, t1=2)
    task = CropMappingTask(num_classes=10, net_kwargs=SMALL, warmup_steps=WARMUP, lr=LR,
                           schedule_by_updates=by_updates)
    rec = Recorder()
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, callbacks=[rec],
                      gradient_clip_val=1.0, precision=None,
                      plugins=[MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=1e6))])
    trainer.fit(task, datamodule=dm)
    return rec, trainer


def _factor(step: int) -> float:
    """Linear warm-up by hand: (step + 1) / (WARMUP + 1) for the first WARMUP steps, then 1."""
    return (step + 1) / (WARMUP + 1) if step < WARMUP else 1.0


def test_by_default_the_schedule_drifts_over_skipped_steps(flanders_root):
    rec, trainer = _fit(flanders_root, by_updates=False)
    assert trainer.global_step == 8 and 0 < sum(rec.skipped) < 8  # some steps skipped, some not
    # Lightning steps the scheduler after every step: after step k it has stepped k + 1 times
    assert rec.lrs == pytest.approx([LR * _factor(k + 1) for k in range(8)], rel=1e-9)


def test_with_schedule_by_updates_the_lr_follows_the_updates_that_ran(flanders_root):
    rec, trainer = _fit(flanders_root, by_updates=True)
    assert 0 < sum(rec.skipped) < 8
    updates = [sum(not s for s in rec.skipped[:k + 1]) for k in range(8)]
    assert rec.lrs == pytest.approx([LR * _factor(u) for u in updates], rel=1e-9)
    assert rec.lrs != pytest.approx([LR * _factor(k + 1) for k in range(8)], rel=1e-9)  # not the drifting one
    (config,) = trainer.lr_scheduler_configs
    saved = config.scheduler.state_dict()["lr_lambdas"][0]  # what a checkpoint keeps for the resume
    assert saved == {"warmup_steps": WARMUP, "total_steps": 8, "schedule": "constant", "updates": updates[-1]}
    assert trainer.lightning_module.fused_optimizer_used[0] is False  # a fused AdamW skips out of the host's sight


def test_a_fused_adamw_cannot_be_forced_with_it_under_16_mixed(flanders_root):
    task = CropMappingTask(num_classes=10, net_kwargs=SMALL, warmup_steps=WARMUP, schedule_by_updates=True,
                           fused_optimizer=True)
    dm = PastisHDDataModule(str(flanders_root), batch_size=1, samples_per_patch=4, t2=4, t1=2)
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, precision=None,
                      plugins=[MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))])
    with pytest.raises(CropScaleError, match="model.fused_optimizer=true: model.schedule_by_updates under 16-mixed"):
        trainer.fit(task, datamodule=dm)
