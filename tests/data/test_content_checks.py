"""Data mistakes that used to train with exit 0 (issue 17): each now ends in a CropScaleError naming the
patch and the file, or in a warning the data module records (``data_warnings``, written to ``run.json``).

Broken copies of the bundled real samples are built in ``tmp_path`` (as in ``test_errors.py``). The
Flanders sample: patches 1001, 2001 in fold 1 (training), 1002, 2002 in fold 2 (validation).
"""

import json
import warnings

import numpy as np
import pytest
import torch

from cropscale.data.datamodule import PastisHDDataModule
from cropscale.data.dataset import PastisHDDataset
from cropscale.data.metadata import read_metadata
from cropscale.data.scans import compute_norm_stats
from tests.data.test_errors import raises_naming, rewrite_tif


def _dm(root, **kw):
    kw.setdefault("t2", 8)
    kw.setdefault("t1", 2)
    return PastisHDDataModule(str(root), **kw)


def _rewrite_meta(root, edit):
    meta = json.loads((root / "metadata.geojson").read_text())
    edit(meta)
    (root / "metadata.geojson").write_text(json.dumps(meta))


# ------------------------------------------------------------------ case 1: dates out of order
def test_dates_in_reverse_order_are_refused(flanders4):
    values = []

    def reverse(meta):
        props = next(f["properties"] for f in meta["features"] if f["properties"]["ID_PATCH"] == 1002)
        dates = props["dates-S2"]
        values.extend(int(dates[k]) for k in sorted(dates, key=int))
        props["dates-S2"] = {str(i): v for i, v in enumerate(reversed(values))}

    _rewrite_meta(flanders4, reverse)
    meta = flanders4 / "metadata.geojson"
    with raises_naming(meta, "patch 1002", "dates-S2", "not in chronological order",
                       f"the date at index 1, {values[-2]}, is earlier than the one at index 0, {values[-1]}",
                       f"({len(values) - 1} such step(s))"):
        read_metadata(meta)
    with raises_naming(meta, "patch 1002", "dates-S2"):
        _dm(flanders4).setup("fit")


# ------------------------------------------------------------------ case 2: a dtype that cannot hold the unit
def test_s2_stored_as_uint8_is_refused(flanders4):
    path = flanders4 / "DATA_S2" / "S2_2001.npy"
    np.save(path, np.load(path).astype(np.uint8))  # wraps mod 256, as a careless export does
    with raises_naming("patch 2001", path, "uint8", "reflectance x 1e4"):
        PastisHDDataset(flanders4, [1], train=True)


def test_s1_stored_as_unsigned_integers_is_refused(flanders4):
    path = flanders4 / "DATA_S1A" / "S1A_1002.npy"
    np.save(path, np.load(path).astype(np.uint16))
    with raises_naming("patch 1002", path, "uint16", "dB"):
        _dm(flanders4).setup("fit")


# ------------------------------------------------------------------ case 3: another unit or scale
def test_validation_reflectance_in_0_1_is_refused_at_setup(flanders4):
    path = flanders4 / "DATA_S2" / "S2_1002.npy"
    np.save(path, (np.load(path) / 1e4).astype(np.float32))
    with raises_naming("patch 1002", path, "reflectance in 0..1", "x 1e4"):
        _dm(flanders4).setup("fit")


def test_s1_on_another_scale_is_a_recorded_warning(flanders4):
    """dB / 10 (bel) keeps every value in dB's range and its sign, so no single value is wrong: the patch's
    per-band magnitude against the training statistics flags it. (Linear power, 10^(dB/10), has no value
    below 0 and is an error: tests/data/test_silent_data.py.)"""
    path = flanders4 / "DATA_S1A" / "S1A_1002.npy"
    np.save(path, (np.load(path) / 10.0).astype(np.float32))
    dm = _dm(flanders4)
    with pytest.warns(UserWarning, match="patch 1002") as rec:
        dm.setup("fit")
    text = " ".join(str(w.message) for w in rec)
    assert "S1A" in text and str(path) in text and "training statistics" in text
    assert any("patch 1002" in w and "S1A" in w for w in dm.data_warnings)
    assert not any("S2" in w for w in dm.data_warnings)  # the S2 of every patch is as the statistics


# ------------------------------------------------------------------ case 4: zeros in every band are no data
def test_all_zero_s2_with_clear_mask_is_no_data(flanders4):
    path = flanders4 / "DATA_S2" / "S2_1001.npy"
    np.save(path, np.zeros_like(np.load(path)))
    with raises_naming("patch 1001", "all 118 dates invalid", path, "all bands 0"):
        _dm(flanders4).setup("fit")


def test_zero_pixels_under_a_clear_mask_are_masked_and_left_out_of_statistics(flanders4):
    s2_path = flanders4 / "DATA_S2" / "S2_1001.npy"
    mask = np.load(flanders4 / "DATA_S2_MASK" / "MASK_1001.npy") > 0
    s2 = np.load(s2_path)
    clear_dates = np.flatnonzero(mask.reshape(mask.shape[0], -1).mean(axis=1) >= 0.5)
    zeroed = clear_dates[::2]
    s2[zeroed, :, :, :16] = 0  # left half of the patch: no data on those dates, the mask says clear
    np.save(s2_path, s2)

    # statistics: an independent computation over mask & not-all-zero of the training patches
    values = []
    for pid in (1001, 2001):
        x = np.load(flanders4 / "DATA_S2" / f"S2_{pid}.npy").astype(np.float64)
        m = (np.load(flanders4 / "DATA_S2_MASK" / f"MASK_{pid}.npy") > 0) & np.any(x != 0, axis=1)
        values.append(x.transpose(1, 0, 2, 3)[:, m])
    values = np.concatenate(values, axis=1)
    stats = compute_norm_stats(flanders4, [1])
    np.testing.assert_allclose(stats.s2_mean, values.mean(axis=1), rtol=1e-10)
    np.testing.assert_allclose(stats.s2_std, values.std(axis=1), rtol=1e-10)

    # samples: wherever the ten bands are 0, s2_mask is False, whatever DATA_S2_MASK says
    ds = PastisHDDataset(flanders4, [1], train=False, t2=len(clear_dates))
    s = ds[0]
    assert s["patch_id"] == 1001
    zero = (s["s2"] == 0).all(dim=1)
    assert zero[:, :, :16].any()
    assert not (s["s2_mask"] & zero).any()
    assert s["s2_mask"][:, :, 16:].any()


# ------------------------------------------------------------------ case 5: files without a metadata entry
def test_orphan_files_are_one_recorded_warning(flanders4):
    _rewrite_meta(flanders4, lambda m: m.update(features=[f for f in m["features"]
                                                          if f["properties"]["ID_PATCH"] in (1001, 1002)]))
    dm = _dm(flanders4)
    with pytest.warns(UserWarning) as rec:
        dm.setup("fit")
    orphan = [str(w.message) for w in rec if "no entry in" in str(w.message)]
    assert len(orphan) == 1, orphan
    assert "2 patch id(s)" in orphan[0] and "2001, 2002" in orphan[0] and "metadata.geojson" in orphan[0]
    assert [w for w in dm.data_warnings if "no entry in" in w] == orphan
    dm.setup("validate")  # a second setup does not repeat it
    assert len([w for w in dm.data_warnings if "no entry in" in w]) == 1


def test_metadata_without_files_stays_an_error(flanders4):
    (flanders4 / "DATA_S2" / "S2_1002.npy").unlink()
    with raises_naming("patch 1002", "missing", flanders4 / "DATA_S2" / "S2_1002.npy"):
        _dm(flanders4).setup("fit")


# ------------------------------------------------------------------ case 6: overlapping folds
def test_overlapping_folds_are_refused_unless_allowed(flanders_root):
    with raises_naming("data.train_folds [1, 2]", "data.val_folds [2]", "fold(s) [2]", "data.allow_fold_overlap"):
        PastisHDDataModule(str(flanders_root), train_folds=[1, 2], val_folds=[2])
    with raises_naming("data.train_folds [1]", "data.test_folds [1]", "fold(s) [1]"):
        PastisHDDataModule(str(flanders_root), train_folds=[1], val_folds=[2], test_folds=[1])
    PastisHDDataModule(str(flanders_root), train_folds=[1], val_folds=[2], test_folds=[2])  # val = test: no leak
    dm = _dm(flanders_root, train_folds=[1, 2], val_folds=[2], allow_fold_overlap=True, s1_orbits=["S1A"])
    assert dm.data_warnings == ["data.train_folds [1, 2] and data.val_folds [2] share fold(s) [2] "
                                "(allowed by data.allow_fold_overlap)"]


# ------------------------------------------------------------------ case 10: every fold checked at setup
def _broken_validation_label(root):
    path = root / "ANNOTATIONS" / "TARGET_2002.npy"
    a = np.load(path)
    a[0, 40, 3] = 12
    np.save(path, a)
    return path, ("patch 2002", path, "class id 12", "pixel (40, 3)")


def _broken_validation_geotiff(root):
    path = root / "DATA_SPOT" / "SPOT_2002.tif"
    rewrite_tif(path, shift=(0.0, -700.0))
    return path, ("patch 2002", path, "does not cover")


def _broken_validation_mask(root):
    path = root / "DATA_S2_MASK" / "MASK_1002.npy"
    np.save(path, np.zeros_like(np.load(path)))
    return path, ("patch 1002", path, "all 118 dates invalid")


def _broken_validation_nan(root):
    path = root / "DATA_S2" / "S2_2002.npy"
    a = np.load(path).astype(np.float32)
    a[:, 3, 10, 20] = np.nan  # every date, so whatever dates are sampled
    np.save(path, a)
    return path, ("patch 2002", path, "non-finite", "band B05", "pixel (10, 20)")


@pytest.mark.parametrize("breaker", [_broken_validation_label, _broken_validation_geotiff, _broken_validation_mask,
                                     _broken_validation_nan])
def test_validation_patch_errors_surface_at_setup(flanders4, breaker):
    _, needles = breaker(flanders4)
    dm = _dm(flanders4)
    with raises_naming(*needles):
        dm.setup("fit")
    with raises_naming(*needles):
        _dm(flanders4).setup("validate")


# ------------------------------------------------------------------ clean data: only what the data set lacks
def test_clean_samples_have_only_the_warnings_of_what_they_lack(flanders_root, pastis_mini_root):
    """The real samples pass every check; what is recorded is what each lacks (issue 37): Flanders has no
    descending orbit; pastis-r-mini has no cloud mask, no high-grid image, and 3 dates per series (t2 = 8 pads)."""
    dm = _dm(flanders_root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm.setup(None)
    assert dm.data_warnings == [f"{flanders_root}: the model is trained without Sentinel-1 descending (no DATA_S1D"
                                " folder: its inputs are zeros with masks False)"]
    assert torch.is_tensor(dm.val_dataset[0]["s2"])
    dm = _dm(pastis_mini_root, test_folds=[3])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm.setup(None)
    assert dm.data_warnings == [
        f"{pastis_mini_root}: the model is trained without the Sentinel-2 cloud mask (no DATA_S2_MASK folder: only"
        " pixels whose ten bands are all 0 count as no data, so every cloudy observation is fed as clear), the"
        " high-grid image (no DATA_SPOT folder: hr_present False, no x10 detail target)",
        "data.t2 8 is above every Sentinel-2 series' length (at most 3 dates): each sample is padded with 5..5 dates"
        " of zeros (62 % of the Sentinel-2 dates fed are padding, computed on but masked); lower data.t2 to 3 or less"]


def test_clean_sample_with_its_modalities_stated_has_no_warning(flanders_root, pastis_mini_root):
    dm = _dm(flanders_root, s1_orbits=["S1A"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dm.setup(None)
    assert dm.data_warnings == []
    dm = _dm(pastis_mini_root, test_folds=[3], t2=3, s2_mask=False, high_grid=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dm.setup(None)
    assert dm.data_warnings == []
