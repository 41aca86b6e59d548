"""Validation, test and predict of the real task over world sizes 1-8, more ranks than patches included.

Each rank of a world of size ``R`` is played in this process: the data module is given a trainer stand-in
with ``world_size = R`` and ``global_rank = r``, its evaluation loader is iterated and every batch goes
through the task's own ``validation_step`` / ``test_step`` / ``predict_step``. The ranks' confusion-matrix
states are then summed, which is what ``torchmetrics`` does across ranks at ``compute()``
(``dist_reduce_fx="sum"``). The reference is the same task on one process. The task's network is
replaced by a fixed per-pixel linear map (:class:`PixelNet`, seconds instead of minutes for the ~70
evaluation passes); everything around it (sharding, placeholders, tiling, losses, metrics) is the real
code. The multi-process (gloo) runs of the same paths are in
``tests/integration/test_eval_world_sizes_ddp.py``.
"""

from types import SimpleNamespace

import pytest
import torch

from cropscale.data.datamodule import PastisHDDataModule
from cropscale.model.task import CropMappingTask


class PixelNet(torch.nn.Module):
    """A seeded 1x1 convolution of the date means of S2 and both S1 orbits (a fixed function of the inputs)."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.num_classes = num_classes
        self.conv = torch.nn.Conv2d(14, num_classes + 6, kernel_size=1)

    def forward(self, s2, s2_doy, s2_mask, s1a, s1a_doy, s1a_mask, s1d, s1d_doy, s1d_mask):
        y = self.conv(torch.cat([s2.mean(1), s1a.mean(1), s1d.mean(1)], dim=1))
        c = self.num_classes
        hr = torch.sigmoid(y[:, c + 3:]).repeat_interleave(10, dim=2).repeat_interleave(10, dim=3)
        return {"semantic": y[:, :c], "parcel": y[:, c:c + 3], "hr": hr}



def _setup(which, flanders_root, pastis_mini_root):
    if which == "flanders":  # 2 validation patches (fold 2), 2 test patches (fold 1)
        dm = PastisHDDataModule(str(flanders_root), test_folds=[1], t2=4, t1=2, allow_fold_overlap=True)
    else:  # 3 validation patches (fold 1), 2 test patches (fold 3)
        dm = PastisHDDataModule(str(pastis_mini_root), train_folds=[2], val_folds=[1], test_folds=[3],
                                ignore_index=19, t2=3, t1=3)
    task = CropMappingTask(num_classes=dm.num_classes, ignore_index=dm.ignore_index, val_window=16, val_stride=8)
    task.net = PixelNet(dm.num_classes)
    dm.setup("validate")
    dm.setup("test")  # the datasets do not depend on the rank: built once
    return dm, task.eval()


def _run_rank(dm, task, world, rank, stages=("validate", "test", "predict")):
    """One rank's evaluation: its steps, its confusion-matrix states and predictions."""
    dm.trainer = SimpleNamespace(world_size=world, global_rank=rank)
    task.val_seg.reset()
    task.test_seg.reset()
    out = {"val_steps": 0, "test_steps": 0, "pred": {}}
    with torch.no_grad():
        for i, batch in enumerate(dm.val_dataloader() if "validate" in stages else []):
            task.validation_step(batch, i)
            out["val_steps"] += 1
        for i, batch in enumerate(dm.test_dataloader() if "test" in stages else []):
            task.test_step(batch, i)
            out["test_steps"] += 1
        for i, batch in enumerate(dm.predict_dataloader() if "predict" in stages else []):
            pred = task.predict_step(batch, i)
            for pid, sem in zip(pred["patch_id"].tolist(), pred["semantic"], strict=True):
                assert pid not in out["pred"], f"patch {pid} predicted twice on rank {rank}"
                out["pred"][pid] = sem
    out["val_confmat"] = task.val_seg.confmat.clone()
    out["test_confmat"] = task.test_seg.confmat.clone()
    return out


@pytest.mark.parametrize("which", ["flanders", "pastis"])
def test_every_world_size_counts_every_patch_once(which, flanders_root, pastis_mini_root):
    dm, task = _setup(which, flanders_root, pastis_mini_root)
    one = _run_rank(dm, task, 1, 0)
    n_val = len(dm.val_dataset)
    assert n_val == (2 if which == "flanders" else 3)
    # every labelled pixel of every validation patch once (independent count from the labels)
    labelled = sum(int((s["semantic"] != 19).sum()) if which == "pastis" else s["semantic"].numel()
                   for s in (dm.val_dataset[i] for i in range(n_val)))
    assert int(one["val_confmat"].sum()) == labelled
    assert one["val_steps"] == n_val and len(one["pred"]) == len(dm.test_dataset)
    for world in range(2, 9):
        # validation at every world size; test and predict (2 test patches) at 2, 3 and 4 ranks
        stages = ("validate", "test", "predict") if world <= 4 else ("validate",)
        ranks = [_run_rank(dm, task, world, r, stages) for r in range(world)]
        per_rank = -(-n_val // world)
        assert [r["val_steps"] for r in ranks] == [per_rank] * world, world  # same steps on every rank
        val = torch.stack([r["val_confmat"] for r in ranks]).sum(0)
        assert torch.equal(val, one["val_confmat"]), world  # element for element
        if world > 4:
            continue
        test = torch.stack([r["test_confmat"] for r in ranks]).sum(0)
        assert torch.equal(test, one["test_confmat"]), world
        preds = {}
        for r in ranks:
            assert not set(preds) & set(r["pred"]), "a patch predicted on two ranks"
            preds.update(r["pred"])
        assert sorted(preds) == sorted(one["pred"])
        for pid, sem in one["pred"].items():
            assert torch.equal(preds[pid], sem), (world, pid)
