"""A modality the layout names that is absent from the whole data set is one recorded data warning saying what the
model is trained without; one the configuration asks for is an error; ``t2`` / ``t1`` above every series' length is
a data warning with the padding it causes (issue 37).

Copies of the bundled Flanders sample (S2, S2 mask, S1 ascending, SPOT; no S1 descending) in ``tmp_path``.
"""

import warnings

import numpy as np
import pytest

from cropscale.data.datamodule import PastisHDDataModule
from tests.data.test_content_checks import _dm
from tests.data.test_errors import raises_naming

S1D = "Sentinel-1 descending (no DATA_S1D folder: its inputs are zeros with masks False)"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _setup(root, **kw):
    with warnings.catch_warnings(record=True) as issued:
        warnings.simplefilter("always")
        dm = _dm(root, **kw)
        dm.setup("fit")
    return dm, [str(w.message) for w in issued]


def _without(dm):
    return [w for w in dm.data_warnings if "the model is trained without" in w]


@pytest.mark.parametrize("how", ["deleted", "renamed S1_ASC"])
def test_absent_s1_ascending_is_one_data_warning(flanders4, how):
    if how == "deleted":
        for f in (flanders4 / "DATA_S1A").iterdir():
            f.unlink()
        (flanders4 / "DATA_S1A").rmdir()
    else:
        (flanders4 / "DATA_S1A").rename(flanders4 / "S1_ASC")
    dm, issued = _setup(flanders4)
    line = (f"{flanders4}: the model is trained without Sentinel-1 ascending (no DATA_S1A folder: its inputs are zeros"
            f" with masks False), {S1D}")
    assert _without(dm) == [line] and dm.data_warnings[0] == line and line in issued
    assert not dm.train_dataset[0]["s1a_mask"].any()


def test_absent_s2_mask_is_one_data_warning_that_says_clouds_are_fed_as_clear(flanders4):
    for f in (flanders4 / "DATA_S2_MASK").iterdir():
        f.unlink()
    (flanders4 / "DATA_S2_MASK").rmdir()
    dm, _ = _setup(flanders4)
    assert _without(dm) == [
        f"{flanders4}: the model is trained without the Sentinel-2 cloud mask (no DATA_S2_MASK folder: only pixels"
        " whose ten bands are all 0 count as no data, so every cloudy observation is fed as clear), " + S1D]


def test_absent_spot_is_one_data_warning(flanders4):
    (flanders4 / "DATA_SPOT").rename(flanders4 / "elsewhere")
    dm, _ = _setup(flanders4)
    assert _without(dm) == [
        f"{flanders4}: the model is trained without {S1D}, the high-grid image (no DATA_SPOT folder: hr_present False,"
        " no x10 detail target)"]


def test_misspelt_folder_says_so_in_the_same_line(flanders4):
    (flanders4 / "DATA_S1A").rename(flanders4 / "DATA_S1a")
    dm, _ = _setup(flanders4)
    (line,) = _without(dm)
    assert "Sentinel-1 ascending (no DATA_S1A folder: its inputs are zeros with masks False; there is DATA_S1a: a" \
           " misspelling? rename it to DATA_S1A)" in line


def test_the_bundled_sample_warns_only_of_the_absent_descending_orbit(flanders_root):
    dm, _ = _setup(flanders_root)
    assert dm.data_warnings == [f"{flanders_root}: the model is trained without {S1D}"]
    dm, issued = _setup(flanders_root, s1_orbits=["S1A"])  # the configuration says which orbits the data set has
    assert dm.data_warnings == [] and issued == []


@pytest.mark.parametrize(("option", "value", "needles"), [
    ("s1_orbits", ["S1A", "S1D"], ("data.s1_orbits asks for S1D", "no DATA_S1D folder")),
    ("high_grid", True, ("data.high_grid asks for DATA_SPOT", "no DATA_SPOT folder")),
    ("s2_mask", True, ("data.s2_mask asks for DATA_S2_MASK", "no DATA_S2_MASK folder")),
])
def test_a_modality_the_configuration_asks_for_is_an_error(flanders4, option, value, needles):
    (flanders4 / "DATA_SPOT").rename(flanders4 / "spot_elsewhere")
    (flanders4 / "DATA_S2_MASK").rename(flanders4 / "mask_elsewhere")
    with raises_naming(str(flanders4), *needles):
        _dm(flanders4, **{option: value}).setup("fit")


def _padding(lengths, t):
    pads = np.array([t - n for n in lengths])
    return int(pads.min()), int(pads.max()), round(100 * pads.sum() / (len(lengths) * t))


def test_t2_above_every_series_is_a_data_warning_with_its_padding(flanders4):
    # S2: 118 dates (1001, 1002), 72 (2001, 2002); every patch is read (training and validation)
    lo, hi, share = _padding([118, 118, 72, 72], 130)
    assert (lo, hi, share) == (12, 58, 27)  # by hand: (12 + 12 + 58 + 58) / (4 x 130) = 26.9 %
    dm, issued = _setup(flanders4, t2=130, s1_orbits=["S1A"])
    line = (f"data.t2 130 is above every Sentinel-2 series' length (at most 118 dates): each sample is padded with"
            f" {lo}..{hi} dates of zeros ({share} % of the Sentinel-2 dates fed are padding, computed on but"
            " masked); lower data.t2 to 118 or less")
    assert dm.data_warnings == [line] and line in issued


def test_t1_above_every_series_is_a_data_warning_with_its_padding(flanders4):
    lo, hi, share = _padding([159, 159, 80, 80], 160)  # S1A: 159 dates (1001, 1002), 80 (2001, 2002)
    dm, _ = _setup(flanders4, t1=160, s1_orbits=["S1A"])
    assert dm.data_warnings == [
        f"data.t1 160 is above every Sentinel-1 ascending series' length (at most 159 dates): each sample is padded"
        f" with {lo}..{hi} dates of zeros ({share} % of the Sentinel-1 ascending dates fed are padding, computed on"
        " but masked); lower data.t1 to 159 or less"]


def test_t2_within_the_longest_series_is_no_warning(flanders4):
    dm, _ = _setup(flanders4, t2=118, t1=159, s1_orbits=["S1A"])  # the shorter series are padded, the longest not
    assert dm.data_warnings == []


def test_the_warnings_are_found_at_construction_for_every_stage(flanders4):
    (flanders4 / "DATA_S2_MASK").rename(flanders4 / "mask_elsewhere")
    dm = PastisHDDataModule(str(flanders4), s1_orbits=["S1A"])
    assert [w for w in dm.data_warnings if "cloud mask" in w]  # before setup: the layout is read once, at once
