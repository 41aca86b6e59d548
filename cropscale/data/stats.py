"""Per-band normalisation statistics, computed over the **training folds only** and applied to every sample.

They are applied the same way to every sample (training crops, validation and test patches); never per tile
or per batch.

Sentinel-2: mean and standard deviation of each band B02 ... B12 (reflectance x 1e4) over every
clear pixel of every date of every training patch (clear = not all bands 0, and ``DATA_S2_MASK`` marks
it clear when the root has masks; values under the mask, NaN included, are left out). Sentinel-1: per orbit,
VV and VH (dB) over the pixels that are finite and not both 0.
Moments are accumulated per date chunk in float64 and merged with the parallel variance formula
(Chan, Golub & LeVeque, 1979); the standard deviation is the population one. Normalised value:
``(x - mean) / std``.

Saved as JSON (``format: cropscale-norm-stats/1``) with the root, the folds and the patch ids it
was computed on, so that loading it for other training folds is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cropscale.batch import S1_BANDS, S2_BANDS
from cropscale.data.index import index_patches, open_npy
from cropscale.data.temporal import s1_pixel_validity, s2_pixel_validity
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


class _Moments:
    """Per-band count, mean and M2 merged chunk by chunk (parallel variance)."""

    def __init__(self, bands: int) -> None:
        self.n = 0
        self.mean = np.zeros(bands)
        self.m2 = np.zeros(bands)

    def update(self, x: np.ndarray, valid: np.ndarray) -> None:
        """``x`` ``[T, C, H, W]`` float64, ``valid`` ``[T, H, W]`` bool."""
        n_b = int(valid.sum())
        if n_b == 0:
            return
        v = valid[:, None]
        mean_b = np.where(v, x, 0.0).sum(axis=(0, 2, 3)) / n_b
        m2_b = np.where(v, (x - mean_b[None, :, None, None]) ** 2, 0.0).sum(axis=(0, 2, 3))
        n = self.n + n_b
        delta = mean_b - self.mean
        self.mean = self.mean + delta * n_b / n
        self.m2 = self.m2 + m2_b + delta**2 * self.n * n_b / n
        self.n = n

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        return self.mean.copy(), np.sqrt(self.m2 / self.n)


def compute_norm_stats(
    root: str | Path,
    folds: list[int],
    *,
    s1_orbits: tuple[str, ...] | list[str] = ("S1A", "S1D"),
    max_patches: int | None = None,
    chunk_dates: int = 16,
) -> NormStats:
    """Per-band statistics over the patches of ``folds`` (the training folds) under ``root``.

    Args:
        root: PASTIS-HD root.
        folds: training folds.
        s1_orbits: orbits to include when present.
        max_patches: use only the first ``max_patches`` patches in metadata order (None = all).
        chunk_dates: dates read at once per patch (bounds memory).

    Raises:
        CropScaleError: unreadable patch files (see :func:`cropscale.data.dataset.index_patches`),
            NaN or Inf in Sentinel-2 reflectance at a clear pixel (under the mask it is left out like
            any cloudy value), no clear observation at all, or a band with zero variance.
    """
    patches = index_patches(root, list(folds), s1_orbits=s1_orbits, hr_dir=None)
    if max_patches is not None:
        patches = patches[: int(max_patches)]
    s2m = _Moments(len(S2_BANDS))
    s1m: dict[str, _Moments] = {}
    for p in patches:
        s2 = open_npy(p.s2, patch_id=p.patch_id, what="S2")
        mask = open_npy(p.mask, patch_id=p.patch_id, what="S2 mask") if p.mask is not None else None
        for t0 in range(0, s2.shape[0], chunk_dates):
            x = np.asarray(s2[t0:t0 + chunk_dates], dtype=np.float64)
            valid = s2_pixel_validity(x)  # zero in every band is no data, whatever the mask says
            if mask is not None:
                valid &= np.asarray(mask[t0:t0 + chunk_dates]) > 0
            if not np.isfinite(x[np.broadcast_to(valid[:, None], x.shape)]).all():
                raise CropScaleError(f"patch {p.patch_id}: S2 file {p.s2}: non-finite reflectance (NaN or Inf)"
                                     " at a clear pixel")
            s2m.update(np.where(np.isfinite(x), x, 0.0), valid)
        for orbit, path in p.s1.items():
            arr = open_npy(path, patch_id=p.patch_id, what=orbit)
            acc = s1m.setdefault(orbit, _Moments(2))
            for t0 in range(0, arr.shape[0], chunk_dates):
                x = np.asarray(arr[t0:t0 + chunk_dates, :2], dtype=np.float64)
                valid = s1_pixel_validity(x)
                acc.update(np.where(np.isfinite(x), x, 0.0), valid)
    if s2m.n == 0:
        raise CropScaleError(
            f"{root}: no clear Sentinel-2 observation in folds {list(folds)}; cannot compute statistics"
        )
    s2_mean, s2_std = s2m.result()
    if not (s2_std > 0).all():
        raise CropScaleError(
            f"{root}: a Sentinel-2 band has zero variance over folds {list(folds)}: std {s2_std.tolist()}"
        )
    s1 = {}
    counts = {"S2": s2m.n}
    for orbit, acc in s1m.items():
        if acc.n == 0:
            continue
        mean, std = acc.result()
        if not (std > 0).all():
            raise CropScaleError(f"{root}: {orbit} VV or VH has zero variance over folds {list(folds)}")
        s1[orbit] = (mean, std)
        counts[orbit] = acc.n
    return NormStats(s2_mean=s2_mean, s2_std=s2_std, s1=s1, folds=sorted(int(f) for f in folds),
                     patch_ids=[p.patch_id for p in patches], counts=counts, root=str(root))
