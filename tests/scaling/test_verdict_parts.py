"""The parts of the scaling verdict (cropscale.scaling.verdict) against independent computations (issue 36).

Weighted least squares against statsmodels' WLS; each term's chi2 against a brute-force refit; the statistic D,
the best-term rules and the raised alternatives by hand; argument limits hit exactly; the reasons of an
inconclusive verdict one by one; the verdict's text. Laws for all inputs with hypothesis: scaling every value by
a constant changes no verdict figure; the order of the repetitions at a point changes nothing.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cropscale.errors import CropScaleError
from cropscale.scaling import verdict as verdict_module
from cropscale.scaling.landau import search_space
from cropscale.scaling.pmnf import CONSTANT, Term
from cropscale.scaling.verdict import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    AssertionOutcome,
    ClassFit,
    _check_args,
    _count,
    _Design,
    _raised,
    _reps_text,
    _rows,
    _wls,
    judge,
)

N, LOG_N, N2 = Term(1, 0), Term(1, 1), Term(2, 0)
X8 = 2.0 ** np.arange(1, 9)


def _sm_wls(xs, w, term, y):
    import statsmodels.api as sm

    if term.is_constant:
        return float(sm.WLS(y, np.ones_like(xs), weights=w).fit().params[0]), 0.0
    fit = sm.WLS(y, sm.add_constant(term(xs)), weights=w).fit()
    return float(fit.params[0]), float(fit.params[1])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.1, 1000.0), min_size=6, max_size=6), st.lists(st.floats(0.2, 5.0), min_size=6,
                                                                          max_size=6),
       st.sampled_from([CONSTANT, N, LOG_N, N2, Term(Fraction(1, 2), 0)]))
def test_weighted_least_squares_is_statsmodels_wls(y, w, term):
    xs = np.array([1.0, 2.0, 3.0, 5.0, 8.0, 13.0])
    c0, c1 = _wls(xs, np.array(w), term, np.array(y))
    ref0, ref1 = _sm_wls(xs, np.array(w), term, np.array(y))
    assert (c0, c1) == (pytest.approx(ref0, rel=1e-6, abs=1e-6), pytest.approx(ref1, rel=1e-6, abs=1e-9))


def test_weighted_least_squares_with_a_fixed_slope_by_hand():
    xs, w, y = np.array([1.0, 2.0, 4.0]), np.array([1.0, 2.0, 1.0]), np.array([3.0, 5.0, 11.0])
    c0, c1 = _wls(xs, w, N, y, c1=2.0)  # c0 = weighted mean of y - 2 x = (1*1 + 2*1 + 1*3) / 4
    assert (c0, c1) == (1.5, 2.0)


def test_each_terms_chi2_is_its_weighted_refit_over_sigma_squared():
    rng = np.random.default_rng(3)
    xs = X8
    sw = rng.uniform(0.5, 2.0, xs.size)
    terms = search_space(N)
    design = _Design.build(xs, sw, terms, N)
    centres = np.stack([100 + 3 * xs + rng.normal(0, 5, xs.size), 50 + 0.1 * xs**2])
    sigma = np.array([0.5, 2.0])
    c, inside = design.chi2(centres, sigma)
    for b in range(2):
        for k, t in enumerate(terms):
            c0, c1 = _wls(xs, sw * sw, t, centres[b])
            resid = (centres[b] - (c0 + c1 * (t(xs) if not t.is_constant else 0))) * sw
            assert c[b, k] == pytest.approx(np.sum(resid**2) / sigma[b] ** 2, rel=1e-7), (b, t)
            slope_sign = c1 if not t.is_constant else 0.0
            assert inside[b, k] == (t.order <= N or slope_sign <= 0), (b, t)  # a falling fit counts as within


def test_the_noise_floor_bounds_the_chi2():
    design = _Design.build(X8[:4], np.ones(4), (CONSTANT, N), N)
    c, _ = design.chi2(np.array([[1.0, 2.0, 3.0, 5.0]]), np.array([0.0]))
    assert np.isfinite(c).all() and c[0, 0] > 1e9  # sigma 0 counts as 1 ppm, not as a division by zero


def test_the_statistic_by_hand():
    c = np.array([[10.0, 4.0, 1.0], [9.0, 9.0, 9.0], [6.0, 6.0, 6.0]])
    within = np.array([[True, False, False], [True, True, True], [True, True, False]])
    d = _Design.statistic(c, within, dof=2)
    # row 0: phi = max(1, 1 / 2) = 1, D = 10 - 1 = 9; row 1: nothing above grows: -inf
    # row 2: phi = 6 / 2 = 3, D = (6 - 6) / 3 = 0
    assert d[0] == 9.0 and d[1] == -math.inf and d[2] == 0.0


def test_the_best_term_rules_by_hand():
    terms = (CONSTANT, N, N2)
    design = _Design.build(X8[:5], np.ones(5), terms, N)  # within: O(1), O(n); above: O(n^2)
    c = np.array([5.0, 3.0, 2.5])
    falling = np.array([True, True, True])  # n^2 with a falling fit counts as within
    assert design.best(c, falling, family=True) == 1  # 2.5 is not lower than 3 by more than 1: keep O(n)
    assert design.best(np.array([5.0, 3.0, 1.9]), falling, family=True) == 2  # lower by more than 1
    assert design.best(c, np.array([True, True, False]), family=False) == 2
    assert design.best(c, falling, family=False) == 2  # nothing above grows: the lowest class above


def test_raised_alternatives_rise_by_the_floor_at_least():
    xs, w = np.array([1.0, 2.0, 4.0, 8.0]), np.ones(4)
    flat = np.array([10.0, 10.0, 10.0, 10.0])
    alt = _raised(xs, w, N, flat, floor=2.1, chi2=7.0)
    assert alt.c1 == pytest.approx(2.1 / 7.0) and alt.c0 == pytest.approx(10.0 - 0.3 * 15.0 / 4) and alt.chi2 == 7.0
    steep = 3.0 * xs
    kept = _raised(xs, w, N, steep, floor=2.1, chi2=1.0)
    assert (kept.c0, kept.c1) == (pytest.approx(0.0, abs=1e-12), pytest.approx(3.0))  # rises by 21 already
    const = _raised(xs, w, CONSTANT, flat, floor=2.1, chi2=0.0)
    assert (const.c0, const.c1) == (10.0, 0.0)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"resamples": 99}, "resamples must be an integer >= 100, got 99"),
    ({"resamples": True}, "resamples must be an integer >= 100, got True"),
    ({"resamples": 100.0}, "resamples must be an integer >= 100, got 100.0"),
    ({"resolution": 0}, "resolution must be a fraction in (0, 1] (0.1 = 10 %), got 0"),
    ({"resolution": 1.0001}, "resolution must be a fraction in (0, 1] (0.1 = 10 %), got 1.0001"),
    ({"resolution": False}, "resolution must be a fraction in (0, 1] (0.1 = 10 %), got False"),
    ({"alpha_fail": 0.5}, "alpha_fail must be in (0, 0.5), got 0.5"),
    ({"alpha_pass": 0}, "alpha_pass must be in (0, 0.5), got 0"),
])
def test_argument_limits(kwargs, message):
    args = {"resamples": 100, "resolution": 0.1, "alpha_fail": 0.05, "alpha_pass": 0.005} | kwargs
    with pytest.raises(CropScaleError) as info:
        _check_args(N, args["resamples"], args["resolution"], (args["alpha_fail"], args["alpha_pass"]))
    assert str(info.value) == message


def test_arguments_at_their_limits_are_accepted():
    _check_args(N, 100, 1.0, (0.4999, 1e-9))
    _check_args(N, 100, 1, (0.01, 0.01))
    with pytest.raises(CropScaleError, match=r"^expected must be a Term \(see landau.parse_order\), got 'O\(n\)'$"):
        _check_args("O(n)", 100, 0.1, (0.05, 0.005))


def test_rows_group_repeated_x_and_refuse_what_cannot_be_judged():
    xs, rows = _rows([4, 1, 4, 2], [1.0, 2.0, 3.0, 4.0])
    assert xs.tolist() == [1.0, 2.0, 4.0] and [r.tolist() for r in rows] == [[2.0], [4.0], [1.0, 3.0]]
    xs, rows = _rows([1, 2], [[1.0, 1.5], [2.0]])
    assert [r.tolist() for r in rows] == [[1.0, 1.5], [2.0]]
    for x, y, message in [
        ([[1, 2]], [1, 2], "x must be a non-empty 1-D sequence of numbers, got shape (1, 2)"),
        ([1, 2, 3], [1.0, 2.0], "y must have one value per x (3) or one sequence of repetitions per x"),
        ([1, 2, 3], [[1.0], [2.0]], "y has 2 rows of repetitions for 3 x values"),
        ([1, 2], [[1.0], []], "y has an x value without any repetition"),
        ([1, 2], [[1.0], [math.inf]], "x and y must be finite numbers (got nan or inf)"),
        ([0, 2], [1.0, 2.0], "x must be > 0 for the terms x^i log2(x)^j, got min 0"),
    ]:
        with pytest.raises(CropScaleError) as info:
            _rows(x, y)
        assert str(info.value) == message


def test_judge_needs_three_points_and_log_terms_need_x_of_one_or_more():
    with pytest.raises(CropScaleError, match="^a verdict needs at least 3 distinct x values, got 2$"):
        judge([1, 2, 2], [1.0, 2.0, 2.5], N)
    with pytest.raises(CropScaleError, match=r"^log terms need every x >= 1, got min 0.5$"):
        judge([0.5, 1, 2, 4], [1.0, 2.0, 3.0, 4.0], N, log_terms=True)
    v = judge([0.5, 1, 2, 4, 8], [1.0, 2.0, 4.0, 8.0, 16.0], N, resamples=100)  # below 1: no log classes searched
    assert all(alt.term.j == 0 for alt, _ in v.excluded) and v.status == PASS


def test_the_small_texts():
    assert _count(0.0475, 1000) == 48 and _count(0.0, 100) == 0
    assert _reps_text(np.array([5, 5, 5])) == "5" and _reps_text(np.array([3, 5, 4])) == "3-5"
    fit = ClassFit(N2, 2.5, -0.125, 1.0)
    assert fit.formula("n") == "2.5 - 0.125 * n^2" and fit.order_text("n") == "O(n^2), falling"
    assert ClassFit(N, 1.0, 0.0, 0.0).formula() == "1" and ClassFit(CONSTANT, 4.0, 0.0, 0.0).order_text() == "O(1)"
    assert ClassFit(CONSTANT, 4.0, 0.0, 0.0)(np.array([1.0, 2.0])).tolist() == [4.0, 4.0]
    assert ClassFit(Term(-1, 0), 4.0, -2.0, 0.0).order_text("n") == "O(1)"  # bounded, never "falling"


class _Outcome(AssertionOutcome):
    def __init__(self, status, label, evidence):
        self.status, self.label, self.evidence = status, label, evidence


def test_assertion_outcome_flags_and_heading():
    assert [(o.passed, o.failed, o.inconclusive) for o in (_Outcome(s, "", "") for s in (PASS, FAIL, INCONCLUSIVE))] \
        == [(True, False, False), (False, True, False), (False, False, True)]
    assert _Outcome(FAIL, "step time vs batch", "measured-run")._heading() == (
        "performance assertion failed for step time vs batch [measured-run]")
    assert _Outcome(INCONCLUSIVE, "", "")._heading() == "performance assertion was inconclusive"
    assert _Outcome(PASS, "x", "")._heading() == "performance assertion held for x"


def _noisy(f, sigma, seed, xs=X8, reps=5):
    rng = np.random.default_rng(seed)
    return f(xs)[:, None] * (1.0 + sigma * rng.standard_normal((xs.size, reps)))


def test_each_reason_of_an_inconclusive_verdict():
    four = judge(X8[:4], _noisy(lambda x: 10 + x, 0.01, 0, X8[:4]), N, resamples=200)
    assert four.status == INCONCLUSIVE and four.reason.startswith(
        "too few points (4 distinct n values; at least 5 are needed to pass): the data cannot separate O(n) from")
    narrow = np.array([10.0, 11.0, 12.0, 13.0, 14.0, 15.0])  # max / min = 1.5 < 8
    v = judge(narrow, _noisy(lambda x: 10 + x, 0.05, 1, narrow), N, resamples=200)
    assert v.status == INCONCLUSIVE and v.reason.startswith("too narrow a range (max n / min n = 1.5 < 8)")
    wide = judge(X8, _noisy(lambda x: 10 + x, 0.3, 0), N, resamples=200)
    assert wide.status == INCONCLUSIVE and wide.reason.startswith("too much noise: the data cannot separate O(n)")
    assert "(8 points, repetitions 5)" in wide.reason and "; to decide" in wide.reason and wide.hint
    misfit = judge(X8, _noisy(lambda x: 10 + x, 0.3, 2), N, resamples=200)
    assert misfit.status == INCONCLUSIVE and misfit.adequacy < 0.01
    assert misfit.reason.startswith("no model of O(n) or below fits within the noise (its chi2 is reached by ")


def test_a_range_of_exactly_eight_is_not_too_narrow():
    xs = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    v = judge(xs, _noisy(lambda x: 10 + x, 0.05, 0, xs), N, resamples=200)
    assert v.status == INCONCLUSIVE and not v.reason.startswith("too narrow") and v.reason.startswith("too much noise")


def test_describe_texts_of_the_three_outcomes():
    passed = judge(X8, _noisy(lambda x: 100 + 3 * x, 0.01, 0), N, resamples=200)
    assert passed.status == PASS and passed.describe("n").startswith("within O(n): best model f(n) = ")
    assert "(fraction of 200 series drawn from each that look like the data)" in passed.describe("n")
    failed = judge(X8, _noisy(lambda x: 10 + x**2, 0.01, 0), N, resamples=200)
    text = failed.describe("n")
    assert failed.status == FAIL and text.startswith("exceeds O(n) by a factor ")
    assert "of 200 series drawn from the best" in text and "% of bootstrap resamples of the repetitions" in text
    single = judge(X8, 10 + X8**2, N, resamples=200)  # no repetitions: no support sentence
    assert single.status == FAIL and "bootstrap resamples" not in single.describe("n")
    assert single.noise_source == "residuals" and math.isnan(single.support)


@settings(max_examples=15, deadline=None)
@given(st.floats(1e-3, 1e3), st.integers(0, 3))
def test_scaling_every_value_changes_no_verdict(factor, seed):
    y = _noisy(lambda x: 50 + 2 * x, 0.05, seed)
    a, b = judge(X8, y, N, resamples=100), judge(X8, y * factor, N, resamples=100)
    assert (a.status, a.p_within, a.p_above, a.support) == (b.status, b.p_within, b.p_above, b.support)
    assert a.statistic == pytest.approx(b.statistic, rel=1e-6, abs=1e-9) and a.noise == pytest.approx(b.noise)


@settings(max_examples=10, deadline=None)
@given(st.randoms(use_true_random=False))
def test_the_order_of_the_repetitions_changes_no_figure_of_the_data(rnd):
    """Centres, noise, the statistic and the fitted models do not depend on the order (the bootstrap draws do)."""
    y = _noisy(lambda x: 50 + 2 * x, 0.05, 7)
    shuffled = np.array([rnd.sample(list(row), len(row)) for row in y])
    a, b = judge(X8, y, N, resamples=100), judge(X8, shuffled, N, resamples=100)
    assert a.centres == pytest.approx(b.centres) and a.noise == pytest.approx(b.noise)
    assert a.statistic == pytest.approx(b.statistic) and (a.within.c0, a.within.c1) == pytest.approx(
        (b.within.c0, b.within.c1)) and a.above.term == b.above.term


def test_module_constants_are_the_documented_ones():
    assert (verdict_module.MIN_POINTS, verdict_module.NARROW_RANGE, verdict_module.NEIGHBOURS,
            verdict_module.ALPHA_FIT, verdict_module.NOISE_FLOOR) == (5, 8.0, 2, 0.01, 1e-6)
