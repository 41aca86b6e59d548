"""High-grid windowed reads: exact georeferenced alignment with the 10 m crop (Flanders SPOT-layout
GeoTIFFs), resampling and CRS/extent refusal on the real 0.2 m aerial image (EPSG:25832)."""

import json

import numpy as np
import pytest
import rasterio
import torch
from affine import Affine
from rasterio.windows import Window

from cropscale import CropScaleError
from cropscale.batch import HR_SCALE
from cropscale.data.dataset import PastisHDDataset
from cropscale.data.hr import HighGridReader, crop_bounds


def polygons(root):
    meta = json.loads((root / "metadata.geojson").read_text())
    out = {}
    for f in meta["features"]:
        ring = np.asarray(f["geometry"]["coordinates"][0], dtype=float)
        out[f["properties"]["ID_PATCH"]] = (ring[:, 0].min(), ring[:, 1].max())  # (left, top)
    return out


def test_training_crop_hr_is_georeferenced_window(flanders_root):
    """hr of a crop = the GeoTIFF pixels whose ground position is the patch polygon's corner plus the
    crop offset x 10 m, checked through the file's own transform."""
    ds = PastisHDDataset(flanders_root, [1], train=True, augment=False, samples_per_patch=6, seed=11)
    corners = polygons(flanders_root)
    offsets = set()
    for i in range(len(ds)):
        s = ds[i]
        pid = int(s["patch_id"])
        y, x = (int(v) for v in s["crop_yx"])
        offsets.add(y)
        left, top = corners[pid]
        gx, gy = left + 10.0 * x, top - 10.0 * y  # ground coordinates (m, EPSG:32631) of the crop corner
        with rasterio.open(flanders_root / "DATA_SPOT" / f"SPOT_{pid}.tif") as src:
            col, row = ~src.transform @ (gx, gy)
            assert float(col).is_integer() and float(row).is_integer()
            raw = src.read(window=Window(int(col), int(row), 320, 320)).astype(np.float32) / 255.0
        assert s["hr"].shape == (3, 320, 320)
        assert torch.equal(s["hr"], torch.from_numpy(raw))
        # the reader's grid transform is the crop's corner at 1 m
        p = ds.patches[i // 6]
        read = ds.hr_reader.read(p.hr, crs=p.geo.crs, bounds=crop_bounds(p.geo.bounds, p.hw, (y, x), (32, 32)),
                                 out_hw=(320, 320))
        assert read.transform.almost_equals(Affine(1.0, 0.0, gx, 0.0, -1.0, gy))
    assert len(offsets) > 1  # several crop rows exercised


def test_validation_hr_matches_sentinel2_content(flanders_root):
    """Content check of the alignment: the 10 x 10 block mean of hr correlates best with the clear-sky
    S2 median (B04 B03 B02) at zero offset, not at a 10 m shift."""
    ds = PastisHDDataset(flanders_root, [2], train=False)
    s = ds[0]
    pid = int(s["patch_id"])
    s2 = np.load(flanders_root / "DATA_S2" / f"S2_{pid}.npy").astype(float)
    mask = np.load(flanders_root / "DATA_S2_MASK" / f"MASK_{pid}.npy") > 0
    median = np.nanmedian(np.where(mask[:, None], s2[:, [2, 1, 0]], np.nan), axis=0)  # [3, 64, 32]
    hr = s["hr"].numpy()
    assert hr.shape == (3, 640, 320)
    blocks = hr.reshape(3, 64, HR_SCALE, 32, HR_SCALE).mean(axis=(2, 4))

    def corr(dy, dx):
        a = median[:, max(dy, 0):64 + min(dy, 0), max(dx, 0):32 + min(dx, 0)]
        b = blocks[:, max(-dy, 0):64 + min(-dy, 0), max(-dx, 0):32 + min(-dx, 0)]
        return np.corrcoef(a.ravel(), b.ravel())[0, 1]

    c0 = corr(0, 0)
    assert c0 > 0.8
    assert all(c0 > corr(dy, dx) for dy, dx in [(1, 0), (-1, 0), (0, 1), (0, -1)])


# ---------------------------------------------------------------- the real 0.2 m aerial image
VHR_CRS = "EPSG:25832"
# a 5 x 5 patch of 10 m pixels inside the image (565642.6 .. 565703.4 E, 5770919.6 .. 5770980.4 N)
VHR_PATCH = (565645.0, 5770925.0, 565695.0, 5770975.0)


def test_vhr_windowed_read_resamples_to_high_grid(vhr_sample):
    reader = HighGridReader(bands=[2, 3, 4])  # R, G, B of the NIR-R-G-B image
    bounds = crop_bounds(VHR_PATCH, (5, 5), (1, 2), (3, 2))  # rows 1..3, cols 2..3 of the patch
    assert bounds == (565665.0, 5770935.0, 565685.0, 5770965.0)
    read = reader.read(vhr_sample, crs=VHR_CRS, bounds=bounds, out_hw=(3 * HR_SCALE, 2 * HR_SCALE))
    assert read.data.shape == (3, 30, 20) and read.data.dtype == np.float32
    assert read.transform.almost_equals(Affine(1.0, 0.0, 565665.0, 0.0, -1.0, 5770965.0))
    with rasterio.open(vhr_sample) as src:
        col, row = ~src.transform @ (565665.0, 5770965.0)
        c0, r0 = int(round(col)), int(round(row))
        assert (c0, r0) == (112, 77)
        raw = src.read([2, 3, 4], window=Window(c0, r0, 100, 150)).astype(np.float64)
    # 0.2 m -> 1 m: each output pixel is the mean of a 5 x 5 block of source pixels (GDAL rounds to uint8)
    expected = raw.reshape(3, 30, 5, 20, 5).mean(axis=(2, 4)) / 255.0
    assert np.abs(read.data - expected).max() <= 0.5 / 255.0 + 1e-6
    # the window is what was read: a one-pixel (0.2 m) shift gives a visibly different result
    shifted = raw[:, 5:, :].reshape(3, 29, 5, 20, 5).mean(axis=(2, 4)) / 255.0
    assert np.abs(read.data[:, :29] - shifted).max() > 0.02


def test_vhr_upsampling_when_file_is_coarser(vhr_sample):
    reader = HighGridReader(bands=[2, 3, 4])
    bounds = crop_bounds(VHR_PATCH, (5, 5), (0, 0), (1, 1))  # a 10 m pixel = 50 source pixels
    read = reader.read(vhr_sample, crs=VHR_CRS, bounds=bounds, out_hw=(100, 100))  # 0.1 m grid
    assert read.data.shape == (3, 100, 100)
    assert read.transform.a == pytest.approx(0.1) and read.transform.e == pytest.approx(-0.1)
    assert 0.0 <= read.data.min() and read.data.max() <= 1.0


@pytest.mark.parametrize(
    "crs,bounds,needle",
    [
        ("EPSG:32631", VHR_PATCH, "EPSG:25832"),                          # other CRS, same numbers
        (VHR_CRS, (565600.0, 5770925.0, 565650.0, 5770975.0), "does not cover"),   # sticks out west
        (VHR_CRS, (565645.0, 5770960.0, 565695.0, 5771010.0), "does not cover"),   # sticks out north
    ],
)
def test_vhr_refuses_crs_or_extent_not_covering_patch(vhr_sample, crs, bounds, needle):
    reader = HighGridReader(bands=[2, 3, 4])
    with pytest.raises(CropScaleError) as err:
        reader.read(vhr_sample, crs=crs, bounds=bounds, out_hw=(50, 50), where="patch 7")
    msg = str(err.value)
    assert needle in msg and "patch 7" in msg and str(vhr_sample) in msg


def test_vhr_refuses_missing_bands(vhr_sample):
    with pytest.raises(CropScaleError, match="4 bands"):
        HighGridReader(bands=[3, 4, 5]).read(vhr_sample, crs=VHR_CRS, bounds=VHR_PATCH, out_hw=(50, 50))


def test_forked_workers_reopen_geotiffs(flanders_root):
    """Files opened in the main process are not shared with forked workers (GDAL handles and file
    offsets): reads in two workers equal the main process's reads."""
    from torch.utils.data import DataLoader

    ds = PastisHDDataset(flanders_root, None, train=False)
    main_reads = [ds[i]["hr"] for i in range(len(ds))]
    assert len(ds.hr_reader._open) == 4  # opened here, before the workers fork
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    for i, s in enumerate(loader):
        assert torch.equal(s["hr"], main_reads[i])
