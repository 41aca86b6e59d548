"""Rank gathers for the callbacks: per-rank figures collected at epoch ends and in ``on_train_end``.

:func:`gather_vectors` and :func:`gather_objects` are collectives under DDP/FSDP (every rank must
call them at the same point); on one process they return the caller's values. Nothing here runs
per step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer

from cropscale.numbers import finite_or_none, percentile


def dist_ready(trainer: Trainer) -> bool:
    """True when ``torch.distributed`` is initialised and the run has more than one process."""
    return (
        trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
    )


def gather_vectors(
    trainer: Trainer, pl_module: LightningModule, values: Sequence[float | None]
) -> list[list[float | None]]:
    """All ranks' ``values`` (same length on every rank), rank-ordered: ``[world_size][len(values)]``.

    A collective under DDP/FSDP (every rank must call it at the same point); a no-op copy on one
    process. ``None`` travels as NaN and comes back as ``None``. Uses ``trainer.strategy.all_gather``
    on the module's device, so it works with gloo (CPU) and NCCL (CUDA).
    """
    vec = [math.nan if v is None else float(v) for v in values]
    if not dist_ready(trainer):
        return [[finite_or_none(v) for v in vec]]
    t = torch.tensor(vec, dtype=torch.float64, device=pl_module.device)
    g = trainer.strategy.all_gather(t)
    rows = g.reshape(trainer.world_size, len(vec)).cpu().tolist()
    return [[finite_or_none(v) for v in row] for row in rows]


def gather_named(
    trainer: Trainer, pl_module: LightningModule, values: Mapping[str, float | None]
) -> list[dict[str, float | None]]:
    """All ranks' named ``values`` (the same names on every rank), rank-ordered: ``[world_size]{name: value}``.

    :func:`gather_vectors` over the values in ``values``' order, read back by name: the vector is only the
    collective's wire format. A collective, as :func:`gather_vectors`.
    """
    names = list(values)
    return [dict(zip(names, row, strict=True)) for row in gather_vectors(trainer, pl_module, list(values.values()))]


def gather_objects(trainer: Trainer, obj: Any) -> list[Any]:
    """All ranks' picklable ``obj`` (``torch.distributed.all_gather_object``); ``[obj]`` on one process.

    A collective: call it on every rank at the same point.
    """
    if not dist_ready(trainer):
        return [obj]
    out: list[Any] = [None] * trainer.world_size
    torch.distributed.all_gather_object(out, obj)
    return out


def rank_stats(per_rank: Sequence[float | None]) -> dict[str, Any]:
    """Max, median and the slowest (largest-value) rank of a per-rank figure.

    Returns:
        ``{"per_rank": [...], "max", "median", "slowest_rank"}``; ``None`` figures are left out of
        the statistics (all ``None`` when no rank has a value). The median is
        :func:`cropscale.numbers.percentile` at 50.
    """
    vals = [(r, v) for r, v in enumerate(per_rank) if v is not None]
    if not vals:
        return {"per_rank": list(per_rank), "max": None, "median": None, "slowest_rank": None}
    slowest_rank, vmax = max(vals, key=lambda rv: rv[1])
    return {
        "per_rank": list(per_rank),
        "max": vmax,
        "median": percentile([v for _, v in vals], 50.0),
        "slowest_rank": slowest_rank,
    }
