"""``min_clear_fraction`` is "at least" (issue 27): a date exactly at the threshold is valid.

Hand-worked, evaluation (evenly spaced valid dates, ``round(linspace(0, v - 1, 3))`` of the ``v`` valid ones):
clear fractions [0.5, 0.9, 0.5, 0.95, 0.99, 0.6], 3 wanted, threshold 0.5: all six dates are valid, positions
0, 2.5 -> 2, 5: dates [0, 2, 5]. Were 0.5 not valid, the valid dates would be 1, 3, 4, 5 and the picks
positions 0, 1.5 -> 2, 3: dates [1, 4, 5].
"""

import numpy as np

from cropscale.data.temporal import select_dates

FRACTION = np.array([0.5, 0.9, 0.5, 0.95, 0.99, 0.6])


def test_a_date_at_the_threshold_is_valid():
    assert select_dates(FRACTION, 3, min_clear_fraction=0.5).tolist() == [0, 2, 5]


def test_a_date_just_below_the_threshold_is_not():
    assert select_dates(FRACTION, 3, min_clear_fraction=0.5000001).tolist() == [1, 4, 5]


def test_training_draws_only_valid_dates_when_there_are_enough():
    rng = np.random.default_rng(0)
    drawn = {d for _ in range(50) for d in select_dates(FRACTION, 3, min_clear_fraction=0.6, rng=rng).tolist()}
    assert drawn == {1, 3, 4, 5}  # the four dates at 0.6 or above, each drawn at some point; never 0 or 2
