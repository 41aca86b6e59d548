"""Spatially coupled augmentation: the eight flips and 90-degree rotations (dihedral group D4) of a sample.

Each transform is applied identically to every 10 m tensor and to the 1 m high-grid tensor of the sample.

The transform ``(k, flip)`` first mirrors left-right (``flip``: column ``c -> W - 1 - c``) and then
rotates ``k`` times by 90 degrees with :func:`torch.rot90` over the last two dimensions (one turn
moves pixel ``(r, c)`` of an ``H x W`` image to ``(W - 1 - c, r)``). Because the high grid is the
10 m grid refined ``x10`` (``HR_SCALE``), 10 m pixel ``(r, c)`` covers high-grid pixels
``[10r, 10r + 10) x [10c, 10c + 10)`` before and after the transform.

Non-square crops only allow ``k`` in {0, 2}, which keep the shape. ``crop_yx`` keeps the crop's
top-left corner in its patch *before* augmentation (it identifies the data, not the view).
"""

from __future__ import annotations

import numpy as np
import torch

SPATIAL_KEYS: tuple[str, ...] = ("s2", "s2_mask", "s1a", "s1d", "semantic", "parcel", "hr")
"""Sample keys whose last two dimensions are spatial (10 m grid, or the high grid for ``hr``)."""


def dihedral(x, k: int, flip: bool):
    """Mirror left-right if ``flip``, then rotate ``k`` quarter turns over the last two dims.

    Works on a ``numpy.ndarray`` (returns a contiguous copy; used by the dataset, single-threaded)
    or a ``torch.Tensor`` (returns a contiguous tensor).
    """
    if isinstance(x, np.ndarray):
        if flip:
            x = x[..., ::-1]
        if k % 4:
            x = np.rot90(x, k % 4, axes=(-2, -1))
        return np.ascontiguousarray(x)
    if flip:
        x = torch.flip(x, dims=(-1,))
    if k % 4:
        x = torch.rot90(x, k % 4, dims=(-2, -1))
    return x.contiguous()


def apply_dihedral(sample: dict, k: int, flip: bool) -> dict:
    """Apply :func:`dihedral` to every spatial tensor of ``sample`` (:data:`SPATIAL_KEYS`) and return a new dict.

    Other entries are returned unchanged.
    """
    out = dict(sample)
    for key in SPATIAL_KEYS:
        if key in out:
            out[key] = dihedral(out[key], k, flip)
    return out


class RandomDihedral:
    """Random augmentation: one of the eight D4 transforms, drawn uniformly, applied to the whole sample.

    Only four transforms are drawn from when the crop is not square; the transform is applied with
    :func:`apply_dihedral`.

    Args:
        p: probability of applying a random transform at all (1.0 = always draw from D4, where the
            identity is one of the eight).
    """

    def __init__(self, p: float = 1.0) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p}")
        self.p = p

    def draw(self, rng: np.random.Generator, height: int, width: int) -> tuple[int, bool]:
        """The ``(k, flip)`` to apply to an ``height x width`` crop."""
        if self.p < 1.0 and rng.random() >= self.p:
            return 0, False
        k = int(rng.integers(4)) if height == width else 2 * int(rng.integers(2))
        return k, bool(rng.integers(2))

    def __call__(self, sample: dict, rng: np.random.Generator) -> dict:
        """Draw ``(k, flip)`` with ``rng`` for the size of ``sample["semantic"]`` and apply it to ``sample``."""
        h, w = sample["semantic"].shape[-2:]
        k, flip = self.draw(rng, int(h), int(w))
        return apply_dihedral(sample, k, flip)
