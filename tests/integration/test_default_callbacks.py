"""configs/default.yaml runs the scaling callbacks; presets given after it merge into its group instead of
running a callback twice (``cropscale.cli.main.merge_callbacks``)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

from cropscale.callbacks import (
    CallbackGroup,
    CheckpointTimingCallback,
    DivergenceCallback,
    EnergyCallback,
    GradNormCallback,
    LossScaleCallback,
    MemoryCallback,
    NonFiniteCallback,
    ProvenanceCallback,
    QualityCallback,
    StepTimingCallback,
    ThroughputCallback,
    TrainedCallback,
)
from cropscale.cli.main import DEFAULT_CONFIG, CropScaleCLI, merge_callbacks, report_command
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.model.task import CropMappingTask

REPO = Path(__file__).resolve().parents[2]
GROUP = [StepTimingCallback, ThroughputCallback, LossScaleCallback, NonFiniteCallback, GradNormCallback,
         EnergyCallback, MemoryCallback, TrainedCallback, QualityCallback, CheckpointTimingCallback,
         ProvenanceCallback]

pytestmark = [pytest.mark.filterwarnings("ignore:(?s).*was deprecated in v4.49.0"),
              pytest.mark.filterwarnings("ignore:.*LeafSpec")]


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["cropscale"])


def _callbacks(tmp_path, flanders_root, *configs: str) -> list:
    args = ["--config", str(DEFAULT_CONFIG)]
    for c in configs:
        args += ["--config", c]
    args += [f"--data.root={flanders_root}", f"--trainer.logger.init_args.save_dir={tmp_path}"]
    cli = CropScaleCLI(CropMappingTask, PastisHDDataModule, run=False, args=args)
    return cli.trainer.callbacks


def _group(cbs) -> CallbackGroup:
    (group,) = [c for c in cbs if isinstance(c, CallbackGroup)]
    return group


def test_default_config_runs_every_scaling_callback_and_the_divergence_stop(tmp_path, flanders_root):
    cbs = _callbacks(tmp_path, flanders_root)
    assert any(isinstance(c, ModelCheckpoint) for c in cbs) and any(isinstance(c, LearningRateMonitor) for c in cbs)
    assert [type(c) for c in _group(cbs).callbacks] == GROUP
    (stop,) = [c for c in cbs if isinstance(c, DivergenceCallback)]
    assert stop.window == 3 and stop.action == "stop"


def test_scaling_preset_after_the_default_adds_nothing_twice(tmp_path, flanders_root):
    cbs = _callbacks(tmp_path, flanders_root, str(REPO / "callbacks" / "scaling.yaml"))
    assert [type(c) for c in _group(cbs).callbacks] == GROUP
    assert sum(isinstance(c, DivergenceCallback) for c in cbs) == 1


def test_a_single_preset_replaces_the_group_members_settings(tmp_path, flanders_root):
    preset = tmp_path / "skip.yaml"
    preset.write_text("trainer:\n  callbacks+:\n    - class_path: cropscale.callbacks.NonFiniteCallback\n"
                      "      init_args:\n        policy: skip\n        max_records: 7\n")
    cbs = _callbacks(tmp_path, flanders_root, str(preset), str(REPO / "callbacks" / "memory.yaml"))
    members = _group(cbs).callbacks
    assert [type(c) for c in members] == GROUP  # no second NonFiniteCallback or MemoryCallback anywhere
    assert sum(isinstance(c, (NonFiniteCallback, MemoryCallback)) for c in cbs) == 0
    nonfinite = members[GROUP.index(NonFiniteCallback)]
    assert (nonfinite.policy, nonfinite.max_records) == ("skip", 7)


def test_merge_callbacks_on_plain_entries():
    group = {"class_path": "cropscale.callbacks.CallbackGroup", "init_args": {"callbacks": [
        {"class_path": "cropscale.callbacks.MemoryCallback"},
        {"class_path": "cropscale.callbacks.ProvenanceCallback"}]}}
    ckpt = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint"}
    later_group = {"class_path": "cropscale.callbacks.CallbackGroup", "init_args": {"callbacks": [
        {"class_path": "cropscale.callbacks.GradNormCallback"}]}}
    memory = {"class_path": "cropscale.callbacks.MemoryCallback", "init_args": {"x": 1}}
    entries, notes = merge_callbacks([ckpt, group, dict(ckpt), later_group, memory])
    assert entries == [ckpt, group]
    assert [m["class_path"].rsplit(".", 1)[1] for m in group["init_args"]["callbacks"]] == [
        "MemoryCallback", "GradNormCallback", "ProvenanceCallback"]  # provenance stays last
    assert group["init_args"]["callbacks"][0] == memory
    assert notes == [
        "lightning.pytorch.callbacks.ModelCheckpoint is configured twice: kept once",
        "cropscale.callbacks.GradNormCallback of a later CallbackGroup: added to the group",
        "cropscale.callbacks.MemoryCallback is already in the CallbackGroup: its later settings replace the group"
        " member's",
    ]


def test_report_command_names_make_report_beside_the_makefile(tmp_path, monkeypatch):
    trainer = SimpleNamespace(logger=SimpleNamespace(save_dir=str(tmp_path / "runs")), default_root_dir=None)
    monkeypatch.chdir(tmp_path)
    assert report_command(trainer) == "python -m cropscale report runs --output reports"
    (tmp_path / "Makefile").write_text("report:\n")
    assert report_command(trainer) == "make report   (= python -m cropscale report runs --output reports)"
    other = SimpleNamespace(logger=SimpleNamespace(save_dir=str(tmp_path / "elsewhere")), default_root_dir=None)
    assert report_command(other) == "python -m cropscale report elsewhere --output reports"
