"""cropscale.data.content on small hand-made patches (issue 36, mutation testing): the scan-cache entry's exact
form, every message's full text, date chunks beyond the first, the pooled rule in both directions, the scale
warning's reference per modality. Each expected value is worked by hand from the arrays built here.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from cropscale.data.content import (
    CHUNK_DATES,
    PatchScan,
    first_failing_date,
    label_problem,
    mask_value_message,
    no_clear_observation,
    nodata_s2_message,
    scale_warnings,
    scan_patch,
    zero_but_clear_warning,
)
from cropscale.data.index import PatchFiles
from cropscale.data.metadata import PatchGeo
from cropscale.data.stats import Moments, NormStats
from tests.data.test_errors import raises_naming

H = W = 4  # 16 pixels: one date of clear pixels is exactly MIN_PIXELS_PER_DATE, judged alone


def _patch(tmp_path: Path, s2: np.ndarray, mask: np.ndarray | None = None, s1: dict | None = None,
           target: np.ndarray | None = None) -> PatchFiles:
    """Patch 7 of fold 3 with the given arrays saved as .npy files (target by default: every pixel class 0)."""
    np.save(tmp_path / "s2.npy", s2)
    if mask is not None:
        np.save(tmp_path / "mask.npy", mask)
    np.save(tmp_path / "target.npy", np.zeros((3, H, W), dtype=np.int64) if target is None else target)
    files = {}
    for orbit, arr in (s1 or {}).items():
        files[orbit] = tmp_path / f"{orbit}.npy"
        np.save(files[orbit], arr)
    return PatchFiles(patch_id=7, fold=3, hw=(H, W), s2=tmp_path / "s2.npy", s2_t=s2.shape[0],
                      mask=tmp_path / "mask.npy" if mask is not None else None, s1=files,
                      target=tmp_path / "target.npy", instances=None, hr=None)


def _scan(p: PatchFiles) -> PatchScan:
    return scan_patch(p, num_classes=2, ignore_index=None)


def _reflectance(t: int) -> np.ndarray:
    """``[t, 10, H, W]`` float32 reflectance x 1e4 of 1000 everywhere: every value passes every rule."""
    return np.full((t, 10, H, W), 1000.0, dtype=np.float32)


# ------------------------------------------------------------------ the scan cache's entry
def test_patch_scan_to_dict_is_the_documented_entry_and_from_dict_inverts_it():
    scan = PatchScan(patch_id=7, fold=3, files={"S2": Path("a/s2.npy"), "S1A": Path("b/s1a.npy")},
                     moments={"S2": Moments(4, np.array([1.0, 2.0]), np.array([3.0, 4.0]))},
                     dates_read={"S2": 5, "S1A": 6}, zero_but_clear=2, checked=False)
    entry = scan.to_dict()
    assert entry == {"patch_id": 7, "fold": 3, "files": {"S2": "a/s2.npy", "S1A": "b/s1a.npy"},
                     "moments": {"S2": {"n": 4, "mean": [1.0, 2.0], "m2": [3.0, 4.0]}},
                     "dates_read": {"S2": 5, "S1A": 6}, "zero_but_clear": 2, "checked": False}
    back = PatchScan.from_dict(json.loads(json.dumps(entry)))
    assert (back.patch_id, back.fold, back.files, back.dates_read, back.zero_but_clear, back.checked) == (
        7, 3, {"S2": Path("a/s2.npy"), "S1A": Path("b/s1a.npy")}, {"S2": 5, "S1A": 6}, 2, False)
    assert back.moments["S2"].n == 4
    assert back.moments["S2"].mean.tolist() == [1.0, 2.0] and back.moments["S2"].m2.tolist() == [3.0, 4.0]


# ------------------------------------------------------------------ class ids
def test_ignore_index_is_accepted_beside_the_valid_ids_and_a_bad_id_is_still_named():
    assert label_problem(np.array([[0, 2], [255, 1]]), 3, 255) is None
    assert label_problem(np.array([[0, 3], [255, 1]]), 3, 255) == (
        "class id 3 at pixel (0, 1) is outside 0..2 (num_classes 3, ignore_index 255)")


# ------------------------------------------------------------------ messages, whole
def test_the_nodata_message_in_full():
    p = PatchFiles(patch_id=7, fold=3, hw=(H, W), s2=Path("s2.npy"), s2_t=2, mask=None, s1={},
                   target=Path("t.npy"), instances=None, hr=None)
    data = np.zeros((2, 10, 2, 2), dtype=np.float32)
    data[1, 4, 0, 1] = -9999.0
    data[1, 5, 1, 1] = -2000.0  # the second such value, counted, not named
    clear = np.ones((2, 2, 2), dtype=bool)
    assert nodata_s2_message(p, data, np.array([10, 11]), y0=3, x0=5, clear=clear) == (
        "patch 7: S2 file s2.npy: reflectance -9999 at a pixel the mask calls clear (date index 11, band B06, pixel"
        " (3, 6); 2 such value(s) read): a no-data value? Reflectance x 1e4 is >= -1000; mark those pixels 0 in"
        " DATA_S2_MASK or store no data as 0 in all ten bands")


def test_the_reflectance_unit_message_in_full(tmp_path):
    s2 = np.full((1, 10, H, W), 5.0, dtype=np.float32)  # reflectance in 0..1 x 5: nothing reaches 100 ...
    s2[0, 2, 1, 1] = 500.0  # ... but one value of 160: 0.625 %
    with raises_naming("patch 7: S2 file") as info:
        _scan(_patch(tmp_path, s2, np.ones((1, H, W), dtype=np.uint8)))
    assert str(info.value) == (
        f"patch 7: S2 file {tmp_path / 's2.npy'}: values look like reflectance in 0..1 or in percent, not reflectance"
        " x 1e4: at date index 0, 0.625 % of 160 clear band values reach 100 (x 1e4; even dark water reads a few"
        " hundred in most bands)")


def test_the_sentinel1_unit_messages_in_full(tmp_path):
    s1 = {"S1A": np.full((1, 2, H, W), 1000.0, dtype=np.float32)}  # every VV, VH of 32 beyond 100 dB
    with raises_naming("S1A file") as info:
        _scan(_patch(tmp_path, _reflectance(1), s1=s1))
    assert str(info.value) == (
        f"patch 7: S1A file {tmp_path / 'S1A.npy'}: values are not backscatter in dB: at date index 0, 100 % of 32"
        " VV, VH values exceed 100 in magnitude (dB over land: about -50 .. +30)")
    s1 = {"S1A": np.full((1, 2, H, W), 0.5, dtype=np.float32)}  # linear power: none below 0
    with raises_naming("S1A file") as info:
        _scan(_patch(tmp_path, _reflectance(1), s1=s1))
    assert str(info.value) == (
        f"patch 7: S1A file {tmp_path / 'S1A.npy'}: values look like linear power or amplitude, not backscatter in"
        " dB: at date index 0, 0 % of 32 VV, VH values are below 0 (dB over land: about -25 .. 0); convert with"
        " 10 * log10(power)")


def test_no_clear_observation_messages_with_and_without_a_mask(tmp_path):
    with raises_naming() as info:
        _scan(_patch(tmp_path, _reflectance(2), np.zeros((2, H, W), dtype=np.uint8)))
    assert str(info.value) == (f"patch 7: all 2 dates invalid: S2 mask file {tmp_path / 'mask.npy'} marks no clear"
                               " observation; remove the patch or fix the mask")
    (tmp_path / "mask.npy").unlink()
    with raises_naming() as info:
        _scan(_patch(tmp_path, np.zeros((2, 10, H, W), dtype=np.float32)))
    assert str(info.value) == (f"patch 7: all 2 dates invalid: S2 file {tmp_path / 's2.npy'} is no data (all bands"
                               " 0) everywhere; remove the patch")


def test_a_mask_message_in_full_with_more_than_eight_values():
    p = PatchFiles(patch_id=7, fold=3, hw=(H, W), s2=Path("s2.npy"), s2_t=3, mask=Path("m.npy"), s1={},
                   target=Path("t.npy"), instances=None, hr=None)
    mask = np.zeros((3, 2, 5), dtype=np.float32)
    mask[2] = np.arange(10, dtype=np.float32).reshape(2, 5) / 2  # 0, 0.5, ..., 4.5: 10 values, 8 of 10 wrong
    assert mask_value_message(p, mask, np.array([4, 5, 6])) == (
        "patch 7: S2 mask file m.npy: value 0.5 at date index 6, pixel (0, 1) (8 such value(s); values 0, 0.5, 1,"
        " 1.5, 2, 2.5, 3, 3.5 ... in dates 4..6); a validity mask holds 0 (cloud or no data) and 1 (clear) only (a"
        " scene-classification layer such as Sen2Cor's 4 = vegetation, 9 = cloud is no validity mask: convert it"
        " to 0/1 first)")


@pytest.mark.parametrize(("name", "what"), [("s2.npy", "S2"), ("mask.npy", "S2 mask"), ("S1A.npy", "S1A"),
                                            ("target.npy", "TARGET")])
def test_an_unreadable_file_is_named_with_its_patch_and_role(tmp_path, name, what):
    p = _patch(tmp_path, _reflectance(1), np.ones((1, H, W), dtype=np.uint8),
               s1={"S1A": np.full((1, 2, H, W), -12.0, dtype=np.float32)})
    (tmp_path / name).write_bytes(b"not a numpy file")
    with raises_naming(f"patch 7: cannot read {what} file {tmp_path / name} (truncated or corrupt .npy?)"):
        _scan(p)


def test_backscatter_of_exactly_100_db_in_magnitude_is_plausible(tmp_path):
    # |value| must exceed S1_MAX_ABS_DB (100) to count: -100 dB everywhere is in dB (and every value below 0)
    s1 = {"S1A": np.full((1, 2, H, W), -100.0, dtype=np.float32)}
    scan = _scan(_patch(tmp_path, _reflectance(1), s1=s1))
    assert scan.moments["S1A"].n == H * W and scan.dates_read["S1A"] == 1


# ------------------------------------------------------------------ class ids of the target file
def test_the_scan_allows_ignore_index_and_reads_a_two_dimensional_target_whole(tmp_path):
    target = np.zeros((3, H, W), dtype=np.int64)
    target[0, 1, 2] = 255
    p = _patch(tmp_path, _reflectance(1), target=target)
    assert scan_patch(p, num_classes=2, ignore_index=255).checked
    with raises_naming("patch 7: TARGET file", "class id 255 at pixel (1, 2)"):
        scan_patch(p, num_classes=2, ignore_index=None)
    flat = np.zeros((H, W), dtype=np.int64)  # [H, W]: a bad id beyond the first row is found
    flat[2, 1] = 5
    with raises_naming(f"patch 7: TARGET file {tmp_path / 'target.npy'}: class id 5 at pixel (2, 1) is outside 0..1"):
        _scan(_patch(tmp_path, _reflectance(1), target=flat))


class _Reader:
    """A high-grid reader that records its reads."""

    def __init__(self) -> None:
        self.reads = []

    def read(self, path, *, crs, bounds, out_hw, where):
        self.reads.append((path, crs, bounds, out_hw, where))


def test_the_scan_reads_the_high_grid_image_at_two_opposite_corners(tmp_path):
    p = _patch(tmp_path, _reflectance(1))
    p.hr, p.geo = tmp_path / "hr.tif", PatchGeo(crs="EPSG:32631", bounds=(1000.0, 2000.0, 1040.0, 2040.0))
    reader = _Reader()
    _scan(p)  # no reader: not read
    scan_patch(p, num_classes=2, ignore_index=None, hr_reader=reader)
    # 4 x 4 pixels of 10 m: the top-left pixel and the bottom-right one, 10 x 10 high-grid pixels each
    assert reader.reads == [(tmp_path / "hr.tif", "EPSG:32631", (1000.0, 2030.0, 1010.0, 2040.0), (10, 10), "patch 7"),
                            (tmp_path / "hr.tif", "EPSG:32631", (1030.0, 2000.0, 1040.0, 2010.0), (10, 10), "patch 7")]


# ------------------------------------------------------------------ chunks of dates
def test_zero_but_clear_pixels_are_counted_over_every_chunk(tmp_path):
    t = CHUNK_DATES + 4
    s2 = _reflectance(t)
    for date, (y, x) in ((0, (0, 0)), (1, (1, 1)), (CHUNK_DATES + 1, (2, 2))):  # 2 in the first chunk, 1 after
        s2[date, :, y, x] = 0.0
    scan = _scan(_patch(tmp_path, s2, np.ones((t, H, W), dtype=np.uint8)))
    assert scan.zero_but_clear == 3
    assert scan.moments["S2"].n == t * H * W - 3 and scan.dates_read["S2"] == t


def test_no_clear_observation_looks_past_the_first_chunk_and_reads_the_mask():
    p = PatchFiles(patch_id=7, fold=3, hw=(2, 2), s2=Path("s2.npy"), s2_t=20, mask=Path("mask.npy"), s1={},
                   target=Path("t.npy"), instances=None, hr=None)
    s2 = np.zeros((20, 10, 2, 2), dtype=np.float32)
    s2[17, 0, 1, 0] = 800.0  # the only observation with data: date 17, pixel (1, 0)
    mask = np.zeros((20, 2, 2), dtype=np.uint8)
    mask[3] = 1  # clear on date 3, where every band is 0
    assert no_clear_observation(p, s2, mask) == (
        "patch 7: all 20 dates invalid: S2 file s2.npy is no data (all bands 0) wherever S2 mask file mask.npy marks"
        " a clear observation; remove the patch or fix the file")
    mask[17, 1, 0] = 1  # now clear where the data is, in the second chunk of the clear dates
    assert no_clear_observation(p, s2, mask) is None
    assert no_clear_observation(p, s2, None) is None  # without a mask: date 17 has data
    assert no_clear_observation(p, np.zeros_like(s2), None) == (
        "patch 7: all 20 dates invalid: S2 file s2.npy is no data (all bands 0) everywhere; remove the patch")


# ------------------------------------------------------------------ the unit rules' shares
def test_a_date_of_one_value_is_judged_by_its_own_share_when_the_minimum_is_one():
    # share 1 / 1 = 100 % > 60 %: fails (a share of 1 / 2 would not)
    assert first_failing_date(np.array([1]), np.array([1]), 0.6, below=False, minimum=1) == (0, 1.0, 1)


def test_pooled_sparse_dates_fail_an_above_rule():
    # two dates of 10 values, under the minimum of 20 each: pooled 10 / 20 = 50 % > 1 %
    assert first_failing_date(np.array([10, 10]), np.array([5, 5]), 0.01, below=False, minimum=20) == (0, 0.5, 20)
    assert first_failing_date(np.array([10, 10]), np.array([0, 0]), 0.01, below=False, minimum=20) is None


# ------------------------------------------------------------------ warnings
def _moments(mean: list[float], n: int = 10) -> Moments:
    return Moments(n, np.array(mean, dtype=np.float64), np.zeros(len(mean)))


def test_scale_warnings_use_each_modality_s_root_mean_square_and_unit():
    # training: S2 mean 3, std 4 in every band -> rms 5; S1A mean -3, std 4 -> rms 5
    stats = NormStats(s2_mean=np.full(10, 3.0), s2_std=np.full(10, 4.0),
                      s1={"S1A": (np.array([-3.0, -3.0]), np.array([4.0, 4.0]))}, folds=[1])
    scan = PatchScan(patch_id=7, fold=3, files={"S2": Path("s2.npy"), "S1A": Path("s1a.npy"), "S1D": Path("d.npy")},
                     moments={"S2": _moments([30.0] * 10), "S1A": _moments([-30.0, -30.0]),
                              "S1D": _moments([-900.0, -900.0])},  # no training statistics for S1D: not judged
                     dates_read={"S2": 5, "S1A": 6, "S1D": 7})
    assert scale_warnings([scan], stats) == [  # |30| / 5 = 6 > 5 in every band
        "patch 7 (fold 3): S2 file s2.npy: every band's magnitude is 6..6 x that of the training statistics (folds"
        " [1]) over its 5 dates: another unit or scale than reflectance x 1e4?",
        "patch 7 (fold 3): S1A file s1a.npy: every band's magnitude is 6..6 x that of the training statistics (folds"
        " [1]) over its 6 dates: another unit or scale than dB?"]


def test_the_zero_but_clear_warning_lists_the_patches():
    scans = [PatchScan(1, 1, zero_but_clear=3), PatchScan(2, 1), PatchScan(3, 2, zero_but_clear=1)]
    line = ("2 patch(es) have Sentinel-2 pixels that DATA_S2_MASK marks clear but that are 0 in all ten bands, i.e. no"
            " data, and are treated as such (pixel-dates per patch: ")
    assert zero_but_clear_warning(scans) == line + "1 (3), 3 (1))"
    assert zero_but_clear_warning(scans, shown=1) == line + "1 (3) ...)"
    assert zero_but_clear_warning(scans[1:2]) is None
