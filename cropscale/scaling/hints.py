"""What would decide an inconclusive verdict: more repetitions, more points, or a wider range.

An inconclusive verdict could not separate the best model of the expectation or below from an
alternative above it (:mod:`cropscale.scaling.verdict`). How far apart the two are, in the verdict's
noise units, is the *separation*

    lambda(points, r) = min over models m of the expectation or below of
                        sum_k (alt(x_k) - m(x_k))^2 / se_k^2,   se_k = c(r) sigma |alt(x_k)| / sqrt(r),

the chi2 by which the alternative's noise-free values miss the family the expectation allows
(``sigma`` the observed relative noise of one repetition, ``c(r)`` the interquartile mean's factor,
``m = c0 + c1 t(x)`` refitted by weighted least squares for every term ``t``). The statistic ``D``
of the verdict then has a mean of about ``lambda``. A verdict at level 0.005 with a power of 95 %
needs ``lambda >= LAMBDA_NEEDED = (2.576 + 1.645)^2 = 17.8`` (normal quantiles: one-sided 0.005 and
0.05). :func:`decide` estimates, from the observed noise and the two models, each of:

- the repetitions per point that reach it (equal repetitions ``k`` scale ``lambda`` by ``k / c(k)^2``);
- the number of points, spaced evenly in ``log x`` over the same range, that reach it;
- the largest ``x``, the points continued in the same ratio, that reaches it (the two models
  extrapolated beyond the measured range: an assumption the message states).

Each is searched up to a cap (:data:`MAX_REPETITIONS`, :data:`MAX_POINTS`, :data:`MAX_DOUBLINGS`;
points and range by bisection, taking ``lambda`` as growing with them) and reported as "not
within" it when the cap does not suffice. These are estimates, not guarantees: the verdict's
bootstrap, not this formula, decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from cropscale.scaling.noise import iqm_se_factor
from cropscale.scaling.pmnf import Term

LAMBDA_NEEDED = (2.576 + 1.645) ** 2
"""Separation (noise units squared) for a decision at level 0.005 with 95 % power."""
MAX_REPETITIONS = 1000
MAX_POINTS = 64
MAX_DOUBLINGS = 20


def separation(xs: np.ndarray, reps: np.ndarray, sigma: float, alt: Callable[[np.ndarray], np.ndarray],
               within: Sequence[Term]) -> float:
    """``lambda`` of the module docstring at points ``xs`` ``[n]`` with ``reps`` ``[n]`` repetitions each.

    Returns ``inf`` when no model of ``within`` can be fitted (fewer than 2 points).
    """
    xs = np.asarray(xs, dtype=np.float64)
    a = np.asarray(alt(xs), dtype=np.float64)
    cr = np.array([iqm_se_factor(int(r)) for r in reps])
    se = cr * max(sigma, 1e-12) * np.maximum(np.abs(a), 1e-300) / np.sqrt(reps)
    sw = 1.0 / se
    best = math.inf
    for t in within:
        cols = [np.ones_like(xs)] if t.is_constant else [np.ones_like(xs), t(xs) / max(np.max(np.abs(t(xs))), 1e-300)]
        m = np.stack(cols, axis=1) * sw[:, None]
        coef, *_ = np.linalg.lstsq(m, a * sw, rcond=None)
        best = min(best, float(np.sum((a * sw - m @ coef) ** 2)))
    return best


def decide(xs: np.ndarray, counts: np.ndarray, sigma: float, alt: Callable[[np.ndarray], np.ndarray],
           within: Sequence[Term], var: str = "n", min_points: int = 5) -> str:
    """One sentence: what would separate ``alt`` from the ``within`` family (module docstring).

    Args:
        xs: ``[n]`` distinct parameter values measured, ascending (> 0).
        counts: ``[n]`` repetitions at each.
        sigma: observed relative noise of one repetition (0.03 = 3 %).
        alt: the alternative above the expectation, a callable of ``x``.
        within: the terms of the expectation or below.
        var: the parameter's name.
        min_points: distinct values below which a verdict never passes (named first when short of them).
    """
    xs = np.asarray(xs, dtype=np.float64)
    if xs.size < min_points:
        lo, hi = float(xs[0]), float(xs[-1])
        return (f"to decide: measure at least {min_points} distinct {var} values (now {xs.size}; a verdict never "
                f"passes on fewer), e.g. {min_points} values spaced evenly in log {var} over [{lo:g}, {hi:g}] or "
                "further")
    r = max(int(np.median(counts)), 1)
    lam = separation(xs, counts, sigma, alt, within)
    head = f"to decide (estimates from the observed noise: separation {lam:.3g} of the {LAMBDA_NEEDED:.3g} needed): "
    if lam >= LAMBDA_NEEDED:
        return head + "the two models are far enough apart at these points; repeat the measurement"
    # equal repetitions k everywhere scale every weight by k / c(k)^2: one fit gives them all
    unit = separation(xs, np.ones(xs.size), sigma, alt, within)
    need_r = next((k for k in range(r + 1, MAX_REPETITIONS + 1)
                   if unit * k / iqm_se_factor(k) ** 2 >= LAMBDA_NEEDED), None)
    parts = [f"about {need_r} repetitions per point (now {r})" if need_r
             else f"not within {MAX_REPETITIONS} repetitions per point"]
    lo, hi = float(xs[0]), float(xs[-1])
    need_n = _first(range(xs.size + 1, MAX_POINTS + 1),
                    lambda n: separation(np.geomspace(lo, hi, n), np.full(n, r), sigma, alt, within) >= LAMBDA_NEEDED)
    parts.append(f"or {need_n} points over the same range (now {xs.size})" if need_n
                 else f"not within {MAX_POINTS} points over the same range")
    ratio = max((hi / lo) ** (1.0 / max(xs.size - 1, 1)), 1.0 + 1e-9) if hi > lo else 2.0

    def extended(m: int) -> np.ndarray:
        return np.concatenate([xs, hi * ratio ** np.arange(1, m + 1)])

    need_m = _first(range(1, MAX_DOUBLINGS + 1), lambda m: separation(
        extended(m), np.full(xs.size + m, r), sigma, alt, within) >= LAMBDA_NEEDED)
    parts.append(f"or the range up to {var} = {extended(need_m)[-1]:.4g} ({need_m} more points in the same ratio, "
                 "if both models hold there)" if need_m
                 else f"no range up to {MAX_DOUBLINGS} more points in the same ratio")
    return head + ", ".join(parts)


def _first(candidates: range, ok: Callable[[int], bool]) -> int | None:
    """The smallest candidate where ``ok`` holds, by bisection (``ok`` taken as monotone), or ``None``."""
    lo, hi = candidates.start, candidates.stop - 1
    if hi < lo or not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
