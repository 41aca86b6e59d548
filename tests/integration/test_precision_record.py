"""The precision decided once (issue 35): a fit with ``configs/precision/amp_fp16_cpu.yaml`` (``trainer.precision:
null`` and a ``MixedPrecision`` plugin with a real GradScaler) requested 16-mixed by its plugin and ran 16-mixed;
its run folder must not say that "the configuration requested 32-true (Lightning changed it)".

``cli.main`` in this process on the bundled Flanders sample, the network at small widths."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cropscale.cli import main as cli
from cropscale.runs.record import load_run

REPO_ROOT = Path(__file__).resolve().parents[2]
SMALL_NET = {"s2_dim": 16, "s2_heads": 2, "s1_dim": 8, "width": 8, "fpn_dim": 16, "head_dim": 8,
             "decoder_dim": 8, "hr_dim": 4}


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["cropscale"])


def test_fp16_plugin_run_records_what_it_requested_and_ran(tmp_path, flanders_root, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the default logger writes runs/default/version_0 here
    cli.main(["fit", f"--data.root={flanders_root}", "--config",
              str(REPO_ROOT / "configs" / "precision" / "amp_fp16_cpu.yaml"),
              f"--model.net_kwargs={json.dumps(SMALL_NET)}", "--trainer.accelerator=cpu", "--trainer.max_epochs=1",
              "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1", "--data.batch_size=1",
              "--data.samples_per_patch=1", "--trainer.log_every_n_steps=1"])
    (folder,) = sorted((tmp_path / "runs" / "default").glob("version_*"))
    record = load_run(folder)
    cell = record.descriptive["precision"]
    assert cell.value == "16-mixed" and cell.note is None, cell  # nothing was changed: no footnote
    assert record.precision_label == "AMP FP16"
    written = json.loads((folder / "run.json").read_text())
    assert written["precision"] == "16-mixed"  # what Lightning ran: its MixedPrecision plugin, the configured one
    assert written["precision_decision"] == {"requested": "16-mixed", "resolved": "16-mixed", "by": "plugin",
                                             "label": "AMP FP16"}
    assert "Lightning changed" not in capsys.readouterr().out
