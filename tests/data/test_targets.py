"""Parcel targets (extent, boundary, normalised distance) from instance ids."""

import numpy as np

from cropscale.data.targets import parcel_boundary, parcel_targets


def test_boundary_and_distance_on_a_known_map():
    ids = np.zeros((7, 7), dtype=np.int64)
    ids[1:6, 1:6] = 3  # one 5x5 parcel in background
    ext, bnd, dist = parcel_targets(ids)
    assert ext.sum() == 25 and ext[1:6, 1:6].all()
    ring = np.zeros((7, 7), dtype=bool)
    ring[1:6, 1:6] = True
    ring[2:5, 2:5] = False
    assert np.array_equal(bnd.astype(bool), ring)  # inner 4-neighbour boundary
    # distance to the ring: 1 on the 3x3 inside, 2 at the centre, normalised by the parcel max 2
    expected = np.zeros((7, 7))
    expected[2:5, 2:5] = 0.5
    expected[3, 3] = 1.0
    np.testing.assert_allclose(dist, expected)


def test_touching_parcels_and_patch_border():
    ids = np.array([[1, 1, 2, 2],
                    [1, 1, 2, 2],
                    [1, 1, 2, 2]])
    bnd = parcel_boundary(ids)
    # only the shared edge; the patch border is not a boundary
    assert bnd.tolist() == [[False, True, True, False]] * 3
    _, _, dist = parcel_targets(ids)
    # per-parcel normalisation: the outer column is at distance 1 = the parcel's max
    assert dist.tolist() == [[1.0, 0.0, 0.0, 1.0]] * 3


def test_real_instances_targets_in_range(pastis_mini_root, flanders_root):
    for path in [pastis_mini_root / "INSTANCE_ANNOTATIONS" / "INSTANCES_10186.npy",
                 flanders_root / "INSTANCE_ANNOTATIONS" / "INSTANCES_1001.npy"]:
        ids = np.load(path)
        t = parcel_targets(ids)
        assert t.shape == (3, *ids.shape) and t.dtype == np.float32
        assert np.array_equal(t[0], (ids > 0).astype(np.float32))
        assert set(np.unique(t[1])) <= {0.0, 1.0}
        assert t[2].min() >= 0.0 and t[2].max() <= 1.0
        assert np.all(t[1][ids == 0] == 0) and np.all(t[2][t[1] == 1] == 0)
        # every parcel with an interior reaches 1 somewhere
        for pid in np.unique(ids[ids > 0]):
            inner = (ids == pid) & (t[1] == 0)
            if inner.any():
                assert np.isclose(t[2][ids == pid].max(), 1.0)
