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
