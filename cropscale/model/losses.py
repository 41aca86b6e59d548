"""The weighted multi-task loss of the crop-mapping network.

With ``B`` samples, the 10 m grid ``Omega`` (``H x W`` pixels) and the high grid ``Omega_hr``
(``10H x 10W``)::

    L = w_sem * L_sem + w_parcel * L_parcel + w_hr * L_hr

    L_sem    = sum_{b, p in V} CE(z_bp, y_bp) / max(|V|, 1)
               V = pixels whose class is not ``ignore_index`` (all pixels when it is None)
    L_parcel = sum_{b in P} l_b / max(|P|, 1),   P = samples with ``parcel_present``
               l_b = mean_p [ BCE(e_bp, E_bp) + BCE(c_bp, K_bp) + |sigmoid(d_bp) - D_bp| ]
               e, c, d = parcel logits (extent, boundary, distance); E, K in {0, 1}, D in [0, 1]
               (ResUNet-a target set, Diakogiannis et al., ISPRS J. 2020; BCE with logits; L1 on
               the distance)
    L_hr     = sum_{b in Q} mean_{p in Omega_hr, rgb} |x_hat_bp - x_bp| / max(|Q|, 1),
               Q = samples with ``hr_present``

A term whose targets are all absent (or all ignored) is exactly 0 and still depends on the network
outputs (``torch.where`` / a zero-count sum), so the autograd graph reaches every head and DDP sees
every parameter used. Terms are computed in float32 whatever the autocast dtype of the outputs.
No host synchronisation happens in :meth:`MultiTaskLoss.forward`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cropscale.errors import CropScaleError

__all__ = ["MultiTaskLoss"]


def _need(mapping: dict, key: str, where: str) -> Tensor:
    if key not in mapping:
        raise CropScaleError(f"MultiTaskLoss: the {where} has no '{key}' entry (keys: {sorted(mapping)})")
    return mapping[key]


def _masked_mean(per_sample: Tensor, present: Tensor) -> Tensor:
    """Mean of ``per_sample [B]`` over samples where ``present [B]`` is True; 0 when none is."""
    present = present.to(device=per_sample.device, dtype=torch.bool)
    kept = torch.where(present, per_sample, torch.zeros_like(per_sample))
    return kept.sum() / present.sum().clamp(min=1)


class MultiTaskLoss(nn.Module):
    """Weighted sum of the semantic, parcel and high-grid terms (formulas in the module docstring).

    Args:
        semantic_weight: ``w_sem``.
        parcel_weight: ``w_parcel``.
        hr_weight: ``w_hr``.
        ignore_index: semantic class id excluded from the cross-entropy (e.g. PASTIS void 19), or None.

    ``forward(outputs, batch)`` takes the network outputs (``semantic [B, C, H, W]``,
    ``parcel [B, 3, H, W]``, ``hr [B, 3, sH, sW]``) and a batch of :mod:`cropscale.batch`
    (``semantic``, ``parcel``, ``parcel_present``, ``hr``, ``hr_present``) and returns
    ``(total, {"semantic": L_sem, "parcel": L_parcel, "hr": L_hr})``: scalar float32 tensors, the
    terms unweighted and not detached.

    Raises:
        CropScaleError: a negative weight, a missing key, or output and target shapes that differ.
    """

    def __init__(self, semantic_weight: float = 1.0, parcel_weight: float = 1.0, hr_weight: float = 1.0,
                 ignore_index: int | None = None) -> None:
        super().__init__()
        for name, v in [("semantic_weight", semantic_weight), ("parcel_weight", parcel_weight),
                        ("hr_weight", hr_weight)]:
            if not v >= 0:
                raise CropScaleError(f"MultiTaskLoss: {name} must be >= 0, got {v}")
        self.semantic_weight = float(semantic_weight)
        self.parcel_weight = float(parcel_weight)
        self.hr_weight = float(hr_weight)
        self.ignore_index = ignore_index

    def semantic_loss(self, logits: Tensor, target: Tensor) -> Tensor:
        """``logits [B, C, H, W]``, ``target [B, H, W]`` int64 -> mean CE over non-ignored pixels."""
        if logits.dim() != 4 or tuple(target.shape) != (logits.shape[0], *logits.shape[2:]):
            raise CropScaleError(f"MultiTaskLoss: semantic logits {list(logits.shape)} do not match the "
                                 f"target {list(target.shape)} (expected [B, C, H, W] and [B, H, W])")
        target = target.long()
        ignore = -100 if self.ignore_index is None else int(self.ignore_index)
        total = F.cross_entropy(logits.float(), target, ignore_index=ignore, reduction="sum")
        return total / (target != ignore).sum().clamp(min=1)

    @staticmethod
    def parcel_loss(logits: Tensor, target: Tensor, present: Tensor) -> Tensor:
        """``logits``, ``target [B, 3, H, W]`` (extent, boundary, distance), ``present [B]`` bool."""
        if logits.shape != target.shape or logits.dim() != 4 or logits.shape[1] != 3:
            raise CropScaleError(f"MultiTaskLoss: parcel output {list(logits.shape)} and target "
                                 f"{list(target.shape)} must both be [B, 3, H, W] (extent, boundary, distance)")
        z = logits.float()
        t = target.float()
        bce = F.binary_cross_entropy_with_logits(z[:, :2], t[:, :2], reduction="none").mean(dim=(2, 3))
        dist = (torch.sigmoid(z[:, 2]) - t[:, 2]).abs().mean(dim=(1, 2))
        return _masked_mean(bce.sum(dim=1) + dist, present)

    @staticmethod
    def hr_loss(pred: Tensor, target: Tensor, present: Tensor) -> Tensor:
        """``pred``, ``target [B, 3, sH, sW]`` RGB in [0, 1], ``present [B]`` bool -> masked mean L1."""
        if pred.shape != target.shape:
            raise CropScaleError(f"MultiTaskLoss: hr output {list(pred.shape)} does not match the hr target "
                                 f"{list(target.shape)}")
        per_sample = (pred.float() - target.float()).abs().flatten(1).mean(dim=1)
        return _masked_mean(per_sample, present)

    def forward(self, outputs: dict[str, Tensor], batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        """Return the weighted total loss and the unweighted terms of ``outputs`` against ``batch``.

        Args:
            outputs: network outputs ``semantic [B, C, H, W]``, ``parcel [B, 3, H, W]``, ``hr [B, 3, sH, sW]``.
            batch: a :mod:`cropscale.batch` batch with ``semantic``, ``parcel``, ``parcel_present``, ``hr``
                and ``hr_present``.

        Returns:
            ``(total, {"semantic": L_sem, "parcel": L_parcel, "hr": L_hr})``: scalar float32 tensors, the
            terms unweighted and not detached.

        Raises:
            CropScaleError: a missing key, or output and target shapes that differ.
        """
        sem = self.semantic_loss(_need(outputs, "semantic", "outputs"), _need(batch, "semantic", "batch"))
        par = self.parcel_loss(_need(outputs, "parcel", "outputs"), _need(batch, "parcel", "batch"),
                               _need(batch, "parcel_present", "batch"))
        hr = self.hr_loss(_need(outputs, "hr", "outputs"), _need(batch, "hr", "batch"),
                          _need(batch, "hr_present", "batch"))
        total = self.semantic_weight * sem + self.parcel_weight * par + self.hr_weight * hr
        return total, {"semantic": sem, "parcel": par, "hr": hr}
