"""The data checks' rules as plain functions, on hand-worked arrays (cropscale.data.content, cropscale.data.layout)."""

from pathlib import Path

import numpy as np
import pytest

from cropscale.data.content import first_failing_date, mask_value_message
from cropscale.data.index import PatchFiles
from cropscale.data.layout import padding_warning


@pytest.mark.parametrize(("values", "hits", "below", "expected"), [
    ([100, 100, 10, 10, 0], [50, 0, 0, 0, 0], True, (1, 0.0, 100)),      # date 1 alone: 0 % < 1 %
    ([100, 100, 10, 10], [50, 50, 0, 0], True, (2, 0.0, 20)),            # dates 2, 3 pooled: 20 values, 0 %
    ([100, 100, 10, 10], [50, 50, 1, 0], True, None),                    # pooled: 1 / 20 = 5 % >= 1 %
    ([100, 5, 5], [50, 0, 0], True, None),                               # pooled: 10 values < 20, not judged
    ([20], [0], True, (0, 0.0, 20)),                                     # exactly the minimum: judged alone
    ([19, 1], [0, 0], True, (0, 0.0, 20)),                               # 19 + 1 pooled reach the minimum
    ([100], [1], True, None),                                            # exactly 1 %: not below
    ([100], [1], False, None),                                           # exactly 1 %: not above
    ([100, 100], [1, 2], False, (1, 0.02, 100)),                         # 2 % > 1 %
])
def test_first_failing_date(values, hits, below, expected):
    assert first_failing_date(np.array(values), np.array(hits), 0.01, below=below, minimum=20) == expected


def _patch(mask_path="m.npy"):
    return PatchFiles(patch_id=7, fold=1, hw=(4, 4), s2=Path("s2.npy"), s2_t=2, mask=Path(mask_path), s1={},
                      target=Path("t.npy"), instances=None, hr=None)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.float32, bool])
def test_mask_values_zero_and_one_pass(dtype):
    m = np.zeros((2, 3, 3), dtype=dtype)
    m[1, 2, 0] = 1
    assert mask_value_message(_patch(), m, np.array([10, 11])) is None


@pytest.mark.parametrize(("dtype", "value", "shown"), [(np.uint8, 2, "2"), (np.int8, -1, "-1"),
                                                        (np.float32, 0.5, "0.5"), (np.uint8, 255, "255")])
def test_a_mask_value_other_than_0_1_names_date_pixel_and_value(dtype, value, shown):
    m = np.ones((2, 3, 3), dtype=dtype)
    m[1, 0, 1] = value
    message = mask_value_message(_patch(), m, np.array([10, 11]), y0=5, x0=7)
    assert message.startswith(f"patch 7: S2 mask file m.npy: value {shown} at date index 11, pixel (5, 8) (1 such"
                              " value(s); values ")


@pytest.mark.parametrize(("t", "lengths", "expected"), [
    (5, [3, 5], None),                       # t equals the longest series: no padding for it
    (6, [3, 5], ("1..3", 33)),               # pads 3 and 1: 4 of 12 dates fed are padding
    (10, [10, 10, 9], None),
    (4, [], None),                           # no series (an orbit no patch has)
])
def test_padding_warning(t, lengths, expected):
    line = padding_warning("t2", t, lengths, "Sentinel-2")
    if expected is None:
        assert line is None
    else:
        assert f"each sample is padded with {expected[0]} dates of zeros ({expected[1]} % of the" in line
        assert line.startswith(f"data.t2 {t} is above every Sentinel-2 series' length (at most {max(lengths)} dates)")
