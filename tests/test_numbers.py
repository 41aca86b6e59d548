"""The layer-0 statistics helpers (cropscale.numbers) against numpy and hand-worked values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cropscale.numbers import finite_or_none, mean_sd, median, median_p95, percentile, speedup, time_to_target

FINITE = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@pytest.mark.parametrize("q", [0, 10, 50, 95, 100])
def test_percentile_matches_numpy(q):
    vals = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0]
    assert percentile(vals, q) == pytest.approx(float(np.percentile(vals, q)))
    assert percentile([], q) is None


@given(st.lists(FINITE, min_size=1, max_size=12), st.floats(min_value=0, max_value=100))
def test_percentile_is_numpys_linear_percentile_for_every_list(values, q):
    """One value and two values included (the single-value shortcut and the first interpolation)."""
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-9, abs=1e-6)


def test_percentile_of_one_and_two_values_hand_worked():
    assert percentile([7.0], 0) == percentile([7.0], 100) == 7.0
    assert percentile([2.0, 6.0], 50) == 4.0 and percentile([6.0, 2.0], 25) == 3.0  # 2 + 0.25 * (6 - 2)


def test_median_of_no_finite_value_is_none():
    assert median([None, math.nan, math.inf]) is None and median([]) is None
    assert median([5.0, 1.0, 2.0, 8.0]) == 3.5  # even count: the mean of the middle two


def test_median_p95_hand_worked():
    # sorted 1, 2, 3, 4, 5: median 3; p95 at position 0.95 * 4 = 3.8 -> 4 + 0.8 * (5 - 4) = 4.8
    assert median_p95([5.0, 1.0, 4.0, 2.0, 3.0], scale=10.0) == {"median": 30.0, "p95": 48.0, "n": 5}
    assert median_p95([]) == {"median": None, "p95": None, "n": 0}
    assert median_p95([2.0, 1.0]) == {"median": 1.5, "p95": 1.95, "n": 2}  # unscaled by default


def test_speedup_accepts_any_positive_rate_and_names_the_bad_one():
    assert speedup(0.5, 0.25) == 2.0 and speedup(0.3, 0.9) == pytest.approx(1 / 3)  # rates below 1 are rates
    with pytest.raises(ValueError, match=r"^samples/s must be a positive finite rate, got None$"):
        speedup(None, 1.0)
    with pytest.raises(ValueError, match=r"^base samples/s must be a positive finite rate, got nan$"):
        speedup(1.0, math.nan)
    with pytest.raises(ValueError, match=r"^base samples/s must be a positive finite rate, got -2.0$"):
        speedup(1.0, -2.0)


def test_none_nan_and_inf_are_no_value():
    assert finite_or_none(math.nan) is None and finite_or_none(math.inf) is None and finite_or_none(2) == 2.0
    assert median([None, 1.0, math.nan, 3.0]) == 2.0
    mean, sd = mean_sd([1.0, None, 3.0, math.inf])
    assert mean == 2.0 and sd == pytest.approx(math.sqrt(2.0))
    assert mean_sd([4.0]) == (4.0, None) and mean_sd([]) == (None, None)


def test_time_to_target_hand_worked():
    points = [(10.0, 0.30), (21.0, float("nan")), (33.0, 0.46), (40.0, 0.41), (52.0, 0.50)]
    assert time_to_target(points, 0.45) == 33.0  # the first best-so-far >= 0.45
    assert time_to_target(points, 0.30) == 10.0
    assert time_to_target(points, 0.51) is None  # not reached
