"""Temporal sampling rules (cropscale.data.temporal) and day of year (cropscale.data.metadata)."""

import numpy as np
import pytest

from cropscale.data.metadata import day_of_year
from cropscale.data.temporal import clear_fraction, s1_pixel_validity, s2_pixel_validity, select_dates


def test_day_of_year_known_dates():
    dates = np.array([20180101, 20181231, 20160229, 20161231, 20170804])
    assert day_of_year(dates).tolist() == [1, 365, 60, 366, 216]


def test_clear_fraction_and_validity():
    valid = np.zeros((3, 2, 2), dtype=bool)
    valid[1, 0, 0] = True
    valid[2] = True
    assert clear_fraction(valid).tolist() == [0.0, 0.25, 1.0]
    s2 = np.ones((2, 10, 1, 2), dtype=np.int16)
    s2[0, :, 0, 1] = 0  # all ten bands 0 -> no data
    s2[1, 3, 0, 0] = 0  # one band 0 -> still data
    assert s2_pixel_validity(s2).tolist() == [[[True, False]], [[True, True]]]
    s1 = np.ones((1, 2, 1, 3), dtype=np.float32)
    s1[0, 0, 0, 0] = np.nan
    s1[0, :, 0, 1] = 0.0
    assert s1_pixel_validity(s1).tolist() == [[[False, False, True]]]


def test_eval_selection_is_evenly_spaced_over_valid_dates():
    frac = np.array([1, 0, 1, 1, 0, 1, 1, 1, 0, 1], dtype=float)  # valid: 0 2 3 5 6 7 9
    idx = select_dates(frac, 4)
    # valid[round(linspace(0, 6, 4))] = valid[[0, 2, 4, 6]]
    assert idx.tolist() == [0, 3, 6, 9]
    assert select_dates(frac, 4).tolist() == idx.tolist()  # deterministic


def test_train_selection_uses_only_valid_dates_when_enough():
    rng = np.random.default_rng(0)
    frac = np.zeros(60)
    valid = np.arange(0, 60, 3)  # 20 valid dates
    frac[valid] = 0.9
    frac[1::3] = 0.4  # below the 0.5 threshold
    seen = set()
    for _ in range(200):
        idx = select_dates(frac, 16, rng=rng)
        assert len(idx) == 16 and np.all(np.diff(idx) > 0)
        assert set(idx.tolist()) <= set(valid.tolist())
        seen.update(idx.tolist())
    assert seen == set(valid.tolist())  # random: every valid date gets drawn


def test_too_few_valid_dates_fills_with_clearest_invalid():
    frac = np.array([0.0, 0.9, 0.3, 0.0, 0.45, 0.2, 1.0, 0.1])
    # valid (>= 0.5): 1, 6; then the clearest others: 4 (0.45), 2 (0.3)
    assert select_dates(frac, 4).tolist() == [1, 2, 4, 6]
    rng = np.random.default_rng(1)
    assert select_dates(frac, 4, rng=rng).tolist() == [1, 2, 4, 6]
    # the threshold is configurable
    assert select_dates(frac, 2, min_clear_fraction=0.25).tolist() == [1, 6]


def test_series_shorter_than_t_returns_every_date_once():
    frac = np.array([0.0, 1.0, 0.5])
    assert select_dates(frac, 16).tolist() == [0, 1, 2]
    assert select_dates(frac, 16, rng=np.random.default_rng(0)).tolist() == [0, 1, 2]
    with pytest.raises(ValueError):
        select_dates(frac, 0)
