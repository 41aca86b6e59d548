"""Validate, test and predict on 1-4 CPU processes (DDP, gloo), on 2 and 3 patches: equal confusion matrices.

The real data module and task (a small :class:`~cropscale.model.network.CropMappingNet`, seeded) run under a
Lightning Trainer with ``devices = R``; 3 and 4 ranks on 2 validation patches (bundled flanders sample) and
4 ranks on 3 (pastis-r-mini fold 1) leave ranks without a patch. Rank 0 writes the confusion matrices
summed across ranks (``compute()`` of the task's metrics, the values the task logs) and every rank its
predicted patches; the test compares them, element for element, with the 1-process run.

This file is also the script the test launches (``python tests/integration/test_eval_world_sizes_ddp.py
--devices R --out DIR``): Lightning's DDP launcher re-executes it for ranks 1..R-1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
SMALL_NET = {"s2_dim": 16, "s2_heads": 2, "s1_dim": 8, "s1_heads": 2, "width": 8, "fpn_dim": 16, "head_dim": 8,
             "decoder_dim": 8, "hr_dim": 4}
CASES = {  # name: (data module arguments, validation patches)
    "flanders": ({"root": str(DATA / "worldcereal-flanders"), "test_folds": [1], "t2": 4, "t1": 2,
                  "allow_fold_overlap": True}, 2),  # nothing is trained: test may share the training fold
    "pastis": ({"root": str(DATA / "pastis-r-mini"), "train_folds": [2], "val_folds": [1], "test_folds": [3],
                "ignore_index": 19, "t2": 3, "t1": 3}, 3),
}


def run(devices: int, out: Path) -> None:
    """Validate, test and predict both cases on ``devices`` CPU processes; write the results under ``out``."""
    import lightning.pytorch as pl
    import torch

    from cropscale.data.datamodule import PastisHDDataModule
    from cropscale.distributed import finish_distributed
    from cropscale.model.task import CropMappingTask

    torch.set_num_threads(1)

    class Recording(CropMappingTask):
        """The task, recording the confusion matrices it logs from (summed across ranks) before the reset."""

        @property
        def _out(self) -> Path:
            return out / f"{self.hparams.num_classes}"

        def on_validation_epoch_end(self):
            if self.trainer.is_global_zero:
                self._out.mkdir(exist_ok=True)
                confmat = self.val_seg.compute()["confusion_matrix"]
                (self._out / "val.json").write_text(json.dumps(confmat.tolist()))
            super().on_validation_epoch_end()

        def on_test_epoch_end(self):
            if self.trainer.is_global_zero:
                self._out.mkdir(exist_ok=True)
                (self._out / "test.json").write_text(json.dumps(self.test_seg.compute()["confusion_matrix"].tolist()))
            super().on_test_epoch_end()

    for name, (kwargs, _) in CASES.items():
        dm = PastisHDDataModule(**kwargs)
        torch.manual_seed(0)
        task = Recording(num_classes=dm.num_classes, ignore_index=dm.ignore_index, net_kwargs=SMALL_NET,
                         val_window=16, val_stride=8)
        trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                             logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        trainer.validate(task, datamodule=dm)
        trainer.test(task, datamodule=dm)
        preds = trainer.predict(task, datamodule=dm)
        mine = {int(pid): sem.tolist() for p in preds for pid, sem in zip(p["patch_id"], p["semantic"], strict=True)}
        (out / f"{name}_pred_rank{trainer.global_rank}.json").write_text(json.dumps(mine))
        (out / f"{name}_classes").write_text(str(dm.num_classes))
    assert finish_distributed(trainer) == []


def _launch(devices: int, out: Path) -> None:
    out.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, __file__, "--devices", str(devices), "--out", str(out)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def _results(out: Path, name: str, devices: int) -> dict:
    classes = (out / f"{name}_classes").read_text()
    preds: dict[str, list] = {}
    for rank in range(devices):
        mine = json.loads((out / f"{name}_pred_rank{rank}.json").read_text())
        assert not set(mine) & set(preds), f"{name}: a patch predicted on two ranks"
        preds.update(mine)
    return {"val": json.loads((out / classes / "val.json").read_text()),
            "test": json.loads((out / classes / "test.json").read_text()), "pred": preds}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*LeafSpec")
def test_one_to_four_processes_give_the_same_confusion_matrices(tmp_path):
    for devices in (1, 2, 3, 4):
        _launch(devices, tmp_path / f"n{devices}")
    for name, (_, n_val) in CASES.items():
        one = _results(tmp_path / "n1", name, 1)
        assert sum(map(sum, one["val"])) > 0 and len(one["pred"]) == 2
        for devices in (2, 3, 4):
            run_ = _results(tmp_path / f"n{devices}", name, devices)
            assert run_["val"] == one["val"], (name, devices, n_val)  # element for element
            assert run_["test"] == one["test"], (name, devices)
            assert run_["pred"] == one["pred"], (name, devices)  # every test patch once, same classes


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    run(args.devices, args.out)
