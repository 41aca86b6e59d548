"""Non-finite detection of a sample with one NaN pixel (issue 27; the other tests make a whole sample NaN).

- the per-sample and per-tensor checks on a batch with one NaN (or Inf) element, against the answer by hand;
- a fit of the real CropMappingNet (small widths) on the bundled Flanders sample: the data module loads real
  batches (the dataset lets no NaN out, :mod:`cropscale.data.dataset`), and the test sets one Sentinel-2 value
  of one sample to NaN after the transfer, at a date and pixel the mask calls clear. ``skip`` must name that
  sample alone (patch id and crop), and ``log`` with the input check must name the ``s2`` tensor.
"""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch import Trainer

from cropscale.callbacks import NonFiniteCallback
from cropscale.callbacks import nonfinite as nonfinite_module
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.model.task import CropMappingTask
from tests.model.test_fp16 import SMALL

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),  # Lightning 2.6 on torch 2.13
    pytest.mark.filterwarnings("ignore:NonFiniteCallback"),  # the warning the injected NaN is meant to raise
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
]



@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_one_bad_element_marks_its_sample_and_its_tensor(bad):
    s2 = torch.zeros(4, 3, 10, 8, 8)
    s2[2, 1, 7, 5, 3] = bad  # sample 2, one band of one pixel at one date
    batch = {"s2": s2, "s1": torch.ones(4, 2, 2, 8, 8), "patch_id": torch.arange(4)}
    assert nonfinite_module._sample_flags(batch) == [False, False, True, False]
    assert nonfinite_module._nonfinite_keys(batch) == ["s2"]
    keys, extremes = nonfinite_module._extremes(["s2", "s1"], [batch["s2"], batch["s1"]])
    assert keys == ["s2", "s1"] and nonfinite_module._finite_flags(extremes) == [False, True]


class OneNaNPixel(PastisHDDataModule):
    """Real batches; in the first training batch, one S2 value of sample 1 becomes NaN at a clear pixel."""

    injected: dict | None = None

    def on_after_batch_transfer(self, batch, dataloader_idx):
        batch = super().on_after_batch_transfer(batch, dataloader_idx)
        if self.trainer.training and self.injected is None:
            t, y, x = (int(v) for v in torch.nonzero(batch["s2_mask"][1])[0])  # a date and pixel the mask calls clear
            batch["s2"][1, t, 4, y, x] = float("nan")
            self.injected = {"patch_id": int(batch["patch_id"][1]), "crop_yx": batch["crop_yx"][1].tolist(),
                             "value_count": int(torch.isnan(batch["s2"]).sum())}
        return batch


def _fit(root, callback):
    torch.manual_seed(0)
    dm = OneNaNPixel(str(root), batch_size=2, t2=4, t1=2, samples_per_patch=2)
    task = CropMappingTask(num_classes=dm.num_classes, net_kwargs=SMALL, val_window=32, val_stride=32)
    trainer = Trainer(accelerator="cpu", max_steps=1, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
                      callbacks=[callback], enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    trainer.fit(task, datamodule=dm)
    assert dm.injected is not None and dm.injected["value_count"] == 1  # one NaN value in the whole batch
    return dm.injected


def test_skip_names_the_one_sample_with_a_nan_pixel_in_the_real_pipeline(flanders_root):
    nf = NonFiniteCallback(policy="skip")
    injected = _fit(flanders_root, nf)
    assert (nf.nonfinite_batches, nf.skipped_steps) == (1, 1)
    (rec,) = nf.summary().records
    assert rec.loss_finite is False and rec.input_finite is False and rec.nonfinite_inputs == ["s2"]
    assert rec.nonfinite_input_patch_id == [injected["patch_id"]]
    assert rec.nonfinite_input_crop_yx == [injected["crop_yx"]]


def test_log_input_check_names_the_tensor_with_a_nan_pixel_in_the_real_pipeline(flanders_root):
    nf = NonFiniteCallback(policy="log", check_inputs=True)
    _fit(flanders_root, nf)
    (rec,) = nf.summary().records
    assert rec.loss_finite is False and rec.input_finite is False and rec.nonfinite_inputs == ["s2"]
