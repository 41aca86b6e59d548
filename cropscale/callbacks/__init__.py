"""The scaling callbacks: Lightning callbacks that record how a training run spends its time, energy and numerics.

One concern per module. Each works on its own in any Lightning project; presets for ``--config`` live
in the top-level ``callbacks/`` folder (``callbacks/scaling.yaml``: all of them in one
:class:`CallbackGroup`). ``docs/run_json.md`` documents what they write into ``run.json``.

=================================  ================================  =============================
class                              concern                           TensorBoard prefix
=================================  ================================  =============================
:class:`StepTimingCallback`        step-time decomposition, comm     ``perf/step``, ``perf/epoch``
:class:`ThroughputCallback`        samples/s, latency, TFLOP/s, MFU  ``perf/``
:class:`LossScaleCallback`         AMP GradScaler events             ``amp/``
:class:`NonFiniteCallback`         non-finite losses / gradients     ``numerics/``
:class:`GradNormCallback`          gradient norm, clipping           ``numerics/``
:class:`EnergyCallback`            NVML energy and power             ``energy/``
:class:`MemoryCallback`            GPU peaks, host RSS               ``memory/``
:class:`TrainedCallback`           whether the weights changed,      —
                                   and are finite at the end
:class:`QualityCallback`           every validation's metric         —
:class:`CheckpointTimingCallback`  checkpoint write times            —
:class:`ProvenanceCallback`        ``run.json`` (and its diagnosis)  ``diagnosis`` (text)
=================================  ================================  =============================

:class:`DivergenceCallback` stops a run whose training loss is non-finite at its last optimizer steps (every
step counted, read at log steps) and records the verdict (``summary.divergence``); ``configs/default.yaml`` has it
outside the group. Together with the trained and quality records it decides the run's validity
(:mod:`cropscale.runs.validity`).

:data:`STEP_WINDOWS` names the disjoint windows of a step that :class:`StepTimingCallback` records
(``data_wait, transfer, forward, backward, optimizer, remainder``; they add up to ``step``).
"""

from cropscale.callbacks._windows import STEP_WINDOWS
from cropscale.callbacks.base import ScalingCallback
from cropscale.callbacks.checkpoint_timing import CheckpointTimingCallback
from cropscale.callbacks.divergence import DivergenceCallback
from cropscale.callbacks.energy import EnergyCallback
from cropscale.callbacks.grad_norm import GradNormCallback
from cropscale.callbacks.group import CallbackGroup
from cropscale.callbacks.loss_scale import LossScaleCallback
from cropscale.callbacks.memory import MemoryCallback
from cropscale.callbacks.nonfinite import NonFiniteCallback, NonFiniteError
from cropscale.callbacks.provenance import ProvenanceCallback
from cropscale.callbacks.quality import QualityCallback
from cropscale.callbacks.step_timing import StepTimingCallback
from cropscale.callbacks.throughput import ThroughputCallback
from cropscale.callbacks.trained import TrainedCallback

__all__ = [
    "STEP_WINDOWS",
    "CallbackGroup",
    "CheckpointTimingCallback",
    "DivergenceCallback",
    "EnergyCallback",
    "GradNormCallback",
    "LossScaleCallback",
    "MemoryCallback",
    "NonFiniteCallback",
    "NonFiniteError",
    "ProvenanceCallback",
    "QualityCallback",
    "ScalingCallback",
    "StepTimingCallback",
    "ThroughputCallback",
    "TrainedCallback",
    "all_scaling_callbacks",
]


def all_scaling_callbacks() -> list[ScalingCallback]:
    """One instance of every scaling callback (defaults; the divergence one only judges), provenance last."""
    return [
        StepTimingCallback(), ThroughputCallback(), LossScaleCallback(), NonFiniteCallback(), GradNormCallback(),
        EnergyCallback(), MemoryCallback(), TrainedCallback(), QualityCallback(), CheckpointTimingCallback(),
        DivergenceCallback(action="log"), ProvenanceCallback(),
    ]
