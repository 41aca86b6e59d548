"""Optimisers, batch-size arithmetic, learning-rate scaling rules and the warm-up schedule.

Optimisers (``model.optimizer``), built by :func:`build_optimizer`:

- ``adamw`` (default): ``torch.optim.AdamW``, one parameter group, weight decay on every parameter.
- ``sgd``: ``torch.optim.SGD`` with momentum, one parameter group, weight decay on every parameter.
- ``lars``: layer-wise adaptive rate scaling (You et al., "Large Batch Training of Convolutional
  Networks", 2017), ``pytorch_optimizer.LARS``: SGD with momentum whose step of each weight tensor is
  scaled by the trust ratio ``eta ||w|| / (||g|| + wd ||w||)``.
- ``lamb``: layer-wise adaptive moments (You et al., "Large Batch Optimization for Deep Learning:
  Training BERT in 76 minutes", ICLR 2020), ``pytorch_optimizer.Lamb``: an Adam update with decoupled
  weight decay, scaled per tensor by the trust ratio ``min(||w||, 10) / ||update||``.

Trust-ratio exclusions of LARS and LAMB (:func:`parameter_groups`): norm and bias parameters are not
adapted layer-wise and not weight-decayed, as in both papers. The rule is the one
``pytorch_optimizer.LARS`` applies itself: every parameter tensor with ``ndim <= 1`` is excluded. In
:class:`~cropscale.model.network.CropMappingNet` that is every bias, every GroupNorm / LayerNorm
weight and bias, and the five learned 1-D embeddings (``s1a_missing``, ``s1d_missing`` and the
``token`` of each encoder): 87 of 130 tensors, 6,608 of 1,947,936 parameters for 10 classes. They form
the group named ``excluded`` (weight decay 0; for LAMB also ``adam=True``, i.e. trust ratio 1); the
weight matrices and convolution kernels form the group ``adapted``.

LR rules relative to a reference global batch (:func:`scale_learning_rate`): linear scaling with gradual
warm-up (Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017); square-root
scaling for Adam-type optimisers (Malladi et al., "On the SDEs and Scaling Rules for Adaptive Gradient
Algorithms", NeurIPS 2022). Large-batch training of remote-sensing models with these rules and LARS /
LAMB: Sedona, Cavallaro et al., IGARSS 2020 (``docs/study.md``).

Set-up from the running Trainer (:func:`configure_optimization`): the world size, accumulation, the training
loader's batches, device, precision and clipping, for :meth:`CropMappingTask.configure_optimizers
<cropscale.model.task.CropMappingTask.configure_optimizers>` and its gradient clipping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from pytorch_optimizer import LARS, Lamb
from torch.optim.lr_scheduler import LambdaLR

from cropscale.errors import CropScaleError
from cropscale.model.speed import choose_fused

LRScaling = Literal["none", "linear", "sqrt"]
OptimizerName = Literal["adamw", "sgd", "lars", "lamb"]
OPTIMIZERS: tuple[str, ...] = ("adamw", "sgd", "lars", "lamb")
"""The optimisers ``model.optimizer`` accepts."""
LAYERWISE: tuple[str, ...] = ("lars", "lamb")
"""The layer-wise adaptive optimisers (trust ratio per tensor, with exclusions)."""
Schedule = Literal["constant", "cosine"]


def global_batch_size(local_batch: int, world_size: int, accumulation: int = 1) -> int:
    """Samples per optimiser update: ``local_batch x world_size x accumulation``.

    Raises:
        CropScaleError: if any factor is < 1.
    """
    for name, value in (("local batch", local_batch), ("world size", world_size), ("accumulation", accumulation)):
        if int(value) < 1:
            raise CropScaleError(f"{name} must be >= 1, got {value}")
    return int(local_batch) * int(world_size) * int(accumulation)


def formed_global_batch(local_batch: int, world_size: int, accumulation: int = 1, *,
                        samples_per_rank: int | None = None, batches_per_epoch: int | None = None) -> int:
    """The global batch that really forms: :func:`global_batch_size`, or an error with the numbers.

    With ``drop_last=False`` a rank's batches hold ``local_batch`` samples, the last one possibly fewer; an
    epoch of fewer samples than ``local_batch`` makes every batch smaller, and an accumulation window longer
    than the epoch steps the optimiser at the epoch's end on fewer batches (Lightning). In both cases the
    product ``local x world x accumulation`` is not what an update holds, and an LR rule scaled by it is
    wrong.

    Args:
        local_batch: ``data.batch_size`` (samples per rank per forward pass).
        world_size: ranks.
        accumulation: ``trainer.accumulate_grad_batches``.
        samples_per_rank: training samples each rank draws per epoch (``len`` of its sampler); None = unknown.
        batches_per_epoch: training batches per rank per epoch after ``limit_train_batches``; None = unknown.

    Returns:
        ``local_batch x world_size x accumulation``.

    Raises:
        CropScaleError: a factor < 1, a local batch larger than the samples per rank, or an accumulation
            window longer than the batches per epoch (each message gives the numbers and the batch that
            would form).
    """
    product = global_batch_size(local_batch, world_size, accumulation)
    if samples_per_rank is not None and 0 < samples_per_rank < local_batch:
        formed = samples_per_rank * world_size * accumulation
        raise CropScaleError(
            f"data.batch_size={local_batch} is larger than the {samples_per_rank} training samples per rank and"
            f" epoch (world size {world_size}): every batch would hold {samples_per_rank}, global batch {formed},"
            f" not {product}, and the printed global batch and the LR rule would use {product}; use"
            f" data.batch_size <= {samples_per_rank} or more samples per epoch (data.samples_per_patch)"
        )
    if batches_per_epoch is not None and 0 < batches_per_epoch < accumulation:
        formed = local_batch * world_size * batches_per_epoch
        raise CropScaleError(
            f"trainer.accumulate_grad_batches={accumulation} is longer than the {batches_per_epoch} batches per"
            f" rank and epoch: Lightning steps at the end of the epoch, so every update would hold global batch"
            f" {formed}, not {product}, and the printed global batch and the LR rule would use {product}; use"
            f" accumulate_grad_batches <= {batches_per_epoch} or more batches per epoch"
        )
    return product


def scale_learning_rate(base_lr: float, global_batch: int, reference_batch: int, rule: LRScaling = "none") -> float:
    """Learning rate for ``global_batch`` given ``base_lr`` tuned at ``reference_batch``.

    ``none``: ``base_lr``; ``linear``: ``base_lr * k`` (Goyal et al. 2017); ``sqrt``: ``base_lr * sqrt(k)``
    (Malladi et al., NeurIPS 2022), with ``k = global_batch / reference_batch``.

    Raises:
        CropScaleError: unknown rule or a batch size < 1.
    """
    if global_batch < 1 or reference_batch < 1:
        raise CropScaleError(
            f"batch sizes must be >= 1 (global batch {global_batch}, reference batch {reference_batch})"
        )
    k = global_batch / reference_batch
    if rule == "none":
        return float(base_lr)
    if rule == "linear":
        return float(base_lr) * k
    if rule == "sqrt":
        return float(base_lr) * math.sqrt(k)
    raise CropScaleError(f"model.lr_scaling must be one of none, linear, sqrt; got {rule!r}")


def warmup_factor(step: int, warmup_steps: int, total_steps: int | None = None, schedule: str = "constant") -> float:
    """Multiplier of the learning rate at optimiser step ``step`` (0-based).

    Linear warm-up from ``1 / (warmup_steps + 1)`` to 1 over ``warmup_steps`` steps (Goyal et al. 2017),
    then constant or a cosine decay to 0 at ``total_steps``.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "cosine" and total_steps:
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def warmup_steps_of(warmup_steps: int = 0, warmup_epochs: float = 0.0, updates_per_epoch: int | None = None) -> int:
    """Warm-up length in optimiser updates, from a count of updates or of epochs.

    Args:
        warmup_steps: warm-up in optimiser updates (``model.warmup_steps``).
        warmup_epochs: warm-up in epochs (``model.warmup_epochs``), may be fractional; converted to
            ``ceil(warmup_epochs x updates_per_epoch)`` updates, so that every global batch warms up
            over the same number of samples (Goyal et al. 2017 warm up for 5 epochs at every batch size).
        updates_per_epoch: optimiser updates per epoch (needed with ``warmup_epochs``).

    Returns:
        The warm-up in optimiser updates (0 = none).

    Raises:
        CropScaleError: a negative value, both units given, or epochs without a known update count.
    """
    if warmup_steps < 0 or warmup_epochs < 0:
        raise CropScaleError(
            f"model.warmup_steps ({warmup_steps}) and model.warmup_epochs ({warmup_epochs}) must be >= 0")
    if warmup_steps > 0 and warmup_epochs > 0:
        raise CropScaleError(
            f"give the warm-up in one unit: model.warmup_steps={warmup_steps} and model.warmup_epochs="
            f"{warmup_epochs:g} are both set (set the other to 0)")
    if warmup_epochs == 0:
        return int(warmup_steps)
    if updates_per_epoch is None or updates_per_epoch < 1:
        raise CropScaleError(
            f"model.warmup_epochs={warmup_epochs:g} needs the optimiser updates per epoch, which are unknown here"
            f" ({updates_per_epoch}); give model.warmup_steps instead")
    return math.ceil(warmup_epochs * updates_per_epoch - 1e-9)


def schedule_lambda(warmup_steps: int, total_steps: int, schedule: str) -> Callable[[int], float]:
    """The LR multiplier by optimiser update for ``torch.optim.lr_scheduler.LambdaLR`` (:func:`warmup_factor`)."""
    return lambda step: warmup_factor(step, warmup_steps, total_steps, schedule)


class UpdateAlignedSchedule:
    """``LambdaLR``'s multiplier by the optimizer updates that ran, not by its steps (``model.schedule_by_updates``).

    Lightning steps an ``interval: step`` scheduler after every optimizer step, also after one that a GradScaler
    skipped (Lightning issues #5558, #16228; counted as ``lr_scheduler_steps_on_skipped``): the warm-up and decay then
    run ahead of the updates. This multiplier counts the ``optimizer.step()`` calls that ran (a step post-hook: a
    GradScaler calls ``step()`` only when the gradients are finite, a decision it read on the host already; no
    device read here) and gives :func:`warmup_factor` of that count, whatever LambdaLR's own count. Its attributes
    are plain numbers, so LambdaLR's ``state_dict`` saves the count in the checkpoint and a resume continues it.

    Args:
        optimizer: the optimizer the scheduler drives (the hook is registered on it).
        warmup_steps, total_steps, schedule: as :func:`warmup_factor`.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int | None,
                 schedule: str) -> None:
        self.warmup_steps, self.total_steps, self.schedule = int(warmup_steps), total_steps, str(schedule)
        self.updates = 0
        optimizer.register_step_post_hook(self._count)

    def _count(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.updates += 1

    def __call__(self, scheduler_steps: int) -> float:
        """The multiplier at the current update count (``scheduler_steps``, LambdaLR's count, is not used)."""
        return warmup_factor(self.updates, self.warmup_steps, self.total_steps, self.schedule)


def is_excluded(param: torch.Tensor) -> bool:
    """Whether a parameter is excluded from the trust ratio and weight decay of LARS / LAMB: ``ndim <= 1``.

    Biases, norm scales and shifts and 1-D embeddings; the rule ``pytorch_optimizer.LARS`` applies itself.
    """
    return param.ndim <= 1


def parameter_groups(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]], optimizer: str, weight_decay: float
) -> list[dict]:
    """Parameter groups of ``optimizer``.

    ``adamw`` and ``sgd``: one group of every trainable parameter with ``weight_decay``. ``lars`` and
    ``lamb``: the group ``adapted`` (tensors with ``ndim > 1``, ``weight_decay``) and the group
    ``excluded`` (``ndim <= 1``: biases, norm parameters, 1-D embeddings; weight decay 0; for LAMB
    ``adam=True``, the library's switch to a trust ratio of 1).

    Raises:
        CropScaleError: an unknown optimiser, or no trainable parameter.
    """
    if optimizer not in OPTIMIZERS:
        raise CropScaleError(f"model.optimizer must be one of {', '.join(OPTIMIZERS)}; got {optimizer!r}")
    named = [(n, p) for n, p in named_parameters if p.requires_grad]
    if not named:
        raise CropScaleError("the model has no trainable parameter to optimise")
    if optimizer not in LAYERWISE:
        return [{"params": [p for _, p in named], "weight_decay": weight_decay}]
    adapted = [(n, p) for n, p in named if not is_excluded(p)]
    excluded = [(n, p) for n, p in named if is_excluded(p)]
    groups = []
    if adapted:
        groups.append({"name": "adapted", "params": [p for _, p in adapted], "weight_decay": weight_decay})
    if excluded:
        group = {"name": "excluded", "params": [p for _, p in excluded], "weight_decay": 0.0}
        if optimizer == "lamb":
            group["adam"] = True
        groups.append(group)
    return groups


def build_optimizer(
    named_parameters: Iterable[tuple[str, torch.nn.Parameter]],
    optimizer: str = "adamw",
    lr: float = 1e-3,
    weight_decay: float = 0.01,
    momentum: float = 0.9,
    trust_coefficient: float = 1e-3,
    fused: bool = False,
) -> torch.optim.Optimizer:
    """The optimiser ``optimizer`` over ``named_parameters`` (groups of :func:`parameter_groups`).

    Args:
        named_parameters: ``module.named_parameters()``.
        optimizer: ``adamw | sgd | lars | lamb``.
        lr: learning rate (after the LR rule; warm-up and schedule multiply it).
        weight_decay: weight decay (AdamW, LAMB: decoupled; SGD, LARS: added to the gradient).
        momentum: momentum of SGD and LARS (unused by AdamW and LAMB, whose betas are (0.9, 0.999)).
        trust_coefficient: LARS ``eta`` (You et al. 2017 use 0.001).
        fused: AdamW only: ``torch.optim.AdamW(fused=True)``, one kernel for the whole update (the caller
            checks the device has it: :func:`cropscale.model.speed.choose_fused`).

    Returns:
        A ``torch.optim.Optimizer``: ``AdamW``, ``SGD``, ``pytorch_optimizer.LARS`` or ``pytorch_optimizer.Lamb``.

    Raises:
        CropScaleError: an unknown optimiser or a value out of range (named as ``model.<option>``).
    """
    for key, value, ok, what in (("lr", lr, lr > 0, "> 0"), ("weight_decay", weight_decay, weight_decay >= 0, ">= 0"),
                                 ("momentum", momentum, 0 <= momentum < 1, "in [0, 1)"),
                                 ("trust_coefficient", trust_coefficient, trust_coefficient > 0, "> 0")):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and ok):
            raise CropScaleError(f"model.{key} must be {what}, got {value!r}")
    groups = parameter_groups(named_parameters, optimizer, weight_decay)
    if optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, **({"fused": True} if fused else {}))
    if optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if optimizer == "lars":
        return LARS(groups, lr=lr, weight_decay=weight_decay, momentum=momentum, trust_coefficient=trust_coefficient)
    return Lamb(groups, lr=lr, weight_decay=weight_decay)


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
    fused = fused_adamw_choice(trainer, hp.optimizer, hp.get("fused_optimizer"), hp.get("schedule_by_updates", False))
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
        by_updates = bool(hp.get("schedule_by_updates", False))
        multiplier = (UpdateAlignedSchedule(optimizer, warmup, total, hp.schedule) if by_updates
                      else schedule_lambda(warmup, total, hp.schedule))
        scheduler = LambdaLR(optimizer, multiplier)
        config = {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
    return OptimizerSetup(global_batch=global_batch, lr_effective=lr, fused=fused, config=config)


def fused_adamw_choice(trainer: Trainer, optimizer: str, requested: bool | None,
                       by_updates: bool = False) -> tuple[bool, str]:
    """``model.fused_optimizer`` resolved for this run's device, precision and clipping (AdamW only).

    With ``model.schedule_by_updates`` under a GradScaler (``16-mixed``) AdamW is not fused: the fused kernel skips
    an overflowed step inside its ``step()``, so the host never learns which steps ran
    (:class:`UpdateAlignedSchedule`).

    Returns:
        ``(fused, why)`` (:func:`~cropscale.model.speed.choose_fused`).

    Raises:
        CropScaleError: ``model.fused_optimizer=true`` where it cannot work (that rule included).
    """
    if optimizer != "adamw":
        return False, f"optimizer {optimizer!r} has no fused variant here"
    if by_updates and str(trainer.precision) == "16-mixed":
        why = ("model.schedule_by_updates under 16-mixed: a fused AdamW skips an overflowed step inside its kernel,"
               " where the schedule cannot see it")
        if requested:
            raise CropScaleError(f"model.fused_optimizer=true: {why}; set one of them to false")
        return False, why
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
