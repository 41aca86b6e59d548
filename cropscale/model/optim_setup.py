"""The task's optimiser, LR schedule and gradient clipping, set up from the Trainer's facts.

:mod:`cropscale.model.optim` holds the arithmetic (global batch, LR rules, warm-up, optimisers) on plain
numbers; this module reads what it needs from the running Trainer (world size, accumulation, the training
loader's batches, device, precision, clipping) for :meth:`CropMappingTask.configure_optimizers
<cropscale.model.task.CropMappingTask.configure_optimizers>` and its gradient clipping.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from torch.optim.lr_scheduler import LambdaLR

from cropscale.model.optim import (
    build_optimizer,
    formed_global_batch,
    scale_learning_rate,
    schedule_lambda,
    warmup_steps_of,
)
from cropscale.model.speed import choose_fused


@dataclass(frozen=True)
class OptimizerSetup:
    """What :func:`configure_optimization` chose for this run."""

    global_batch: int
    """local batch x world size x accumulation (samples per optimiser update)."""
    lr_effective: float
    """``model.lr`` after the LR scaling rule."""
    fused: tuple[bool, str]
    """fused AdamW used, and why (:func:`~cropscale.model.speed.choose_fused`)."""
    config: Any
    """what ``configure_optimizers`` returns: the optimiser, or ``{"optimizer", "lr_scheduler"}``."""


def configure_optimization(trainer: Trainer, named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
                           hp: Any) -> OptimizerSetup:
    """The optimiser and, with warm-up or a schedule, the per-update LR scheduler of the task's ``hp``; printed.

    Args:
        trainer: the running Trainer (its datamodule's ``batch_size`` is the local batch).
        named_parameters: the task's ``named_parameters()``.
        hp: the task's hyperparameters (``lr``, ``lr_scaling``, ``reference_batch_size``, ``optimizer``, ...).

    Raises:
        CropScaleError: the batch or the accumulation window does not form (:func:`formed_global_batch_of`).
    """
    dm = getattr(trainer, "datamodule", None)
    local = int(getattr(dm, "batch_size", 1))
    global_batch = formed_global_batch_of(trainer, local)
    lr = scale_learning_rate(hp.lr, global_batch, hp.reference_batch_size, hp.lr_scaling)
    fused = fused_adamw_choice(trainer, hp.optimizer, hp.get("fused_optimizer"))
    optimizer = build_optimizer(named_parameters, hp.optimizer, lr, hp.weight_decay, hp.momentum,
                                hp.trust_coefficient, fused=fused[0])
    total = per_epoch = None
    if hp.warmup_steps > 0 or hp.warmup_epochs > 0 or hp.schedule != "constant":
        total = int(trainer.estimated_stepping_batches)  # loads the training data: batches known after
        batches = trainer.num_training_batches
        per_epoch = math.ceil(batches / trainer.accumulate_grad_batches) if math.isfinite(batches) else None
    warmup = warmup_steps_of(hp.warmup_steps, hp.warmup_epochs, per_epoch)
    rank_zero_info(
        f"cropscale: global batch {global_batch} = local {local} x world size {trainer.world_size}"
        f" x accumulation {trainer.accumulate_grad_batches}; LR rule {hp.lr_scaling!r} vs reference"
        f" {hp.reference_batch_size}: lr {hp.lr:g} -> {lr:g}; optimizer {hp.optimizer!r}"
        f"{' (fused)' if fused[0] else ''}; warm-up {warmup} update(s), then {hp.schedule}"
    )
    config: Any = optimizer
    if total is not None and (warmup > 0 or hp.schedule != "constant"):
        scheduler = LambdaLR(optimizer, schedule_lambda(warmup, total, hp.schedule))
        config = {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
    return OptimizerSetup(global_batch=global_batch, lr_effective=lr, fused=fused, config=config)


def fused_adamw_choice(trainer: Trainer, optimizer: str, requested: bool | None) -> tuple[bool, str]:
    """``model.fused_optimizer`` resolved for this run's device, precision and clipping (AdamW only).

    Returns:
        ``(fused, why)`` (:func:`~cropscale.model.speed.choose_fused`).
    """
    if optimizer != "adamw":
        return False, f"optimizer {optimizer!r} has no fused variant here"
    return choose_fused(requested, trainer.strategy.root_device.type, str(trainer.precision),
                        bool(trainer.gradient_clip_val))


def formed_global_batch_of(trainer: Trainer, local: int) -> int:
    """``local x world size x accumulation``, checked against the batches this epoch really forms.

    Reads the training loader Lightning builds for this rank (built here as
    ``trainer.estimated_stepping_batches`` does, and reused by the fit loop): the samples its sampler
    draws and ``trainer.num_training_batches`` (after ``limit_train_batches``).

    Raises:
        CropScaleError: the batch or the accumulation window does not form
            (:func:`~cropscale.model.optim.formed_global_batch`).
    """
    samples = batches = None
    try:
        if trainer.train_dataloader is None:
            trainer.fit_loop.setup_data()
        loader = trainer.train_dataloader
        sampler = getattr(loader, "sampler", None)
        samples = len(sampler) if sampler is not None else None
        batches = trainer.num_training_batches
    except (TypeError, AttributeError):  # an iterable loader without a length: nothing to check
        pass
    finite = isinstance(batches, int) or (isinstance(batches, float) and batches != float("inf"))
    return formed_global_batch(local, trainer.world_size, trainer.accumulate_grad_batches,
                               samples_per_rank=samples, batches_per_epoch=int(batches) if finite else None)


def clip_gradients_by_norm(module: LightningModule, optimizer: Any, gradient_clip_val: float | None = None,
                           gradient_clip_algorithm: str | None = None) -> None:
    """Clip gradients by global norm; under FSDP through the root module's ``clip_grad_norm_``.

    FSDP's ``clip_grad_norm_`` reduces the norm over all shards; it is used because Lightning's FSDP precision
    plugin refuses norm clipping. Elsewhere: Lightning's ``module.clip_gradients``.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    root = getattr(module.trainer.strategy, "model", None)
    if (isinstance(root, FullyShardedDataParallel) and gradient_clip_val
            and gradient_clip_algorithm in (None, "norm")):
        root.clip_grad_norm_(float(gradient_clip_val))
        return
    module.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
