"""Every validation of a fit and its quality metric, in ``run.json`` (``summary.quality``).

The report and the end-of-fit summary read a run's best and final macro IoU, their epochs and the per-epoch
quality from here first (:func:`cropscale.runs.rules.quality`), so that a damaged or missing TensorBoard events
file costs nothing but the charts, and a resumed run keeps the epochs before the resume (the list travels in the
checkpoints: ``ModelCheckpoint`` runs after this callback at each validation end). The count of validations is
the third part of the run's validity (:func:`cropscale.runs.validity.validity`): a fit whose validation was
configured but never ran is ``not-validated``.

Each entry also says whether every parameter was finite on every rank when it ran (summed over ranks,
:func:`~cropscale.checkpointing.nonfinite_parameters`): the score of a non-finite model (a constant prediction) is
never the best.

Cost: at each validation end one read of the logged metric and one finiteness check of the parameters (one
all-reduce under DDP); nothing per step.
"""

from __future__ import annotations

import math
from typing import Literal

from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from cropscale.callbacks.base import EpochRecordsCallback
from cropscale.checkpointing import nonfinite_parameters
from cropscale.errors import CropScaleError
from cropscale.runs.rules import best_and_final
from cropscale.runs.schema import QualityEpoch, QualitySummary

__all__ = ["QualityCallback"]


class QualityCallback(EpochRecordsCallback):
    """Records each validation of ``fit`` (epoch, step, the monitored metric, finite weights) for ``run.json``.

    Args:
        monitor: the logged validation metric (``trainer.callback_metrics`` key).
        mode: ``"max"`` (a larger value is better) or ``"min"``.

    Raises:
        CropScaleError: an unknown ``mode``.

    Example::

        from lightning.pytorch import Trainer
        from cropscale.callbacks import ProvenanceCallback, QualityCallback

        trainer = Trainer(callbacks=[QualityCallback("val/mIoU"), ProvenanceCallback()])  # run.json summary.quality

        # command line (configs/default.yaml's CallbackGroup has it; another configuration gets it added):
        #   python -m cropscale fit --config callbacks/quality.yaml
    """

    record_type = QualityEpoch
    summary_key = "quality"

    def __init__(self, monitor: str = "val/mIoU", mode: Literal["max", "min"] = "max") -> None:
        if mode not in ("max", "min"):
            raise CropScaleError(f"QualityCallback(mode={mode!r}): use 'max' or 'min'")
        self.monitor = monitor
        self.mode = mode
        self.epochs: list[QualityEpoch] = []
        self.configured: bool | None = None

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.configured = bool(trainer.enable_validation)

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        bad, _ = nonfinite_parameters(trainer, pl_module)  # every rank: a collective under DDP
        value = trainer.callback_metrics.get(self.monitor)
        value = float(value) if value is not None else None
        epoch = QualityEpoch(epoch=trainer.current_epoch, global_step=trainer.global_step,
                             value=value if value is not None and math.isfinite(value) else None,
                             weights_finite=bad == 0)
        if self.epochs and (self.epochs[-1].epoch, self.epochs[-1].global_step) == (epoch.epoch, epoch.global_step):
            self.epochs[-1] = epoch  # a resumed run validating the same step again
        else:
            self.epochs.append(epoch)

    @override
    def summary(self) -> QualitySummary:
        best, best_epoch, final, final_epoch = best_and_final(self.epochs, self.mode)
        return QualitySummary(monitor=self.monitor, mode=self.mode, validation_configured=self.configured,
                              validations=len(self.epochs), best=best, best_epoch=best_epoch, final=final,
                              final_epoch=final_epoch, epochs=list(self.epochs))
