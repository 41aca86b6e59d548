"""Batch-size arithmetic, learning-rate scaling rules and the warm-up schedule.

Sources: linear scaling with gradual warm-up (Goyal et al., "Accurate, Large Minibatch SGD", 2017);
square-root scaling for Adam-type optimisers (Malladi et al., "On the SDEs and Scaling Rules for
Adaptive Gradient Algorithms", NeurIPS 2022).
"""

from __future__ import annotations

import math
from typing import Literal

from cropscale.errors import CropScaleError

LRScaling = Literal["none", "linear", "sqrt"]


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

    ``none``: ``base_lr``; ``linear``: ``base_lr * k``; ``sqrt``: ``base_lr * sqrt(k)``, with
    ``k = global_batch / reference_batch``.

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

    Linear warm-up from ``1 / (warmup_steps + 1)`` to 1 over ``warmup_steps`` steps, then constant or
    a cosine decay to 0 at ``total_steps``.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    if schedule == "cosine" and total_steps:
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0
