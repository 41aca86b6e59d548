"""Data mistakes that trained with exit 0 and no data warning (issue 27): each now stops the run at setup with
an error naming the file and the value, or is one warning in ``data_warnings``.

Broken copies of the bundled real samples are built in ``tmp_path`` (as in ``test_errors.py``). Flanders:
patches 1001, 2001 in fold 1 (training), 1002, 2002 in fold 2 (validation); S2 with a 0/1 mask, S1A in dB.
"""

import warnings

import numpy as np
import pytest

from tests.data.conftest import FLANDERS_IDS
from tests.data.test_content_checks import _dm
from tests.data.test_errors import raises_naming


# ------------------------------------------------------------------ Sentinel-1 in linear power in every file
def test_s1_in_linear_power_in_every_file_is_refused(flanders4):
    # every file converted alike: the training statistics are linear too, so no scale warning can see it
    for pid in FLANDERS_IDS:
        path = flanders4 / "DATA_S1A" / f"S1A_{pid}.npy"
        db = np.load(path)
        np.save(path, (10.0 ** (db / 10.0)).astype(np.float32))
    with raises_naming("S1A file", "DATA_S1A", "linear power or amplitude, not backscatter in dB",
                       "at date index 0, 0 % of 4096 VV, VH values are below 0", "10 * log10(power)"):
        _dm(flanders4).setup("fit")


def test_s1_in_db_with_a_few_positive_values_is_accepted(flanders4):
    # the real sample is dB: most VV, VH below 0, some above (bright targets); no error, no warning
    path = flanders4 / "DATA_S1A" / "S1A_1001.npy"
    a = np.load(path)
    assert 0.5 < (a[:, :2] < 0).mean() < 1.0  # the premise: a real dB series has positive values too
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dm = _dm(flanders4, s1_orbits=["S1A"])
        dm.setup("fit")
    assert dm.data_warnings == []


# ------------------------------------------------------------------ a class-coded cloud mask (4/9)
def test_mask_coded_4_and_9_is_refused(flanders4):
    path = flanders4 / "DATA_S2_MASK" / "MASK_1002.npy"
    m = np.load(path)
    np.save(path, np.where(m > 0, 4, 9).astype(m.dtype))  # Sen2Cor-like: 4 vegetation, 9 cloud
    with raises_naming("patch 1002", path, "value 9 at date index 0", "values 4, 9",
                       "0 (cloud or no data) and 1 (clear) only"):
        _dm(flanders4).setup("fit")


# ------------------------------------------------------------------ -9999 where the mask says clear
def test_nodata_value_at_a_clear_pixel_is_refused_at_setup(flanders4):
    path = flanders4 / "DATA_S2" / "S2_2002.npy"
    mask = np.load(flanders4 / "DATA_S2_MASK" / "MASK_2002.npy")
    a = np.load(path)
    t = next(t for t in (0, a.shape[0] - 1) if (mask[t] > 0).any())  # first and last dates are always sampled
    y, x = map(int, np.argwhere(mask[t] > 0)[0])
    a[t, :, y, x] = -9999
    np.save(path, a)
    with raises_naming("patch 2002", path, "reflectance -9999 at a pixel the mask calls clear",
                       f"date index {t}", "band B02", f"pixel ({y}, {x})", "10 such value(s)"):
        _dm(flanders4).setup("fit")


def test_nodata_value_on_every_date_but_the_old_sample_is_refused_at_setup(flanders4):
    path = flanders4 / "DATA_S2" / "S2_1002.npy"
    mask = np.load(flanders4 / "DATA_S2_MASK" / "MASK_1002.npy")
    a = np.load(path)
    a[:, 3][mask[:, :, :] > 0] = -9999  # band B05 at every clear pixel of every date
    sampled = np.linspace(0, a.shape[0] - 1, 3).round().astype(int)
    a[sampled] = np.load(path)[sampled]  # not on the three dates the old setup check read
    np.save(path, a)
    first = int(next(t for t in range(a.shape[0]) if t not in sampled and (mask[t] > 0).any()))
    with raises_naming("patch 1002", path, "reflectance -9999 at a pixel the mask calls clear", "band B05",
                       f"date index {first}"):
        _dm(flanders4).setup("fit")


def test_nodata_value_under_the_mask_is_accepted(flanders4):
    path = flanders4 / "DATA_S2" / "S2_1002.npy"
    mask = np.load(flanders4 / "DATA_S2_MASK" / "MASK_1002.npy")
    a = np.load(path)
    cloudy = np.broadcast_to(mask[:, None] == 0, a.shape)
    assert cloudy.any()
    a[cloudy] = -9999
    np.save(path, a)
    dm = _dm(flanders4)
    dm.setup("fit")
    s2 = dm.val_dataset[0]["s2"]
    assert float(s2.abs().max()) < 100  # normalised values; the -9999 under the mask never reach the sample


# ------------------------------------------------------------------ a modality folder misspelt
@pytest.mark.parametrize(("folder", "typo"), [("DATA_S1A", "DATA_S1a"), ("DATA_SPOT", "DATA_SPOT6"),
                                              ("DATA_S2_MASK", "DATA_S2_MASKS")])
def test_misspelt_modality_folder_is_named_in_the_data_warning(flanders4, folder, typo):
    (flanders4 / folder).rename(flanders4 / typo)
    with pytest.warns(UserWarning, match="a misspelling"):
        dm = _dm(flanders4)
    (line,) = [w for w in dm.data_warnings if "misspelling" in w]
    assert line.startswith(f"{flanders4}: the model is trained without ")
    assert f"(no {folder} folder: " in line and f"; there is {typo}: a misspelling? rename it to {folder})" in line


def test_absent_modality_folders_of_pastis_are_one_data_warning(pastis_mini_root):
    # PASTIS-R has no DATA_SPOT and no DATA_S2_MASK: one line says what the model is trained without
    with pytest.warns(UserWarning, match="the model is trained without") as issued:
        dm = _dm(pastis_mini_root, test_folds=[3], t2=3)
    dm.setup(None)
    assert [str(w.message) for w in issued if "trained without" in str(w.message)] == dm.data_warnings
    assert "the Sentinel-2 cloud mask (no DATA_S2_MASK" in dm.data_warnings[0]
    assert "the high-grid image (no DATA_SPOT" in dm.data_warnings[0]
