"""The file index of a PASTIS-HD root: every patch's files resolved and checked before training.

Layout read under ``root`` (PASTIS, Sainte Fare Garnot & Landrieu, ICCV 2021; PASTIS-R, ISPRS J.
2022; PASTIS-HD adds ``DATA_SPOT``); the table is in :mod:`cropscale.data.dataset`, which folders are read in
:mod:`cropscale.data.layout` (resolved once per run, before the index).

Checks (each error names the patch and the file): missing or unreadable ``.npy`` (truncated, bad
header), wrong number of dimensions or bands, a dtype that cannot hold the modality's unit (8-bit
Sentinel-2, unsigned or 8-bit Sentinel-1), spatial shapes that disagree, metadata date counts that
differ from the array's ``T``, a high-grid image for a patch the metadata cannot georeference. Only
array headers are read (memory maps), no pixel data; the values are checked by
:mod:`cropscale.data.content`.

Files of patches that ``metadata.geojson`` does not list are never read; :func:`orphan_files` counts
them for one warning (the reverse, a listed patch without its files, is an error).

Documented fallbacks (one warning lists the patches): when ``DATA_S1A``/``DATA_S1D``,
``INSTANCE_ANNOTATIONS`` or the high-grid directory exists but one patch's file is absent, that
sample has the orbit absent, no parcel target or no high-grid target. A modality folder absent from the
whole data set is :mod:`cropscale.data.layout`'s.
"""

from __future__ import annotations

import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cropscale.batch import S2_BANDS
from cropscale.data.layout import DataLayout
from cropscale.data.metadata import PatchGeo, PatchRecord, day_of_year
from cropscale.errors import CropScaleError, DataWarning


@dataclass
class PatchFiles:
    """Resolved files, shapes and dates of one patch (built and checked by :func:`index_patches`).

    Attributes:
        patch_id, fold: from the metadata.
        hw: ``(H, W)`` in 10 m pixels.
        s2: ``DATA_S2`` file; ``s2_t`` its number of dates.
        mask: ``DATA_S2_MASK`` file or None.
        s1: orbit -> file for the orbits present for this patch.
        target, instances, hr: files (``instances`` and ``hr`` may be None).
        doy: modality -> ``[T]`` int64 day of year of each date.
        geo: the patch polygon (projected CRS) or None.
    """

    patch_id: int
    fold: int
    hw: tuple[int, int]
    s2: Path
    s2_t: int
    mask: Path | None
    s1: dict[str, Path]
    target: Path
    instances: Path | None
    hr: Path | None
    doy: dict[str, np.ndarray] = field(default_factory=dict)
    geo: PatchGeo | None = None


Fallbacks = dict[str, list[int]]
"""What a patch lacks (``"S1D file"``, ``"INSTANCES file"``) -> the patches that lack it, met while indexing."""


def open_npy(path: Path, *, patch_id: int, what: str) -> np.ndarray:
    """Memory-map ``path`` (``numpy.load(mmap_mode="r")``).

    Raises:
        CropScaleError: missing, truncated or corrupt file, naming the patch, the role and the path.
    """
    if not path.is_file():
        raise CropScaleError(f"patch {patch_id}: {what} file missing: {path}")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError, pickle.UnpicklingError) as err:
        raise CropScaleError(
            f"patch {patch_id}: cannot read {what} file {path} (truncated or corrupt .npy?): {err}"
        ) from None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biuf":
        raise CropScaleError(f"patch {patch_id}: {what} file {path} is not a numeric array")
    return arr


def _check(cond: bool, patch_id: int, what: str, path: Path, message: str) -> None:
    if not cond:
        raise CropScaleError(f"patch {patch_id}: {what} file {path}: {message}")


def s2_dtype_problem(dtype: np.dtype) -> str | None:
    """Why ``dtype`` cannot hold Sentinel-2 reflectance x 1e4, or None.

    Reflectance x 1e4 runs from about -1000 (L2A offset) to above 10,000 (bright targets, clouds): it
    needs a float, or integers of at least 16 bits. An 8-bit array has wrapped values (mod 256) or
    another unit.
    """
    if dtype.kind == "f" or (dtype.kind in "iu" and dtype.itemsize >= 2):
        return None
    return (f"dtype {dtype} cannot hold reflectance x 1e4 (values up to 10,000 and more); expected int16,"
            " uint16 or a float (an 8-bit export wraps the values mod 256)")


def s1_dtype_problem(dtype: np.dtype) -> str | None:
    """Why ``dtype`` cannot hold Sentinel-1 backscatter in dB, or None.

    Backscatter in dB is mostly negative (VV about -10, VH about -17 dB over crops): it needs a float or
    a signed integer of at least 16 bits.
    """
    if dtype.kind == "f" or (dtype.kind == "i" and dtype.itemsize >= 2):
        return None
    return (f"dtype {dtype} cannot hold backscatter in dB (mostly negative values, VV about -10 dB); expected"
            " float32 (or a signed integer of at least 16 bits)")


def _select_records(records: list[PatchRecord], folds, meta_path: Path) -> list[PatchRecord]:
    """The records of ``folds`` (None = all), metadata order; an empty requested fold is an error."""
    if folds is None:
        return records
    for fold in folds:
        if not any(r.fold == fold for r in records):
            present = sorted({r.fold for r in records})
            raise CropScaleError(f"fold {fold} has no patches in {meta_path} (folds present: {present})")
    return [r for r in records if r.fold in set(folds)]


def _s2(layout: DataLayout, rec: PatchRecord) -> tuple[Path, tuple[int, int, int]]:
    """The checked ``DATA_S2`` file of ``rec`` and its ``(T, H, W)``."""
    pid = rec.patch_id
    path = layout.root / "DATA_S2" / f"S2_{pid}.npy"
    s2 = open_npy(path, patch_id=pid, what="S2")
    _check(s2.ndim == 4, pid, "S2", path, f"expected [T, {len(S2_BANDS)}, H, W], got shape {s2.shape}")
    _check(s2.shape[1] == len(S2_BANDS), pid, "S2", path,
           f"expected {len(S2_BANDS)} bands {S2_BANDS} on axis 1, got shape {s2.shape}")
    t, _, h, w = s2.shape
    _check(t >= 1 and h >= 1 and w >= 1, pid, "S2", path, f"empty array, shape {s2.shape}")
    problem = s2_dtype_problem(s2.dtype)
    _check(problem is None, pid, "S2", path, problem or "")
    if "S2" not in rec.dates:
        raise CropScaleError(f"patch {pid}: {layout.meta_path} has no dates-S2 for S2 file {path}")
    _check(len(rec.dates["S2"]) == t, pid, "S2", path,
           f"{t} dates in the array but {len(rec.dates['S2'])} in dates-S2 of {layout.meta_path}")
    return path, (t, h, w)


def _s2_mask(layout: DataLayout, pid: int, s2_path: Path, thw: tuple[int, int, int]) -> Path | None:
    """The checked ``DATA_S2_MASK`` file (``[T, H, W]``), or None when masks are not read."""
    if layout.mask_dir is None:
        return None
    path = layout.mask_dir / f"MASK_{pid}.npy"
    mask = open_npy(path, patch_id=pid, what="S2 mask")
    _check(mask.shape == thw, pid, "S2 mask", path,
           f"expected [T, H, W] = {thw} to match {s2_path.name}, got {mask.shape}")
    return path


def _s1(layout: DataLayout, rec: PatchRecord, hw: tuple[int, int],
        fallbacks: Fallbacks) -> tuple[dict[str, Path], dict[str, np.ndarray]]:
    """The checked Sentinel-1 files of ``rec`` per orbit present, and their days of year."""
    pid = rec.patch_id
    files, doy = {}, {}
    for orbit in layout.orbits:
        path = layout.root / f"DATA_{orbit}" / f"{orbit}_{pid}.npy"
        if not path.exists():
            fallbacks.setdefault(f"{orbit} file", []).append(pid)
            continue
        arr = open_npy(path, patch_id=pid, what=orbit)
        _check(arr.ndim == 4 and arr.shape[1] >= 2 and arr.shape[2:] == hw, pid, orbit, path,
               f"expected [T, >=2 (VV, VH, ...), {hw[0]}, {hw[1]}], got shape {arr.shape}")
        problem = s1_dtype_problem(arr.dtype)
        _check(problem is None, pid, orbit, path, problem or "")
        if orbit not in rec.dates:
            raise CropScaleError(f"patch {pid}: {layout.meta_path} has no dates-{orbit} for {orbit} file {path}")
        _check(len(rec.dates[orbit]) == arr.shape[0], pid, orbit, path,
               f"{arr.shape[0]} dates in the array but {len(rec.dates[orbit])} in dates-{orbit} of {layout.meta_path}")
        files[orbit] = path
        doy[orbit] = day_of_year(rec.dates[orbit])
    return files, doy


def _target(layout: DataLayout, pid: int, hw: tuple[int, int]) -> Path:
    """The checked ``ANNOTATIONS`` file (integer ``[H, W]`` or ``[K, H, W]``)."""
    path = layout.root / "ANNOTATIONS" / f"TARGET_{pid}.npy"
    target = open_npy(path, patch_id=pid, what="TARGET")
    _check(target.ndim in (2, 3) and target.shape[-2:] == hw, pid, "TARGET", path,
           f"expected [H, W] or [K, H, W] with H, W = {hw[0]}, {hw[1]}, got shape {target.shape}")
    _check(target.dtype.kind in "biu", pid, "TARGET", path, f"class ids must be integers, got {target.dtype}")
    return path


def _instances(layout: DataLayout, pid: int, hw: tuple[int, int], fallbacks: Fallbacks) -> Path | None:
    """The checked ``INSTANCE_ANNOTATIONS`` file, or None (no folder, or a fallback for this patch)."""
    if layout.inst_dir is None:
        return None
    path = layout.inst_dir / f"INSTANCES_{pid}.npy"
    if not path.exists():
        fallbacks.setdefault("INSTANCES file", []).append(pid)
        return None
    inst = open_npy(path, patch_id=pid, what="INSTANCES")
    _check(inst.shape == hw and inst.dtype.kind in "biu", pid, "INSTANCES", path,
           f"expected integer [H, W] = {hw}, got {inst.dtype} {inst.shape}")
    return path


def _high_grid(layout: DataLayout, rec: PatchRecord, fallbacks: Fallbacks) -> Path | None:
    """The high-grid image of ``rec``, or None (no folder, or a fallback for this patch)."""
    if layout.hr_root is None:
        return None
    candidate = layout.hr_root / layout.hr_pattern.format(patch_id=rec.patch_id)
    if not candidate.exists():
        fallbacks.setdefault(f"high-grid image ({layout.hr_root.name})", []).append(rec.patch_id)
        return None
    if rec.geo is None:
        raise CropScaleError(
            f"patch {rec.patch_id}: high-grid image {candidate} exists but {layout.meta_path} has no patch polygon "
            "in a projected CRS, so the image cannot be aligned with the 10 m grid"
        )
    return candidate


def _patch_files(layout: DataLayout, rec: PatchRecord, fallbacks: Fallbacks) -> PatchFiles:
    """Every file of one patch, resolved and checked against each other and the metadata."""
    s2_path, (t, h, w) = _s2(layout, rec)
    mask_path = _s2_mask(layout, rec.patch_id, s2_path, (t, h, w))
    s1, s1_doy = _s1(layout, rec, (h, w), fallbacks)
    return PatchFiles(
        patch_id=rec.patch_id, fold=rec.fold, hw=(h, w), s2=s2_path, s2_t=t, mask=mask_path, s1=s1,
        target=_target(layout, rec.patch_id, (h, w)), instances=_instances(layout, rec.patch_id, (h, w), fallbacks),
        hr=_high_grid(layout, rec, fallbacks), doy={"S2": day_of_year(rec.dates["S2"]), **s1_doy}, geo=rec.geo,
    )


PATCH_FILE_PATTERNS: tuple[tuple[str, str], ...] = (
    ("DATA_S2", "S2_"), ("DATA_S2_MASK", "MASK_"), ("DATA_S1A", "S1A_"), ("DATA_S1D", "S1D_"),
    ("ANNOTATIONS", "TARGET_"), ("INSTANCE_ANNOTATIONS", "INSTANCES_"),
)
"""``(folder, file prefix)`` of the per-patch ``<prefix><id>.npy`` files of the layout."""


def orphan_files(root: str | Path, records: list[PatchRecord]) -> dict[int, list[Path]]:
    """Patch files under ``root`` whose id ``records`` (the metadata) does not list.

    Only directory listings are read. Files named ``<prefix><id>.npy`` in the folders of
    :data:`PATCH_FILE_PATTERNS` count; other names are not patch files.

    Returns:
        patch id -> its files (sorted by id, paths in folder order); empty when every file has its entry.
    """
    root = Path(root)
    listed = {r.patch_id for r in records}
    found: dict[int, list[Path]] = {}
    for folder, prefix in PATCH_FILE_PATTERNS:
        if not (root / folder).is_dir():
            continue
        for path in sorted((root / folder).glob(f"{prefix}*.npy")):
            stem = path.stem[len(prefix):]
            if stem.isdigit() and int(stem) not in listed:
                found.setdefault(int(stem), []).append(path)
    return dict(sorted(found.items()))


def orphan_warning(root: str | Path, records: list[PatchRecord], shown: int = 5) -> str | None:
    """One line for :func:`orphan_files` (the count, the first ``shown`` ids and one file), or None."""
    orphans = orphan_files(root, records)
    if not orphans:
        return None
    ids = list(orphans)
    first = orphans[ids[0]][0]
    listed = ", ".join(map(str, ids[:shown])) + (" ..." if len(ids) > shown else "")
    return (f"{Path(root)}: {len(ids)} patch id(s) have files but no entry in metadata.geojson ({listed}; e.g."
            f" {first}); their files are not read")


def index_patches(layout: DataLayout, folds: list[int] | tuple[int, ...] | None, *,
                  notes: list[str] | None = None) -> list[PatchFiles]:
    """Resolve and check the files of every patch in ``folds`` (None = all folds) of ``layout``, metadata order.

    Opens each array's header (memory map, no data read) to check shapes against each other and
    against the metadata's date counts. The documented fallbacks are one ``UserWarning`` each, also
    appended to ``notes`` when given.

    Raises:
        CropScaleError: no patch in a requested fold, or any check of the module docstring (the message names
            patch and file).
    """
    records = _select_records(layout.records, folds, layout.meta_path)
    fallbacks: Fallbacks = {}
    out = [_patch_files(layout, rec, fallbacks) for rec in records]
    for what, ids in fallbacks.items():
        shown = ", ".join(map(str, ids[:10])) + (" ..." if len(ids) > 10 else "")
        message = f"{layout.root}: no {what} for {len(ids)} patch(es) ({shown}); those samples mark it absent"
        warnings.warn(message, DataWarning, stacklevel=2)
        if notes is not None:
            notes.append(message)
    return out
