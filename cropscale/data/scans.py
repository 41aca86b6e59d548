"""Every patch scanned once (:func:`~cropscale.data.content.scan_patch`), cached: a second run reads no value.

A scan's result (:class:`~cropscale.data.content.PatchScan`: per-band moments and counts, small) is kept in
:class:`ScanCache`, one JSON file per patch, named by a hash of what the scan depends on: each of the patch's
files' resolved path, size and modification time (ns), the class count, ``ignore_index``, whether the values
were checked, and :data:`~cropscale.data.content.SCAN_FORMAT`. A file rewritten or touched since gets a new key
and is scanned again; only a file changed in place with its size and modification time restored would be missed.
A scan that found an error is not cached.

Where the cache lives: ``data.cache_dir``, else ``$XDG_CACHE_HOME/cropscale/data-scans`` (``~/.cache/...``) —
never the data folder, which may be read-only. Under DDP every rank scans the patches it does not find there and
writes each entry atomically (:func:`~cropscale.files.atomic_write_json`: a temporary file renamed into place), so
ranks writing the same entry at once leave one whole file; every rank meets the same error on the same data. A
folder that cannot be written is one warning, and the run scans without caching.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cropscale.data.content import SCAN_FORMAT, PatchScan, check_high_grid, scan_patch
from cropscale.data.hr import HighGridReader
from cropscale.data.index import PatchFiles, index_patches
from cropscale.data.layout import resolve_layout
from cropscale.data.stats import NormStats, stats_from_moments
from cropscale.errors import CropScaleError, DataWarning
from cropscale.files import atomic_write_json


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/cropscale/data-scans``, or ``~/.cache/cropscale/data-scans`` without that variable."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cropscale" / "data-scans"


class ScanCache:
    """Scans of patches keyed by their files' sizes and modification times (module docstring).

    Args:
        folder: where the entries live (None: :func:`default_cache_dir`).

    Attributes:
        hits, misses: patches found in the cache, and scanned.
        scanned_bytes: size of the ``.npy`` files of the patches scanned (the misses), in bytes.
        problem: why entries cannot be written (None while they can).
    """

    def __init__(self, folder: str | Path | None = None) -> None:
        self.folder = Path(folder) if folder else default_cache_dir()
        self.hits = self.misses = self.scanned_bytes = 0
        self.problem: str | None = None

    def key(self, p: PatchFiles, settings: dict) -> str:
        """Hex digest of the patch's files (resolved path, size, mtime in ns) and the scan ``settings``."""
        stamps = []
        for path in [*_arrays(p), p.hr]:
            if path is not None:
                st = path.stat()
                stamps.append([str(path.resolve()), st.st_size, st.st_mtime_ns])
        blob = json.dumps({"format": SCAN_FORMAT, "patch": [p.patch_id, p.fold], "settings": settings,
                           "files": stamps}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def get(self, key: str) -> PatchScan | None:
        """The cached scan of ``key``, or None (absent, unreadable or of another format: scanned again)."""
        try:
            return PatchScan.from_dict(json.loads((self.folder / f"{key}.json").read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, scan: PatchScan) -> None:
        """Keep ``scan`` under ``key`` (atomically); a folder that cannot be written is one warning, then nothing."""
        if self.problem is not None:
            return
        try:
            atomic_write_json(self.folder / f"{key}.json", scan.to_dict(), indent=None)
        except CropScaleError as err:
            self.problem = str(err)
            warnings.warn(f"data scan cache: {err}; every run checks the data again (set data.cache_dir to a"
                          " writable folder)", DataWarning, stacklevel=2)


def scan_patches(patches: Iterable[PatchFiles], *, num_classes: int, ignore_index: int | None,
                 hr_reader: HighGridReader | None = None, cache: ScanCache | None = None,
                 check: bool = True, threads: int = 1) -> list[PatchScan]:
    """:func:`~cropscale.data.content.scan_patch` of each patch not in ``cache``; the new scans are cached.

    Args:
        patches: the patches, indexed.
        num_classes: class count (the label check).
        ignore_index: class id allowed beyond the classes.
        check: check the values (False: the moments only), as :func:`~cropscale.data.content.scan_patch`.
        hr_reader: the high-grid reader: each scanned patch's image is checked through it, in this thread.
        cache: the scan cache (None: none).
        threads: patches scanned at once (NumPy releases the GIL while it reads and reduces).

    Returns:
        One scan per patch, in order.

    Raises:
        CropScaleError: the first patch, in order, with a bad value (as :func:`~cropscale.data.content.scan_patch`).
    """
    patches = list(patches)
    settings = {"num_classes": int(num_classes), "ignore_index": ignore_index, "check": bool(check),
                "high_grid": hr_reader is not None}
    keys = [cache.key(p, settings) for p in patches] if cache is not None else [None] * len(patches)
    found = [cache.get(k) for k in keys] if cache is not None else [None] * len(patches)
    todo = [i for i, scan in enumerate(found) if scan is None]
    if cache is not None:
        cache.hits, cache.misses = cache.hits + len(patches) - len(todo), cache.misses + len(todo)
        cache.scanned_bytes += sum(f.stat().st_size for i in todo for f in _arrays(patches[i]))

    def one(i: int) -> PatchScan:
        return scan_patch(patches[i], num_classes=num_classes, ignore_index=ignore_index, check=check)

    with ThreadPoolExecutor(max(1, int(threads))) as pool:
        for i, scan in zip(todo, pool.map(one, todo), strict=True):  # raises the first error in patch order
            if check and hr_reader is not None:
                check_high_grid(patches[i], hr_reader)
            found[i] = scan
            if cache is not None:
                cache.put(keys[i], scan)
    return found


def _arrays(p: PatchFiles) -> list[Path]:
    """The ``.npy`` files a scan of ``p`` reads."""
    return [f for f in (p.s2, p.mask, *p.s1.values(), p.target) if f is not None]


def compute_norm_stats(root: str | Path, folds: list[int], *, s1_orbits: list[str] | None = None,
                       max_patches: int | None = None, cache: ScanCache | None = None) -> NormStats:
    """Per-band statistics over the patches of ``folds`` (the training folds) under ``root``.

    One pass over each patch's values (:func:`scan_patches` without the checks, ``cache`` as there); a data module
    takes the statistics from its own checked scans instead (:meth:`PastisHDDataModule.setup`).

    Args:
        root: PASTIS-HD root.
        folds: training folds.
        s1_orbits: orbits to include (None: those the root has).
        max_patches: use only the first ``max_patches`` patches in metadata order (None = all).
        cache: scan cache (None: none).

    Raises:
        CropScaleError: unreadable patch files (:func:`~cropscale.data.index.index_patches`), NaN or Inf in
            Sentinel-2 reflectance at a clear pixel (under the mask it is left out like any cloudy value), no clear
            observation at all, or a band with zero variance.
    """
    patches = index_patches(resolve_layout(root, s1_orbits=s1_orbits), list(folds))
    if max_patches is not None:
        patches = patches[: int(max_patches)]
    scans = scan_patches(patches, num_classes=0, ignore_index=None, cache=cache, check=False)
    return stats_from_moments([s.moments for s in scans], folds=list(folds), patch_ids=[p.patch_id for p in patches],
                              root=str(root))
