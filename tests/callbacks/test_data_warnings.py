"""``run.json["data_warnings"]``: what the data module's checks found, written by ProvenanceCallback from the
data module's ``data_warnings`` attribute (issue 17)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lightning.pytorch import LightningDataModule, Trainer
from torch.utils.data import DataLoader

from cropscale.callbacks import ProvenanceCallback
from cropscale.report import command as rp
from cropscale.runs.record import load_run
from cropscale.testing.toy import ToyDataset, ToyTask
from tests.report.test_report import _footnote

pytestmark = [pytest.mark.filterwarnings("ignore:.*LeafSpec"),
              pytest.mark.filterwarnings("ignore:The number of training batches"),
              pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")]


class WarningData(LightningDataModule):
    """Toy batches; its setup finds two things to report, as PastisHDDataModule's checks do."""

    def __init__(self) -> None:
        super().__init__()
        self.data_warnings: list[str] = []

    def setup(self, stage: str) -> None:
        self.data_warnings += ["patch 7: S2 scale off", "2 patch id(s) have files but no entry in metadata"]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(ToyDataset(8, t=1, c=6), batch_size=4)


def _fit(tmp_path: Path, dm: LightningDataModule | None) -> dict:
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, callbacks=[ProvenanceCallback(topology=False)],
                      logger=False, default_root_dir=str(tmp_path), enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0)
    trainer.fit(ToyTask(), datamodule=dm) if dm is not None else trainer.fit(ToyTask())
    return json.loads((tmp_path / "run.json").read_text())


def test_data_warnings_are_written_and_reported(tmp_path):
    record = _fit(tmp_path / "run", WarningData())
    assert record["data_warnings"] == ["patch 7: S2 scale off", "2 patch id(s) have files but no entry in metadata"]
    assert load_run(tmp_path / "run").data_warnings == record["data_warnings"]
    out = tmp_path / "rep"
    assert rp.main([str(tmp_path / "run"), "--output", str(out)]) == 0
    md = (out / "report.md").read_text()
    header = next(x for x in md.splitlines() if x.startswith("| Run |") and "| Data warnings |" in x)
    col = [c.strip() for c in header.strip("|").split("|")].index("Data warnings")
    table = md.split(header)[1]  # the rows under that header
    row = next(x for x in table.splitlines() if x.startswith("| ") and "run" in x.split("|")[1])
    cell = [c.strip() for c in row.strip("|").split("|")][col]
    assert cell.startswith("2 [")
    note = _footnote(table, cell)  # each table numbers its own notes
    assert "patch 7: S2 scale off" in note and "no entry in metadata" in note


def test_no_data_module_means_no_warning(tmp_path):
    assert _fit(tmp_path, None)["data_warnings"] == []
