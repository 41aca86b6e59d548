"""Synthetic batches that follow the batch contract (:mod:`cropscale.batch`) exactly.

For benchmarks, FLOP counting, Lightning's ``example_input_array`` and tests: every key, shape and
dtype of a real batch, with plausible values (not real data, never reported as such):

- ``s2``: normalised reflectance ~ N(0, 1) per band plus a smooth per-parcel seasonal signal;
  ``s2_doy`` sorted, evenly spread over the year with jitter; ``s2_mask`` per date and pixel, about
  80 % clear, with cloud blobs.
- ``s1a``/``s1d``: normalised VV, VH ~ N(0, 1); ``*_doy`` sorted; ``*_mask`` all True, or (orbit
  disabled) zeros with an all-False mask, as the collate function emits an absent orbit.
- ``semantic``: parcels of 8 x 8 pixels (4 x 4 when the crop is smaller than 16 pixels) with random
  class ids in ``[0, num_classes)``; ``parcel``: extent (class > 0), boundary (a 4-neighbour has
  another parcel or background), distance to the boundary (Euclidean, pixels, divided by the
  per-sample maximum: [0, 1]); ``hr``: a smooth RGB image in [0, 1] on the ``hr_scale`` grid.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import ndimage
from torch import Tensor

from cropscale.batch import HR_SCALE
from cropscale.errors import CropScaleError

__all__ = ["synthetic_batch"]


def _sorted_doy(g: torch.Generator, b: int, t: int) -> Tensor:
    base = torch.linspace(1.0, 366.0, t + 2)[1:-1] if t > 0 else torch.zeros(0)
    jitter = (torch.rand(b, t, generator=g) - 0.5) * (300.0 / max(t, 1))
    doy = (base[None] + jitter).round().clamp(1, 366).to(torch.int64)
    return doy.sort(dim=1).values


def _parcel_targets(ids: np.ndarray, semantic: np.ndarray) -> np.ndarray:
    """``ids [H, W]`` parcel ids, ``semantic [H, W]`` -> ``[3, H, W]`` extent, boundary, distance."""
    extent = semantic > 0
    lab = np.where(extent, ids + 1, 0)
    pad = np.pad(lab, 1, mode="edge")
    h, w = lab.shape
    boundary = np.zeros((h, w), dtype=bool)
    for dy, dx in ((0, 1), (2, 1), (1, 0), (1, 2)):
        boundary |= pad[dy:dy + h, dx:dx + w] != lab
    boundary &= extent
    dist = ndimage.distance_transform_edt(extent & ~boundary).astype(np.float32)
    dist = dist / dist.max() if dist.max() > 0 else dist
    return np.stack([extent.astype(np.float32), boundary.astype(np.float32), dist])


def synthetic_batch(
    batch_size: int = 1,
    t2: int = 16,
    t1: int = 4,
    height: int = 32,
    width: int = 32,
    num_classes: int = 10,
    s1a: bool = True,
    s1d: bool = True,
    device: str | torch.device = "cpu",
    seed: int = 0,
    hr_scale: int = HR_SCALE,
) -> dict[str, Tensor]:
    """A full synthetic batch (inputs, targets and ids) per :mod:`cropscale.batch`.

    Args:
        batch_size: ``B``.
        t2: Sentinel-2 dates ``T2`` (>= 1).
        t1: dates per Sentinel-1 orbit ``T1`` (>= 1).
        height: ``H`` at 10 m (>= 1).
        width: ``W`` at 10 m (>= 1).
        num_classes: classes ``C`` of ``semantic``.
        s1a: False -> the ascending orbit absent for every sample (zeros + all-False mask).
        s1d: False -> the descending orbit absent for every sample (zeros + all-False mask).
        device: where the tensors are put.
        seed: the values are a deterministic function of the arguments and ``seed``.
        hr_scale: high-grid ratio (``hr`` is ``[B, 3, hr_scale*H, hr_scale*W]``).

    Returns:
        ``dict[str, Tensor]`` with every key of the contract (``MODEL_INPUT_KEYS``, ``TARGET_KEYS``,
        ``ID_KEYS``).

    Raises:
        CropScaleError: a non-positive size.
    """
    for name, v in [("batch_size", batch_size), ("t2", t2), ("t1", t1), ("height", height),
                    ("width", width), ("num_classes", num_classes), ("hr_scale", hr_scale)]:
        if int(v) < 1:
            raise CropScaleError(f"synthetic_batch: {name} must be >= 1, got {v}")
    g = torch.Generator().manual_seed(seed)
    b, h, w = batch_size, height, width
    # the draws from `g` happen in this order: parcels, Sentinel-2, S1 ascending, S1 descending, hr
    semantic, parcel = _parcels(g, b, h, w, num_classes)
    s2, s2_doy, s2_mask = _sentinel2(g, semantic, t2, num_classes)
    s1a_x, s1a_doy, s1a_mask = _orbit(g, b, t1, h, w, s1a)
    s1d_x, s1d_doy, s1d_mask = _orbit(g, b, t1, h, w, s1d)
    low = torch.rand(b, 3, max(1, h // 4), max(1, w // 4), generator=g)
    hr = torch.nn.functional.interpolate(low, size=(hr_scale * h, hr_scale * w), mode="bilinear",
                                         align_corners=False).clamp(0.0, 1.0)
    batch = {
        "s2": s2, "s2_doy": s2_doy, "s2_mask": s2_mask,
        "s1a": s1a_x, "s1a_doy": s1a_doy, "s1a_mask": s1a_mask,
        "s1d": s1d_x, "s1d_doy": s1d_doy, "s1d_mask": s1d_mask,
        "semantic": semantic.to(torch.int64), "parcel": parcel.float(),
        "parcel_present": torch.ones(b, dtype=torch.bool),
        "hr": hr, "hr_present": torch.ones(b, dtype=torch.bool),
        "patch_id": torch.arange(b, dtype=torch.int64) + 1,
        "crop_yx": torch.zeros(b, 2, dtype=torch.int64),
    }
    return {k: v.to(device) for k, v in batch.items()}


def _parcels(g: torch.Generator, b: int, h: int, w: int, num_classes: int) -> tuple[Tensor, Tensor]:
    """Draw square parcels with random classes: ``semantic [B, H, W]`` and ``parcel [B, 3, H, W]``.

    ``semantic`` holds square parcels of ``cell`` pixels (8, or 4 below 16 pixels) with random classes
    (background included); ``parcel`` their extent, boundary and distance.
    """
    cell = 8 if min(h, w) >= 16 else 4
    gh, gw = -(-h // cell), -(-w // cell)
    cls_grid = torch.randint(0, num_classes, (b, gh, gw), generator=g)
    semantic = cls_grid.repeat_interleave(cell, 1).repeat_interleave(cell, 2)[:, :h, :w].contiguous()
    ids = torch.arange(gh * gw).reshape(gh, gw).repeat_interleave(cell, 0).repeat_interleave(cell, 1)[:h, :w]
    parcel = torch.from_numpy(np.stack([_parcel_targets(ids.numpy(), s.numpy()) for s in semantic]))
    return semantic, parcel


def _sentinel2(g: torch.Generator, semantic: Tensor, t2: int, num_classes: int) -> tuple[Tensor, Tensor, Tensor]:
    """Draw ``s2 [B, T2, 10, H, W]`` float32, ``s2_doy [B, T2]`` and ``s2_mask [B, T2, H, W]``.

    ``s2`` is noise + a class-dependent seasonal curve, so a model can learn something; ``s2_mask`` has about
    20 % cloud blobs.
    """
    b, h, w = semantic.shape
    s2_doy = _sorted_doy(g, b, t2)
    phase = torch.rand(num_classes, 10, generator=g) * 2 * torch.pi
    season = torch.sin(2 * torch.pi * s2_doy[:, :, None, None, None].float() / 366.0
                       + phase[semantic][:, None].permute(0, 1, 4, 2, 3))       # [B, T2, 10, H, W]
    s2 = 0.7 * season + 0.5 * torch.randn(b, t2, 10, h, w, generator=g)
    clouds = torch.rand(b, t2, max(1, h // 8), max(1, w // 8), generator=g) < 0.2
    s2_mask = ~torch.nn.functional.interpolate(clouds.float(), size=(h, w), mode="nearest").bool()
    return s2.float(), s2_doy, s2_mask


def _orbit(g: torch.Generator, b: int, t1: int, h: int, w: int, present: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Draw one Sentinel-1 orbit: ``[B, T1, 2, H, W]`` values, ``[B, T1]`` days of year, ``[B, T1]`` mask.

    The values are zeros with an all-False mask when the orbit is absent; the draws are made either way.
    """
    doy = _sorted_doy(g, b, t1)
    x = torch.randn(b, t1, 2, h, w, generator=g)
    if present:
        return x, doy, torch.ones(b, t1, dtype=torch.bool)
    return torch.zeros_like(x), doy, torch.zeros(b, t1, dtype=torch.bool)
