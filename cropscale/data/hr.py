"""Windowed reads of the high-grid (1 m) image, e.g. PASTIS-HD ``DATA_SPOT`` SPOT-6/7 GeoTIFFs.

A 10 m crop of a patch covers the ground rectangle given by the patch polygon and the crop offset
(:func:`crop_bounds`). :class:`HighGridReader` reads exactly that rectangle from the GeoTIFF with a
rasterio **windowed** read (only the blocks under the window are decoded) onto a grid
``HR_SCALE = 10`` times finer than the 10 m grid. When the file's pixel size differs from that grid
(SPOT-6/7 at 1.5 m, an aerial image at 0.2 m) the read resamples: ``average`` when the file is finer
(downsampling), ``bilinear`` when it is coarser (upsampling); equal resolutions read the pixels
unchanged.

The read is refused (:class:`cropscale.CropScaleError` naming the file and the patch) when the file
has no CRS, a CRS different from the patch's (:func:`same_crs`; no silent reprojection), a rotated
transform, too few bands, or an extent that does not cover the crop.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cropscale.batch import HR_SCALE
from cropscale.errors import CropScaleError

_SNAP = 1e-3  # window offsets within this many source pixels of an integer are snapped to it


@dataclass(frozen=True)
class HighGridRead:
    """Result of a windowed read.

    Attributes:
        data: ``[C, h, w]`` float32 in [0, 1] (digital numbers / ``value_max``, clipped).
        transform: affine transform (``rasterio.Affine``) of the returned grid, in the file's CRS.
        window: the source window read (``rasterio.windows.Window``, in file pixels).
    """

    data: np.ndarray
    transform: object
    window: object


def crop_bounds(
    patch_bounds: tuple[float, float, float, float],
    patch_hw: tuple[int, int],
    crop_yx: tuple[int, int],
    crop_hw: tuple[int, int],
) -> tuple[float, float, float, float]:
    """Ground bounds ``(left, bottom, right, top)`` of a crop of a north-up patch.

    Args:
        patch_bounds: the patch polygon's bounds (CRS units, e.g. m).
        patch_hw: the patch's ``(H, W)`` in 10 m pixels (the pixel size is bounds / shape).
        crop_yx: top-left ``(row, column)`` of the crop in the patch.
        crop_hw: ``(h, w)`` of the crop in pixels.
    """
    left, bottom, right, top = patch_bounds
    res_x = (right - left) / patch_hw[1]
    res_y = (top - bottom) / patch_hw[0]
    y, x = crop_yx
    h, w = crop_hw
    return (left + x * res_x, top - (y + h) * res_y, left + (x + w) * res_x, top - y * res_y)


def same_crs(a, b) -> bool:
    """True when two ``rasterio.crs.CRS`` are equal, or PROJ identifies both as the same EPSG code.

    PROJ's identification is ``CRS.to_epsg()`` with confidence >= 70 %: a GeoTIFF whose WKT says "unknown"
    datum "based on GRS80" with UTM 32N parameters is EPSG:25832.
    """
    if a == b:
        return True
    code_a, code_b = a.to_epsg(), b.to_epsg()
    return code_a is not None and code_a == code_b


def _snap(v: float) -> float:
    r = round(v)
    return float(r) if abs(v - r) < _SNAP else float(v)


class HighGridReader:
    """Windowed, resampling reader of high-grid GeoTIFFs, keeping up to ``max_open`` files open.

    Args:
        bands: 1-based band indices to read, in output order (SPOT RGB: ``[1, 2, 3]``; an RGBN
            image with NIR first: ``[2, 3, 4]``).
        value_max: digital number mapped to 1.0 (255 for 8-bit images).
        max_open: open datasets kept per process (least recently used closed first).

    The reader holds open file handles; they are neither pickled nor reused after a fork (a
    DataLoader worker opens its own).
    """

    def __init__(self, bands: tuple[int, ...] | list[int] = (1, 2, 3), value_max: float = 255.0, max_open: int = 64):
        if not bands or any(int(b) < 1 for b in bands):
            raise CropScaleError(f"hr_bands must be 1-based band indices, got {list(bands)}")
        if not value_max > 0:
            raise CropScaleError(f"hr_max must be > 0, got {value_max}")
        self.bands = [int(b) for b in bands]
        self.value_max = float(value_max)
        self.max_open = max_open
        self._open: OrderedDict[str, object] = OrderedDict()
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_open"] = OrderedDict()
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    def close(self) -> None:
        """Close every open file."""
        while self._open:
            _, src = self._open.popitem()
            src.close()

    def _dataset(self, path: Path, where: str):
        import rasterio
        from rasterio.errors import RasterioIOError

        if self._pid != os.getpid():
            # a forked DataLoader worker must not share GDAL file handles (and offsets) with its parent
            self._open = OrderedDict()
            self._pid = os.getpid()
        key = str(path)
        src = self._open.get(key)
        if src is not None:
            self._open.move_to_end(key)
            return src
        try:
            src = rasterio.open(key)
        except RasterioIOError as err:
            raise CropScaleError(f"{where}: cannot open high-grid image {path}: {err}") from None
        self._open[key] = src
        if len(self._open) > self.max_open:
            _, old = self._open.popitem(last=False)
            old.close()
        return src

    def read(
        self,
        path: str | Path,
        *,
        crs: str,
        bounds: tuple[float, float, float, float],
        out_hw: tuple[int, int],
        where: str = "",
    ) -> HighGridRead:
        """Read ground rectangle ``bounds`` (in ``crs``) of ``path`` onto an ``out_hw`` grid.

        Args:
            path: GeoTIFF (or any GDAL raster).
            crs: the patch's CRS (anything :meth:`rasterio.crs.CRS.from_user_input` takes).
            bounds: ``(left, bottom, right, top)`` in ``crs`` units, from :func:`crop_bounds`.
            out_hw: output ``(h, w)``: ``HR_SCALE`` x the 10 m crop.
            where: context for error messages (e.g. ``"patch 1001"``).

        Returns:
            :class:`HighGridRead` with ``data`` ``[len(bands), h, w]`` float32 in [0, 1].

        Raises:
            CropScaleError: unreadable file, missing or different CRS, rotated transform, too few
                bands, extent not covering ``bounds``.
        """
        from rasterio.crs import CRS
        from rasterio.enums import Resampling
        from rasterio.errors import RasterioIOError
        from rasterio.transform import Affine
        from rasterio.windows import Window, from_bounds

        path = Path(path)
        where = where or "high-grid read"
        src = self._dataset(path, where)
        if src.crs is None:
            raise CropScaleError(f"{where}: high-grid image {path} has no CRS; cannot check that it covers the patch")
        patch_crs = CRS.from_user_input(crs)
        if not same_crs(src.crs, patch_crs):
            raise CropScaleError(
                f"{where}: high-grid image {path} is in {src.crs}, the patch in {patch_crs}; "
                "reproject the image to the patch CRS (no silent reprojection)"
            )
        t = src.transform
        if t.b != 0 or t.d != 0 or t.a <= 0 or t.e >= 0:
            raise CropScaleError(f"{where}: high-grid image {path} has a rotated or flipped transform {tuple(t)[:6]}")
        if max(self.bands) > src.count:
            raise CropScaleError(
                f"{where}: high-grid image {path} has {src.count} bands, hr_bands asks for {self.bands}"
            )
        left, bottom, right, top = bounds
        fb = src.bounds
        tol_x, tol_y = _SNAP * t.a, _SNAP * -t.e
        if left < fb.left - tol_x or right > fb.right + tol_x or bottom < fb.bottom - tol_y or top > fb.top + tol_y:
            raise CropScaleError(
                f"{where}: high-grid image {path} covers {tuple(round(v, 3) for v in fb)}, which does not "
                f"cover the crop {tuple(round(v, 3) for v in bounds)} ({patch_crs})"
            )
        win = from_bounds(left, bottom, right, top, transform=t)
        win = Window(_snap(win.col_off), _snap(win.row_off), _snap(win.width), _snap(win.height))
        out_h, out_w = out_hw
        same_grid = all(float(v).is_integer() for v in (win.col_off, win.row_off)) and (
            win.width == out_w and win.height == out_h
        )
        if same_grid:
            resampling = Resampling.nearest
        elif win.width > out_w or win.height > out_h:
            resampling = Resampling.average
        else:
            resampling = Resampling.bilinear
        try:
            data = src.read(
                self.bands, window=win, out_shape=(len(self.bands), out_h, out_w),
                resampling=resampling, out_dtype="float32",
            )
        except RasterioIOError as err:
            raise CropScaleError(f"{where}: cannot read high-grid image {path}: {err}") from None
        np.divide(data, np.float32(self.value_max), out=data)
        np.clip(data, 0.0, 1.0, out=data)
        grid = t @ Affine.translation(win.col_off, win.row_off) @ Affine.scale(win.width / out_w, win.height / out_h)
        return HighGridRead(data=data, transform=grid, window=win)


def high_grid_shape(crop_hw: tuple[int, int]) -> tuple[int, int]:
    """High-grid ``(10h, 10w)`` of a 10 m ``(h, w)`` crop."""
    return (int(crop_hw[0]) * HR_SCALE, int(crop_hw[1]) * HR_SCALE)

