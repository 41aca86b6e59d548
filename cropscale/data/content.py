"""Value checks of every patch a run will read, at setup, before the first step (bounded cost per patch).

:mod:`cropscale.data.index` checks file headers (shapes, dtypes, date counts). This module reads a
bounded sample of the values of one patch (:func:`scan_patch`), so that a bad validation or test patch
stops the run at setup rather than after a training epoch:

=============================  =================================================================
``ANNOTATIONS``                channel 0 whole (``[H, W]``): class ids in ``0..C-1`` or ``ignore_index``
``DATA_S2`` (+ ``_MASK``)      :data:`SAMPLE_DATES` whole dates, evenly spaced (first, middle, last):
                               NaN / Inf; the unit: the 99th percentile of ``|value|`` over the clear
                               pixels must reach :data:`S2_MIN_P99` (reflectance x 1e4 of 0.01;
                               reflectance in 0..1 or in percent stays far below); pixels the mask
                               marks clear whose ten bands are all 0 (no data, counted); a patch with
                               no clear observation on any date (decided over every date only when
                               the sampled dates have none); a mask value other than 0 / 1 (a
                               class-coded mask such as Sen2Cor's 4 / 9 is no validity mask); a
                               clear value below :data:`S2_MIN_VALUE` (a no-data value such as -9999
                               where the mask says clear)
``DATA_S1A`` / ``DATA_S1D``    the same dates, VV and VH: ``|value|`` (dB) within :data:`S1_MAX_ABS_DB`
                               for 99 % of the valid pixels, and below 0 dB for more than
                               :data:`S1_MIN_NEGATIVE_SHARE` of them (linear power or amplitude is never
                               negative; land backscatter in dB almost always is)
high-grid image                two one-pixel windows at opposite corners of the patch through
                               :class:`~cropscale.data.hr.HighGridReader` (CRS, transform, bands,
                               coverage of the whole patch)
=============================  =================================================================

Cost per patch does not grow with the series length ``T``: for a PASTIS patch (128 x 128, S2 int16, both
S1 orbits float32) 3 x 0.33 MB of S2, 2 x 3 x 0.13 MB of S1 (VV, VH), 16 kB of labels and two GeoTIFF
blocks, about 1.8 MB, so about 4.4 GB for all 2,433 PASTIS-HD patches when every fold is read; reading
the series whole would take ``T`` x 0.33 MB of S2 alone per patch. NaN in a date outside the sample is
still caught when that date is read (:class:`~cropscale.data.dataset.PastisHDDataset`).

A scan also keeps each band's root mean square over the sampled clear pixels; :func:`scale_warnings`
compares it with the training statistics: a patch whose every band is more than :data:`SCALE_FACTOR`
times larger, or every band that many times smaller, than the training folds' (``sqrt(mean^2 + std^2)``)
is on another scale or unit (Sentinel-1 in linear power instead of dB, for instance). Natural variation
(a cloudy or snowy patch, open water) moves the bands in different directions or by less; the finding is
a warning, not an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cropscale.batch import S1_BANDS, S2_BANDS
from cropscale.data.hr import HighGridReader, crop_bounds, high_grid_shape
from cropscale.data.index import PatchFiles, open_npy
from cropscale.data.stats import NormStats
from cropscale.data.temporal import s1_pixel_validity, s2_pixel_validity
from cropscale.errors import CropScaleError

SAMPLE_DATES = 3
"""Whole dates read per series (evenly spaced, first and last included)."""
S2_MIN_P99 = 100.0
"""Smallest 99th percentile of ``|value|`` over clear Sentinel-2 pixels for reflectance x 1e4 (= 0.01)."""
S1_MAX_ABS_DB = 100.0
"""Largest plausible ``|VV|``, ``|VH|`` in dB (land: about -50 .. +30 dB)."""
S1_MIN_NEGATIVE_SHARE = 0.05
"""Smallest share of valid VV, VH values below 0 dB (power below 1) for a series in dB: land backscatter is
about -25 .. 0 dB (VV) and -30 .. -5 dB (VH); linear power or amplitude has none below 0."""
S2_MIN_VALUE = -1000
"""Smallest plausible clear Sentinel-2 value in reflectance x 1e4 (the L2A offset of processing baseline 04.00
is -1000); a clear value below it is a no-data value (-9999, -32768) the mask does not mark."""
S2_MASK_VALUES = (0, 1)
"""Values of a ``DATA_S2_MASK`` validity mask: 0 cloud or no data, 1 clear."""
SCALE_FACTOR = 5.0
"""Factor by which every band of a patch must differ from the training statistics to be flagged."""
_CHUNK_DATES = 16


@dataclass
class BandMagnitude:
    """Root mean square of each band over the sampled clear pixels of one series.

    Attributes:
        rms: ``[C]`` float64, in the modality's unit (reflectance x 1e4, dB).
        count: clear pixel-dates it is computed over (0: no clear pixel in the sample).
    """

    rms: np.ndarray
    count: int


@dataclass
class PatchScan:
    """What :func:`scan_patch` found in one patch that is not an error.

    Attributes:
        patch_id, fold: the patch.
        files: modality (``S2``, ``S1A``, ``S1D``) -> file.
        magnitudes: modality -> :class:`BandMagnitude` of the sampled dates.
        dates_read: modality -> number of dates read.
        zero_but_clear: sampled Sentinel-2 pixel-dates the mask marks clear whose ten bands are all 0.
    """

    patch_id: int
    fold: int
    files: dict[str, Path] = field(default_factory=dict)
    magnitudes: dict[str, BandMagnitude] = field(default_factory=dict)
    dates_read: dict[str, int] = field(default_factory=dict)
    zero_but_clear: int = 0


def sample_dates(t: int, k: int = SAMPLE_DATES) -> np.ndarray:
    """Indices of ``min(k, t)`` evenly spaced dates of a series of ``t``: ``round(linspace(0, t - 1, k))``."""
    return np.unique(np.round(np.linspace(0, t - 1, min(k, t))).astype(np.int64))


def label_problem(labels: np.ndarray, num_classes: int, ignore_index: int | None) -> str | None:
    """Why the class ids ``labels`` (``[H, W]`` integers) are not valid, or None.

    Valid: ``0 <= id < num_classes``, or ``id == ignore_index``. The message names the first bad pixel.
    """
    labels = np.asarray(labels).astype(np.int64)
    bad = (labels < 0) | (labels >= num_classes)
    if ignore_index is not None:
        bad &= labels != ignore_index
    if not bad.any():
        return None
    r, c = np.argwhere(bad)[0]
    return (f"class id {int(labels[r, c])} at pixel ({int(r)}, {int(c)}) is outside 0..{num_classes - 1} "
            f"(num_classes {num_classes}, ignore_index {ignore_index})")


def nonfinite_s2_message(p: PatchFiles, data: np.ndarray, dates: np.ndarray, y0: int = 0, x0: int = 0,
                         clear: np.ndarray | None = None) -> str | None:
    """The error for NaN / Inf in Sentinel-2 values ``data`` ``[t, 10, h, w]``, or None when all are finite.

    ``dates`` are the date indices of ``data`` in the series, ``(y0, x0)`` its top-left pixel in the patch.
    ``clear`` (``[t, h, w]`` bool, None = every pixel): only these pixels count; NaN or Inf under a cloud
    mask is accepted (the dataset sets masked values to 0).
    """
    if data.dtype.kind != "f" or np.isfinite(data).all():
        return None
    bad = ~np.isfinite(data)
    if clear is not None:
        bad &= np.asarray(clear, dtype=bool)[:, None]
    if not bad.any():
        return None
    bad = np.argwhere(bad)[0]
    where = "" if clear is None else " at a clear pixel,"
    return (f"patch {p.patch_id}: S2 file {p.s2}: non-finite reflectance (NaN or Inf){where} at date index "
            f"{int(dates[bad[0]])}, band {S2_BANDS[bad[1]]}, pixel ({y0 + int(bad[2])}, {x0 + int(bad[3])})")


def nodata_s2_message(p: PatchFiles, data: np.ndarray, dates: np.ndarray, y0: int = 0, x0: int = 0,
                      clear: np.ndarray | None = None) -> str | None:
    """The error for a clear Sentinel-2 value below :data:`S2_MIN_VALUE` (a no-data value), or None.

    Arguments as in :func:`nonfinite_s2_message`; NaN is left to that function.
    """
    with np.errstate(invalid="ignore"):
        low = np.asarray(data) < S2_MIN_VALUE
    if clear is not None:
        low &= np.asarray(clear, dtype=bool)[:, None]
    if not low.any():
        return None
    n = int(low.sum())
    at = np.argwhere(low)[0]
    value = np.asarray(data)[tuple(at)]
    return (f"patch {p.patch_id}: S2 file {p.s2}: reflectance {value:.6g} at a pixel the mask calls clear (date "
            f"index {int(dates[at[0]])}, band {S2_BANDS[at[1]]}, pixel ({y0 + int(at[2])}, {x0 + int(at[3])}); "
            f"{n} such value(s) read): a no-data value? Reflectance x 1e4 is >= {S2_MIN_VALUE}; mark those "
            "pixels 0 in DATA_S2_MASK or store no data as 0 in all ten bands")


def mask_value_message(p: PatchFiles, mask: np.ndarray) -> str | None:
    """The error for a ``DATA_S2_MASK`` whose values are not 0 / 1 (:data:`S2_MASK_VALUES`), or None."""
    if mask.dtype == bool:
        return None
    values = np.unique(mask)
    bad = values[~np.isin(values, S2_MASK_VALUES)]
    if bad.size == 0:
        return None
    shown = ", ".join(f"{v:g}" for v in values[:8]) + (" ..." if values.size > 8 else "")
    return (f"patch {p.patch_id}: S2 mask file {p.mask}: values {shown} in the sampled dates; a validity mask holds "
            "0 (cloud or no data) and 1 (clear) only (a scene-classification layer such as Sen2Cor's 4 = "
            "vegetation, 9 = cloud is no validity mask: convert it to 0/1 first)")


def no_clear_observation(p: PatchFiles, s2: np.ndarray, mask: np.ndarray | None) -> str | None:
    """The error for a patch with no clear Sentinel-2 pixel on any date, or None.

    Clear: the mask says so (when there is one) and not all ten bands are 0. Reads the mask whole and the
    series by chunks of dates (only the dates the mask marks clear).
    """
    t = s2.shape[0]
    if mask is not None:
        clear = np.asarray(mask) > 0
        if not clear.any():
            return (f"patch {p.patch_id}: all {t} dates invalid: S2 mask file {p.mask} marks no clear "
                    "observation; remove the patch or fix the mask")
        dates = np.flatnonzero(clear.reshape(t, -1).any(axis=1))
        for i in range(0, dates.size, _CHUNK_DATES):
            chunk = dates[i:i + _CHUNK_DATES]
            if (clear[chunk] & s2_pixel_validity(np.asarray(s2[chunk]))).any():
                return None
        return (f"patch {p.patch_id}: all {t} dates invalid: S2 file {p.s2} is no data (all bands 0) wherever "
                f"S2 mask file {p.mask} marks a clear observation; remove the patch or fix the file")
    for i in range(0, t, _CHUNK_DATES):
        if s2_pixel_validity(np.asarray(s2[i:i + _CHUNK_DATES])).any():
            return None
    return (f"patch {p.patch_id}: all {t} dates invalid: S2 file {p.s2} is no data (all bands 0) everywhere; "
            "remove the patch")


def _magnitude(values: np.ndarray, valid: np.ndarray) -> BandMagnitude:
    """RMS per band of ``values`` ``[t, C, h, w]`` over ``valid`` ``[t, h, w]``."""
    n = int(valid.sum())
    if n == 0:
        return BandMagnitude(np.full(values.shape[1], np.nan), 0)
    x = values.astype(np.float64)
    return BandMagnitude(np.sqrt(np.einsum("tchw,tchw,thw->c", x, x, valid.astype(np.float64)) / n), n)


def _share_at_least(values: np.ndarray, valid: np.ndarray, threshold: float) -> float:
    """Fraction of the band values of the ``valid`` pixels whose magnitude is ``>= threshold``."""
    big = np.count_nonzero((np.abs(values) >= threshold) & valid[:, None])
    return big / (int(valid.sum()) * values.shape[1])


def _p99_abs(values: np.ndarray, valid: np.ndarray) -> float:
    """99th percentile of ``|value|`` over the bands of the ``valid`` pixels (for messages)."""
    return float(np.percentile(np.abs(values.transpose(1, 0, 2, 3)[:, valid]), 99))


def _scan_s2(p: PatchFiles, scan: PatchScan) -> None:
    s2 = open_npy(p.s2, patch_id=p.patch_id, what="S2")
    mask = open_npy(p.mask, patch_id=p.patch_id, what="S2 mask") if p.mask is not None else None
    dates = sample_dates(s2.shape[0])
    data = np.asarray(s2[dates])
    present = s2_pixel_validity(data)  # NaN is not 0: a NaN pixel is present unless the mask says cloud
    if mask is not None:
        marked = np.asarray(mask[dates])
        message = mask_value_message(p, marked)
        if message:
            raise CropScaleError(message)
        marked = marked > 0
        valid = marked & present
        scan.zero_but_clear = int((marked & ~present).sum())
    else:
        valid = present
    message = nonfinite_s2_message(p, data, dates, clear=valid) or nodata_s2_message(p, data, dates, clear=valid)
    if message:
        raise CropScaleError(message)
    data = np.where(np.isfinite(data), data, 0) if data.dtype.kind == "f" else data  # NaN under the mask only
    if not valid.any():
        message = no_clear_observation(p, s2, mask)
        if message:
            raise CropScaleError(message)
    scan.files["S2"], scan.dates_read["S2"] = p.s2, int(dates.size)
    scan.magnitudes["S2"] = _magnitude(data, valid)
    if valid.any() and _share_at_least(data, valid, S2_MIN_P99) < 0.01:  # i.e. 99th percentile below
        raise CropScaleError(
            f"patch {p.patch_id}: S2 file {p.s2}: values look like reflectance in 0..1 or in percent, not "
            f"reflectance x 1e4: the 99th percentile of |value| over the clear pixels of {dates.size} sampled "
            f"dates is {_p99_abs(data, valid):.3g} (x 1e4, even dark water reads a few hundred)"
        )


def _scan_s1(p: PatchFiles, orbit: str, path: Path, scan: PatchScan) -> None:
    arr = open_npy(path, patch_id=p.patch_id, what=orbit)
    dates = sample_dates(arr.shape[0])
    data = np.asarray(arr[dates, :len(S1_BANDS)], dtype=np.float64)
    valid = s1_pixel_validity(data)
    scan.files[orbit], scan.dates_read[orbit] = path, int(dates.size)
    scan.magnitudes[orbit] = _magnitude(np.where(np.isfinite(data), data, 0.0), valid)
    if valid.any() and _share_at_least(data, valid, np.nextafter(S1_MAX_ABS_DB, np.inf)) > 0.01:
        raise CropScaleError(
            f"patch {p.patch_id}: {orbit} file {path}: values are not backscatter in dB: the 99th percentile "
            f"of |VV|, |VH| over {dates.size} sampled dates is {_p99_abs(data, valid):.3g} (dB over land: about"
            " -50 .. +30)"
        )
    if valid.any():
        negative = np.count_nonzero((data < 0) & valid[:, None]) / (int(valid.sum()) * data.shape[1])
        if negative < S1_MIN_NEGATIVE_SHARE:
            raise CropScaleError(
                f"patch {p.patch_id}: {orbit} file {path}: values look like linear power or amplitude, not "
                f"backscatter in dB: {100 * negative:.3g} % of VV, VH over {dates.size} sampled dates are below 0 "
                f"(median {np.median(data.transpose(1, 0, 2, 3)[:, valid]):.3g}; dB over land: about -25 .. 0); "
                "convert with 10 * log10(power)"
            )


def _scan_high_grid(p: PatchFiles, reader: HighGridReader) -> None:
    """Two one-pixel reads at opposite corners: the image must cover the whole patch."""
    h, w = p.hw
    for corner in ((0, 0), (h - 1, w - 1)):
        bounds = crop_bounds(p.geo.bounds, p.hw, corner, (1, 1))
        reader.read(p.hr, crs=p.geo.crs, bounds=bounds, out_hw=high_grid_shape((1, 1)), where=f"patch {p.patch_id}")


def scan_patch(p: PatchFiles, *, num_classes: int, ignore_index: int | None,
               hr_reader: HighGridReader | None = None) -> PatchScan:
    """Check a bounded sample of the values of patch ``p`` (the table of the module docstring).

    Args:
        p: the patch, indexed by :func:`~cropscale.data.index.index_patches`.
        num_classes: class count ``C``.
        ignore_index: class id allowed beyond ``C`` (None = none).
        hr_reader: reader of the high-grid image (None: the image is not checked).

    Returns:
        :class:`PatchScan` with the per-band magnitudes and the counts for warnings.

    Raises:
        CropScaleError: class ids out of range, NaN / Inf in the sampled Sentinel-2 dates, no clear
            Sentinel-2 observation on any date, Sentinel-2 values not in reflectance x 1e4 or a no-data
            value at a clear pixel, a mask not coded 0 / 1, Sentinel-1 values not in dB, a high-grid image
            that cannot be read over the whole patch; each names the patch and the file.
    """
    target = open_npy(p.target, patch_id=p.patch_id, what="TARGET")
    problem = label_problem(np.asarray(target[0] if target.ndim == 3 else target), num_classes, ignore_index)
    if problem:
        raise CropScaleError(f"patch {p.patch_id}: TARGET file {p.target}: {problem}")
    scan = PatchScan(patch_id=p.patch_id, fold=p.fold)
    _scan_s2(p, scan)
    for orbit, path in p.s1.items():
        _scan_s1(p, orbit, path, scan)
    if hr_reader is not None and p.hr is not None and p.geo is not None:
        _scan_high_grid(p, hr_reader)
    return scan


def _training_rms(stats: NormStats, modality: str) -> np.ndarray | None:
    if modality == "S2":
        return np.sqrt(stats.s2_mean**2 + stats.s2_std**2)
    if modality in stats.s1:
        mean, std = stats.s1[modality]
        return np.sqrt(mean**2 + std**2)
    return None


def scale_warnings(scans: list[PatchScan], stats: NormStats, factor: float = SCALE_FACTOR) -> list[str]:
    """One line per patch and modality whose every band is ``factor`` times off the training statistics.

    Args:
        scans: the patches' scans (:func:`scan_patch`).
        stats: the training folds' statistics.
        factor: how far every band must be, in the same direction (> 1).

    Returns:
        Messages naming the patch, its fold, the modality, the file and the band ratios.
    """
    out = []
    for scan in scans:
        for modality, mag in scan.magnitudes.items():
            reference = _training_rms(stats, modality)
            if mag.count == 0 or reference is None:
                continue
            ratio = mag.rms / reference
            if not (ratio.max() < 1.0 / factor or ratio.min() > factor):
                continue
            unit = "reflectance x 1e4" if modality == "S2" else "dB"
            out.append(
                f"patch {scan.patch_id} (fold {scan.fold}): {modality} file {scan.files[modality]}: every band's "
                f"magnitude is {ratio.min():.3g}..{ratio.max():.3g} x that of the training statistics (folds "
                f"{stats.folds}) over {scan.dates_read[modality]} sampled dates: another unit or scale than "
                f"{unit}?"
            )
    return out


def zero_but_clear_warning(scans: list[PatchScan], shown: int = 5) -> str | None:
    """One line for the patches whose mask marks pixels clear that are no data (all ten bands 0), or None."""
    hits = [(s.patch_id, s.zero_but_clear) for s in scans if s.zero_but_clear]
    if not hits:
        return None
    listed = ", ".join(f"{pid} ({n})" for pid, n in hits[:shown]) + (" ..." if len(hits) > shown else "")
    return (f"{len(hits)} patch(es) have Sentinel-2 pixels that DATA_S2_MASK marks clear but that are 0 in all ten "
            f"bands, i.e. no data, and are treated as such (sampled pixel-dates per patch: {listed})")
