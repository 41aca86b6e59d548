"""The data checks of cropscale.data.content on small synthetic patches, values hit exactly at each threshold.

Each check is fed the values it reads (the sampled dates, the clear pixels), with the boundary value on the
accepted side and its neighbour on the refused side, and the message is compared whole where it names a
place. The checks on copies of the real samples: test_content_checks.py, test_silent_data.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from cropscale.data.content import (
    S1_MAX_ABS_DB,
    S1_MIN_NEGATIVE_SHARE,
    S2_MIN_P99,
    S2_MIN_VALUE,
    SCALE_FACTOR,
    BandMagnitude,
    PatchScan,
    _magnitude,
    label_problem,
    mask_value_message,
    no_clear_observation,
    nodata_s2_message,
    nonfinite_s2_message,
    sample_dates,
    scale_warnings,
    scan_patch,
    zero_but_clear_warning,
)
from cropscale.data.index import PatchFiles
from cropscale.data.stats import NormStats
from cropscale.errors import CropScaleError

H = W = 10  # 100 pixels: one pixel is 1 % of a band's values


def _patch(tmp_path, s2, mask=None, s1=None, target=None, pid=7):
    d = tmp_path / f"p{pid}"
    d.mkdir(exist_ok=True)
    np.save(d / "s2.npy", s2)
    if mask is not None:
        np.save(d / "mask.npy", mask)
    np.save(d / "target.npy", np.zeros((3, H, W), np.int64) if target is None else target)
    s1_files = {}
    for orbit, arr in (s1 or {}).items():
        np.save(d / f"{orbit}.npy", arr)
        s1_files[orbit] = d / f"{orbit}.npy"
    return PatchFiles(patch_id=pid, fold=2, hw=(H, W), s2=d / "s2.npy", s2_t=s2.shape[0],
                      mask=None if mask is None else d / "mask.npy", s1=s1_files, target=d / "target.npy",
                      instances=None, hr=None)


def _s2(t=3, value=1500.0):
    return np.full((t, 10, H, W), value, np.float32)


def _s1(t=3, value=-12.0):
    return np.full((t, 2, H, W), value, np.float32)


@pytest.mark.parametrize(("t", "dates"), [(1, [0]), (2, [0, 1]), (3, [0, 1, 2]), (7, [0, 3, 6]), (10, [0, 4, 9]),
                                          (61, [0, 30, 60])])
def test_sample_dates_first_middle_last(t, dates):
    assert sample_dates(t).tolist() == dates
    assert sample_dates(10, k=5).tolist() == [0, 2, 4, 7, 9]  # round(linspace(0, 9, 5)) = 0, 2.25, 4.5, 6.75, 9


def test_label_ids_at_the_edges_of_the_range():
    labels = np.zeros((4, 5), np.int64)
    labels[1, 2] = 2
    assert label_problem(labels, 3, None) is None  # C - 1 is a class
    labels[2, 4], labels[3, 0] = 3, 3
    assert label_problem(labels, 3, None) == ("class id 3 at pixel (2, 4) is outside 0..2 (num_classes 3, "
                                              "ignore_index None)")  # the first bad pixel in row order
    assert label_problem(labels, 3, 3) is None  # C itself may be the ignore index
    labels[0, 1] = -1
    assert label_problem(labels, 3, 3).startswith("class id -1 at pixel (0, 1)")
    assert label_problem(labels, 4, -1) is None


def test_nonfinite_reflectance_is_named_at_clear_pixels_only():
    data = _s2()
    data[1, 3, 4, 5] = np.nan
    files = PatchFiles(7, 2, (H, W), "S2_7.npy", 3, None, {}, "t.npy", None, None)
    dates = np.array([0, 5, 9])
    assert nonfinite_s2_message(files, data, dates, y0=10, x0=20) == (
        "patch 7: S2 file S2_7.npy: non-finite reflectance (NaN or Inf) at date index 5, band B05, pixel (14, 25)")
    clear = np.ones((3, H, W), bool)
    clear[1, 4, 5] = False
    assert nonfinite_s2_message(files, data, dates, clear=clear) is None  # NaN under a cloud: accepted
    clear[1, 4, 5] = True
    assert "(NaN or Inf) at a clear pixel, at date index 5" in nonfinite_s2_message(files, data, dates, clear=clear)
    assert nonfinite_s2_message(files, data.astype(np.int16), dates) is None  # integers hold no NaN


def test_a_no_data_value_below_the_l2a_offset_at_a_clear_pixel():
    files = PatchFiles(7, 2, (H, W), "S2_7.npy", 3, None, {}, "t.npy", None, None)
    data = _s2()
    data[2, 0, 1, 1] = S2_MIN_VALUE  # -1000: the L2A offset itself is a reflectance
    dates = np.array([0, 1, 2])
    assert nodata_s2_message(files, data, dates) is None
    data[2, 0, 1, 1] = S2_MIN_VALUE - 1
    data[0, 9, 3, 3] = -9999
    msg = nodata_s2_message(files, data, dates)
    assert msg.startswith("patch 7: S2 file S2_7.npy: reflectance -9999 at a pixel the mask calls clear (date index "
                          "0, band B12, pixel (3, 3); 2 such value(s) read)")
    clear = np.ones((3, H, W), bool)
    clear[0, 3, 3] = clear[2, 1, 1] = False
    assert nodata_s2_message(files, data, dates, clear=clear) is None


def test_a_mask_holds_0_and_1_only():
    files = PatchFiles(7, 2, (H, W), "S2_7.npy", 3, "MASK_7.npy", {}, "t.npy", None, None)
    assert mask_value_message(files, np.array([[True, False]])) is None
    assert mask_value_message(files, np.array([[0, 1], [1, 1]], np.uint8)) is None
    msg = mask_value_message(files, np.array([[0, 4], [9, 1]], np.uint8))
    assert msg.startswith("patch 7: S2 mask file MASK_7.npy: values 0, 1, 4, 9 in the sampled dates;")
    many = mask_value_message(files, np.arange(10).reshape(2, 5))
    assert "values 0, 1, 2, 3, 4, 5, 6, 7 ... in the sampled dates" in many


def test_no_clear_observation_looks_past_the_first_chunk_of_dates():
    files = PatchFiles(7, 2, (H, W), "S2_7.npy", 40, "MASK_7.npy", {}, "t.npy", None, None)
    s2 = np.zeros((40, 10, H, W), np.int16)
    mask = np.zeros((40, H, W), np.uint8)
    assert no_clear_observation(files, s2, mask) == (
        "patch 7: all 40 dates invalid: S2 mask file MASK_7.npy marks no clear observation; remove the patch or fix "
        "the mask")
    mask[[3, 33]] = 1  # clear on date 3 (no data there) and date 33, in the third chunk of 16
    assert "is no data (all bands 0) wherever S2 mask file MASK_7.npy marks a clear observation" in (
        no_clear_observation(files, s2, mask))
    s2[33, 0, 5, 5] = 100
    assert no_clear_observation(files, s2, mask) is None
    mask[33, 5, 5] = 0  # data where the mask says cloud does not count
    assert no_clear_observation(files, s2, mask) is not None
    s2_only = np.zeros((40, 10, H, W), np.int16)
    assert no_clear_observation(files, s2_only, None).endswith("is no data (all bands 0) everywhere; remove the patch")
    s2_only[20, 9, 0, 0] = 1  # without a mask: any date, any band
    assert no_clear_observation(files, s2_only, None) is None


def test_band_magnitude_is_the_rms_over_the_valid_pixels():
    values = np.zeros((2, 2, 1, 2), np.float32)
    values[:, 0] = [[[3.0, 100.0]], [[4.0, -100.0]]]  # band 0; pixel 1 is invalid
    values[:, 1] = [[[1.0, 7.0]], [[1.0, 7.0]]]
    valid = np.array([[[True, False]], [[True, False]]])
    m = _magnitude(values, valid)
    assert m.count == 2 and m.rms.tolist() == pytest.approx([np.sqrt((9 + 16) / 2), 1.0])
    empty = _magnitude(values, np.zeros_like(valid))
    assert empty.count == 0 and np.isnan(empty.rms).all() and empty.rms.shape == (2,)


def test_s2_unit_check_at_the_99th_percentile_boundary(tmp_path):
    s2 = _s2(value=S2_MIN_P99 - 1)  # every clear value 99: reflectance in percent, not x 1e4
    with pytest.raises(CropScaleError, match=r"patch 7: S2 file .*: values look like reflectance in 0\.\.1 or in "
                                             r"percent, not reflectance x 1e4: the 99th percentile of \|value\| over "
                                             r"the clear pixels of 3 sampled dates is 99 "):
        scan_patch(_patch(tmp_path, s2), num_classes=3, ignore_index=None)
    s2[:, :, 0, 0] = S2_MIN_P99  # exactly 1 % of the values reach 100: the 99th percentile does
    scan = scan_patch(_patch(tmp_path, s2, pid=8), num_classes=3, ignore_index=None)
    assert scan.dates_read == {"S2": 3} and scan.magnitudes["S2"].count == 3 * H * W


def test_s2_clear_zero_pixels_are_counted_and_left_out(tmp_path):
    s2 = _s2(t=5)
    s2[:, :, 0, :] = 0  # row 0 is no data on every date
    mask = np.ones((5, H, W), np.uint8)
    mask[:, 9, :] = 0  # row 9 is cloud
    scan = scan_patch(_patch(tmp_path, s2, mask=mask), num_classes=3, ignore_index=None)
    assert scan.zero_but_clear == 3 * W  # 3 sampled dates x row 0, which the mask calls clear
    assert scan.magnitudes["S2"].count == 3 * 8 * W and scan.magnitudes["S2"].rms[0] == pytest.approx(1500.0)
    assert zero_but_clear_warning([scan]).startswith("1 patch(es) have Sentinel-2 pixels that DATA_S2_MASK marks "
                                                     "clear but that are 0 in all ten bands")
    mask[0, 0, 0] = 4
    with pytest.raises(CropScaleError, match="values 0, 1, 4 in the sampled dates"):
        scan_patch(_patch(tmp_path, s2, mask=mask, pid=9), num_classes=3, ignore_index=None)


def test_a_bad_label_stops_the_scan_naming_the_file(tmp_path):
    target = np.zeros((3, H, W), np.int64)
    target[0, 2, 3] = 5  # channel 0 is the class map; the other channels are not class ids
    target[1] = 99
    with pytest.raises(CropScaleError, match=r"patch 7: TARGET file .*target\.npy: class id 5 at pixel \(2, 3\)"):
        scan_patch(_patch(tmp_path, _s2(), target=target), num_classes=3, ignore_index=None)
    target2d = np.full((H, W), 2, np.int64)
    assert scan_patch(_patch(tmp_path, _s2(), target=target2d, pid=8), num_classes=3, ignore_index=None)


@pytest.mark.parametrize("big", [S1_MAX_ABS_DB, np.nextafter(S1_MAX_ABS_DB, np.inf), 1e6])
def test_s1_db_range_boundary_one_percent_of_values_may_exceed(tmp_path, big):
    s1 = _s1()
    s1[:, :, 0, 0] = big  # 1 % of the values of each band and date
    scan = scan_patch(_patch(tmp_path, _s2(), s1={"S1A": s1}), num_classes=3, ignore_index=None)
    assert scan.dates_read == {"S2": 3, "S1A": 3} and scan.magnitudes["S1A"].count == 3 * H * W


def test_s1_more_than_one_percent_beyond_100_db_is_not_db(tmp_path):
    s1 = _s1()
    s1[:, :, 0, :2] = 1e4  # 2 % of the values
    with pytest.raises(CropScaleError, match=r"patch 7: S1A file .*: values are not backscatter in dB: the 99th "
                                             r"percentile of \|VV\|, \|VH\| over 3 sampled dates is 1e\+04"):
        scan_patch(_patch(tmp_path, _s2(), s1={"S1A": s1}), num_classes=3, ignore_index=None)
    s1[:, :, 0, :2] = S1_MAX_ABS_DB  # at the limit: dB
    assert scan_patch(_patch(tmp_path, _s2(), s1={"S1A": s1}, pid=8), num_classes=3, ignore_index=None)


def test_s1_negative_share_boundary(tmp_path):
    s1 = np.full((3, 2, H, W), 3.0, np.float32)
    share = S1_MIN_NEGATIVE_SHARE  # 5 % of the values below 0 dB: dB
    s1.reshape(3, 2, -1)[:, :, :int(share * H * W)] = -10.0
    assert scan_patch(_patch(tmp_path, _s2(), s1={"S1D": s1}), num_classes=3, ignore_index=None)
    s1.reshape(3, 2, -1)[:, :, int(share * H * W) - 1] = 3.0  # 4 %: linear power or amplitude
    with pytest.raises(CropScaleError, match=r"patch 8: S1D file .*: values look like linear power or amplitude, "
                                             r"not backscatter in dB: 4 % of VV, VH over 3 sampled dates are below "
                                             r"0 \(median 3;"):
        scan_patch(_patch(tmp_path, _s2(), s1={"S1D": s1}, pid=8), num_classes=3, ignore_index=None)


def test_s1_no_data_pixels_are_not_valid(tmp_path):
    s1 = np.zeros((3, 2, H, W), np.float32)
    s1[:, :, 1, 1] = -15.0
    scan = scan_patch(_patch(tmp_path, _s2(), s1={"S1A": s1}), num_classes=3, ignore_index=None)
    assert scan.magnitudes["S1A"].count == 3 and scan.magnitudes["S1A"].rms.tolist() == [15.0, 15.0]


def _stats():
    return NormStats(s2_mean=np.full(10, 300.0), s2_std=np.full(10, 400.0),
                     s1={"S1A": (np.array([-12.0, -18.0]), np.array([5.0, 0.0]))}, folds=[1])


def _scan(pid, modality, rms, count=10):
    return PatchScan(pid, 3, files={modality: f"{modality}_{pid}.npy"}, dates_read={modality: 3},
                     magnitudes={modality: BandMagnitude(np.asarray(rms, float), count)})


def test_scale_warnings_need_every_band_past_the_factor_in_one_direction():
    # training RMS: S2 sqrt(300^2 + 400^2) = 500 per band; S1A VV 13, VH 18
    edge = _scan(1, "S2", np.full(10, 500.0 * SCALE_FACTOR))  # exactly 5x: not past it
    past = _scan(2, "S2", np.full(10, 500.0 * SCALE_FACTOR * 1.01))
    mixed = _scan(3, "S2", [2600.0] * 9 + [90.0])  # one band the other way: natural variation
    small = _scan(4, "S1A", [13.0 / 6, 18.0 / 6])
    empty = _scan(5, "S2", np.full(10, 1e9), count=0)
    other = _scan(6, "S1D", [1e6, 1e6])  # no training statistics for this orbit
    out = scale_warnings([edge, past, mixed, small, empty, other], _stats())
    assert out == [
        "patch 2 (fold 3): S2 file S2_2.npy: every band's magnitude is 5.05..5.05 x that of the training statistics "
        "(folds [1]) over 3 sampled dates: another unit or scale than reflectance x 1e4?",
        "patch 4 (fold 3): S1A file S1A_4.npy: every band's magnitude is 0.167..0.167 x that of the training "
        "statistics (folds [1]) over 3 sampled dates: another unit or scale than dB?",
    ]
    assert scale_warnings([_scan(7, "S1A", [13.0 / 5, 18.0 / 5])], _stats()) == []  # exactly 1/5: not past it


def test_zero_but_clear_warning_lists_five_patches_then_stops():
    scans = [PatchScan(100 + i, 1, zero_but_clear=i) for i in range(8)]  # patch 100 has none
    assert zero_but_clear_warning(scans) == (
        "7 patch(es) have Sentinel-2 pixels that DATA_S2_MASK marks clear but that are 0 in all ten bands, i.e. no "
        "data, and are treated as such (sampled pixel-dates per patch: 101 (1), 102 (2), 103 (3), 104 (4), 105 (5) "
        "...)")
    assert zero_but_clear_warning(scans[:6]).endswith("105 (5))")
    assert zero_but_clear_warning(scans[:1]) is None
