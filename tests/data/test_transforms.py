"""Spatially coupled augmentation: flips and 90-degree rotations move every 10 m tensor and the
high-grid tensor identically (on real samples of the bundled Flanders data)."""

import itertools

import numpy as np
import pytest
import torch

from cropscale.batch import HR_SCALE
from cropscale.data.dataset import PastisHDDataset
from cropscale.data.transforms import SPATIAL_KEYS, RandomDihedral, apply_dihedral

D4 = list(itertools.product(range(4), (False, True)))


def expected_position(r, c, n, k, flip):
    """Where pixel (r, c) of an n x n image lands: mirror (c -> n-1-c), then k quarter turns,
    each (r, c) -> (n-1-c, r)."""
    if flip:
        c = n - 1 - c
    for _ in range(k):
        r, c = n - 1 - c, r
    return r, c


@pytest.fixture(scope="module")
def plain_sample(flanders_root):
    ds = PastisHDDataset(flanders_root, [1], train=True, augment=False, seed=3)
    return ds[0]


def marked(sample, r, c):
    s = {k: v.clone() for k, v in sample.items()}
    s["s2"][..., r, c] = 1e4
    s["s2_mask"][:] = True
    s["s2_mask"][..., r, c] = False
    s["s1a"][..., r, c] = 1e4
    s["semantic"][r, c] = 99
    s["parcel"][..., r, c] = 7.0
    s["hr"][:, HR_SCALE * r:HR_SCALE * (r + 1), HR_SCALE * c:HR_SCALE * (c + 1)] = 5.0
    return s


def where(mask2d):
    return [tuple(int(v) for v in p) for p in torch.nonzero(mask2d)]


@pytest.mark.parametrize("k,flip", D4)
def test_known_pixel_moves_identically_everywhere(plain_sample, k, flip):
    r, c = 3, 27  # an asymmetric spot of the 32 x 32 crop
    n = plain_sample["semantic"].shape[-1]
    out = apply_dihedral(marked(plain_sample, r, c), k, flip)
    er, ec = expected_position(r, c, n, k, flip)
    assert where((out["s2"] == 1e4).all(dim=0).all(dim=0)) == [(er, ec)]
    assert where(~out["s2_mask"].any(dim=0)) == [(er, ec)]
    assert where((out["s1a"] == 1e4).all(dim=0).all(dim=0)) == [(er, ec)]
    assert where(out["semantic"] == 99) == [(er, ec)]
    assert where((out["parcel"] == 7.0).all(dim=0)) == [(er, ec)]
    hr_hits = torch.nonzero((out["hr"] == 5.0).all(dim=0))
    rows, cols = set(hr_hits[:, 0].tolist()), set(hr_hits[:, 1].tolist())
    assert rows == set(range(HR_SCALE * er, HR_SCALE * (er + 1)))
    assert cols == set(range(HR_SCALE * ec, HR_SCALE * (ec + 1)))
    assert len(hr_hits) == HR_SCALE * HR_SCALE
    # shapes, dtypes and non-spatial entries unchanged
    for key, value in plain_sample.items():
        assert out[key].shape == value.shape and out[key].dtype == value.dtype
        if key not in SPATIAL_KEYS:
            assert torch.equal(out[key], value)


def test_numpy_and_torch_paths_agree(plain_sample):
    x = plain_sample["hr"]
    for k, flip in D4:
        a = apply_dihedral({"hr": x.numpy()}, k, flip)["hr"]
        b = apply_dihedral({"hr": x}, k, flip)["hr"]
        assert np.array_equal(a, b.numpy())


@pytest.mark.parametrize("seed", [0, 2, 5])  # draws (1, no flip), identity, (0, flip)
def test_dataset_augmentation_is_one_d4_element_for_all_tensors(flanders_root, seed):
    """The augmented sample equals the plain one under one single (k, flip) for every tensor at once."""
    plain = PastisHDDataset(flanders_root, [1], train=True, augment=False, seed=seed)[0]
    aug = PastisHDDataset(flanders_root, [1], train=True, augment=True, seed=seed)[0]
    matches = [(k, f) for k, f in D4
               if all(torch.equal(apply_dihedral(plain, k, f)[key], aug[key]) for key in plain)]
    assert len(matches) == 1, f"augmented sample is not exactly one D4 transform of the plain one: {matches}"
    assert torch.equal(aug["crop_yx"], plain["crop_yx"])


def test_non_square_crop_keeps_shape():
    rng = np.random.default_rng(0)
    draws = {RandomDihedral().draw(rng, 64, 32) for _ in range(200)}
    assert {k for k, _ in draws} == {0, 2}
    assert len({RandomDihedral().draw(rng, 32, 32) for _ in range(400)}) == 8
