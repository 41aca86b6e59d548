"""Temporal sampling: choose ``T`` acquisition dates out of a series of any length.

A date is **valid** for a sample when at least ``min_clear_fraction`` of the sample's pixels are
clear on that date (Sentinel-2: the ``DATA_S2_MASK`` validity mask when present, else no-data
detection, a pixel whose ten bands are all 0; Sentinel-1: VV and VH finite and not both 0).

Rules (``n`` = series length, ``v`` = number of valid dates, ``T`` = dates wanted):

* training, ``v >= T``: ``T`` valid dates drawn uniformly without replacement, sorted in time, so
  an invalid date is never chosen;
* evaluation, ``v >= T``: ``T`` evenly spaced valid dates, ``valid[round(linspace(0, v - 1, T))]``,
  the same every call;
* ``v < T <= n``: every valid date, completed with the invalid dates of highest clear fraction
  (ties: earlier date first in evaluation, random in training), sorted in time;
* ``n < T`` (a series shorter than ``T``): every date, sorted; the caller appends ``T - n``
  **padding dates** with zero data, an all-False mask and day of year 0 (the same convention as an
  absent Sentinel-1 orbit in :mod:`cropscale.batch`). Dates are never repeated.
"""

from __future__ import annotations

import numpy as np


def clear_fraction(valid: np.ndarray) -> np.ndarray:
    """Per-date fraction of clear pixels: ``valid`` ``[T, H, W]`` bool -> ``[T]`` float64 in [0, 1]."""
    valid = np.asarray(valid, dtype=bool)
    if valid.ndim < 2:
        raise ValueError(f"clear_fraction expects [T, ...], got shape {valid.shape}")
    return valid.reshape(valid.shape[0], -1).mean(axis=1, dtype=np.float64)


def s2_pixel_validity(s2: np.ndarray) -> np.ndarray:
    """No-data detection for Sentinel-2 without a mask: ``[T, C, H, W]`` -> ``[T, H, W]`` bool.

    A pixel is False where every band is 0 (the PASTIS no-data value).
    """
    return np.any(np.asarray(s2) != 0, axis=1)


def s1_pixel_validity(s1: np.ndarray) -> np.ndarray:
    """Sentinel-1 validity: ``[T, 2, H, W]`` (VV, VH in dB) -> ``[T, H, W]`` bool.

    A pixel is True where both channels are finite and not both exactly 0 (no data).
    """
    s1 = np.asarray(s1)
    finite = np.all(np.isfinite(s1), axis=1)
    return finite & np.any(s1 != 0, axis=1)


def select_dates(
    fraction: np.ndarray,
    t: int,
    *,
    min_clear_fraction: float = 0.5,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Indices of the dates to use, sorted in time, length ``min(t, len(fraction))``.

    Args:
        fraction: ``[n]`` clear fraction of each date (see :func:`clear_fraction`).
        t: dates wanted (``T2`` or ``T1``), at least 1.
        min_clear_fraction: a date is valid when its clear fraction is at least this and above 0.
        rng: training draws (random subset of the valid dates); None = evaluation (deterministic,
            evenly spaced valid dates).

    Returns:
        ``[min(t, n)]`` int64 increasing indices; the caller pads to ``t`` when ``n < t``
        (module docstring).
    """
    if t < 1:
        raise ValueError(f"t must be >= 1, got {t}")
    fraction = np.asarray(fraction, dtype=np.float64)
    n = fraction.shape[0]
    if n <= t:
        return np.arange(n, dtype=np.int64)
    is_valid = (fraction >= min_clear_fraction) & (fraction > 0)
    valid = np.flatnonzero(is_valid)
    if valid.size >= t:
        if rng is None:
            picks = valid[np.round(np.linspace(0, valid.size - 1, t)).astype(np.int64)]
        else:
            picks = rng.choice(valid, size=t, replace=False)
        return np.sort(picks).astype(np.int64)
    others = np.flatnonzero(~is_valid)
    if rng is not None:
        others = rng.permutation(others)
    # stable sort by decreasing clear fraction: ties keep the (random or temporal) order above
    others = others[np.argsort(-fraction[others], kind="stable")]
    picks = np.concatenate([valid, others[: t - valid.size]])
    return np.sort(picks).astype(np.int64)
