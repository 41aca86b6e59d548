"""``run.json`` of a fit that failed: before training started (the data checks at setup) and inside a
DataLoader worker. The report must list such a run as failed with the error's own one-line message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lightning.pytorch import LightningDataModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader, Dataset

from cropscale.callbacks import ProvenanceCallback
from cropscale.errors import CropScaleError
from cropscale.report import command as rp
from cropscale.runs.record import load_inputs
from cropscale.testing.toy import ToyDataset, ToyTask
from tests.report.test_report import _footnote, _md_row

pytestmark = [pytest.mark.filterwarnings("ignore:.*LeafSpec"),
              pytest.mark.filterwarnings("ignore:The number of training batches"),
              pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")]

MESSAGE = "patch 1002: S2 file /d/S2_1002.npy: dates-S2 is not in chronological order"


class RefusedAtSetup(LightningDataModule):
    """A data module whose setup check refuses the data, as PastisHDDataModule's checks do."""

    def setup(self, stage: str) -> None:
        raise CropScaleError(MESSAGE)

    def train_dataloader(self) -> DataLoader:  # never reached
        return DataLoader(ToyDataset(8, t=1, c=6), batch_size=4)


class BadSample(Dataset):
    """Toy samples; sample 5 raises the data error (read in a DataLoader worker)."""

    def __init__(self) -> None:
        self.inner = ToyDataset(8, t=1, c=6)

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int):
        if i == 5:
            raise CropScaleError(MESSAGE)
        return self.inner[i]


class WorkerError(LightningDataModule):
    """Batches from one DataLoader worker process; the second batch holds the bad sample."""

    def train_dataloader(self) -> DataLoader:
        return DataLoader(BadSample(), batch_size=4, num_workers=1)


def _fit(tmp_path: Path, dm: LightningDataModule) -> Path:
    logger = TensorBoardLogger(str(tmp_path / "runs"), name="default")
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[ProvenanceCallback(topology=False)],
                      logger=logger, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, limit_val_batches=0)
    with pytest.raises(CropScaleError):
        trainer.fit(ToyTask(), datamodule=dm)
    return tmp_path / "runs" / "default" / "version_0"


def test_a_fit_refused_at_setup_leaves_a_failed_run_json_and_a_failed_report_row(tmp_path, capsys):
    folder = _fit(tmp_path, RefusedAtSetup())
    record = json.loads((folder / "run.json").read_text())
    assert record["status"] == "failed"
    assert record["error"] == {"type": "CropScaleError", "message": MESSAGE}
    assert record["global_step"] == 0 and record["epochs_completed"] == 0
    skipped: list[str] = []
    (run,) = load_inputs([tmp_path / "runs"], on_skip=skipped.append)
    assert skipped == [] and run.training_run and run.status == "failed"
    out = tmp_path / "rep"
    assert rp.main([str(tmp_path / "runs"), "--output", str(out)]) == 0
    assert "skipped" not in capsys.readouterr().out
    quality = (out / "report.md").read_text().split("### Quality")[1]
    cell = _md_row(quality, "default/version_0")[1]
    assert cell.startswith("failed [") and _footnote(quality, cell).endswith(f"CropScaleError: {MESSAGE}")


def test_a_data_error_in_a_worker_is_recorded_as_its_own_message(tmp_path):
    folder = _fit(tmp_path, WorkerError())
    record = json.loads((folder / "run.json").read_text())
    assert record["status"] == "failed"
    assert record["error"] == {"type": "CropScaleError", "message": MESSAGE}  # not the worker's traceback
