"""Whether the optimizer steps of a fit changed the weights (``run.json["summary"]["trained"]``).

A run whose every optimizer step is skipped (a GradScaler that finds non-finite gradients at every step)
or whose updates are all zero ends with the weights it started with, and every other figure then
describes a model that did not train. :class:`TrainedCallback` copies the parameters at the start of the
training loop and compares them with ``torch.equal`` at its end; the verdict itself is
:func:`cropscale.runs.rules.trained` (skipped-step share and weight change), applied by
:class:`~cropscale.callbacks.ProvenanceCallback` (``run.json`` status ``not-trained``), by the end-of-fit
summary (its first line) and by ``python -m cropscale fit`` (exit status 1).

It also records whether the final weights are finite (``weights_finite``, ``nonfinite_parameters``: tensors holding
a NaN or inf, summed over ranks with one all-reduce at ``on_train_end``, so every rank reaches the same verdict
even when one rank's weights alone went non-finite): a run that ends with non-finite weights is ``diverged``
(:func:`cropscale.runs.validity.validity`).

Cost: one copy of the parameters (host memory, ``4 x parameters`` bytes in fp32) at ``on_train_start`` and
one comparison and one finiteness check at ``on_train_end``; nothing per step.
"""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from cropscale.callbacks.base import ScalingCallback
from cropscale.checkpointing import nonfinite_parameters
from cropscale.runs.schema import TrainedSummary

__all__ = ["TrainedCallback"]


class TrainedCallback(ScalingCallback):
    """Records whether the weights changed between ``on_train_start`` and ``on_train_end`` on any rank, and are finite.

    No arguments.

    Example::

        from lightning.pytorch import Trainer
        from cropscale.callbacks import ProvenanceCallback, TrainedCallback

        trainer = Trainer(callbacks=[TrainedCallback(), ProvenanceCallback()])  # run.json summary.trained

        # command line (configs/default.yaml's CallbackGroup has it; another configuration gets it added):
        #   python -m cropscale fit --trainer.callbacks+=cropscale.callbacks.TrainedCallback
    """

    summary_key = "trained"

    def __init__(self) -> None:
        self._start: dict[str, torch.Tensor] = {}
        self._start_step = 0
        self.result = TrainedSummary()

    @override
    def wants_hook(self, hook: str) -> bool:
        return False  # no per-step hook

    @override
    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer) -> None:
        return None

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start = {n: p.detach().to("cpu", copy=True) for n, p in pl_module.named_parameters()}
        self._start_step = int(trainer.global_step)

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        changed = sum(1 for n, p in pl_module.named_parameters()
                      if n in self._start and not torch.equal(p.detach().cpu(), self._start[n]))
        if trainer.world_size > 1:  # a sharded model changes on some rank only: count over ranks
            total = trainer.strategy.reduce(torch.tensor(float(changed), device=pl_module.device), reduce_op="sum")
            changed = int(total.item())
        nonfinite, _ = nonfinite_parameters(trainer, pl_module)
        self.result = TrainedSummary(weights_changed=changed > 0, parameters_changed=changed,
                                     parameters=len(self._start),
                                     optimizer_steps=int(trainer.global_step) - self._start_step,
                                     weights_finite=nonfinite == 0, nonfinite_parameters=nonfinite)
        self._start = {}

    @override
    def summary(self) -> TrainedSummary:
        return self.result
