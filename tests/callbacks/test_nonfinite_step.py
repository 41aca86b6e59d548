"""Which step a non-finite record names, on the real CropMappingNet (small widths) and the bundled Flanders sample.

A record's ``global_step`` is the 0-based index of the optimizer step its micro-batch belongs to: Lightning's
``trainer.global_step`` while the micro-batch runs (skipped steps count: Lightning counts every
``optimizer.step`` call, and ``skip`` leaves the call in place with no gradient), the step at which Lightning logs
that step's ``train/loss_step``, and the ``step`` of the same step's step-timing trace line. Expected numbers are
worked by hand (micro-batch ``b`` of accumulation ``a`` belongs to step ``b // a``, index ``b % a`` in it) and
checked against the test's own reading of ``trainer.global_step`` at each batch start.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer

from cropscale.callbacks import CallbackGroup, NonFiniteCallback, NonFiniteError, StepTimingCallback
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.model.task import CropMappingTask
from tests.model.test_fp16 import SMALL

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),  # Lightning 2.6 on torch 2.13
    pytest.mark.filterwarnings("ignore:NonFiniteCallback"),  # the warning the injected NaN is meant to raise
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
]


class NaNBatches(PastisHDDataModule):
    """Real batches; in the training batches numbered in ``bad`` (0-based, in order), one clear S2 value becomes NaN."""

    def __init__(self, *args, bad: tuple[int, ...] = (), **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.bad, self.seen = bad, 0

    def on_after_batch_transfer(self, batch, dataloader_idx):
        batch = super().on_after_batch_transfer(batch, dataloader_idx)
        if self.trainer.training:
            if self.seen in self.bad:
                t, y, x = (int(v) for v in torch.nonzero(batch["s2_mask"][0])[0])  # a date and pixel called clear
                batch["s2"][0, t, 0, y, x] = float("nan")
            self.seen += 1
        return batch


class StepSpy(Callback):
    """The test's own reading: ``trainer.global_step`` at the start of each training batch, by (epoch, batch_idx)."""

    def __init__(self) -> None:
        self.step_of: dict[tuple[int, int], int] = {}
        self.batches_per_epoch = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.step_of[trainer.current_epoch, batch_idx] = trainer.global_step
        self.batches_per_epoch = trainer.num_training_batches


def _fit(root: Path, out: Path, policy: str, accumulate: int, bad: tuple[int, ...], steps: int):
    torch.manual_seed(0)
    dm = NaNBatches(str(root), batch_size=2, t2=4, t1=2, samples_per_patch=2, bad=bad)
    task = CropMappingTask(num_classes=dm.num_classes, net_kwargs=SMALL, val_window=32, val_stride=32)
    nf, spy = NonFiniteCallback(policy=policy), StepSpy()
    st = StepTimingCallback(warmup_steps=0, trace_path=str(out / "trace.jsonl"))
    trainer = Trainer(accelerator="cpu", max_steps=steps, accumulate_grad_batches=accumulate, limit_val_batches=0,
                      num_sanity_val_steps=0, logger=False, callbacks=[CallbackGroup([nf, st]), spy],
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      log_every_n_steps=1, default_root_dir=str(out))
    trainer.fit(task, datamodule=dm)
    trace = [json.loads(x) for x in (out / "trace.jsonl").read_text().splitlines()]
    return trainer, nf, spy, sorted(x["step"] for x in trace if x["callpath"] == "train_step")


@pytest.fixture
def fit(flanders_root, tmp_path):
    return lambda *args: _fit(flanders_root, tmp_path, *args)


# The bundled sample gives 2 training batches an epoch (batch 2): the n-th batch (0-based) is batch_idx n % 2 of
# epoch n // 2. Expected records: (global_step, epoch, batch_idx, micro_batch).
@pytest.mark.parametrize(("policy", "accumulate", "bad", "steps", "expected"), [
    # skip, no accumulation: batches 0 and 2 are steps 0 and 2 (epochs 0 and 1), both skipped; 3 steps counted
    ("skip", 1, (0, 2), 3, [(0, 0, 0, 0), (2, 1, 0, 0)]),
    # skip, accumulation 2 (one step an epoch): batch 0 is micro-batch 0 of step 0, batch 3 micro-batch 1 of step 1
    ("skip", 2, (0, 3), 2, [(0, 0, 0, 0), (1, 1, 1, 1)]),
    # log, accumulation 2: the last batch (3) is micro-batch 1 of step 1 (earlier ones would poison the weights)
    ("log", 2, (3,), 2, [(1, 1, 1, 1)]),
])
def test_a_record_names_the_optimizer_step_its_batch_belonged_to(fit, policy, accumulate, bad, steps, expected):
    trainer, nf, spy, trace_steps = fit(policy, accumulate, bad, steps)
    assert spy.batches_per_epoch == 2 and trainer.global_step == steps  # skipped steps are steps for Lightning
    records = nf.summary().records
    assert [(r.global_step, r.epoch, r.batch_idx, r.micro_batch) for r in records] == expected
    assert [spy.step_of[r.epoch, r.batch_idx] for r in records] == [e[0] for e in expected]  # Lightning's count
    assert trace_steps == list(range(steps))  # the step-timing trace numbers the same steps the same way
    assert nf.skipped_steps == (len(expected) if policy == "skip" else 0)


def test_raise_names_the_step_of_the_batch(fit):
    # accumulation 2, batch 2 = micro-batch 0 of step 1 (epoch 1): the error names step 1
    with pytest.raises(NonFiniteError, match=r"global step 1 \(epoch 1\): .*micro-batch 0"):
        fit("raise", 2, (2,), 2)
