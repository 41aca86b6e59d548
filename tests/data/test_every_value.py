"""The data checks see every value a run reads (issue 37): a bad value on any date, not only on the first, middle
and last, stops the run at setup with an error naming the file, the patch and the date index.

Each case poisons a copy of the bundled Flanders sample (patches 1001, 2001 in fold 1, training; 1002, 2002 in
fold 2, validation) on the dates in between: every date except the three the old checks read (first, middle,
last), which holds every date the training sampler and the validation reads take.
"""

import numpy as np
import pytest

from cropscale.data.dataset import PastisHDDataset
from tests.data.test_content_checks import _dm
from tests.data.test_errors import raises_naming


def _between(t: int) -> np.ndarray:
    """Every date index of a series of ``t`` but the first, middle and last."""
    old = np.unique(np.round(np.linspace(0, t - 1, 3)).astype(int))
    return np.setdiff1d(np.arange(t), old)


def _edit(path, edit, dtype=None):
    a = np.load(path)
    a = a.astype(dtype) if dtype is not None else a
    edit(a)
    np.save(path, a)
    return a


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_s1_in_linear_power_on_the_dates_in_between_is_refused(flanders4):
    path = flanders4 / "DATA_S1A" / "S1A_1002.npy"
    first = int(_between(159)[40])
    _edit(path, lambda a: a.__setitem__(slice(first, first + 20),
                                        10.0 ** (a[first:first + 20] / 10.0)))  # 20 dates in linear power
    with raises_naming("patch 1002", path, f"date index {first}", "linear power or amplitude, not backscatter in dB",
                       "10 * log10(power)"):
        _dm(flanders4).setup("fit")


def test_s1_far_from_db_on_one_date_is_refused(flanders4):
    path = flanders4 / "DATA_S1A" / "S1A_2001.npy"  # training patch
    _edit(path, lambda a: a.__setitem__(33, a[33] * 1e3))
    with raises_naming("patch 2001", path, "date index 33", "not backscatter in dB"):
        _dm(flanders4).setup("fit")


def test_mask_with_other_values_on_the_dates_in_between_is_an_error_not_clear(flanders4):
    path = flanders4 / "DATA_S2_MASK" / "MASK_1002.npy"
    m = np.load(path)
    t = int(_between(m.shape[0])[7])
    y, x = map(int, np.argwhere(m[t] == 1)[0])
    _edit(path, lambda a: a.__setitem__((t, y, x), 2))
    with raises_naming("patch 1002", path, f"date index {t}", f"pixel ({y}, {x})", "value 2",
                       "0 (cloud or no data) and 1 (clear) only"):
        _dm(flanders4).setup("fit")


def test_mask_with_other_values_is_an_error_when_read_without_the_setup_scan(flanders4):
    # the dataset alone (no data module, so no setup scan): the dates a training sample reads carry value 3
    path = flanders4 / "DATA_S2_MASK" / "MASK_1001.npy"
    m = np.load(path)
    between = _between(m.shape[0])
    _edit(path, lambda a: a.__setitem__(between, np.where(a[between] == 1, 3, a[between])))
    ds = PastisHDDataset(flanders4, [1], train=True, t2=8, t1=2)
    with raises_naming("patch 1001", path, "date index", "value 3", "0 (cloud or no data) and 1 (clear) only"):
        ds[0]


def test_nan_on_the_dates_in_between_is_refused_at_setup(flanders4):
    path = flanders4 / "DATA_S2" / "S2_1002.npy"
    mask = np.load(flanders4 / "DATA_S2_MASK" / "MASK_1002.npy")
    between = _between(mask.shape[0])
    t = int(next(d for d in between if mask[d, 0, 0] == 1))
    _edit(path, lambda a: a.__setitem__((between, 0, 0, 0), np.nan), dtype=np.float32)
    with raises_naming("patch 1002", path, "non-finite", f"date index {t}", "band B02", "pixel (0, 0)"):
        _dm(flanders4).setup("fit")


def test_nodata_value_on_the_dates_in_between_is_refused_at_setup(flanders4):
    path = flanders4 / "DATA_S2" / "S2_1002.npy"
    mask = np.load(flanders4 / "DATA_S2_MASK" / "MASK_1002.npy")
    between = _between(mask.shape[0])
    t = int(next(d for d in between if (mask[d] == 1).any()))
    y, x = map(int, np.argwhere(mask[t] == 1)[0])
    _edit(path, lambda a: a.__setitem__((t, 3, y, x), -9999))
    with raises_naming("patch 1002", path, "reflectance -9999 at a pixel the mask calls clear", f"date index {t}",
                       "band B05", f"pixel ({y}, {x})"):
        _dm(flanders4).setup("fit")


def test_reflectance_in_0_1_on_the_dates_in_between_is_refused(flanders4):
    path = flanders4 / "DATA_S2" / "S2_2002.npy"
    mask = np.load(flanders4 / "DATA_S2_MASK" / "MASK_2002.npy")
    t = int(next(d for d in _between(mask.shape[0]) if (mask[d] == 1).sum() > 500))
    _edit(path, lambda a: a.__setitem__(t, a[t] / 1e4), dtype=np.float32)
    with raises_naming("patch 2002", path, f"date index {t}", "not reflectance x 1e4"):
        _dm(flanders4).setup("fit")
