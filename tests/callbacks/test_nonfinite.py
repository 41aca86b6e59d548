"""Non-finite batches on one CPU process: NaN injected into chosen samples -> the exact sample ids,
``skip`` leaves the parameters untouched, ``raise`` stops with the ids, NaN gradients with a finite loss."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.plugins import MixedPrecision

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
    assert (rec.global_step, rec.epoch, rec.batch_idx, rec.rank) == (3, 0, 3, 0)  # batch 3 is step 3
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
    with pytest.raises(NonFiniteError, match=r"global step 1 .*patch_id=\[1004, 1005, 1006, 1007\]"):
        run([NonFiniteCallback(policy="raise")], ToyTask(nan_patch_ids={1005}))


def test_nan_gradients_with_a_finite_loss():
    torch.manual_seed(0)
    nf = NonFiniteCallback(policy="skip")
    run([nf], ToyTask(nan_grad_steps={2}))
    assert nf.nonfinite_batches == 1
    rec = nf.records[0]
    assert rec.loss_finite is True and rec.grads_finite is False
    assert rec.patch_id == [1008, 1009, 1010, 1011] and rec.global_step == 2  # the step ToyTask poisoned
    assert rec.nonfinite_input_patch_id == []
    assert rec.micro_batch is None and rec.input_finite is True  # the step, not one micro-batch: inputs were fine


def test_state_dict_round_trip_keeps_records():
    nf = NonFiniteCallback(policy="log")
    run([nf], ToyTask(nan_patch_ids={1013}))
    sd = nf.state_dict()
    fresh = NonFiniteCallback()
    fresh.load_state_dict(sd)
    assert fresh.nonfinite_batches == 1 and fresh.records == nf.records


# ------------------------------------------------------------------ gradient accumulation (issue 12, item 1)
# ToyDataset(16), batch 2, accumulate_grad_batches=4: optimizer step k (1-based) holds micro-batches
# 4(k-1) .. 4k-1; micro-batch m holds patch ids 1000+2m, 1001+2m. A NaN in sample 1010 is micro-batch 5,
# i.e. index 1 of optimizer step 2; crop_yx of sample i is [8 (i % 4), 8 (i // 4)].
ACC = 4
BAD_IDS, BAD_YX = [1010, 1011], [[16, 16], [24, 16]]


def fp16_plugins():
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000)
    return [MixedPrecision("16-mixed", "cpu", scaler)]


class StepParamSpy(Callback):
    """Parameters at the start and at the end of every optimizer step (``accumulate_grad_batches`` micro-batches)."""

    def __init__(self, acc):
        self.acc, self.before, self.after = acc, [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx % self.acc == 0:
            self.before.append([p.detach().clone() for p in pl_module.parameters()])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx % self.acc == self.acc - 1:
            self.after.append([p.detach().clone() for p in pl_module.parameters()])


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_log_policy_names_the_micro_batch_under_accumulation(precision):
    torch.manual_seed(0)
    nf = NonFiniteCallback(policy="log", check_inputs=True)
    plugins = fp16_plugins() if precision == "16-mixed" else []
    run([nf], ToyTask(batch_size=2, nan_patch_ids={1010}), accumulate_grad_batches=ACC, plugins=plugins)
    assert nf.nonfinite_batches == 1 and len(nf.records) == 1
    rec = nf.records[0]
    assert rec.patch_id == BAD_IDS and rec.crop_yx == BAD_YX  # not the step's last micro-batch [1014, 1015]
    assert (rec.global_step, rec.batch_idx, rec.micro_batch) == (1, 5, 1)  # batch 5 // ACC, 5 % ACC
    assert rec.loss_finite is False
    assert rec.input_finite is False and rec.nonfinite_inputs == ["s2"]
    assert rec.grads_finite is (None if precision == "16-mixed" else False)  # the scaler's business under fp16
    assert nf.summary().input_check == "every micro-batch"


def test_log_policy_examines_no_input_by_default():
    """No per-step work on the inputs under ``log`` unless asked for: the record says the input was not examined."""
    torch.manual_seed(0)
    nf = NonFiniteCallback(policy="log")
    run([nf], ToyTask(batch_size=2, nan_patch_ids={1010}), accumulate_grad_batches=ACC)
    rec = nf.records[0]
    assert (rec.patch_id, rec.micro_batch, rec.loss_finite) == (BAD_IDS, 1, False)
    assert rec.input_finite is None and rec.nonfinite_inputs is None
    assert nf.summary().input_check == "off"


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_skip_drops_exactly_that_optimizer_step_under_accumulation(precision):
    torch.manual_seed(0)
    nf, spy = NonFiniteCallback(policy="skip"), StepParamSpy(ACC)
    plugins = fp16_plugins() if precision == "16-mixed" else []
    task = ToyTask(batch_size=2, optimizer="adamw", weight_decay=0.5, lr=0.1, nan_patch_ids={1010})
    trainer = run([nf, spy], task, accumulate_grad_batches=ACC, plugins=plugins)
    assert trainer.global_step == 2
    assert nf.nonfinite_batches == 1 and nf.skipped_steps == 1
    rec = nf.records[0]
    assert (rec.patch_id, rec.micro_batch, rec.batch_idx) == (BAD_IDS, 1, 5)
    assert rec.nonfinite_input_patch_id == [1010] and rec.nonfinite_input_crop_yx == [[16, 16]]
    assert rec.input_finite is False and rec.nonfinite_inputs == ["s2"]  # examined on the rare path
    assert nf.summary().input_check == "non-finite micro-batches"
    changed = [not all(torch.equal(a, b) for a, b in zip(x, y, strict=True)) for x, y in zip(spy.before, spy.after,
                                                                                            strict=True)]
    assert changed == [True, False]  # step 1 updated the parameters, step 2 was dropped
    for p in task.parameters():
        assert torch.isfinite(p).all()
        assert int(trainer.optimizers[0].state[p]["step"]) == 1


def test_raise_under_fp16_names_the_micro_batch():
    torch.manual_seed(0)
    with pytest.raises(NonFiniteError, match=r"global step 1 .*micro-batch 1: patch_id=\[1010, 1011\]"):
        run([NonFiniteCallback(policy="raise")], ToyTask(batch_size=2, nan_patch_ids={1010}),
            accumulate_grad_batches=ACC, plugins=fp16_plugins())


def test_counts_are_exact_with_two_bad_micro_batches_in_one_step():
    """NaN in 1002 (micro-batch 1) and 1006 (micro-batch 3), both in the first optimizer step (step 0): two
    non-finite batches, one skipped step."""
    torch.manual_seed(0)
    nf = NonFiniteCallback(policy="skip")
    run([nf], ToyTask(batch_size=2, nan_patch_ids={1002, 1006}), accumulate_grad_batches=ACC)
    assert nf.nonfinite_batches == 2 and nf.skipped_steps == 1
    assert [(r.global_step, r.micro_batch, r.patch_id) for r in nf.records] == [(0, 1, [1002, 1003]),
                                                                                 (0, 3, [1006, 1007])]


def test_input_check_is_one_value_per_tensor_and_finite_exactly_when_every_element_is():
    from cropscale.callbacks.nonfinite import _extremes

    nan = float("nan")
    tensors = [torch.tensor([1.0, nan]), torch.tensor([-5.0, 2.0]), torch.tensor([float("-inf")]),
               torch.zeros(0), torch.tensor([3.0], dtype=torch.float16), torch.tensor([2.0], requires_grad=True)]
    keys, values = _extremes(["a", "b", "c", "empty", "half", "leaf"], tensors)
    assert keys == ["a", "b", "c", "half", "leaf"]  # the empty tensor has nothing to check
    finite = [bool(torch.isfinite(v)) for v in values]
    assert finite == [False, True, False, True, True]
    assert float(values[1]) == 5.0 and float(values[3]) == 3.0  # max |x|, by hand


def test_finite_flags_of_mixed_dtypes_and_shapes():
    from cropscale.callbacks.nonfinite import _finite_flags

    nan, inf = float("nan"), float("inf")
    same_shape = [torch.tensor(1.0), torch.tensor(nan, dtype=torch.float16), torch.tensor(2.0, dtype=torch.bfloat16),
                  torch.tensor(inf)]
    assert _finite_flags(same_shape) == [True, False, True, False]
    other_shapes = [torch.tensor([1.0]), torch.tensor(nan)]  # a [1] loss beside a 0-d value: the per-value path
    assert _finite_flags(other_shapes) == [True, False]
    assert _finite_flags([torch.tensor(3.0)] * 5) == [True] * 5
