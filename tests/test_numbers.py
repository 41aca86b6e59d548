"""The layer-0 statistics helpers (cropscale.numbers) against numpy and hand-worked values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cropscale.numbers import finite_or_none, mean_sd, median, median_p95, percentile, time_to_target


@pytest.mark.parametrize("q", [0, 10, 50, 95, 100])
def test_percentile_matches_numpy(q):
    vals = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.0]
    assert percentile(vals, q) == pytest.approx(float(np.percentile(vals, q)))
    assert percentile([], q) is None


def test_median_p95_hand_worked():
    # sorted 1, 2, 3, 4, 5: median 3; p95 at position 0.95 * 4 = 3.8 -> 4 + 0.8 * (5 - 4) = 4.8
    assert median_p95([5.0, 1.0, 4.0, 2.0, 3.0], scale=10.0) == {"median": 30.0, "p95": 48.0, "n": 5}
    assert median_p95([]) == {"median": None, "p95": None, "n": 0}


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
