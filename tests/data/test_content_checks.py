"""Data mistakes that used to train with exit 0 (issue 17): each now ends in a CropScaleError naming the
patch and the file, or in a warning the data module records (``data_warnings``, written to ``run.json``).

Broken copies of the bundled real samples are built in ``tmp_path`` (as in ``test_errors.py``). The
Flanders sample: patches 1001, 2001 in fold 1 (training), 1002, 2002 in fold 2 (validation).
"""

import json

import numpy as np
import pytest

from cropscale.data.datamodule import PastisHDDataModule
from cropscale.data.metadata import read_metadata
from tests.data.test_errors import make_copy, raises_naming, rewrite_tif

FLANDERS_IDS = [1001, 1002, 2001, 2002]


@pytest.fixture
def flanders4(flanders_root, tmp_path):
    """A full copy of the Flanders sample (two training, two validation patches)."""
    return make_copy(flanders_root, tmp_path / "flanders", FLANDERS_IDS)


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
    with raises_naming(meta, "patch 1002", "dates-S2", "not in chronological order", f"index 1 = {values[-2]}",
                       f"index 0 = {values[-1]}", f"({len(values) - 1} such step(s))"):
        read_metadata(meta)
    with raises_naming(meta, "patch 1002", "dates-S2"):
        _dm(flanders4).setup("fit")


# ------------------------------------------------------------------ case 2: a dtype that cannot hold the unit
# ------------------------------------------------------------------ case 3: another unit or scale
# ------------------------------------------------------------------ case 4: zeros in every band are no data
# ------------------------------------------------------------------ case 5: files without a metadata entry
# ------------------------------------------------------------------ case 6: overlapping folds
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


# ------------------------------------------------------------------ clean data: no new warning
