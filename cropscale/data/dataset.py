"""The PASTIS-HD patch dataset: one :mod:`cropscale.batch` sample per patch, read from memory-mapped files.

Each sample holds the memory-mapped NPY time series, validity masks, labels, parcel targets and the windowed
high-grid image.

Layout read under ``root`` (PASTIS, Sainte Fare Garnot & Landrieu, ICCV 2021; PASTIS-R, ISPRS J.
2022; PASTIS-HD adds ``DATA_SPOT``):

=========================================  ===================================================
``metadata.geojson``                       patch ids, folds, dates (:mod:`.metadata`)
``classes.json``                           class names, id = index
``DATA_S2/S2_<id>.npy``                    ``[T, 10, H, W]`` reflectance x 1e4 (B02 ... B12)
``DATA_S2_MASK/MASK_<id>.npy`` (optional)  ``[T, H, W]`` 1 = clear observation
``DATA_S1A/S1A_<id>.npy`` (optional)       ``[T, >=2, H, W]`` dB, channels 0, 1 = VV, VH
``DATA_S1D/S1D_<id>.npy`` (optional)       as S1A, descending orbit
``ANNOTATIONS/TARGET_<id>.npy``            ``[H, W]`` or ``[K, H, W]``, channel 0 = class id
``INSTANCE_ANNOTATIONS/INSTANCES_<id>.npy``  ``[H, W]`` parcel ids, 0 = background (optional)
``<hr_dir>/<hr_pattern>`` (optional)       GeoTIFF, read windowed (:mod:`.hr`)
=========================================  ===================================================

Arrays are opened with ``numpy.load(mmap_mode="r")`` and sliced, never loaded whole per sample
(labels and instances, ``[H, W]``, are read whole for the label check and the parcel targets).

Checks at construction (before training; each error names the patch and the file): the root, the orbit
names and which modality folders are read (:mod:`.layout`, once per run), missing or unreadable ``.npy``
(truncated, bad header), wrong number of dimensions or bands, spatial shapes that disagree, metadata date
counts that differ from the array's ``T``, a high-grid directory for patches the metadata cannot
georeference, a dtype that cannot hold the unit. :meth:`PastisHDDataset.check_content` (called by the data
module at setup) checks every value of every patch once (:mod:`.content`, cached by :mod:`.scans`). Checks
while reading a sample (``check_values``): a mask value other than 0 / 1 in the window read, NaN, Inf or a
no-data value below -1000 (-9999) in Sentinel-2 reflectance at a pixel the mask calls clear (NaN or Inf under
the mask is accepted: masked values are set to 0 after normalisation and never reach the network), class ids
``>= num_classes`` (other than ``ignore_index``), a patch whose Sentinel-2 series has no clear observation at
all.

Documented fallbacks (a warning at construction lists the patches): when ``DATA_S1A``/``DATA_S1D``,
``INSTANCE_ANNOTATIONS`` or the high-grid directory exists but one patch's file is absent, that
sample has the orbit absent (masks all False), ``parcel_present = False`` or ``hr_present = False``.
Sentinel-1 masks are per date (:mod:`cropscale.batch`): a date with a non-finite VV or VH value in the
sample's window is invalid for that sample (``s1x_mask`` False, values 0), as is a date with no
finite, non-zero pixel; dates with fewer than ``min_clear_fraction`` such pixels are chosen last
(see :mod:`.temporal`). No NaN or Inf reaches a batch. A Sentinel-2 pixel whose ten bands are all 0
is no data (``s2_mask`` False) even where ``DATA_S2_MASK`` marks it clear; dates are chosen by the
mask's clear fraction.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from cropscale.batch import HR_SCALE, S2_BANDS
from cropscale.data.content import (
    PatchScan,
    clear_mask,
    label_problem,
    mask_value_message,
    no_clear_observation,
    nodata_s2_message,
    nonfinite_s2_message,
)
from cropscale.data.hr import HighGridReader, crop_bounds, high_grid_shape
from cropscale.data.index import PatchFiles, index_patches, open_npy
from cropscale.data.layout import DEFAULT_HR_DIR, S1_ORBITS, DataLayout, resolve_layout
from cropscale.data.metadata import read_classes
from cropscale.data.scans import ScanCache, scan_patches
from cropscale.data.stats import NormStats
from cropscale.data.targets import parcel_targets
from cropscale.data.temporal import clear_fraction, s1_pixel_validity, s2_pixel_validity, select_dates
from cropscale.data.transforms import RandomDihedral
from cropscale.errors import CropScaleError, DataWarning


def check_options(*, crop_size: int, t2: int, t1: int, samples_per_patch: int, min_clear_fraction: float,
                  hr_bands: list[int] | tuple[int, ...]) -> None:
    """Refuse sample options out of range (the dataset's, also checked by the data module at construction).

    Raises:
        CropScaleError: naming the option as ``data.<name>``.
    """
    for name, value in (("crop_size", crop_size), ("t2", t2), ("t1", t1), ("samples_per_patch", samples_per_patch)):
        if int(value) < 1:
            raise CropScaleError(f"data.{name} must be >= 1, got {value}")
    if not 0.0 <= min_clear_fraction <= 1.0:
        raise CropScaleError(f"data.min_clear_fraction must be in [0, 1], got {min_clear_fraction}")
    if len(hr_bands) != 3:
        raise CropScaleError(f"data.hr_bands must name 3 bands (R, G, B), got {list(hr_bands)}")


class PastisHDDataset(Dataset):
    """PASTIS-HD patches as :mod:`cropscale.batch` samples (dicts of tensors, no batch dim).

    Training (``train=True``): ``len = patches x samples_per_patch``; item ``i`` is one random
    ``crop_size x crop_size`` crop of patch ``i // samples_per_patch`` with random temporal sampling
    and a random D4 augmentation (:class:`~cropscale.data.transforms.RandomDihedral`), drawn from a
    generator seeded by ``(seed, epoch, i)``: the same sample whichever process, DataLoader worker or
    restart reads it. The index is ``i`` (epoch :attr:`epoch`, set by :meth:`set_epoch`) or a pair
    ``(epoch, i)`` as :class:`~cropscale.data.sharding.TrainShardSampler` yields them. Evaluation
    (``train=False``): item ``i`` is the whole patch ``i``, deterministic (evenly spaced valid dates, no
    augmentation).

    A sample holds every key of the contract, per sample (no leading ``B``): ``s2`` ``[T2, 10, h, w]``
    f32, ``s2_doy`` ``[T2]`` int64, ``s2_mask`` ``[T2, h, w]`` bool, ``s1a``/``s1d``
    ``[T1, 2, h, w]`` f32, ``s1a_doy``/``s1d_doy`` ``[T1]`` int64, ``s1a_mask``/``s1d_mask``
    ``[T1]`` bool, ``semantic`` ``[h, w]`` int64, ``parcel`` ``[3, h, w]`` f32,
    ``parcel_present`` ``[]`` bool, ``hr`` ``[3, 10h, 10w]`` f32 in [0, 1], ``hr_present`` ``[]``
    bool, ``patch_id`` ``[]`` int64, ``crop_yx`` ``[2]`` int64. Absent parts are zeros with False
    masks/flags; padding dates (series shorter than ``T``, :mod:`.temporal`) have day of year 0.

    Args:
        root: dataset root (``metadata.geojson``, ``classes.json``, ``DATA_S2`` ...).
        folds: folds to use (None = all).
        train: training (random crops) or evaluation (whole patches) sampling.
        crop_size: training crop side (10 m pixels); the high-grid crop is 10x that.
        t2: Sentinel-2 dates per sample.
        t1: dates per Sentinel-1 orbit per sample.
        samples_per_patch: random training crops per patch per epoch (epoch length = training patches x
            this).
        stats: normalisation statistics (training folds); None = raw values.
        augment: random flips and 90-degree rotations of training crops (evaluation samples never).
        num_classes: class count (default: from ``classes.json``).
        ignore_index: class id to ignore in loss and metrics (PASTIS void 19), allowed beyond the classes;
            None = none.
        high_grid: read the high-grid images: True = their folder must exist, False = never (no x10 detail
            target), None = where present.
        hr_dir: high-grid GeoTIFF folder (relative to the root).
        hr_pattern: high-grid file name pattern (``{patch_id}``).
        hr_bands: 1-based band indices of R, G, B in the high-grid files.
        hr_max: digital number mapped to 1.0 in ``hr`` (255 for 8-bit images).
        s1_orbits: Sentinel-1 orbits to read (``S1A``, ``S1D``), each of which must have its folder; None =
            those the root has.
        s2_mask: read ``DATA_S2_MASK``: True = it must exist, False = never (no-data detection only), None =
            where present.
        min_clear_fraction: fraction of clear pixels for a date to count as valid.
        check_values: check the values each sample reads, and (data module) every value of every patch once at
            setup; False only to measure what the checks cost (``loader-bench --checks off``).
        seed: seed of the training sampling (crops, dates, augmentation, order).
        layout: the root already resolved (:func:`~cropscale.data.layout.resolve_layout`, by the data module);
            None = resolved here from ``root``, ``s1_orbits``, ``s2_mask``, ``high_grid``, ``hr_dir``, ``hr_pattern``.

    Attributes:
        patches: the indexed patches (:class:`~cropscale.data.index.PatchFiles`), metadata order.
        data_warnings: what the layout and the index found (what the model is trained without, the documented
            fallbacks), also issued as ``UserWarning``.

    Raises:
        CropScaleError: see the module docstring.
    """

    def __init__(
        self,
        root: str | Path,
        folds: list[int] | None,
        *,
        train: bool,
        crop_size: int = 32,
        t2: int = 16,
        t1: int = 4,
        samples_per_patch: int = 1,
        stats: NormStats | None = None,
        augment: bool = True,
        num_classes: int | None = None,
        ignore_index: int | None = None,
        high_grid: bool | None = None,
        hr_dir: str = DEFAULT_HR_DIR,
        hr_pattern: str = "SPOT_{patch_id}.tif",
        hr_bands: list[int] = [1, 2, 3],  # noqa: B006 - jsonargparse needs the literal default
        hr_max: float = 255.0,
        s1_orbits: list[str] | None = None,
        s2_mask: bool | None = None,
        min_clear_fraction: float = 0.5,
        check_values: bool = True,
        seed: int = 0,
        layout: DataLayout | None = None,
    ) -> None:
        check_options(crop_size=crop_size, t2=t2, t1=t1, samples_per_patch=samples_per_patch,
                      min_clear_fraction=min_clear_fraction, hr_bands=hr_bands)
        self.data_warnings: list[str] = []
        if layout is None:
            layout = resolve_layout(root, s1_orbits=s1_orbits, s2_mask=s2_mask, high_grid=high_grid, hr_dir=hr_dir,
                                    hr_pattern=hr_pattern)
            for message in layout.warnings:
                warnings.warn(message, DataWarning, stacklevel=2)
                self.data_warnings.append(message)
        self.layout = layout
        self.root = layout.root
        self.train = bool(train)
        self.crop_size, self.t2, self.t1 = int(crop_size), int(t2), int(t1)
        self.samples_per_patch = int(samples_per_patch)
        self.stats = stats
        self.num_classes = len(read_classes(self.root / "classes.json")) if num_classes is None else int(num_classes)
        self.ignore_index = ignore_index
        self.min_clear_fraction = float(min_clear_fraction)
        self.check_values = bool(check_values)
        self.patches = index_patches(layout, folds, notes=self.data_warnings)
        if not self.patches:
            raise CropScaleError(f"no patches in folds {folds} under {self.root}")
        if self.train:
            for p in self.patches:
                if min(p.hw) < self.crop_size:
                    raise CropScaleError(
                        f"patch {p.patch_id}: {p.hw[0]}x{p.hw[1]} pixels, smaller than crop_size {self.crop_size}"
                    )
        self.augment = RandomDihedral() if self.train and augment else None
        self.hr_reader = HighGridReader(hr_bands, hr_max)
        self.seed = int(seed)
        self.epoch = 0
        self._arrays: OrderedDict[Path, np.ndarray] = OrderedDict()

    # -------------------------------------------------------------- plumbing
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_arrays"] = OrderedDict()
        return state

    def reseed(self, seed: int) -> None:
        """Set the base seed of the training draws (each sample's generator is seeded by ``(seed, epoch, i)``)."""
        self.seed = int(seed)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch used for plain integer indices."""
        self.epoch = int(epoch)

    def sample_rng(self, epoch: int, index: int) -> np.random.Generator:
        """The generator of training sample ``index`` in ``epoch``: ``default_rng([seed, epoch, index])``."""
        return np.random.default_rng([self.seed, int(epoch), int(index)])

    def __len__(self) -> int:
        return len(self.patches) * (self.samples_per_patch if self.train else 1)

    def _array(self, path: Path, patch_id: int, what: str) -> np.ndarray:
        arr = self._arrays.get(path)
        if arr is None:
            arr = open_npy(path, patch_id=patch_id, what=what)
            self._arrays[path] = arr
            if len(self._arrays) > 256:
                self._arrays.popitem(last=False)
        else:
            self._arrays.move_to_end(path)
        return arr

    # -------------------------------------------------------------- sample
    def __getitem__(self, index: int | tuple[int, int]) -> dict[str, torch.Tensor]:
        epoch, index = (int(index[0]), int(index[1])) if isinstance(index, tuple) else (self.epoch, index)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} samples")
        rng = None
        if self.train:
            p = self.patches[index // self.samples_per_patch]
            rng = self.sample_rng(epoch, index)
            c = self.crop_size
            y = int(rng.integers(p.hw[0] - c + 1))
            x = int(rng.integers(p.hw[1] - c + 1))
            hw = (c, c)
        else:
            p = self.patches[index]
            y, x, hw = 0, 0, p.hw
        # built with NumPy (single-threaded whatever torch's thread count), converted at the end
        sample: dict[str, np.ndarray] = {}
        sample.update(self._read_s2(p, y, x, hw, rng))
        for orbit in S1_ORBITS:
            sample.update(self._read_s1(p, orbit, y, x, hw, rng))
        sample["semantic"] = self._read_semantic(p, y, x, hw)
        sample.update(self._read_parcel(p, y, x, hw))
        sample.update(self._read_hr(p, y, x, hw))
        sample["patch_id"] = np.array(p.patch_id, dtype=np.int64)
        sample["crop_yx"] = np.array([y, x], dtype=np.int64)
        if self.augment is not None:
            sample = self.augment(sample, rng if rng is not None else self.sample_rng(epoch, index))
        return {k: torch.from_numpy(v if v.flags.c_contiguous else v.copy()) for k, v in sample.items()}

    def _read_s2(self, p: PatchFiles, y: int, x: int, hw: tuple[int, int], rng) -> dict[str, np.ndarray]:
        h, w = hw
        arr = self._array(p.s2, p.patch_id, "S2")
        window = (slice(y, y + h), slice(x, x + w))
        data_all = None
        if p.mask is not None:
            marked = np.asarray(self._array(p.mask, p.patch_id, "S2 mask")[(slice(None), *window)])
            if self.check_values:  # a value other than 0 / 1 is an error, never "clear"
                message = mask_value_message(p, marked, np.arange(marked.shape[0]), y, x)
                if message:
                    raise CropScaleError(message)
            valid_all = clear_mask(marked)
        else:
            data_all = np.asarray(arr[(slice(None), slice(None), *window)])
            valid_all = s2_pixel_validity(data_all)
        frac = clear_fraction(valid_all)
        if not frac.any():
            self._check_patch_has_clear_s2(p)
        idx = select_dates(frac, self.t2, min_clear_fraction=self.min_clear_fraction, rng=rng)
        data = data_all[idx] if data_all is not None else np.asarray(arr[(idx, slice(None), *window)])
        clear = valid_all[idx]                                              # [n, h, w]
        if p.mask is not None:  # zero in every band is no data, whatever the mask says (NaN is not zero)
            clear = clear & s2_pixel_validity(data)
        message = nonfinite_s2_message(p, data, idx, y, x, clear=clear)  # NaN must never reach the network
        if not message and self.check_values:
            message = nodata_s2_message(p, data, idx, y, x, clear)
        if message:  # NaN, Inf or a no-data value (-9999) where the mask (or no-data detection) says clear
            raise CropScaleError(message)
        data = data.astype(np.float32)
        if self.stats is not None:
            with np.errstate(invalid="ignore", over="ignore"):
                data = self.stats.normalise_s2(data)
        data[~np.broadcast_to(clear[:, None], data.shape)] = 0.0  # masked values (clouds, NaN) never leave
        n = idx.size
        s2 = np.zeros((self.t2, len(S2_BANDS), h, w), dtype=np.float32)
        s2[:n] = data
        mask = np.zeros((self.t2, h, w), dtype=bool)
        mask[:n] = clear
        doy = np.zeros(self.t2, dtype=np.int64)
        doy[:n] = p.doy["S2"][idx]
        return {"s2": s2, "s2_doy": doy, "s2_mask": mask}

    def _check_patch_has_clear_s2(self, p: PatchFiles) -> None:
        """Raise when the whole patch has no clear Sentinel-2 observation on any date."""
        mask = self._array(p.mask, p.patch_id, "S2 mask") if p.mask is not None else None
        message = no_clear_observation(p, self._array(p.s2, p.patch_id, "S2"), mask)
        if message:
            raise CropScaleError(message)

    def check_content(self, cache: ScanCache | None = None, threads: int = 1) -> list[PatchScan]:
        """Check every value of every patch once (:func:`~cropscale.data.scans.scan_patches`, through ``cache``).

        With ``check_values`` False only the band moments are accumulated (for the statistics). ``threads``:
        patches scanned at once.

        Returns:
            One :class:`~cropscale.data.content.PatchScan` per patch, in order.

        Raises:
            CropScaleError: the first patch with a bad value (named with its file and date index).
        """
        try:
            return scan_patches(self.patches, num_classes=self.num_classes, ignore_index=self.ignore_index,
                                hr_reader=self.hr_reader if self.check_values else None, cache=cache,
                                check=self.check_values, threads=threads)
        finally:
            self.hr_reader.close()

    def _read_s1(self, p: PatchFiles, orbit: str, y: int, x: int, hw: tuple[int, int], rng) -> dict[str, np.ndarray]:
        h, w = hw
        key = orbit.lower()
        out = {
            key: np.zeros((self.t1, 2, h, w), dtype=np.float32),
            f"{key}_doy": np.zeros(self.t1, dtype=np.int64),
            f"{key}_mask": np.zeros(self.t1, dtype=bool),
        }
        path = p.s1.get(orbit)
        if path is None:
            return out
        arr = self._array(path, p.patch_id, orbit)
        data_all = np.asarray(arr[:, :2, y:y + h, x:x + w])
        valid = s1_pixel_validity(data_all)
        frac = clear_fraction(valid)
        # the per-date mask cannot mask one pixel: a date with a non-finite value in the window is no date
        complete = np.isfinite(data_all).reshape(len(data_all), -1).all(axis=1)
        frac = np.where(complete, frac, 0.0)
        idx = select_dates(frac, self.t1, min_clear_fraction=self.min_clear_fraction, rng=rng)
        data = data_all[idx].astype(np.float32)
        if self.stats is not None:
            with np.errstate(invalid="ignore", over="ignore"):
                data = self.stats.normalise_s1(data, orbit)
        date_valid = frac[idx] > 0
        data[~date_valid] = 0.0
        n = idx.size
        out[key][:n] = data
        out[f"{key}_doy"][:n] = p.doy[orbit][idx]
        out[f"{key}_mask"][:n] = date_valid
        return out

    def _read_semantic(self, p: PatchFiles, y: int, x: int, hw: tuple[int, int]) -> np.ndarray:
        arr = self._array(p.target, p.patch_id, "TARGET")
        labels = np.asarray(arr[0] if arr.ndim == 3 else arr).astype(np.int64)
        problem = label_problem(labels, self.num_classes, self.ignore_index) if self.check_values else None
        if problem:
            raise CropScaleError(f"patch {p.patch_id}: TARGET file {p.target}: {problem}")
        h, w = hw
        return labels[y:y + h, x:x + w]

    def _read_parcel(self, p: PatchFiles, y: int, x: int, hw: tuple[int, int]) -> dict[str, np.ndarray]:
        h, w = hw
        if p.instances is None:
            return {"parcel": np.zeros((3, h, w), dtype=np.float32), "parcel_present": np.array(False)}
        ids = np.asarray(self._array(p.instances, p.patch_id, "INSTANCES"))
        return {"parcel": parcel_targets(ids)[:, y:y + h, x:x + w], "parcel_present": np.array(True)}

    def _read_hr(self, p: PatchFiles, y: int, x: int, hw: tuple[int, int]) -> dict[str, np.ndarray]:
        out_hw = high_grid_shape(hw)
        if p.hr is None or p.geo is None:
            return {"hr": np.zeros((3, *out_hw), dtype=np.float32), "hr_present": np.array(False)}
        bounds = crop_bounds(p.geo.bounds, p.hw, (y, x), hw)
        read = self.hr_reader.read(p.hr, crs=p.geo.crs, bounds=bounds, out_hw=out_hw, where=f"patch {p.patch_id}")
        return {"hr": read.data, "hr_present": np.array(True)}


__all__ = ["HR_SCALE", "PastisHDDataset", "PatchFiles", "S1_ORBITS", "index_patches", "open_npy"]
