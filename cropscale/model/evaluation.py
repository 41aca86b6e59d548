"""The task's evaluation arithmetic: placeholders dropped, ``val/loss`` from element-weighted terms, score keys.

Framework-free helpers of :class:`~cropscale.model.task.CropMappingTask`'s validation, test and predict steps;
the task keeps the metric objects and does the logging.
"""

from __future__ import annotations

import torch

from cropscale.batch import PLACEHOLDER_PATCH_ID


def without_placeholders(batch: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor], keep_empty: bool = False,
                         ) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None]:
    """Drop the evaluation placeholders (``patch_id == -1``, :mod:`cropscale.batch`) from a batch and its outputs.

    The placeholders have been run through the network (every rank runs the same steps); they must not
    reach a metric, a loss or a prediction.

    Args:
        batch: a batch of ``B`` samples (``patch_id`` ``[B]``).
        outputs: network outputs whose first dimension is ``B``.
        keep_empty: return empty ``[0, ...]`` tensors when every sample is a placeholder (for predictions)
            instead of ``(None, None)``.

    Returns:
        ``(batch, outputs)`` restricted to the real samples (the same objects when there is no
        placeholder), or ``(None, None)`` when none is real and ``keep_empty`` is False.
    """
    keep = batch["patch_id"] != PLACEHOLDER_PATCH_ID
    if bool(keep.all()):
        return batch, outputs
    if not keep_empty and not bool(keep.any()):
        return None, None
    b = keep.shape[0]
    real = {k: v[keep] if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == b else v
            for k, v in batch.items()}
    return real, {k: v[keep] for k, v in outputs.items()}


def loss_term_counts(batch: dict[str, torch.Tensor], ignore_index: int | None) -> dict[str, torch.Tensor]:
    """The elements each loss term of ``batch`` averages over (0-d float tensors, no host read).

    ``semantic``: pixels whose class is not ``ignore_index``; ``parcel`` / ``hr``: samples whose target is
    present (see :class:`~cropscale.model.losses.MultiTaskLoss`).
    """
    labelled = batch["semantic"] != (-100 if ignore_index is None else int(ignore_index))
    return {"semantic": labelled.sum().float(), "parcel": batch["parcel_present"].sum().float(),
            "hr": batch["hr_present"].sum().float()}


def weighted_term_mean(weights: dict[str, float], totals: dict[str, torch.Tensor],
                       device: torch.device) -> torch.Tensor:
    """``sum_t weight_t * sum_t / n_t`` over the loss terms ``t``; a term without elements counts 0, as in the loss.

    Args:
        weights: ``{term: weight}`` of the multi-task loss.
        totals: 0-d tensors ``<term>_sum`` (the term's batch values times their element counts) and ``<term>_n``
            (the counts), each summed over the batches (and ranks).
        device: where the 0-d result lives.
    """
    total = torch.zeros((), device=device)
    for name, weight in weights.items():
        value, count = totals[f"{name}_sum"].to(device), totals[f"{name}_n"].to(device)
        total = total + weight * torch.where(count > 0, value / count.clamp(min=1), torch.zeros_like(value))
    return total


def class_iou_keys(names: list[str], iou_per_class: list[float], support: torch.Tensor) -> dict[str, float]:
    """``{"val_class/IoU_<i>_<name>": IoU}`` of the classes present in the validation labels (``support > 0``).

    ``<name>`` keeps letters and digits of the class name, other characters as ``_``, 40 characters at most.
    """
    return {f"val_class/IoU_{idx}_{_slug(names[idx])}": iou
            for idx, iou in enumerate(iou_per_class) if support[idx] > 0}


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name).strip("_")[:40]
