"""The precision decision made once (:func:`cropscale.callbacks.provenance.precision_decision`), against what real
Lightning Trainers run: ``16-mixed`` on CPU runs as ``bf16-mixed`` (Lightning's own fallback, read here from the
Trainer), a MixedPrecision plugin runs its own precision, nothing configured runs ``32-true``."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.plugins import MixedPrecision

from cropscale.callbacks.provenance import precision_decision
from cropscale.errors import CropScaleError
from cropscale.precision import (
    BY_CONFIGURATION,
    BY_CPU_FALLBACK,
    BY_DEFAULT,
    BY_LIGHTNING,
    BY_PLUGIN,
    NOT_RECORDED,
    PrecisionDecision,
    decide,
)
from cropscale.runs.schema import RunJson

PLUGIN = {"class_path": "lightning.pytorch.plugins.MixedPrecision",
          "init_args": {"precision": "16-mixed", "device": "cpu", "scaler": {"class_path": "torch.amp.GradScaler"}}}


def _trainer(**kwargs) -> Trainer:
    return Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, **kwargs)


@pytest.mark.parametrize(("trainer_kwargs", "config", "expected", "label", "note"), [
    ({"precision": "16-mixed"}, {"trainer": {"precision": "16-mixed"}},
     PrecisionDecision("16-mixed", "bf16-mixed", BY_CPU_FALLBACK), "AMP BF16", "Lightning's CPU fallback ran bf16"),
    ({"precision": 16}, {"trainer": {"precision": 16}},  # Lightning's legacy spelling of 16-mixed
     PrecisionDecision("16-mixed", "bf16-mixed", BY_CPU_FALLBACK), "AMP BF16", "requested 16-mixed"),
    ({"plugins": [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))]},
     {"trainer": {"precision": None, "plugins": [PLUGIN]}},
     PrecisionDecision("16-mixed", "16-mixed", BY_PLUGIN), "AMP FP16", None),
    ({"precision": "bf16-mixed"}, {"trainer": {"precision": "bf16-mixed"}},
     PrecisionDecision("bf16-mixed", "bf16-mixed", BY_CONFIGURATION), "AMP BF16", None),
    ({}, {"trainer": {"max_epochs": 1}}, PrecisionDecision("32-true", "32-true", BY_DEFAULT), "FP32", None),
    ({}, {"model": {"lr": 0.1}},  # a Trainer built in Python: hyper-parameters only, no trainer section
     PrecisionDecision(None, "32-true", NOT_RECORDED), "FP32", None),
])
def test_the_decision_follows_what_lightning_ran(trainer_kwargs, config, expected, label, note):
    trainer = _trainer(**trainer_kwargs)
    decision = precision_decision(trainer, config)
    assert decision == expected
    assert decision.resolved == str(trainer.precision)  # what Lightning runs, never re-derived
    assert decision.label == label and decision.verified
    assert (decision.note is None) if note is None else (note in decision.note)


def test_another_change_is_said_as_such_and_the_record_round_trips():
    changed = decide("16-mixed", BY_CONFIGURATION, "32-true", "cuda")
    assert changed == PrecisionDecision("16-mixed", "32-true", BY_LIGHTNING)
    assert changed.note == "the configuration requested 16-mixed; Lightning ran 32-true"
    run = RunJson(precision="32-true", precision_decision=changed)
    written = run.to_json()
    assert written["precision_decision"] == {"requested": "16-mixed", "resolved": "32-true", "by": "Lightning",
                                             "label": "FP32"}
    assert RunJson.from_json(written).precision_decision == changed
    assert "precision_decision" not in RunJson(precision="32-true").to_json()  # an older file's shape stays


def test_a_precision_decision_that_is_no_object_is_a_malformed_run_json():
    """Read alone or as run.json's field, a decision that is not a JSON object is refused by name (not a traceback)."""
    with pytest.raises(CropScaleError, match="PrecisionDecision: expected a JSON object, got str"):
        PrecisionDecision.from_json("bf16-mixed")
    with pytest.raises(CropScaleError, match="PrecisionDecision: expected a JSON object, got list"):
        RunJson.from_json({"precision_decision": ["32-true"]})
