"""Non-finite batches on one CPU process: NaN injected into chosen samples -> the exact sample ids,
``skip`` leaves the parameters untouched, ``raise`` stops with the ids, NaN gradients with a finite loss."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback, Trainer

from cropscale.callbacks import NonFiniteCallback, NonFiniteError
from cropscale.testing.toy import ToyTask

# ToyDataset(16), batch 4, no shuffling: batch k holds patch ids 1000+4k .. 1003+4k and
# crop_yx [8*(i % 4), 8*(i // 4)] for sample i
BATCH1 = [1004, 1005, 1006, 1007]
BATCH3 = [1012, 1013, 1014, 1015]
YX1 = [[0, 8], [8, 8], [16, 8], [24, 8]]
YX3 = [[0, 24], [8, 24], [16, 24], [24, 24]]

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),  # Lightning 2.6 on torch 2.13
    pytest.mark.filterwarnings("ignore:NonFiniteCallback"),  # the warning the injected NaNs are meant to raise
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
]


class ParamSpy(Callback):
    """Parameters before and after every training batch."""

    def __init__(self):
        self.before, self.after = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.before.append([p.detach().clone() for p in pl_module.parameters()])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after.append([p.detach().clone() for p in pl_module.parameters()])


def run(callbacks, task, **kw):
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=callbacks, logger=False,
                      log_every_n_steps=2, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, limit_val_batches=0, **kw)
    trainer.fit(task)
    return trainer


def test_log_policy_records_the_exact_sample_ids():
    torch.manual_seed(0)
    nf = NonFiniteCallback(policy="log")
    run([nf], ToyTask(nan_patch_ids={1013}))  # the last batch: the NaN does not reach later steps
    assert nf.nonfinite_batches == 1 and nf.skipped_steps == 0
    rec = nf.records[0]
    assert rec.patch_id == BATCH3 and rec.crop_yx == YX3
    assert (rec.global_step, rec.epoch, rec.batch_idx, rec.rank) == (4, 0, 3, 0)
    assert rec.loss_finite is False and rec.grads_finite is False
    assert nf.summary().records == [rec]


def test_skip_policy_skips_the_step_and_keeps_training():
    torch.manual_seed(0)
    nf, spy = NonFiniteCallback(policy="skip"), ParamSpy()
    task = ToyTask(optimizer="adamw", weight_decay=0.5, lr=0.1, nan_patch_ids={1005, 1013})
    trainer = run([nf, spy], task)
    assert trainer.global_step == 4  # training went on to the end of the epoch
    assert nf.nonfinite_batches == 2 and nf.skipped_steps == 2
    assert [r.patch_id for r in nf.records] == [BATCH1, BATCH3]
    assert [r.crop_yx for r in nf.records] == [YX1, YX3]
    assert [r.nonfinite_input_patch_id for r in nf.records] == [[1005], [1013]]
    assert [r.nonfinite_input_crop_yx for r in nf.records] == [[[8, 8]], [[8, 24]]]
    for k in range(4):
        same = all(torch.equal(a, b) for a, b in zip(spy.before[k], spy.after[k], strict=True))
        assert same == (k in (1, 3)), k  # skipped steps leave parameters (and weight decay) untouched
    for p in task.parameters():
        assert torch.isfinite(p).all()
        assert int(trainer.optimizers[0].state[p]["step"]) == 2  # AdamW stepped twice, not four times


def test_raise_policy_names_the_samples():
    torch.manual_seed(0)
    with pytest.raises(NonFiniteError, match=r"global step 2 .*patch_id=\[1004, 1005, 1006, 1007\]"):
        run([NonFiniteCallback(policy="raise")], ToyTask(nan_patch_ids={1005}))


def test_nan_gradients_with_a_finite_loss():
    torch.manual_seed(0)
    nf = NonFiniteCallback(policy="skip")
    run([nf], ToyTask(nan_grad_steps={2}))
    assert nf.nonfinite_batches == 1
    rec = nf.records[0]
    assert rec.loss_finite is True and rec.grads_finite is False
    assert rec.patch_id == [1008, 1009, 1010, 1011] and rec.global_step == 3
    assert rec.nonfinite_input_patch_id == []


def test_state_dict_round_trip_keeps_records():
    nf = NonFiniteCallback(policy="log")
    run([nf], ToyTask(nan_patch_ids={1013}))
    sd = nf.state_dict()
    fresh = NonFiniteCallback()
    fresh.load_state_dict(sd)
    assert fresh.nonfinite_batches == 1 and fresh.records == nf.records
