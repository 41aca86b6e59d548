"""Batch inspection for the callbacks: sample count and sample ids of a batch.

Works on a cropscale batch (:mod:`cropscale.batch`) and, for the sample count, on any dict / list /
tuple batch of another Lightning project. Nothing here reads device values except
:func:`ids_to_lists`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch


def batch_size(batch: Any) -> int | None:
    """Number of samples in ``batch``.

    ``batch["s2"].shape[0]`` for a cropscale batch (see :mod:`cropscale.batch`); otherwise the first
    dimension of the first tensor found in a dict / list / tuple batch, so that the callbacks work in
    any Lightning project. ``None`` when no tensor with a dimension is found.
    """
    if type(batch) is dict:  # the per-step path of a cropscale batch: no ABC check
        s2 = batch.get("s2")
        if type(s2) is torch.Tensor and s2.dim() > 0:
            return s2.shape[0]
    if isinstance(batch, Mapping):
        s2 = batch.get("s2")
        if isinstance(s2, torch.Tensor) and s2.dim() > 0:
            return int(s2.shape[0])
        values: Iterable[Any] = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    elif isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    else:
        return None
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.dim() > 0:
                return int(value.shape[0])
        elif isinstance(value, (Mapping, list, tuple)):
            n = batch_size(value)
            if n is not None:
                return n
    return None


def id_tensors(batch: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """References to ``batch["patch_id"]`` (``[B]``) and ``batch["crop_yx"]`` (``[B, 2]``), or ``None``.

    No copy and no device read: cheap enough to call every step.
    """
    if type(batch) is dict or isinstance(batch, Mapping):
        pid = batch.get("patch_id")
        yx = batch.get("crop_yx")
        return (pid if isinstance(pid, torch.Tensor) else None, yx if isinstance(yx, torch.Tensor) else None)
    return None, None


def ids_to_lists(patch_id: torch.Tensor | None, crop_yx: torch.Tensor | None) -> dict[str, Any]:
    """Sample ids as JSON-ready lists (reads device values: call on a rare path only)."""
    out: dict[str, Any] = {}
    if patch_id is not None:
        out["patch_id"] = [int(v) for v in patch_id.detach().reshape(-1).cpu().tolist()]
    if crop_yx is not None:
        out["crop_yx"] = [[int(a) for a in row] for row in crop_yx.detach().reshape(-1, 2).cpu().tolist()]
    return out


def float_tensors(batch: Any, prefix: str = "") -> tuple[list[str], list[torch.Tensor]]:
    """The floating-point tensors of ``batch`` and their keys (no copy, no device read).

    A dict batch gives its keys (nested dicts as ``outer.inner``), a list or tuple its indices, a bare tensor
    ``"batch"``. For a cropscale batch: ``s2``, ``s1a``, ``s1d``, ``parcel``, ``hr`` (the model inputs and the
    floating-point targets, see :mod:`cropscale.batch`).
    """
    keys: list[str] = []
    tensors: list[torch.Tensor] = []
    if isinstance(batch, torch.Tensor):
        if batch.is_floating_point():
            keys.append(prefix or "batch")
            tensors.append(batch)
        return keys, tensors
    if isinstance(batch, Mapping):
        items: Iterable[tuple[Any, Any]] = batch.items()
    elif isinstance(batch, (list, tuple)):
        items = enumerate(batch)
    else:
        return keys, tensors
    for key, value in items:
        k, t = float_tensors(value, f"{prefix}.{key}" if prefix else str(key))
        keys += k
        tensors += t
    return keys, tensors
