"""PastisHDDataset on the real samples: shapes and dtypes, temporal sampling, padding rule,
determinism of validation, normalisation."""

import numpy as np
import pytest
import torch

from cropscale.data.dataset import PastisHDDataset
from cropscale.data.metadata import day_of_year, read_metadata
from cropscale.data.scans import compute_norm_stats


def expected_shapes(t2, t1, h, w):
    return {
        "s2": ((t2, 10, h, w), torch.float32), "s2_doy": ((t2,), torch.int64), "s2_mask": ((t2, h, w), torch.bool),
        "s1a": ((t1, 2, h, w), torch.float32), "s1a_doy": ((t1,), torch.int64), "s1a_mask": ((t1,), torch.bool),
        "s1d": ((t1, 2, h, w), torch.float32), "s1d_doy": ((t1,), torch.int64), "s1d_mask": ((t1,), torch.bool),
        "semantic": ((h, w), torch.int64), "parcel": ((3, h, w), torch.float32), "parcel_present": ((), torch.bool),
        "hr": ((3, 10 * h, 10 * w), torch.float32), "hr_present": ((), torch.bool),
        "patch_id": ((), torch.int64), "crop_yx": ((2,), torch.int64),
    }


def check_sample(sample, t2, t1, h, w):
    exp = expected_shapes(t2, t1, h, w)
    assert set(sample) == set(exp)
    for key, (shape, dtype) in exp.items():
        assert tuple(sample[key].shape) == shape, key
        assert sample[key].dtype == dtype, key
        if sample[key].is_floating_point():
            assert torch.isfinite(sample[key]).all(), key


@pytest.mark.parametrize("train", [True, False])
def test_flanders_shapes_and_presence(flanders_root, train):
    ds = PastisHDDataset(flanders_root, [1] if train else [2], train=train, samples_per_patch=3)
    assert len(ds) == (6 if train else 2)
    for i in range(len(ds)):
        s = ds[i]
        check_sample(s, 16, 4, *((32, 32) if train else (64, 32)))
        assert s["hr_present"] and s["parcel_present"]
        assert s["s1a_mask"].all() and not s["s1d_mask"].any()  # no descending orbit in this sample
        assert (s["s1d"] == 0).all() and (s["s1d_doy"] == 0).all()
        assert 0.0 <= s["hr"].min() and s["hr"].max() <= 1.0
        assert int(s["semantic"].max()) <= 9
        assert (s["s2_doy"] >= 1).all() and (s["s2_doy"] <= 366).all()
        if not train:
            assert s["crop_yx"].tolist() == [0, 0]


def test_pastis_mini_loads_with_void_and_pads_short_series(pastis_mini_root):
    """3 dates per modality < T2 = 16 and T1 = 4: every date once, then padding dates (zeros,
    all-False mask, day of year 0); no high-grid image; class 19 kept as the ignore index."""
    records = {r.patch_id: r for r in read_metadata(pastis_mini_root / "metadata.geojson")}
    ds = PastisHDDataset(pastis_mini_root, [1], train=True, ignore_index=19)
    assert [p.patch_id for p in ds.patches] == [10186, 10477, 30012]
    for i in range(len(ds)):
        s = ds[i]
        check_sample(s, 16, 4, 32, 32)
        pid = int(s["patch_id"])
        assert not s["hr_present"] and (s["hr"] == 0).all()
        assert s["parcel_present"]
        raw = np.load(pastis_mini_root / "DATA_S2" / f"S2_{pid}.npy")
        # the crop is the whole 32 x 32 patch: the three real dates come first, in order
        assert s["s2_doy"][:3].tolist() == day_of_year(records[pid].dates["S2"]).tolist()
        assert (s["s2_doy"][3:] == 0).all()
        assert s["s2_mask"][:3].all() == bool((raw != 0).any(axis=1).all())
        assert not s["s2_mask"][3:].any() and (s["s2"][3:] == 0).all()
        for orbit in ("s1a", "s1d"):
            assert s[f"{orbit}_mask"].tolist() == [True, True, True, False]
            assert s[f"{orbit}_doy"][:3].tolist() == day_of_year(records[pid].dates[orbit.upper()]).tolist()
            assert (s[orbit][3] == 0).all()
        labels = np.load(pastis_mini_root / "ANNOTATIONS" / f"TARGET_{pid}.npy")[0]
        # no augmentation would keep the label map; with it, it is a D4 transform of it
        assert sorted(np.unique(labels).tolist()) == sorted(torch.unique(s["semantic"]).tolist())
    val = PastisHDDataset(pastis_mini_root, [2], train=False, ignore_index=19)
    s = val[0]
    labels = np.load(pastis_mini_root / "ANNOTATIONS" / f"TARGET_{int(s['patch_id'])}.npy")[0]
    assert torch.equal(s["semantic"], torch.from_numpy(labels.astype(np.int64)))
    assert 19 in labels


def test_validation_is_deterministic(flanders_root):
    a = PastisHDDataset(flanders_root, [2], train=False)
    b = PastisHDDataset(flanders_root, [2], train=False, seed=123)
    for i in range(len(a)):
        sa, sa2, sb = a[i], a[i], b[i]
        for key in sa:
            assert torch.equal(sa[key], sa2[key]) and torch.equal(sa[key], sb[key]), key


def test_validation_dates_evenly_spaced_over_valid(flanders_root):
    ds = PastisHDDataset(flanders_root, [2], train=False, t2=8)
    s = ds[0]
    pid = int(s["patch_id"])
    mask = np.load(flanders_root / "DATA_S2_MASK" / f"MASK_{pid}.npy") > 0
    frac = mask.reshape(len(mask), -1).mean(axis=1)
    valid = np.flatnonzero(frac >= 0.5)
    assert valid.size >= 8
    expected = valid[np.round(np.linspace(0, valid.size - 1, 8)).astype(int)]
    for j, t in enumerate(expected):
        assert torch.equal(s["s2_mask"][j], torch.from_numpy(mask[t]))
    assert s["s2_doy"].tolist() == ds.patches[0].doy["S2"][expected].tolist()


def test_training_never_selects_invalid_dates_and_values_are_normalised(flanders_root):
    stats = compute_norm_stats(flanders_root, [1])
    ds = PastisHDDataset(flanders_root, [1], train=True, augment=False, samples_per_patch=12, stats=stats, seed=4)
    checked = 0
    for i in range(len(ds)):
        s = ds[i]
        p = ds.patches[i // 12]
        y, x = s["crop_yx"].tolist()
        mask = np.load(p.mask)[:, y:y + 32, x:x + 32] > 0
        frac = mask.reshape(len(mask), -1).mean(axis=1)
        assert (frac >= 0.5).sum() >= 16  # enough valid dates in every crop of this sample
        per_date = s["s2_mask"].float().mean(dim=(1, 2))
        assert (per_date >= 0.5).all(), per_date
        # identify each drawn date in the raw series (increasing in time): same day of year, same
        # mask and values equal to (raw - mean) / std with the training-fold statistics
        raw = np.load(p.s2, mmap_mode="r")
        mean = stats.s2_mean[:, None, None].astype(np.float32)
        std = stats.s2_std[:, None, None].astype(np.float32)
        prev = -1
        for j in range(16):
            found = None
            for t in np.flatnonzero(p.doy["S2"] == int(s["s2_doy"][j])):
                if t <= prev or not np.array_equal(mask[t], s["s2_mask"][j].numpy()):
                    continue
                expected = (raw[t, :, y:y + 32, x:x + 32].astype(np.float32) - mean) / std
                expected[:, ~mask[t]] = 0.0  # values under the cloud mask are 0 (they never reach the network)
                if np.allclose(s["s2"][j].numpy(), expected, rtol=1e-6, atol=1e-6):
                    found = t
                    break
            assert found is not None, (i, j)
            assert frac[found] >= 0.5
            prev = found
            checked += 1
        assert torch.all(s["s2_doy"][1:] != 0)
    assert checked == 16 * len(ds)


def test_training_crops_cover_the_patch(flanders_root):
    ds = PastisHDDataset(flanders_root, [1], train=True, samples_per_patch=40, seed=0)
    rows = {int(ds[i]["crop_yx"][0]) for i in range(40)}
    cols = {int(ds[i]["crop_yx"][1]) for i in range(40)}
    assert cols == {0} and min(rows) >= 0 and max(rows) <= 32 and len(rows) > 10


def test_series_shorter_than_t_on_flanders(flanders_root):
    """T2 = 130 > 118 dates of patch 1002: all 118 dates once in time order, then 12 padding dates."""
    ds = PastisHDDataset(flanders_root, [2], train=False, t2=130)
    s = next(ds[i] for i in range(len(ds)) if int(ds.patches[i].patch_id) == 1002)
    assert s["s2_doy"][:118].tolist() == ds.patches[0].doy["S2"].tolist()
    assert (s["s2_doy"][118:] == 0).all() and not s["s2_mask"][118:].any() and (s["s2"][118:] == 0).all()
