"""Bad inputs: each gives a clear CropScaleError naming the patch and the file (or the documented
fallback). Broken copies of real patches are built in tmp_path."""

import json
import shutil
import warnings

import numpy as np
import pytest
import rasterio
import torch
from affine import Affine

from cropscale import CropScaleError
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.data.dataset import PastisHDDataset
from cropscale.data.scans import compute_norm_stats

DATA_DIRS = ("DATA_S2", "DATA_S2_MASK", "DATA_S1A", "DATA_S1D", "ANNOTATIONS", "INSTANCE_ANNOTATIONS", "DATA_SPOT")


def make_copy(src, dst, ids):
    """Copy metadata (restricted to ``ids``), classes.json and the files of the patches ``ids``."""
    dst.mkdir(parents=True, exist_ok=True)
    meta = json.loads((src / "metadata.geojson").read_text())
    meta["features"] = [f for f in meta["features"] if f["properties"]["ID_PATCH"] in ids]
    (dst / "metadata.geojson").write_text(json.dumps(meta))
    shutil.copy(src / "classes.json", dst / "classes.json")
    for d in DATA_DIRS:
        if (src / d).is_dir():
            (dst / d).mkdir()
            for pid in ids:
                for f in (src / d).glob(f"*_{pid}.*"):
                    shutil.copy(f, dst / d / f.name)
    return dst


@pytest.fixture
def pastis_copy(pastis_mini_root, tmp_path):
    return make_copy(pastis_mini_root, tmp_path / "pastis", [10186, 20275])  # folds 1 and 2


@pytest.fixture
def flanders_copy(flanders_root, tmp_path):
    return make_copy(flanders_root, tmp_path / "flanders", [1001])


def raises_naming(*needles):
    class _Ctx:
        def __enter__(self):
            self.ctx = pytest.raises(CropScaleError)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.ctx.__exit__(*exc)
            msg = str(self.info.value)
            for needle in needles:
                assert str(needle) in msg, (needle, msg)
            return handled

    return _Ctx()


# ------------------------------------------------------------------ root, metadata, folds
def test_missing_root(tmp_path):
    with raises_naming(tmp_path / "nope"):
        PastisHDDataModule(str(tmp_path / "nope"))
    with raises_naming(tmp_path / "nope"):
        PastisHDDataset(tmp_path / "nope", [1], train=True)


def test_missing_metadata(pastis_copy):
    (pastis_copy / "metadata.geojson").unlink()
    with raises_naming(pastis_copy / "metadata.geojson"):
        PastisHDDataModule(str(pastis_copy))
    with raises_naming(pastis_copy / "metadata.geojson"):
        PastisHDDataset(pastis_copy, [1], train=True)


def test_fold_with_no_patches(pastis_copy):
    with raises_naming("fold 4", pastis_copy / "metadata.geojson", "[1, 2]"):
        PastisHDDataset(pastis_copy, [4], train=True)
    dm = PastisHDDataModule(str(pastis_copy), val_folds=[5])
    with raises_naming("fold 5"):
        dm.setup("fit")


def test_metadata_date_count_mismatch(pastis_copy):
    meta = json.loads((pastis_copy / "metadata.geojson").read_text())
    meta["features"][0]["properties"]["dates-S2"].pop("2")
    (pastis_copy / "metadata.geojson").write_text(json.dumps(meta))
    with raises_naming("patch 10186", pastis_copy / "DATA_S2" / "S2_10186.npy", "3 dates in the array but 2"):
        PastisHDDataset(pastis_copy, [1], train=True)


# ------------------------------------------------------------------ files
@pytest.mark.parametrize("rel", ["DATA_S2/S2_10186.npy", "ANNOTATIONS/TARGET_10186.npy"])
def test_missing_file(pastis_copy, rel):
    (pastis_copy / rel).unlink()
    with raises_naming("patch 10186", "missing", pastis_copy / rel):
        PastisHDDataset(pastis_copy, [1], train=True)


def test_missing_optional_files_fall_back_with_warning(pastis_copy):
    (pastis_copy / "DATA_S1D" / "S1D_10186.npy").unlink()
    (pastis_copy / "INSTANCE_ANNOTATIONS" / "INSTANCES_10186.npy").unlink()
    with pytest.warns(UserWarning) as record:
        ds = PastisHDDataset(pastis_copy, [1], train=True)
    messages = " ".join(str(w.message) for w in record)
    assert "no S1D file for 1 patch(es) (10186)" in messages and "no INSTANCES file for 1 patch(es) (10186)" in messages
    s = ds[0]
    assert not s["s1d_mask"].any() and (s["s1d"] == 0).all() and s["s1a_mask"][:3].all()
    assert not s["parcel_present"] and (s["parcel"] == 0).all()


@pytest.mark.parametrize("how", ["truncated", "bad header"])
def test_truncated_or_corrupt_npy(pastis_copy, how):
    path = pastis_copy / "DATA_S2" / "S2_10186.npy"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncated" else b"garbage!" + data[8:])
    with raises_naming("patch 10186", path, "truncated or corrupt"):
        PastisHDDataset(pastis_copy, [1], train=True)


@pytest.mark.parametrize(
    "rel,make,needle",
    [
        ("DATA_S2/S2_10186.npy", lambda a: a[:, :9], "10 bands"),
        ("DATA_S2/S2_10186.npy", lambda a: a[0], "expected [T, 10, H, W]"),
        ("ANNOTATIONS/TARGET_10186.npy", lambda a: a[:, :31], "H, W = 32, 32"),
        ("DATA_S1A/S1A_10186.npy", lambda a: a[:, :1], "VV, VH"),
        ("INSTANCE_ANNOTATIONS/INSTANCES_10186.npy", lambda a: a[:, :16], "(32, 32)"),
    ],
)
def test_wrong_shape_or_band_count(pastis_copy, rel, make, needle):
    path = pastis_copy / rel
    np.save(path, np.ascontiguousarray(make(np.load(path))))
    with raises_naming("patch 10186", path, needle):
        PastisHDDataset(pastis_copy, [1], train=True)


def test_mask_shape_mismatch(flanders_copy):
    path = flanders_copy / "DATA_S2_MASK" / "MASK_1001.npy"
    np.save(path, np.load(path)[:-1])
    with raises_naming("patch 1001", path, "[T, H, W] = (118, 64, 32)"):
        PastisHDDataset(flanders_copy, [1], train=True)


# ------------------------------------------------------------------ content
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_reflectance(pastis_copy, bad):
    path = pastis_copy / "DATA_S2" / "S2_10186.npy"
    a = np.load(path).astype(np.float32)
    a[:, 4, 5, 6] = bad
    np.save(path, a)
    ds = PastisHDDataset(pastis_copy, [1], train=True)
    with raises_naming("patch 10186", path, "non-finite", "band B06", "pixel (5, 6)"):
        ds[0]
    with raises_naming("patch 10186", path, "non-finite"):
        compute_norm_stats(pastis_copy, [1])


def test_all_dates_invalid_by_mask(flanders_copy):
    path = flanders_copy / "DATA_S2_MASK" / "MASK_1001.npy"
    np.save(path, np.zeros_like(np.load(path)))
    ds = PastisHDDataset(flanders_copy, [1], train=True)
    with raises_naming("patch 1001", "all 118 dates invalid", path):
        ds[0]
    val = PastisHDDataset(flanders_copy, [1], train=False)
    with raises_naming("patch 1001", "all 118 dates invalid"):
        val[0]


def test_all_dates_invalid_by_no_data(pastis_copy):
    path = pastis_copy / "DATA_S2" / "S2_10186.npy"
    np.save(path, np.zeros_like(np.load(path)))
    with raises_naming("patch 10186", "all 3 dates invalid", path):
        PastisHDDataset(pastis_copy, [1], train=True)[0]


def test_crop_with_no_clear_date_uses_documented_fill(flanders_copy):
    """Only the crop rows 0..31 are cloudy on every date: the sample takes the clearest dates, marks
    them in s2_mask (all False here) and does not raise (the patch has clear observations)."""
    path = flanders_copy / "DATA_S2_MASK" / "MASK_1001.npy"
    m = np.load(path)
    m[:, :40] = 0
    np.save(path, m)
    ds = PastisHDDataset(flanders_copy, [1], train=True, samples_per_patch=20, seed=0)
    samples = [ds[i] for i in range(20)]
    top = [s for s in samples if int(s["crop_yx"][0]) <= 8]
    assert top and all(not s["s2_mask"].any() for s in top)
    assert all((s["s2_doy"] > 0).all() for s in top)


@pytest.mark.parametrize("value,ignore,ok", [(20, 19, False), (20, None, False), (19, None, True), (255, 255, True)])
def test_label_id_out_of_range(pastis_copy, value, ignore, ok):
    path = pastis_copy / "ANNOTATIONS" / "TARGET_10186.npy"
    a = np.load(path)
    a[0, 7, 8] = value
    np.save(path, a)
    ds = PastisHDDataset(pastis_copy, [1], train=False, ignore_index=ignore)
    if ok:
        assert int(ds[0]["semantic"][7, 8]) == value
    else:
        with raises_naming("patch 10186", path, f"class id {value}", "pixel (7, 8)", "num_classes 20"):
            ds[0]


# ------------------------------------------------------------------ high-grid GeoTIFF
def rewrite_tif(path, *, crs=None, shift=(0.0, 0.0)):
    with rasterio.open(path) as src:
        profile, data = src.profile, src.read()
    t = profile["transform"]
    profile.update(crs=crs or profile["crs"], transform=Affine(t.a, t.b, t.c + shift[0], t.d, t.e, t.f + shift[1]))
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data)


@pytest.mark.parametrize(
    "crs,shift,needle",
    [("EPSG:25832", (0.0, 0.0), "is in EPSG:25832, the patch in EPSG:32631"),
     (None, (5.0, 0.0), "does not cover"),
     (None, (0.0, -700.0), "does not cover")],
)
def test_geotiff_crs_or_extent_not_covering(flanders_copy, crs, shift, needle):
    path = flanders_copy / "DATA_SPOT" / "SPOT_1001.tif"
    rewrite_tif(path, crs=crs, shift=shift)
    ds = PastisHDDataset(flanders_copy, [1], train=True)
    with raises_naming("patch 1001", path, needle):
        ds[0]


def test_missing_geotiff_falls_back(flanders_copy):
    (flanders_copy / "DATA_SPOT" / "SPOT_1001.tif").unlink()
    with pytest.warns(UserWarning, match="high-grid image"):
        ds = PastisHDDataset(flanders_copy, [1], train=True)
    s = ds[0]
    assert not s["hr_present"] and s["hr"].shape == (3, 320, 320) and (s["hr"] == 0).all()


def test_geotiff_without_projected_polygon_is_refused(pastis_copy):
    (pastis_copy / "DATA_SPOT").mkdir()
    (pastis_copy / "DATA_SPOT" / "SPOT_10186.tif").write_bytes(b"not read: refused before opening")
    with raises_naming("patch 10186", "no patch polygon in a projected CRS"):
        PastisHDDataset(pastis_copy, [1], train=True)


def test_pastis_mini_warns_only_of_what_it_lacks(pastis_mini_root):
    with warnings.catch_warnings(record=True) as issued:
        warnings.simplefilter("always")
        PastisHDDataset(pastis_mini_root, None, train=False)
    assert [str(w.message).split(": the model is trained without ")[1] for w in issued] == [
        "the Sentinel-2 cloud mask (no DATA_S2_MASK folder: only pixels whose ten bands are all 0 count as no data,"
        " so every cloudy observation is fed as clear), the high-grid image (no DATA_SPOT folder: hr_present False,"
        " no x10 detail target)"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PastisHDDataset(pastis_mini_root, None, train=False, s2_mask=False, high_grid=False)


def test_non_finite_backscatter_masks_its_date(pastis_copy):
    """Documented rule for Sentinel-1 (per-date masks): a date with a non-finite dB value in the sample's
    window is invalid for the sample (s1x_mask False, values 0); no NaN or Inf reaches the network."""
    path = pastis_copy / "DATA_S1A" / "S1A_10186.npy"
    a = np.load(path)
    a[1] = np.nan  # second date: no data at all
    a[2, :, 0, 0] = -np.inf  # third date: one pixel
    np.save(path, a)
    s = PastisHDDataset(pastis_copy, [1], train=False)[0]
    assert s["s1a_mask"].tolist() == [True, False, False, False]
    assert (s["s1a"][1] == 0).all() and (s["s1a"][2] == 0).all() and (s["s1a"][0] != 0).any()
    assert torch.isfinite(s["s1a"]).all()
