"""Values under a cloud mask in the data pipeline: NaN and Inf accepted where the mask says cloud, refused
where it says clear; masked values are 0 in every batch and left out of the normalisation statistics."""

import json

import numpy as np
import pytest
import torch

from cropscale import CropScaleError
from cropscale.data.dataset import PastisHDDataset
from cropscale.data.scans import compute_norm_stats
from tests.data.test_errors import make_copy


@pytest.fixture
def flanders_copy(flanders_root, tmp_path):
    return make_copy(flanders_root, tmp_path / "flanders", [1001, 2001])


def _cloudy_pixels(root, pid=1001):
    """(date, row, col) of three pixels the S2 mask calls cloudy, and one it calls clear."""
    mask = np.load(root / "DATA_S2_MASK" / f"MASK_{pid}.npy")
    cloudy = np.argwhere(mask == 0)[[0, len(np.argwhere(mask == 0)) // 2, -1]]
    clear = np.argwhere(mask > 0)[0]
    return cloudy, clear


def _write_float_s2(root, pid, edit):
    path = root / "DATA_S2" / f"S2_{pid}.npy"
    a = np.load(path).astype(np.float32)  # int16 on disk: a float copy can hold NaN
    edit(a)
    np.save(path, a)
    return path


def test_nan_and_inf_under_the_mask_change_nothing(flanders_root, flanders_copy):
    ref_stats = compute_norm_stats(flanders_root, [1])
    cloudy, _ = _cloudy_pixels(flanders_copy)

    def poison(a):
        for value, (t, r, c) in zip((np.nan, np.inf, -np.inf), cloudy, strict=True):
            a[t, :, r, c] = value
        t0 = cloudy[0][0]  # and huge values on every cloudy pixel of that date
        a[t0][:, np.load(flanders_copy / "DATA_S2_MASK" / "MASK_1001.npy")[t0] == 0] = 9e4
    _write_float_s2(flanders_copy, 1001, poison)
    stats = compute_norm_stats(flanders_copy, [1])
    # same statistics as from the untouched files: the masked values are left out (float64 sums, same order)
    np.testing.assert_array_equal(stats.s2_mean, ref_stats.s2_mean)
    np.testing.assert_array_equal(stats.s2_std, ref_stats.s2_std)
    ref = PastisHDDataset(flanders_root, [1], train=False, stats=ref_stats)[0]
    out = PastisHDDataset(flanders_copy, [1], train=False, stats=stats)[0]
    assert int(out["patch_id"]) == 1001
    for key in ref:
        assert torch.equal(out[key], ref[key]), key  # cloudy values are 0 in both, clear ones unchanged
    assert torch.isfinite(out["s2"]).all()
    assert (out["s2"].permute(1, 0, 2, 3)[:, ~out["s2_mask"]] == 0).all()  # every masked value is 0
    train = PastisHDDataset(flanders_copy, [1], train=True, stats=stats, samples_per_patch=4)
    assert all(torch.isfinite(train[i]["s2"]).all() for i in range(4))


def test_nan_at_a_clear_pixel_keeps_its_error(flanders_copy):
    _, (_, r, c) = _cloudy_pixels(flanders_copy)
    clear_dates = np.load(flanders_copy / "DATA_S2_MASK" / "MASK_1001.npy")[:, r, c] > 0
    path = _write_float_s2(flanders_copy, 1001, lambda a: a.__setitem__((clear_dates, 3, r, c), np.nan))
    ds = PastisHDDataset(flanders_copy, [1], train=False)
    with pytest.raises(CropScaleError, match=rf"patch 1001: S2 file .*{path.name}.*non-finite.*clear pixel.*"
                                            rf"band B05, pixel \({r}, {c}\)"):
        ds[0]
    with pytest.raises(CropScaleError, match=r"patch 1001.*non-finite.*clear pixel"):
        compute_norm_stats(flanders_copy, [1])


def test_stats_path_that_is_a_folder_is_refused_at_once(flanders_root, tmp_path):
    from cropscale.data.datamodule import PastisHDDataModule

    with pytest.raises(CropScaleError, match=rf"data.stats_path: {tmp_path} is a folder"):
        PastisHDDataModule(str(flanders_root), stats_path=str(tmp_path))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(CropScaleError, match=rf"data.stats_path: folder {blocker}/sub cannot be created: {blocker}"
                                            " is a file"):
        PastisHDDataModule(str(flanders_root), stats_path=str(blocker / "sub" / "stats.json"))


def test_stats_are_written_atomically(flanders_root, tmp_path, monkeypatch):
    """A failure while the statistics are written leaves the previous file whole (and no temporary file)."""
    from cropscale.data import stats as stats_module

    path = tmp_path / "stats.json"
    first = compute_norm_stats(flanders_root, [1]).save(path)
    before = path.read_text()

    def broken_dump(obj, f, **kwargs):
        f.write('{"format": "cropscale-norm-stats/1", "trunc')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(stats_module, "atomic_write_json", stats_module.atomic_write_json)  # the real writer
    monkeypatch.setattr("cropscale.files.json.dump", broken_dump)
    with pytest.raises(CropScaleError, match=f"cannot write {path}: No space left on device"):
        compute_norm_stats(flanders_root, [1]).save(first)
    assert path.read_text() == before and json.loads(before)["format"] == "cropscale-norm-stats/1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.json"]
