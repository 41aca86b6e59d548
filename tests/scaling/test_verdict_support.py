"""The bootstrap-support condition of a FAIL verdict (issue 27).

The rule (``cropscale.scaling.verdict``): FAIL needs ``D > 0``, ``p_within < alpha_fail`` *and*, when there are
repetitions, ``support >= 0.5`` (at least half of the plain-bootstrap resamples of the repetitions fit best
above the expectation). Two parts:

- the support itself, where it is known by hand: with identical repetitions every resample *is* the data, so
  the support is 1 when the data grows faster than expected and 0 when it does not;
- the condition, on a series that fails on every other count: the support is set to chosen values (the
  bootstrap replaced by a constant) and the verdict must be FAIL exactly when it is at least 0.5.
"""

import math

import numpy as np
import pytest

from cropscale.scaling import verdict as verdict_module
from cropscale.scaling.pmnf import Term
from cropscale.scaling.verdict import FAIL, judge

X = 2.0 ** np.arange(1, 7)
QUADRATIC = np.repeat((3 + X**2)[:, None], 4, axis=1)  # 4 identical repetitions per point
LINEAR = np.repeat((3 + X)[:, None], 4, axis=1)


def test_support_of_identical_repetitions_is_all_or_nothing():
    above = judge(X, QUADRATIC, Term(1), resamples=200)
    assert above.noise_source == "repetitions" and above.support == 1.0 and above.status == FAIL
    within = judge(X, LINEAR, Term(1), resamples=200)
    assert within.support == 0.0 and within.status != FAIL


@pytest.mark.parametrize(("support", "fails"), [(0.0, False), (0.49, False), (0.5, True), (0.8, True)])
def test_fail_needs_at_least_half_the_resamples_above(monkeypatch, support, fails):
    monkeypatch.setattr(verdict_module._State, "support", lambda self: support)
    v = judge(X, QUADRATIC, Term(1), resamples=200)
    assert v.statistic > 0 and v.p_within < 0.05  # every other condition of FAIL holds
    assert v.support == support
    assert (v.status == FAIL) is fails
    if fails:
        assert f"{100 * support:.0f} % of bootstrap resamples of the repetitions fit best above" in v.describe()


def test_without_repetitions_there_is_no_support_condition():
    v = judge(X, 3 + X**2, Term(1), resamples=200)
    assert math.isnan(v.support) and v.status == FAIL
