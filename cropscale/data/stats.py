"""Per-band normalisation statistics, computed over the **training folds only** and applied to every sample.

They are applied the same way to every sample (training crops, validation and test patches); never per tile
or per batch.

Sentinel-2: mean and standard deviation of each band B02 ... B12 (reflectance x 1e4) over every
clear pixel of every date of every training patch (clear = not all bands 0, and ``DATA_S2_MASK`` marks
it clear when the root has masks; values under the mask, NaN included, are left out). Sentinel-1: per orbit,
VV and VH (dB) over the pixels that are finite and not both 0.
Moments (:class:`Moments`) are accumulated per date chunk in float64 by the same pass that checks each
patch's values (:mod:`cropscale.data.scans`), kept per patch, and merged over the training patches with the
parallel variance formula (Chan, Golub & LeVeque, 1979); the standard deviation is the population one.
Normalised value: ``(x - mean) / std``.

Saved as JSON (``format: cropscale-norm-stats/1``) with the root, the folds and the patch ids it
was computed on, so that loading it for other training folds is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cropscale.batch import S1_BANDS, S2_BANDS
from cropscale.errors import CropScaleError
from cropscale.files import atomic_write_json

FORMAT = "cropscale-norm-stats/1"


@dataclass
class NormStats:
    """Per-band mean and standard deviation.

    Attributes:
        s2_mean, s2_std: ``[10]`` float64, reflectance x 1e4, band order ``S2_BANDS``.
        s1: orbit (``"S1A"``, ``"S1D"``) -> ``(mean [2], std [2])`` in dB, order VV, VH.
        folds: training folds the statistics come from.
        patch_ids: patches used.
        counts: modality -> number of pixel-date values per band used.
        root: dataset root (informative).
    """

    s2_mean: np.ndarray
    s2_std: np.ndarray
    s1: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    folds: list[int] = field(default_factory=list)
    patch_ids: list[int] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    root: str = ""

    def normalise_s2(self, x: np.ndarray) -> np.ndarray:
        """``[T, 10, H, W]`` reflectance x 1e4 -> float32 ``(x - mean) / std`` per band."""
        mean = self.s2_mean.astype(np.float32)[None, :, None, None]
        std = self.s2_std.astype(np.float32)[None, :, None, None]
        return ((np.asarray(x, dtype=np.float32) - mean) / std).astype(np.float32, copy=False)

    def normalise_s1(self, x: np.ndarray, orbit: str) -> np.ndarray:
        """``[T, 2, H, W]`` VV, VH in dB -> float32 ``(x - mean) / std`` per band of ``orbit``.

        Raises:
            CropScaleError: the training folds had no data for ``orbit``.
        """
        if orbit not in self.s1:
            raise CropScaleError(
                f"no normalisation statistics for {orbit}: the training folds {self.folds} have no {orbit} data"
            )
        mean, std = self.s1[orbit]
        mean = mean.astype(np.float32)[None, :, None, None]
        std = std.astype(np.float32)[None, :, None, None]
        with np.errstate(invalid="ignore"):
            return ((np.asarray(x, dtype=np.float32) - mean) / std).astype(np.float32, copy=False)

    def to_dict(self) -> dict:
        """JSON-ready dict (see module docstring)."""
        out = {
            "format": FORMAT,
            "root": self.root,
            "folds": [int(f) for f in self.folds],
            "patch_ids": [int(p) for p in self.patch_ids],
            "s2": {"bands": list(S2_BANDS), "unit": "reflectance x 1e4", "mean": self.s2_mean.tolist(),
                   "std": self.s2_std.tolist(), "count": int(self.counts.get("S2", 0))},
        }
        for orbit, (mean, std) in sorted(self.s1.items()):
            out[orbit] = {"bands": list(S1_BANDS), "unit": "dB", "mean": mean.tolist(), "std": std.tolist(),
                          "count": int(self.counts.get(orbit, 0))}
        return out

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "statistics") -> NormStats:
        """Inverse of :meth:`to_dict`.

        Raises:
            CropScaleError: unknown format or wrong band count (names ``source``).
        """
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise CropScaleError(f"{source}: not a {FORMAT} file")
        try:
            s2_mean = np.asarray(d["s2"]["mean"], dtype=np.float64)
            s2_std = np.asarray(d["s2"]["std"], dtype=np.float64)
            s1 = {o: (np.asarray(d[o]["mean"], dtype=np.float64), np.asarray(d[o]["std"], dtype=np.float64))
                  for o in ("S1A", "S1D") if o in d}
        except (KeyError, TypeError, ValueError) as err:
            raise CropScaleError(f"{source}: malformed statistics ({err})") from None
        if s2_mean.shape != (len(S2_BANDS),) or s2_std.shape != (len(S2_BANDS),) or not (s2_std > 0).all():
            raise CropScaleError(f"{source}: s2 needs {len(S2_BANDS)} means and positive stds")
        for o, (m, s) in s1.items():
            if m.shape != (2,) or s.shape != (2,) or not (s > 0).all():
                raise CropScaleError(f"{source}: {o} needs 2 means and positive stds (VV, VH)")
        counts = {"S2": int(d["s2"].get("count", 0)), **{o: int(d[o].get("count", 0)) for o in s1}}
        return cls(s2_mean=s2_mean, s2_std=s2_std, s1=s1, folds=[int(f) for f in d.get("folds", [])],
                   patch_ids=[int(p) for p in d.get("patch_ids", [])], counts=counts, root=str(d.get("root", "")))

    def save(self, path: str | Path) -> Path:
        """Write JSON atomically (:func:`cropscale.files.atomic_write_json`: temporary file, fsync, rename).

        A reader, another rank writing the same file, or a kill mid-write never leaves a truncated file.

        Raises:
            CropScaleError: ``path`` is a folder or cannot be written (the message names it).
        """
        return atomic_write_json(path, self.to_dict(), indent=1)

    @classmethod
    def load(cls, path: str | Path) -> NormStats:
        """Read a file written by :meth:`save`.

        Raises:
            CropScaleError: missing or malformed file.
        """
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise CropScaleError(f"normalisation statistics not found: {path}") from None
        except (OSError, json.JSONDecodeError) as err:
            raise CropScaleError(f"cannot read normalisation statistics {path}: {err}") from None
        return cls.from_dict(d, source=str(path))


@dataclass
class Moments:
    """Per-band count, mean and sum of squared deviations, merged batch by batch (parallel variance).

    Attributes:
        n: values per band accumulated.
        mean: ``[C]`` float64 mean, in the modality's unit.
        m2: ``[C]`` float64 sum of squared deviations from the mean.
    """

    n: int = 0
    mean: np.ndarray = field(default_factory=lambda: np.zeros(0))
    m2: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @classmethod
    def empty(cls, bands: int) -> Moments:
        """No value yet, ``bands`` bands."""
        return cls(0, np.zeros(bands), np.zeros(bands))

    def update(self, x: np.ndarray, valid: np.ndarray) -> None:
        """Add the values of ``x`` ``[T, C, H, W]`` at the pixels ``valid`` ``[T, H, W]`` bool.

        ``x`` may have any numeric dtype and must be finite where ``valid``; only those values are read
        (gathered, then summed in float64).
        """
        n_b = int(valid.sum())
        if n_b == 0:
            return
        values = np.moveaxis(np.asarray(x), 1, 0)[:, valid].astype(np.float64)  # [C, n_b]
        mean_b = values.sum(axis=1) / n_b
        values -= mean_b[:, None]
        self.merge(Moments(n_b, mean_b, np.einsum("cn,cn->c", values, values)))

    def merge(self, other: Moments) -> None:
        """Add the values ``other`` summarises (Chan, Golub & LeVeque, 1979)."""
        if other.n == 0:
            return
        if self.n == 0:
            self.n, self.mean, self.m2 = other.n, np.array(other.mean, np.float64), np.array(other.m2, np.float64)
            return
        n = self.n + other.n
        delta = other.mean - self.mean
        self.mean = self.mean + delta * other.n / n
        self.m2 = self.m2 + other.m2 + delta**2 * self.n * other.n / n
        self.n = n

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, population std)`` per band."""
        return self.mean.copy(), np.sqrt(self.m2 / self.n)

    def rms(self) -> np.ndarray:
        """Root mean square per band, ``sqrt(mean^2 + variance)`` (NaN without values)."""
        if self.n == 0:
            return np.full(self.mean.shape, np.nan)
        return np.sqrt(self.mean**2 + self.m2 / self.n)

    def to_dict(self) -> dict:
        """JSON-ready ``{n, mean, m2}``."""
        return {"n": int(self.n), "mean": self.mean.tolist(), "m2": self.m2.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> Moments:
        """Inverse of :meth:`to_dict`."""
        return cls(int(d["n"]), np.asarray(d["mean"], dtype=np.float64), np.asarray(d["m2"], dtype=np.float64))


def stats_from_moments(moments: list[dict[str, Moments]], *, folds: list[int], patch_ids: list[int],
                       root: str) -> NormStats:
    """Merge the per-patch moments of the training patches (modality -> :class:`Moments`) into :class:`NormStats`.

    Raises:
        CropScaleError: no clear Sentinel-2 observation, or a band with zero variance (naming the folds).
    """
    total: dict[str, Moments] = {}
    for per_patch in moments:
        for modality, m in per_patch.items():
            total.setdefault(modality, Moments.empty(m.mean.shape[0])).merge(m)
    s2m = total.get("S2", Moments.empty(len(S2_BANDS)))
    if s2m.n == 0:
        raise CropScaleError(f"{root}: no clear Sentinel-2 observation in folds {list(folds)}; cannot compute"
                             " statistics")
    s2_mean, s2_std = s2m.result()
    if not (s2_std > 0).all():
        raise CropScaleError(
            f"{root}: a Sentinel-2 band has zero variance over folds {list(folds)}: std {s2_std.tolist()}"
        )
    s1, counts = {}, {"S2": s2m.n}
    for orbit in sorted(o for o in total if o != "S2"):
        acc = total[orbit]
        if acc.n == 0:
            continue
        mean, std = acc.result()
        if not (std > 0).all():
            raise CropScaleError(f"{root}: {orbit} VV or VH has zero variance over folds {list(folds)}")
        s1[orbit], counts[orbit] = (mean, std), acc.n
    return NormStats(s2_mean=s2_mean, s2_std=s2_std, s1=s1, folds=sorted(int(f) for f in folds),
                     patch_ids=list(patch_ids), counts=counts, root=str(root))
