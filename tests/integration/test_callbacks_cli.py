"""The presets in ``callbacks/`` through a tiny LightningCLI: ``callbacks+`` appends to the callbacks of
the configs before it (ModelCheckpoint stays), and a CLI ``fit`` writes the resolved config into run.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from cropscale.callbacks import (
    CallbackGroup,
    CheckpointTimingCallback,
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
from cropscale.testing.toy import ToyTask

PRESETS = Path(__file__).resolve().parents[2] / "callbacks"
SINGLE = {
    "step_timing.yaml": StepTimingCallback,
    "throughput.yaml": ThroughputCallback,
    "loss_scale.yaml": LossScaleCallback,
    "nonfinite.yaml": NonFiniteCallback,
    "grad_norm.yaml": GradNormCallback,
    "energy.yaml": EnergyCallback,
    "memory.yaml": MemoryCallback,
    "provenance.yaml": ProvenanceCallback,
    "checkpoint_timing.yaml": CheckpointTimingCallback,
    "quality.yaml": QualityCallback,
}
DEFAULT = """
trainer:
  accelerator: cpu
  devices: 1
  max_epochs: 1
  log_every_n_steps: 2
  enable_progress_bar: false
  enable_model_summary: false
  num_sanity_val_steps: 0
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger
    init_args: {save_dir: %s, name: cli}
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {save_last: true}
    - class_path: lightning.pytorch.callbacks.LearningRateMonitor
"""

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),  # Lightning 2.6 on torch 2.13
    pytest.mark.filterwarnings("ignore:NonFiniteCallback"),  # the warning the injected NaNs are meant to raise
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
    pytest.mark.filterwarnings("ignore:(?s).*was deprecated in v4.49.0"),  # jsonargparse, via Lightning CLI
    pytest.mark.filterwarnings("ignore:No seed found"),
]


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["cropscale"])  # LightningCLI(args=...) warns about pytest's argv


def cli(tmp_path: Path, *configs: str, run: bool = False) -> LightningCLI:
    default = tmp_path / "default.yaml"
    default.write_text(DEFAULT % tmp_path)
    args = ["--config", str(default)]
    for c in configs:
        args += ["--config", str(PRESETS / c)]
    if run:
        return LightningCLI(ToyTask, args=["fit", *args], save_config_kwargs={"overwrite": True})
    return LightningCLI(ToyTask, run=False, args=args, save_config_kwargs={"overwrite": True})


def test_every_preset_exists():
    assert {p.name for p in PRESETS.glob("*.yaml")} == set(SINGLE) | {"scaling.yaml"}


@pytest.mark.parametrize("name", sorted(SINGLE))
def test_single_preset_appends(tmp_path, name):
    cbs = cli(tmp_path, name).trainer.callbacks
    assert any(isinstance(c, ModelCheckpoint) for c in cbs)
    assert any(isinstance(c, LearningRateMonitor) for c in cbs)
    assert sum(isinstance(c, SINGLE[name]) for c in cbs) == 1


def test_scaling_preset_appends_one_group_of_all(tmp_path):
    cbs = cli(tmp_path, "scaling.yaml").trainer.callbacks
    assert any(isinstance(c, ModelCheckpoint) for c in cbs) and any(isinstance(c, LearningRateMonitor) for c in cbs)
    groups = [c for c in cbs if isinstance(c, CallbackGroup)]
    assert len(groups) == 1
    assert [type(c) for c in groups[0].callbacks] == [
        StepTimingCallback, ThroughputCallback, LossScaleCallback, NonFiniteCallback, GradNormCallback,
        EnergyCallback, MemoryCallback, TrainedCallback, QualityCallback, CheckpointTimingCallback, ProvenanceCallback,
    ]
    assert groups[0].callbacks[0].trace_path == "step_trace.rank{rank}.jsonl"


def test_two_presets_append_in_order(tmp_path):
    cbs = cli(tmp_path, "memory.yaml", "grad_norm.yaml").trainer.callbacks
    kinds = [type(c) for c in cbs if isinstance(c, (MemoryCallback, GradNormCallback))]
    assert kinds == [MemoryCallback, GradNormCallback]


def test_cli_fit_writes_resolved_config_into_run_json(tmp_path):
    c = cli(tmp_path, "scaling.yaml", run=True)
    rec = json.loads(Path(c.trainer.log_dir, "run.json").read_text())
    assert rec["status"] == "finished" and rec["config_source"] == "SaveConfigCallback"
    cfg_callbacks = rec["config"]["trainer"]["callbacks"]
    assert cfg_callbacks[0]["class_path"] == "lightning.pytorch.callbacks.ModelCheckpoint"
    assert cfg_callbacks[-1]["class_path"] == "cropscale.callbacks.CallbackGroup"
    assert (Path(c.trainer.log_dir) / "step_trace.rank0.jsonl").is_file()
