"""``val/loss`` is the multi-task loss of the whole validation set, whatever the grouping (issue 12, item 7).

Each loss term is averaged over its own elements: the cross-entropy over the pixels whose class is not
ignored, the parcel and high-grid terms over the samples that have that target. A batch's term therefore
weighs by its element count; weighting per-batch losses by samples makes ``val/loss`` depend on how the
patches fall into batches (and ranks) as soon as batches hold different numbers of ignored pixels.
"""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer

from cropscale.model.synthetic import synthetic_batch
from cropscale.model.task import CropMappingTask

SMALL_NET = {"s2_dim": 16, "s2_heads": 2, "s1_dim": 8, "width": 8, "fpn_dim": 16, "head_dim": 8,
             "decoder_dim": 8, "hr_dim": 4}
VOID = 9


def _samples() -> dict[str, torch.Tensor]:
    """Five synthetic 8 x 8 patches; most pixels of patches 0 and 3 ignored, no parcel target for patch 1."""
    b = synthetic_batch(5, t2=3, t1=2, height=8, width=8, num_classes=10, seed=3)
    b["semantic"][0, :7] = VOID  # 8 labelled pixels left
    b["semantic"][3, :, 1:] = VOID  # 8 labelled pixels left
    b["parcel_present"][1] = False
    b["patch_id"], b["crop_yx"] = torch.arange(5), torch.zeros(5, 2, dtype=torch.long)
    return b


def _slice(batch: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
    return {k: v[rows] for k, v in batch.items()}


def _task() -> CropMappingTask:
    torch.manual_seed(0)
    task = CropMappingTask(num_classes=10, ignore_index=VOID, net_kwargs=SMALL_NET, val_window=8,
                           semantic_weight=1.0, parcel_weight=0.5, hr_weight=2.0)
    task.flops_per_sample = 1.0  # no FLOP count at setup
    return task.eval()


@pytest.mark.filterwarnings("ignore:.*LeafSpec", "ignore:.*num_workers", "ignore:.*does not have many workers")
def test_val_loss_equals_the_loss_of_the_whole_set_for_any_batching(tmp_path):
    task = _task()
    everything = _samples()
    with torch.no_grad():  # the reference: one loss over all five patches at once, no batching at all
        reference, _ = task.loss_fn(task._tiled_forward(everything), everything)
    results = []
    for groups in ([slice(0, 2), slice(2, 4), slice(4, 5)], [slice(0, 1), slice(1, 5)]):
        batches = [_slice(everything, g) for g in groups]
        trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, default_root_dir=str(tmp_path))
        out = trainer.validate(task, dataloaders=torch.utils.data.DataLoader(batches, batch_size=None), verbose=False)
        results.append(out[0]["val/loss"])
    assert results[0] == pytest.approx(float(reference), rel=1e-6)
    assert results[1] == pytest.approx(float(reference), rel=1e-6)


def test_weighting_by_hand(monkeypatch):
    """Two batches with chosen term values and element counts. Semantic: 2.0 over 10 labelled pixels, 4.0 over
    30 -> (20 + 120) / 40 = 3.5; parcel: 1.0 over 2 samples, batch 2 has none (its 0 weighs nothing) -> 1.0;
    high grid: 0.5 over 1 sample, 0.25 over 3 -> (0.5 + 0.75) / 4 = 0.3125. val/loss = 1 x 3.5 + 0.5 x 1.0 +
    2 x 0.3125 = 4.625 (a per-batch mean weighted by samples, 2 and 3, would give 3.675)."""
    task = _task()
    terms = iter([{"semantic": 2.0, "parcel": 1.0, "hr": 0.5}, {"semantic": 4.0, "parcel": 0.0, "hr": 0.25}])

    class FakeLoss(torch.nn.Module):
        semantic_weight, parcel_weight, hr_weight, ignore_index = 1.0, 0.5, 2.0, VOID

        def forward(self, outputs, batch):
            values = {k: torch.tensor(v) for k, v in next(terms).items()}
            return sum(values.values()), values

    task.loss_fn = FakeLoss()
    monkeypatch.setattr(task, "_tiled_forward", lambda batch: {
        "semantic": torch.zeros(batch["s2"].shape[0], 10, 8, 8), "parcel": torch.zeros(batch["s2"].shape[0], 3, 8, 8),
        "hr": torch.zeros(batch["s2"].shape[0], 3, 80, 80)})
    first, second = _slice(_samples(), slice(0, 2)), _slice(_samples(), slice(2, 5))
    first["semantic"][:] = VOID
    first["semantic"][0, 0, :5], first["semantic"][1, 0, :5] = 1, 2  # 10 labelled pixels
    first["parcel_present"][:], first["hr_present"][:] = True, torch.tensor([True, False])
    second["semantic"][:] = VOID
    second["semantic"][:, 0, :8], second["semantic"][:, 1, :2] = 3, 4  # 3 x 10 = 30 labelled pixels
    second["parcel_present"][:], second["hr_present"][:] = False, True
    task.validation_step(first, 0)
    task.validation_step(second, 1)
    assert float(task._val_loss()) == pytest.approx(1.0 * 3.5 + 0.5 * 1.0 + 2.0 * 0.3125, rel=1e-7)
