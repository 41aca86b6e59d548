"""Amdahl, Gustafson and Karp-Flatt: what N devices can and cannot do for a given serial fraction.

Definitions (the study's notation; ``N`` devices or ranks, ``s`` serial fraction in [0, 1]):

- Amdahl's law (Amdahl, AFIPS 1967): speed-up ``S(N, s) = 1 / (s + (1 - s) / N)``;
  parallel efficiency ``E = S / N``.
- Gustafson's law (Gustafson, CACM 31(5), 1988), scaled speed-up for a problem that grows with
  ``N``: ``S_G(N, s) = s + (1 - s) N = N - s (N - 1)``.
- Karp-Flatt metric (Karp and Flatt, CACM 33(5), 1990), the experimentally determined serial
  fraction from a measured speed-up ``S`` on ``N > 1`` devices:
  ``e = (1/S - 1/N) / (1 - 1/N)``. A serial fraction that grows with ``N`` points at parallel
  overhead (communication, synchronisation) rather than at inherently serial work.
- The serial fraction fitted to several measured speed-ups (:func:`fit_serial_fraction`): Amdahl's
  law is linear in ``1/S``, ``1/S - 1/N = s (1 - 1/N)``, so least squares in ``1/S`` give
  ``s = sum x y / sum x^2`` with ``x = 1 - 1/N``, ``y = 1/S - 1/N``; for one point it is Karp-Flatt's.

Every value computed here from assumed serial fractions is an ``analytical-scenario``; a
Karp-Flatt fraction carries the evidence label of the speed-up it was computed from.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cropscale.errors import CropScaleError
from cropscale.evidence import ANALYTICAL_SCENARIO


def _check_devices(n: float, name: str = "n", minimum: float = 1) -> float:
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n < minimum:
        raise CropScaleError(f"{name} must be a number of devices >= {minimum:g}, got {n!r}")
    return float(n)


def _check_fraction(s: float, name: str = "serial_fraction") -> float:
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not (0.0 <= s <= 1.0):
        raise CropScaleError(f"{name} must be a fraction in [0, 1] (e.g. 0.2 for 20 %), got {s!r}")
    return float(s)


def amdahl_speedup(n: float, serial_fraction: float) -> float:
    """Amdahl's speed-up ``S(N, s) = 1 / (s + (1 - s) / N)`` (dimensionless).

    Args:
        n: number of devices ``N >= 1``.
        serial_fraction: fraction ``s`` of the single-device time that does not parallelise.

    Raises:
        CropScaleError: ``n < 1`` or ``s`` outside [0, 1].
    """
    n = _check_devices(n)
    s = _check_fraction(serial_fraction)
    return 1.0 / (s + (1.0 - s) / n)


def efficiency(speedup: float, n: float) -> float:
    """Parallel efficiency ``E = S / N`` (dimensionless, 1.0 = perfect scaling).

    Raises:
        CropScaleError: ``n < 1`` or a non-positive speed-up.
    """
    n = _check_devices(n)
    if not (isinstance(speedup, (int, float)) and math.isfinite(speedup) and speedup > 0):
        raise CropScaleError(f"speedup must be a positive number, got {speedup!r}")
    return float(speedup) / n


def amdahl_efficiency(n: float, serial_fraction: float) -> float:
    """Amdahl efficiency ``E(N, s) = S(N, s) / N``."""
    return efficiency(amdahl_speedup(n, serial_fraction), n)


def gustafson_speedup(n: float, serial_fraction: float) -> float:
    """Gustafson's scaled speed-up ``S_G(N, s) = s + (1 - s) N`` (weak scaling).

    ``s`` is here the serial fraction of the time *on N devices* (Gustafson 1988).

    Raises:
        CropScaleError: ``n < 1`` or ``s`` outside [0, 1].
    """
    n = _check_devices(n)
    s = _check_fraction(serial_fraction)
    return s + (1.0 - s) * n


def karp_flatt(speedup: float, n: float) -> float:
    """Karp-Flatt experimentally determined serial fraction ``e = (1/S - 1/N) / (1 - 1/N)``.

    Args:
        speedup: measured speed-up ``S = T_1 / T_N`` (> 0).
        n: number of devices ``N > 1`` the speed-up was measured on.

    Returns:
        ``e`` (dimensionless). 0 for linear speed-up, 1 for no speed-up, negative for
        super-linear speed-up (cache effects), above 1 for a slow-down.

    Raises:
        CropScaleError: ``n <= 1`` (undefined) or a non-positive speed-up.
    """
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n <= 1:
        raise CropScaleError(f"n must be > 1 for the Karp-Flatt metric (it is undefined at N = 1), got {n!r}")
    if not (isinstance(speedup, (int, float)) and math.isfinite(speedup) and speedup > 0):
        raise CropScaleError(f"speedup must be a positive measured number, got {speedup!r}")
    n = float(n)
    return (1.0 / speedup - 1.0 / n) / (1.0 - 1.0 / n)


def fit_serial_fraction(devices: Sequence[float], speedups: Sequence[float]) -> float:
    """Amdahl's serial fraction fitted to measured speed-ups by least squares in ``1/S``.

    ``s = sum x_i y_i / sum x_i^2`` with ``x_i = 1 - 1/N_i`` and ``y_i = 1/S_i - 1/N_i`` (Amdahl's law
    rearranged: ``y = s x``). Points at ``N = 1`` carry no information (``x = 0``) and are skipped. For
    a single ``N > 1`` point this is :func:`karp_flatt`. The value is not clipped: below 0 means
    super-linear speed-up, above 1 a slow-down (a caller drawing an Amdahl curve clips it to [0, 1]).

    Args:
        devices: device counts ``N_i >= 1``.
        speedups: measured speed-ups ``S_i > 0`` against one device, in the same order.

    Raises:
        CropScaleError: lengths differ, a count below 1, a non-positive speed-up, or no point with ``N > 1``.
    """
    if len(devices) != len(speedups):
        raise CropScaleError(f"fit_serial_fraction: {len(devices)} device counts but {len(speedups)} speed-ups")
    num = den = 0.0
    for n, sp in zip(devices, speedups, strict=True):
        n = _check_devices(n)
        if not (isinstance(sp, (int, float)) and math.isfinite(sp) and sp > 0):
            raise CropScaleError(f"speedup must be a positive measured number, got {sp!r}")
        x, y = 1.0 - 1.0 / n, 1.0 / sp - 1.0 / n
        num += x * y
        den += x * x
    if den == 0.0:
        raise CropScaleError("fit_serial_fraction needs a speed-up measured on more than one device")
    return num / den


@dataclass(frozen=True)
class AmdahlRow:
    """One cell of the Amdahl table: ``n`` devices at serial fraction ``serial_fraction``."""

    n: int
    serial_fraction: float
    speedup: float
    efficiency: float
    gustafson_speedup: float
    evidence: str = ANALYTICAL_SCENARIO


def amdahl_table(
    devices: Iterable[int] = (2, 4, 8),
    serial_fractions: Iterable[float] = (0.10, 0.20, 0.35),
) -> list[AmdahlRow]:
    """Amdahl speed-up and efficiency (and Gustafson's scaled speed-up) for every pair.

    Rows come device-major: for each ``n`` in ``devices``, one row per serial fraction.
    Defaults are the study's table (N = 2, 4, 8; 10, 20, 35 % serial).
    """
    devices = list(devices)
    fractions = list(serial_fractions)
    if not devices or not fractions:
        raise CropScaleError("amdahl_table needs at least one device count and one serial fraction")
    rows = []
    for n in devices:
        for s in fractions:
            sp = amdahl_speedup(n, s)
            rows.append(AmdahlRow(int(n), float(s), sp, sp / n, gustafson_speedup(n, s)))
    return rows


def _percent_label(fraction: float) -> str:
    pct = fraction * 100.0
    return f"{pct:.0f} %" if abs(pct - round(pct)) < 1e-9 else f"{pct:g} %"


def format_amdahl_table(rows: Sequence[AmdahlRow], evidence_column: bool = False) -> str:
    """Markdown table as the study prints it: one line per device count, cells ``"1.82x / 90.9 %"``.

    Args:
        rows: output of :func:`amdahl_table` (any order; cells are placed by ``n`` and fraction).
        evidence_column: append an ``Evidence`` column (``analytical-scenario``) to each row.
    """
    if not rows:
        raise CropScaleError("format_amdahl_table needs at least one row")
    devices = sorted({r.n for r in rows})
    fractions = sorted({r.serial_fraction for r in rows})
    cell = {(r.n, r.serial_fraction): r for r in rows}
    header = ["GPUs"] + [f"{_percent_label(s)} serial" for s in fractions]
    if evidence_column:
        header.append("Evidence")
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for n in devices:
        cells = [str(n)]
        evidence = set()
        for s in fractions:
            r = cell.get((n, s))
            if r is None:
                cells.append("-")
                continue
            cells.append(f"{r.speedup:.2f}x / {100.0 * r.efficiency:.1f} %")
            evidence.add(r.evidence)
        if evidence_column:
            cells.append(", ".join(sorted(evidence)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
