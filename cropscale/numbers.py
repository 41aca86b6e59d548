"""Statistics helpers shared by the callbacks, benchmarks, the run reader, the report and the study.

Layer 0: stdlib only. One definition of each: percentiles follow ``numpy.percentile(method="linear")``;
``None``, NaN and inf are "no value" and are dropped (JSON has no NaN).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence


def finite_or_none(x: float | None) -> float | None:
    """``x`` as a float, or ``None`` for ``None`` / NaN / inf (JSON has no NaN)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def finite(values: Iterable[float | None]) -> list[float]:
    """The finite values of ``values`` as floats (``None``, NaN and inf dropped), in order."""
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of ``values`` with linear interpolation, ``None`` when empty.

    Same definition as ``numpy.percentile(values, q)`` (method "linear").
    """
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def median(values: Iterable[float | None]) -> float | None:
    """Median of the finite values, ``None`` when there is none."""
    vals = finite(values)
    return statistics.median(vals) if vals else None


def median_p95(values: Sequence[float], scale: float = 1.0) -> dict[str, float | None]:
    """``{"median": ..., "p95": ..., "n": ...}`` of ``values`` multiplied by ``scale``."""
    med = percentile(values, 50.0)
    p95 = percentile(values, 95.0)
    return {
        "median": None if med is None else med * scale,
        "p95": None if p95 is None else p95 * scale,
        "n": len(values),
    }


def speedup(samples_per_s: float, base_samples_per_s: float) -> float:
    """The one speed-up of cropscale, in the report and the study: ``S = Q / Q_base`` (dimensionless).

    ``Q`` is the training samples/s of :func:`cropscale.runs.rules.samples_per_s` (training samples /
    training seconds over the measured epochs; benchmarks: batch / median step): the protocol's samples/s at
    equal work. When both sides train the same samples it equals ``T_base / T`` of the training-epoch times;
    where they differ (padding of a ``DistributedSampler``, a training window that excludes validation) the
    samples/s ratio is the figure. Efficiency is ``S / N`` (:func:`cropscale.scaling.amdahl.efficiency`).

    Raises:
        ValueError: a rate that is not a positive finite number.
    """
    for name, q in (("samples/s", samples_per_s), ("base samples/s", base_samples_per_s)):
        if q is None or not math.isfinite(float(q)) or float(q) <= 0:
            raise ValueError(f"{name} must be a positive finite rate, got {q!r}")
    return float(samples_per_s) / float(base_samples_per_s)


TARGET_FRACTION = 0.95
"""Default target of time-to-quality: this fraction of the baseline's best macro IoU (the run's own best in
TensorBoard's HPARAMS, where a single run knows no other baseline)."""


def time_to_target(points: Iterable[tuple[float, float | None]], target: float) -> float | None:
    """The first time whose best-so-far value reaches ``target``: ``points`` are ``(seconds, value)`` in order.

    None when the best-so-far never reaches it ("not reached"); non-finite values are skipped.
    """
    best = -math.inf
    for t, v in points:
        v = finite_or_none(v)
        if v is not None:
            best = max(best, v)
        if best >= target:
            return float(t)
    return None


def mean_sd(values: Iterable[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n - 1) of the finite values; sd is ``None`` below 2 values."""
    vals = finite(values)
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)
