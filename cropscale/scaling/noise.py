"""The noise of repeated measurements, robust to outliers: screening, centres, the pooled relative noise.

Screening rule (:func:`screen`)
    At each ``x`` the relative deviations of the repetitions from their median,
    ``d = (y - median) / |median|``, are pooled over every ``x`` with 3 or more repetitions; their
    robust scale is ``s = b(r) MAD_TO_SD median(|d|)`` over the non-zero deviations (the median
    repetition of an odd count deviates by exactly 0 and is left out of the scale; ``b(r)``, for
    the median count ``r``, corrects the bias of deviations from a sample median, 0.98 for ``r = 5``).
    A repetition with ``|d| > SCREEN * s`` (:data:`SCREEN` = 7 robust standard deviations: the
    pooled ``s`` of a few dozen deviations can be 30 % low) is screened out, at most ``r // 4`` of
    the ``r`` repetitions at one ``x`` (the most extreme first, so that the interquartile mean
    still has its middle half), never one of 1 to 3 repetitions. For Gaussian noise a repetition is
    screened with a probability below 1e-5; a repetition 3x too slow among five with 2-25 % noise
    always is. The screened repetitions are reported (:class:`Screened`).

Centre
    The interquartile mean of the kept repetitions (:func:`interquartile_mean`).

Noise (:func:`noise_of`, :func:`pooled_noise`)
    The relative deviations of the kept repetitions from their point's mean, times
    ``sqrt(r / (r - 1))`` (so that their mean square is the noise variance), pooled; the noise of one
    repetition is their root mean square after clipping each at :data:`CLIP` robust standard
    deviations (a second guard: Gaussian noise is almost never clipped).

Layer 1: numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAD_TO_SD = 1.4826
"""Median absolute deviation to standard deviation for Gaussian noise."""
CLIP = 4.0
"""Deviations beyond ``CLIP`` robust standard deviations count as that many in the noise estimate."""
SCREEN = 7.0
"""A repetition further than ``SCREEN`` robust standard deviations from its point's median is screened out."""
_MAD_BIAS = {3: 0.975, 4: 1.381, 5: 0.978, 6: 1.272, 7: 1.0, 8: 1.193, 10: 1.143, 16: 1.080}
"""``sigma / (MAD_TO_SD median |y - median|)`` over the non-zero deviations of ``r`` Gaussian values
(simulated, 20000 draws each; 1 for counts not listed)."""

_IQM_SE = (1.0, 1.0, 1.0, 1.092, 1.065, 1.050, 1.042, 1.086, 1.074, 1.066, 1.056, 1.088, 1.079, 1.072, 1.065, 1.088)
"""``c(r)`` for ``r = 1 .. 16``: standard deviation of the interquartile mean of ``r`` standard
normal values times ``sqrt(r)`` (simulated, 10^6 draws each; 1.08 beyond)."""


def interquartile_mean(a: np.ndarray) -> np.ndarray:
    """Mean over the last axis without its ``r // 4`` lowest and ``r // 4`` highest values."""
    a = np.asarray(a, dtype=np.float64)
    r = a.shape[-1]
    k = r // 4
    return np.sort(a, axis=-1)[..., k : r - k].mean(axis=-1)


def iqm_se_factor(r: int) -> float:
    """``c(r)``: the interquartile mean's standard error over a plain mean's, ``r`` Gaussian values."""
    return _IQM_SE[r - 1] if r <= len(_IQM_SE) else 1.08


@dataclass(frozen=True)
class Screened:
    """One repetition screened out by the rule of the module docstring.

    Attributes:
        x: the parameter value of its point.
        value: the repetition (unit of the metric).
        deviation: its relative deviation from the point's median (2.0 = 200 % above).
        robust_sd: the pooled robust standard deviation ``s`` it was compared with (relative).
    """

    x: float
    value: float
    deviation: float
    robust_sd: float

    def text(self, var: str = "x") -> str:
        """E.g. ``"13.2 at n = 16 (+196 %, 41 robust sd)"``."""
        return (f"{self.value:.4g} at {var} = {self.x:g} ({100 * self.deviation:+.0f} %, "
                f"{abs(self.deviation) / self.robust_sd:.0f} robust sd)")


def screen(xs: np.ndarray, rows: list[np.ndarray]) -> tuple[list[np.ndarray], tuple[Screened, ...]]:
    """The repetitions kept at each ``x`` and those screened out (rule of the module docstring).

    Args:
        xs: ``[n]`` distinct parameter values.
        rows: ``n`` arrays of repetitions (ragged allowed).

    Returns:
        ``(kept rows, screened)``: the rows without the screened repetitions (order kept), and each
        screened repetition.
    """
    meds = [float(np.median(r)) for r in rows]
    devs = [(r - m) / abs(m) if m != 0 else np.zeros_like(r) for r, m in zip(rows, meds, strict=True)]
    pool = np.concatenate([np.abs(d) for d, r in zip(devs, rows, strict=True) if r.size >= 3] or [np.zeros(0)])
    pool = pool[pool > 0]
    if pool.size == 0:
        return list(rows), ()
    r_typ = int(np.median([r.size for r in rows]))
    s = _MAD_BIAS.get(r_typ, 1.0) * MAD_TO_SD * float(np.median(pool))
    if s <= 0:
        return list(rows), ()
    kept, out = [], []
    for x, r, d in zip(xs, rows, devs, strict=True):
        limit = r.size // 4
        order = np.argsort(-np.abs(d))[:limit]
        drop = [int(k) for k in order if abs(d[k]) > SCREEN * s]
        keep = np.ones(r.size, dtype=bool)
        keep[drop] = False
        kept.append(r[keep])
        out += [Screened(float(x), float(r[k]), float(d[k]), s) for k in drop]
    return kept, tuple(out)


def deviations(reps: np.ndarray, scale) -> np.ndarray:
    """Relative deviations of repetitions ``[..., r]`` from their mean, times ``sqrt(r / (r - 1))``.

    The factor makes their mean square the noise variance.
    """
    r = reps.shape[-1]
    return (reps - reps.mean(axis=-1, keepdims=True)) / scale * math.sqrt(r / (r - 1))


def noise_of(pool: np.ndarray) -> np.ndarray:
    """Relative noise of one repetition from pooled deviations ``[..., m]``.

    Their root mean square after clipping at ``CLIP`` robust standard deviations (``MAD_TO_SD`` times
    the median absolute deviation).
    """
    a = np.abs(pool)
    limit = CLIP * MAD_TO_SD * np.median(a, axis=-1, keepdims=True)
    return np.sqrt(np.mean(np.minimum(a, limit) ** 2, axis=-1))


def pooled_noise(rows: list[np.ndarray], scale: np.ndarray) -> tuple[float, np.ndarray]:
    """Relative noise of one repetition (:func:`noise_of`) and the pool of relative deviations.

    Args:
        rows: the (kept) repetitions at each point.
        scale: ``[n]`` the value each point's deviations are relative to (its centre).

    Returns:
        ``(noise, pool)``; ``(0.0, empty)`` without repetitions.
    """
    devs = [deviations(r, s) for r, s in zip(rows, scale, strict=True) if r.size > 1]
    if not devs:
        return 0.0, np.zeros(0)
    pool = np.concatenate(devs)
    return float(noise_of(pool)), pool
