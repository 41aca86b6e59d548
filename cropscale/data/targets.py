"""Parcel targets derived from ``INSTANCE_ANNOTATIONS`` (``[H, W]`` parcel ids, 0 = background).

Three channels (``cropscale.batch.PARCEL_TARGETS``), float32, in the order:

* **extent**: 1 where ``instance > 0``, else 0.
* **boundary**: 1 on parcel pixels (``instance > 0``) with at least one 4-neighbour (up, down,
  left, right) holding a different id, i.e. another parcel or background; the inner boundary of
  every parcel. Neighbours outside the patch do not count: a parcel cut by the patch border has no
  boundary along the border (the parcel continues beyond it).
* **distance**: Euclidean distance (pixels, :func:`scipy.ndimage.distance_transform_edt`) from
  each parcel pixel to the nearest boundary or background pixel, divided by its parcel's maximum,
  so that it lies in [0, 1] (0 on the boundary and background, 1 at the parcel's centre). This is
  the per-field normalised distance of ResUNet-a (Diakogiannis et al., ISPRS J. 2020) and of field
  boundary delineation (Waldner & Diakogiannis, RSE 2020).

Targets are computed on the whole patch and then cropped, so a crop's distance map sees the parcels'
true boundaries outside the crop.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage


def parcel_boundary(instances: np.ndarray) -> np.ndarray:
    """Inner 4-neighbour boundary of the parcels: ``[H, W]`` ids -> ``[H, W]`` bool (see module doc)."""
    ids = np.asarray(instances)
    if ids.ndim != 2:
        raise ValueError(f"instances must be [H, W], got shape {ids.shape}")
    diff = np.zeros(ids.shape, dtype=bool)
    vertical = ids[1:, :] != ids[:-1, :]
    horizontal = ids[:, 1:] != ids[:, :-1]
    diff[1:, :] |= vertical
    diff[:-1, :] |= vertical
    diff[:, 1:] |= horizontal
    diff[:, :-1] |= horizontal
    return diff & (ids > 0)


def parcel_targets(instances: np.ndarray) -> np.ndarray:
    """Extent, boundary and normalised distance: ``[H, W]`` ids -> ``[3, H, W]`` float32."""
    ids = np.asarray(instances)
    extent = ids > 0
    boundary = parcel_boundary(ids)
    inner = extent & ~boundary
    distance = ndimage.distance_transform_edt(inner) if inner.any() else np.zeros(ids.shape)
    labels = np.where(extent, ids, 0)
    present = np.unique(labels[extent])
    if present.size:
        peak = np.asarray(ndimage.maximum(distance, labels=labels, index=present), dtype=np.float64)
        # per-parcel maximum broadcast to pixels through a sorted lookup of the parcel ids
        per_pixel = np.zeros(ids.shape, dtype=np.float64)
        pos = np.searchsorted(present, labels[extent])
        per_pixel[extent] = peak[pos]
        distance = np.divide(distance, per_pixel, out=np.zeros_like(distance, dtype=np.float64), where=per_pixel > 0)
    return np.stack([extent, boundary, distance]).astype(np.float32)
