"""Value checks of every patch a run reads: every value of every date, once per file, before the first step.

:mod:`cropscale.data.index` checks file headers (shapes, dtypes, date counts). :func:`scan_patch` reads every
value of a patch once, date chunk by date chunk, so that a bad value anywhere (a validation or test patch, a
date in the middle of a series) stops the run at setup with the file, the patch and the date index, rather than
training on it or failing after an epoch:

=============================  =================================================================
``ANNOTATIONS``                channel 0 whole (``[H, W]``): class ids in ``0..C-1`` or ``ignore_index``
``DATA_S2_MASK``               every value 0 or 1 (:data:`S2_MASK_VALUES`): a class-coded mask such as
                               Sen2Cor's 4 / 9, or any other value, is an error, never "clear"
``DATA_S2`` (with the mask)    every date: NaN / Inf or a value below :data:`S2_MIN_VALUE` (a no-data value
                               such as -9999) at a pixel the mask marks clear; the unit, per date: at least
                               1 % of the clear values reach :data:`S2_MIN_P99` (reflectance x 1e4 of 0.01;
                               reflectance in 0..1 or in percent stays far below); pixels the mask marks
                               clear whose ten bands are all 0 (no data, counted); a patch with no clear
                               observation on any date
``DATA_S1A`` / ``DATA_S1D``    every date, VV and VH: ``|value|`` (dB) within :data:`S1_MAX_ABS_DB` for 99 %
                               of the valid pixels, and below 0 dB for more than
                               :data:`S1_MIN_NEGATIVE_SHARE` of them (linear power or amplitude is never
                               negative; land backscatter in dB almost always is)
high-grid image                two one-pixel windows at opposite corners of the patch through
                               :class:`~cropscale.data.hr.HighGridReader` (CRS, transform, bands,
                               coverage of the whole patch)
=============================  =================================================================

The unit rules are judged per date on dates with at least :data:`MIN_PIXELS_PER_DATE` valid pixels; the sparser
dates of a series are judged together (:func:`first_failing_date`). The same pass accumulates each band's
moments over the valid pixels (:class:`~cropscale.data.stats.Moments`): the training folds' normalisation
statistics come from them, so a training array is read once for both. A scan's result is cached by
:mod:`cropscale.data.scans` under the files' sizes and modification times: a second run reads no value.

Cost: one read of every array of the patches the stage uses (PASTIS: about 16 MB of Sentinel-2 and 2 x 14 MB of
Sentinel-1 per patch), once; ``loader-bench`` prints it (``docs/01_first_run.md``, "Data checks"). The dataset
also checks the values each sample reads (mask values, NaN / no-data at clear pixels, class ids;
:class:`~cropscale.data.dataset.PastisHDDataset`), so a file changed after its scan is still caught.

:func:`scale_warnings` compares each patch's per-band root mean square with the training statistics
(``sqrt(mean^2 + std^2)``): a patch whose every band is more than :data:`SCALE_FACTOR` times larger, or every
band that many times smaller, is on another scale or unit (a warning, not an error: natural variation moves the
bands in different directions or by less).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cropscale.batch import S1_BANDS, S2_BANDS
from cropscale.data.hr import HighGridReader, crop_bounds, high_grid_shape
from cropscale.data.index import PatchFiles, open_npy
from cropscale.data.stats import Moments, NormStats
from cropscale.data.temporal import s1_pixel_validity, s2_pixel_validity
from cropscale.errors import CropScaleError

S2_MIN_P99 = 100.0
"""Value (reflectance x 1e4, = 0.01) that at least 1 % of a date's clear Sentinel-2 values reach."""
S1_MAX_ABS_DB = 100.0
"""Largest plausible ``|VV|``, ``|VH|`` in dB (land: about -50 .. +30 dB)."""
S1_MIN_NEGATIVE_SHARE = 0.05
"""Smallest share of valid VV, VH values below 0 dB (power below 1) for a date in dB: land backscatter is
about -25 .. 0 dB (VV) and -30 .. -5 dB (VH); linear power or amplitude has none below 0."""
S2_MIN_VALUE = -1000
"""Smallest plausible clear Sentinel-2 value in reflectance x 1e4 (the L2A offset of processing baseline 04.00
is -1000); a clear value below it is a no-data value (-9999, -32768) the mask does not mark."""
S2_MASK_VALUES = (0, 1)
"""Values of a ``DATA_S2_MASK`` validity mask: 0 cloud or no data, 1 clear."""
MIN_PIXELS_PER_DATE = 16
"""Valid pixels a date needs for the unit rules to judge it alone; sparser dates are judged together."""
SCALE_FACTOR = 5.0
"""Factor by which every band of a patch must differ from the training statistics to be flagged."""
CHUNK_DATES = 16
"""Dates read at once (bounds memory: 16 x 0.33 MB for a 128 x 128 Sentinel-2 patch)."""
SCAN_FORMAT = "cropscale-data-scan/2"
"""Version of what :func:`scan_patch` checks and returns (a cached scan of another version is not used)."""


@dataclass
class PatchScan:
    """What :func:`scan_patch` found in one patch that is not an error.

    Attributes:
        patch_id, fold: the patch.
        files: modality (``S2``, ``S1A``, ``S1D``) -> file.
        moments: modality -> per-band :class:`~cropscale.data.stats.Moments` over the valid pixels of every date.
        dates_read: modality -> number of dates read (all of them).
        zero_but_clear: Sentinel-2 pixel-dates the mask marks clear whose ten bands are all 0.
        checked: the values were checked (False: only the moments were accumulated, ``check_values=False``).
    """

    patch_id: int
    fold: int
    files: dict[str, Path] = field(default_factory=dict)
    moments: dict[str, Moments] = field(default_factory=dict)
    dates_read: dict[str, int] = field(default_factory=dict)
    zero_but_clear: int = 0
    checked: bool = True

    def to_dict(self) -> dict:
        """JSON-ready form (the scan cache's entry)."""
        return {"patch_id": self.patch_id, "fold": self.fold, "files": {k: str(v) for k, v in self.files.items()},
                "moments": {k: m.to_dict() for k, m in self.moments.items()}, "dates_read": dict(self.dates_read),
                "zero_but_clear": self.zero_but_clear, "checked": self.checked}

    @classmethod
    def from_dict(cls, d: dict) -> PatchScan:
        """Inverse of :meth:`to_dict`."""
        return cls(patch_id=int(d["patch_id"]), fold=int(d["fold"]), files={k: Path(v) for k, v in d["files"].items()},
                   moments={k: Moments.from_dict(m) for k, m in d["moments"].items()},
                   dates_read={k: int(v) for k, v in d["dates_read"].items()},
                   zero_but_clear=int(d["zero_but_clear"]), checked=bool(d["checked"]))


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


def mask_value_message(p: PatchFiles, mask: np.ndarray, dates: np.ndarray, y0: int = 0, x0: int = 0) -> str | None:
    """The error for ``DATA_S2_MASK`` values ``mask`` ``[t, h, w]`` other than 0 / 1 (:data:`S2_MASK_VALUES`), or None.

    ``dates`` are the date indices of ``mask`` in the series, ``(y0, x0)`` its top-left pixel in the patch. The
    message names the first bad value's date index and pixel, and the values found.
    """
    mask = np.asarray(mask)
    if mask.dtype == bool:
        return None
    if mask.dtype.kind in "iu":
        if mask.size == 0 or (mask.min() >= 0 and mask.max() <= 1):  # two reductions: the common case
            return None
        bad = (mask != 0) & (mask != 1)
    else:
        bad = (mask != 0) & (mask != 1)
        if not bad.any():
            return None
    t, r, c = np.argwhere(bad)[0]
    values = np.unique(mask)
    shown = ", ".join(f"{v:g}" for v in values[:8]) + (" ..." if values.size > 8 else "")
    return (f"patch {p.patch_id}: S2 mask file {p.mask}: value {mask[t, r, c]:g} at date index {int(dates[t])}, pixel"
            f" ({y0 + int(r)}, {x0 + int(c)}) ({int(bad.sum())} such value(s); values {shown} in dates"
            f" {int(dates[0])}..{int(dates[-1])}); a validity mask holds 0 (cloud or no data) and 1 (clear) only (a"
            " scene-classification layer such as Sen2Cor's 4 = vegetation, 9 = cloud is no validity mask: convert it"
            " to 0/1 first)")


def clear_mask(mask: np.ndarray) -> np.ndarray:
    """``DATA_S2_MASK`` values (checked 0 / 1, or bool) -> bool, True = clear."""
    return np.asarray(mask) == 1


def no_clear_observation(p: PatchFiles, s2: np.ndarray, mask: np.ndarray | None) -> str | None:
    """The error for a patch with no clear Sentinel-2 pixel on any date, or None.

    Clear: the mask says so (when there is one) and not all ten bands are 0. Reads the mask whole and the
    series by chunks of dates (only the dates the mask marks clear).
    """
    t = s2.shape[0]
    if mask is not None:
        clear = clear_mask(mask)
        if not clear.any():
            return (f"patch {p.patch_id}: all {t} dates invalid: S2 mask file {p.mask} marks no clear "
                    "observation; remove the patch or fix the mask")
        dates = np.flatnonzero(clear.reshape(t, -1).any(axis=1))
        for i in range(0, dates.size, CHUNK_DATES):
            chunk = dates[i:i + CHUNK_DATES]
            if (clear[chunk] & s2_pixel_validity(np.asarray(s2[chunk]))).any():
                return None
        return (f"patch {p.patch_id}: all {t} dates invalid: S2 file {p.s2} is no data (all bands 0) wherever "
                f"S2 mask file {p.mask} marks a clear observation; remove the patch or fix the file")
    for i in range(0, t, CHUNK_DATES):
        if s2_pixel_validity(np.asarray(s2[i:i + CHUNK_DATES])).any():
            return None
    return (f"patch {p.patch_id}: all {t} dates invalid: S2 file {p.s2} is no data (all bands 0) everywhere; "
            "remove the patch")


def first_failing_date(values: np.ndarray, hits: np.ndarray, threshold: float, *, below: bool,
                       minimum: int) -> tuple[int, float, int] | None:
    """The first date whose share ``hits / values`` breaks a unit rule, or None.

    Args:
        values: ``[T]`` valid values counted on each date.
        hits: ``[T]`` of those, the ones the rule counts (e.g. below 0 dB).
        threshold: the share the rule compares with.
        below: the rule fails when the share is below ``threshold`` (else: above it).
        minimum: values a date needs to be judged alone; the dates with fewer (but some) are judged together,
            when they hold ``minimum`` values in all.

    Returns:
        ``(date index, share, values judged)``; for the dates judged together, the first of them.
    """
    values, hits = np.asarray(values, dtype=np.int64), np.asarray(hits, dtype=np.int64)
    alone = values >= minimum
    share = hits / np.maximum(values, 1)
    failing = alone & ((share < threshold) if below else (share > threshold))
    if failing.any():
        t = int(np.flatnonzero(failing)[0])
        return t, float(share[t]), int(values[t])
    sparse = ~alone & (values > 0)
    n = int(values[sparse].sum())
    if n < minimum:
        return None
    pooled = float(hits[sparse].sum()) / n
    if (pooled < threshold) if below else (pooled > threshold):
        return int(np.flatnonzero(sparse)[0]), pooled, n
    return None


def _raise(message: str | None) -> None:
    if message:
        raise CropScaleError(message)


def _s2_unit_message(p: PatchFiles, values: np.ndarray, hits: np.ndarray) -> str | None:
    found = first_failing_date(values, hits, 0.01, below=True, minimum=MIN_PIXELS_PER_DATE * len(S2_BANDS))
    if found is None:
        return None
    t, share, n = found
    return (f"patch {p.patch_id}: S2 file {p.s2}: values look like reflectance in 0..1 or in percent, not reflectance"
            f" x 1e4: at date index {t}, {100 * share:.3g} % of {n} clear band values reach {S2_MIN_P99:g} (x 1e4;"
            " even dark water reads a few hundred in most bands)")


def _scan_s2(p: PatchFiles, scan: PatchScan, check: bool) -> None:
    """Every date of the Sentinel-2 series (and its mask) of ``p``: checks, moments, no-data counts."""
    s2 = open_npy(p.s2, patch_id=p.patch_id, what="S2")
    mask = open_npy(p.mask, patch_id=p.patch_id, what="S2 mask") if p.mask is not None else None
    t_all = s2.shape[0]
    moments, marked_any = Moments.empty(len(S2_BANDS)), False
    values, hits = np.zeros(t_all, dtype=np.int64), np.zeros(t_all, dtype=np.int64)
    for t0 in range(0, t_all, CHUNK_DATES):
        dates = np.arange(t0, min(t_all, t0 + CHUNK_DATES))
        data = np.asarray(s2[t0:t0 + CHUNK_DATES])
        valid = s2_pixel_validity(data)  # NaN is not 0: a NaN pixel is present unless the mask says cloud
        if mask is not None:
            marked = np.asarray(mask[t0:t0 + CHUNK_DATES])
            if check:
                _raise(mask_value_message(p, marked, dates))
            marked = clear_mask(marked)
            marked_any = marked_any or bool(marked.any())
            scan.zero_but_clear += int((marked & ~valid).sum())
            valid &= marked
        _raise(nonfinite_s2_message(p, data, dates, clear=valid))  # the statistics cannot hold one
        if check:
            _raise(nodata_s2_message(p, data, dates, clear=valid))
            values[dates] = valid.sum(axis=(1, 2)) * len(S2_BANDS)
            hits[dates] = ((np.abs(data) >= S2_MIN_P99) & valid[:, None]).sum(axis=(1, 2, 3))
        moments.update(data, valid)  # the valid values only: NaN under the mask is never read
    if moments.n == 0:
        _raise(f"patch {p.patch_id}: all {t_all} dates invalid: S2 mask file {p.mask} marks no clear observation;"
               " remove the patch or fix the mask" if mask is not None and not marked_any else
               no_clear_observation(p, s2, mask))
    if check:
        _raise(_s2_unit_message(p, values, hits))
    scan.files["S2"], scan.dates_read["S2"], scan.moments["S2"] = p.s2, t_all, moments


def _s1_unit_message(p: PatchFiles, orbit: str, path: Path, values: np.ndarray, huge: np.ndarray,
                     negative: np.ndarray) -> str | None:
    minimum = MIN_PIXELS_PER_DATE * len(S1_BANDS)
    found = first_failing_date(values, huge, 0.01, below=False, minimum=minimum)
    if found is not None:
        t, share, n = found
        return (f"patch {p.patch_id}: {orbit} file {path}: values are not backscatter in dB: at date index {t},"
                f" {100 * share:.3g} % of {n} VV, VH values exceed {S1_MAX_ABS_DB:g} in magnitude (dB over land:"
                " about -50 .. +30)")
    found = first_failing_date(values, negative, S1_MIN_NEGATIVE_SHARE, below=True, minimum=minimum)
    if found is not None:
        t, share, n = found
        return (f"patch {p.patch_id}: {orbit} file {path}: values look like linear power or amplitude, not"
                f" backscatter in dB: at date index {t}, {100 * share:.3g} % of {n} VV, VH values are below 0 (dB over"
                " land: about -25 .. 0); convert with 10 * log10(power)")
    return None


def _scan_s1(p: PatchFiles, orbit: str, path: Path, scan: PatchScan, check: bool) -> None:
    """Every date of one Sentinel-1 series of ``p`` (VV, VH): unit checks and moments."""
    arr = open_npy(path, patch_id=p.patch_id, what=orbit)
    t_all = arr.shape[0]
    moments = Moments.empty(len(S1_BANDS))
    values, huge, negative = (np.zeros(t_all, dtype=np.int64) for _ in range(3))
    for t0 in range(0, t_all, CHUNK_DATES):
        dates = np.arange(t0, min(t_all, t0 + CHUNK_DATES))
        data = np.asarray(arr[t0:t0 + CHUNK_DATES, :len(S1_BANDS)])  # float32 (or int): the moments sum in float64
        valid = s1_pixel_validity(data)
        if check:
            counted = valid[:, None]
            values[dates] = valid.sum(axis=(1, 2)) * len(S1_BANDS)
            with np.errstate(invalid="ignore"):
                huge[dates] = ((np.abs(data) > S1_MAX_ABS_DB) & counted).sum(axis=(1, 2, 3))
                negative[dates] = ((data < 0) & counted).sum(axis=(1, 2, 3))
        moments.update(data, valid)  # valid: finite
    if check:
        _raise(_s1_unit_message(p, orbit, path, values, huge, negative))
    scan.files[orbit], scan.dates_read[orbit], scan.moments[orbit] = path, t_all, moments


def check_high_grid(p: PatchFiles, reader: HighGridReader) -> None:
    """Two one-pixel reads at opposite corners of ``p``'s high-grid image (if any): it must cover the whole patch.

    Raises:
        CropScaleError: the image cannot be read over the patch (:class:`~cropscale.data.hr.HighGridReader`).
    """
    if p.hr is None or p.geo is None:
        return
    h, w = p.hw
    for corner in ((0, 0), (h - 1, w - 1)):
        bounds = crop_bounds(p.geo.bounds, p.hw, corner, (1, 1))
        reader.read(p.hr, crs=p.geo.crs, bounds=bounds, out_hw=high_grid_shape((1, 1)), where=f"patch {p.patch_id}")


def scan_patch(p: PatchFiles, *, num_classes: int, ignore_index: int | None,
               hr_reader: HighGridReader | None = None, check: bool = True) -> PatchScan:
    """Check every value of patch ``p`` (the table of the module docstring) and accumulate its band moments.

    Args:
        p: the patch, indexed by :func:`~cropscale.data.index.index_patches`.
        num_classes: class count ``C``.
        ignore_index: class id allowed beyond ``C`` (None = none).
        hr_reader: reader of the high-grid image (None: the image is not checked).
        check: False: only the moments (for the statistics), no check but NaN / Inf at a clear Sentinel-2
            pixel, which no statistic can hold (``check_values=False``).

    Returns:
        :class:`PatchScan` with the per-band moments and the counts for warnings.

    Raises:
        CropScaleError: class ids out of range, a mask value other than 0 / 1, NaN / Inf or a no-data value at a
            clear Sentinel-2 pixel, no clear Sentinel-2 observation on any date, a date not in reflectance x 1e4
            or not in dB, a high-grid image that cannot be read over the whole patch; each names the patch, the
            file and, for a value, its date index.
    """
    if check:
        target = open_npy(p.target, patch_id=p.patch_id, what="TARGET")
        problem = label_problem(np.asarray(target[0] if target.ndim == 3 else target), num_classes, ignore_index)
        _raise(f"patch {p.patch_id}: TARGET file {p.target}: {problem}" if problem else None)
    scan = PatchScan(patch_id=p.patch_id, fold=p.fold, checked=check)
    _scan_s2(p, scan, check)
    for orbit, path in p.s1.items():
        _scan_s1(p, orbit, path, scan, check)
    if check and hr_reader is not None:
        check_high_grid(p, hr_reader)
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
        for modality, moments in scan.moments.items():
            reference = _training_rms(stats, modality)
            if moments.n == 0 or reference is None:
                continue
            ratio = moments.rms() / reference
            if not (ratio.max() < 1.0 / factor or ratio.min() > factor):
                continue
            unit = "reflectance x 1e4" if modality == "S2" else "dB"
            out.append(
                f"patch {scan.patch_id} (fold {scan.fold}): {modality} file {scan.files[modality]}: every band's "
                f"magnitude is {ratio.min():.3g}..{ratio.max():.3g} x that of the training statistics (folds "
                f"{stats.folds}) over its {scan.dates_read[modality]} dates: another unit or scale than "
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
            f"bands, i.e. no data, and are treated as such (pixel-dates per patch: {listed})")
