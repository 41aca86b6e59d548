"""PMNF fitter: exact recovery without noise, closed-form leave-one-out = brute force, recovery
rates on noisy synthetic truths (stated per case and met), input handling and errors.

Recovery protocol (fixed seeds, ``numpy.random.default_rng([case, trial])``): x = 2, 4, ..., 256
(8 points), 5 repetitions per point, multiplicative Gaussian noise ``y (1 + sigma eps)`` with
sigma = 1 %, 3 %, 10 %, 20 trials per case. Stated rates (the rate observed with these seeds,
minus one trial of slack for platform round-off), exact lead order of the selected model:

============  =====  =====  =====
truth          1 %    3 %   10 %
============  =====  =====  =====
c + x          90 %   70 %   25 %
c + x log x    95 %   75 %   25 %
x^2            90 %   65 %   25 %
constant       75 %   80 %   80 %
log x          95 %   95 %   95 %
============  =====  =====  =====

As the study warns, the selected exponent drifts at 10 % noise (c + x is then often modelled as
c + x^(4/5) log x, a near-identical curve over this range), which is why assertions check the lead
order with the noise in view: the verdict of ``check_scaling(expected=<truth's order>)`` is not
``fail`` in >= 85 % of the trials of every case (it may be inconclusive; its failure test has a 5 %
level, so 0 to 3 false alarms in 20 trials are expected), and every non-constant truth fails an
O(1) expectation in 100 % of its trials.
"""

import warnings
from fractions import Fraction

import numpy as np
import pytest

from cropscale import CropScaleError
from cropscale.scaling.assertions import check_scaling
from cropscale.scaling.pmnf import (
    CONSTANT,
    LOG_EXPONENTS,
    POLY_EXPONENTS,
    Hypothesis,
    PMNFWarning,
    Term,
    _smape,
    aggregate,
    design_matrix,
    fit_pmnf,
    hypotheses,
    loo_fits,
    term_contributes,
)

X = 2.0 ** np.arange(1, 9)
TRUTHS = {
    "c + x": (lambda x: 100 + 5 * x, Term(1, 0)),
    "c + x log x": (lambda x: 100 + 2 * x * np.log2(x), Term(1, 1)),
    "x^2": (lambda x: 0.5 * x**2, Term(2, 0)),
    "constant": (lambda x: 250 + 0 * x, CONSTANT),
    "log x": (lambda x: 20 * np.log2(x), Term(0, 1)),
}
NOISES = (0.01, 0.03, 0.10)
TRIALS = 20
STATED_EXACT = {
    "c + x": (0.90, 0.70, 0.25),
    "c + x log x": (0.95, 0.75, 0.25),
    "x^2": (0.90, 0.65, 0.25),
    "constant": (0.75, 0.80, 0.80),
    "log x": (0.95, 0.95, 0.95),
}
STATED_ASSERT_PASS = 0.85


def test_exponent_sets_are_the_issues():
    assert [str(i) for i in POLY_EXPONENTS] == [
        "0", "1/4", "1/3", "1/2", "2/3", "3/4", "4/5", "1", "5/4", "4/3", "3/2", "5/3", "7/4", "2", "9/4",
        "7/3", "5/2", "8/3", "11/4", "3",
    ]
    assert LOG_EXPONENTS == (0, 1, 2)
    hs = hypotheses()
    assert len(hs) == 20 * 3 - 1 and CONSTANT not in hs
    assert hs == sorted(hs)  # simplest first
    assert len(hypotheses(log_terms=False)) == 19
    neg = hypotheses(negative_exponents=True)
    assert len(neg) == 59 + 19 and neg[0] == Term(Fraction(-3), 0)


@pytest.mark.parametrize("name", list(TRUTHS))
def test_exact_recovery_without_noise(name):
    f, term = TRUTHS[name]
    m = fit_pmnf(X, f(X))
    assert m.term == term and m.lead_order == term
    assert m.smape == pytest.approx(0.0, abs=1e-9)
    if not term.is_constant:
        assert m.adjusted_r2 == pytest.approx(1.0, abs=1e-12)
    assert np.allclose(m(X), f(X), rtol=1e-9)


def test_coefficients_are_least_squares():
    m = fit_pmnf(X, 3.0 + 0.25 * X**1.5)
    assert m.term == Term(Fraction(3, 2)) and m.c0 == pytest.approx(3.0) and m.c1 == pytest.approx(0.25)
    assert m.formula == "3 + 0.25 * x^(3/2)"
    assert m.big_o == "O(x^(3/2))"


def test_loo_smape_equals_brute_force_refits():
    rng = np.random.default_rng(7)
    y = (100 + 5 * X) * (1 + 0.05 * rng.standard_normal(X.size))
    m = fit_pmnf(X, y)
    for term, smape in m.ranking:
        if term.is_constant:
            continue  # scored in-sample, as in Extra-P
        preds = []
        for k in range(X.size):
            keep = np.arange(X.size) != k
            a = np.stack([np.ones(keep.sum()), term(X[keep])], axis=1)
            coef, *_ = np.linalg.lstsq(a, y[keep], rcond=None)
            preds.append(coef[0] + coef[1] * term(X[k : k + 1])[0])
        assert smape == pytest.approx(float(_smape(np.array(preds), y)), rel=1e-9)
    # the final coefficients are the least-squares fit on all points
    a = np.stack([np.ones(X.size), m.term(X)], axis=1)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    assert (m.c0, m.c1) == pytest.approx(tuple(coef), rel=1e-9)


def test_closed_form_loo_of_every_hypothesis_equals_brute_force():
    rng = np.random.default_rng(11)
    y = (20 + 3 * X**0.5) * (1 + 0.05 * rng.standard_normal(X.size))
    terms = hypotheses(negative_exponents=True)
    design = design_matrix(terms, X)
    assert np.allclose(np.max(np.abs(design.t), axis=1), 1.0) and design.ok.all()
    fits = loo_fits(design.t, y)
    assert fits.valid.all()
    for h, term in enumerate(terms):
        preds = []
        for k in range(X.size):
            keep = np.arange(X.size) != k
            a = np.stack([np.ones(keep.sum()), term(X[keep])], axis=1)
            coef, *_ = np.linalg.lstsq(a, y[keep], rcond=None)
            preds.append(coef[0] + coef[1] * term(X[k : k + 1])[0])
        assert fits.loo_smape[h] == pytest.approx(float(_smape(np.array(preds), y)), rel=1e-8), term
        full, *_ = np.linalg.lstsq(np.stack([np.ones(X.size), term(X)], axis=1), y, rcond=None)
        assert fits.slope[h] / design.scale[h] == pytest.approx(full[1], rel=1e-8), term


def test_term_contribution_and_tie_breaking_by_hand():
    # slope 2 on t = [0.5, 1]: contributions |2 * t| / |y| = [1 / 100, 2 / 1000] -> max 1 %
    t = np.array([[0.5, 1.0], [0.5, 1.0]])
    out = term_contributes(np.array([2.0, 0.0]), t, np.array([100.0, 1000.0]), minimum=0.01)
    assert out.tolist() == [True, False]  # a zero slope never contributes
    assert not term_contributes(np.array([2.0]), t[:1], np.array([100.0, 1000.0]), minimum=0.011)[0]
    simple, other = Hypothesis(Term(1), 1.0, 1.0, 5.0), Hypothesis(Term(2), 1.0, 1.0, 5.0)
    assert not other.beats(simple) and Hypothesis(Term(2), 1.0, 1.0, 4.9).beats(simple)


def _sample(f, noise, trial, case):
    rng = np.random.default_rng([case, trial])
    return f(X)[:, None] * (1 + noise * rng.standard_normal((X.size, 5)))


def test_recovery_rates_on_noisy_truths():
    """The table of the module docstring: stated rates met for every truth and noise level."""
    failures = []
    for ci, (name, (f, term)) in enumerate(TRUTHS.items()):
        for ni, noise in enumerate(NOISES):
            exact = asserted = caught = 0
            for trial in range(TRIALS):
                y = _sample(f, noise, trial, 10 * ci + ni)
                m = fit_pmnf(X, y)
                exact += m.lead_order == term
                asserted += not check_scaling(X, y, term, model=m, resamples=200).failed
                if not term.is_constant:
                    caught += check_scaling(X, y, "O(1)", model=m, resamples=200).failed
            stated = STATED_EXACT[name][ni]
            if exact / TRIALS < stated:
                failures.append(f"{name} @ {noise:.0%}: exact lead order {exact}/{TRIALS} < stated {stated:.0%}")
            if asserted / TRIALS < STATED_ASSERT_PASS:
                failures.append(f"{name} @ {noise:.0%}: check_scaling({term.big_o()}) not failed {asserted}/{TRIALS}")
            if not term.is_constant and caught != TRIALS:
                failures.append(f"{name} @ {noise:.0%}: O(1) expectation caught only {caught}/{TRIALS}")
    assert not failures, "\n".join(failures)


def test_repetitions_are_aggregated_by_the_median():
    # One wild outlier per point does not move the median.
    y = [[10 + x, 10 + x, 10 + x, 1e6, 10 + x] for x in X]
    m = fit_pmnf(X, y)
    assert m.term == Term(1) and m.c1 == pytest.approx(1.0) and list(m.repetitions) == [5] * X.size


def test_aggregate_layouts_agree():
    xs = [1, 2, 3, 4, 5]
    rows = [[1.0, 3.0, 2.0], [4, 5, 6], [7, 8, 9], [10], [11, 12]]
    long_x = [x for x, r in zip(xs, rows, strict=True) for _ in r]
    long_y = [v for r in rows for v in r]
    a = aggregate(xs, rows)
    b = aggregate(long_x, long_y)
    for u, v in zip(a, b, strict=True):
        assert np.array_equal(u, v)
    assert list(a[1]) == [2.0, 5.0, 8.0, 10.0, 11.5] and list(a[2]) == [3, 3, 3, 1, 2]
    c = aggregate(xs, np.array([[1.0, 2.0]] * 5))
    assert list(c[1]) == [1.5] * 5


def test_fewer_than_five_points_warns():
    with pytest.warns(PMNFWarning, match="at least 5"):
        fit_pmnf([1, 2, 4, 8], [1, 2, 4, 8])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_pmnf([1, 2, 4, 8, 16], [1, 2, 4, 8, 16])


def test_values_below_one_drop_log_terms_with_a_warning():
    x = np.array([0.25, 0.5, 1, 2, 4, 8])
    with pytest.warns(PMNFWarning, match="logarithmic"):
        m = fit_pmnf(x, 1 + x)
    assert m.term == Term(1)
    with pytest.raises(CropScaleError, match="log terms"):
        fit_pmnf(x, 1 + x, log_terms=True)


def test_negative_exponents_model_a_saturating_curve_as_bounded():
    n = np.array([2, 4, 8, 16, 32, 64], dtype=float)
    v = 2 * (n - 1) / n * 7.43
    m = fit_pmnf(n, v, negative_exponents=True)
    assert m.term == Term(-1) and m.lead_order == CONSTANT and m.big_o == "O(1)"
    assert m.c0 == pytest.approx(2 * 7.43) and m.c1 == pytest.approx(-2 * 7.43)
    assert fit_pmnf(n, v).lead_order > CONSTANT  # without them, a growing term is the best fit


def test_minimum_term_contribution_discards_negligible_terms():
    y = 1000 + 1e-3 * X  # the term adds at most 0.026 % of the value: below the default 0.1 %
    assert fit_pmnf(X, y).lead_order == CONSTANT
    assert fit_pmnf(X, y, min_term_contribution=0).term == Term(1)
    y = 1000 + 0.01 * X  # at most 0.26 %
    assert fit_pmnf(X, y).term == Term(1)
    assert fit_pmnf(X, y, min_term_contribution=0.01).lead_order == CONSTANT


def test_term_helpers():
    t = Term(Fraction(3, 2), 2)
    assert t.formula("p") == "p^(3/2) * log2(p)^2" and t.big_o("p") == "O(p^(3/2) log^2 p)"
    assert Term(0, 1).big_o() == "O(log n)" and Term(1, 1).big_o() == "O(n log n)" and Term(2).big_o() == "O(n^2)"
    assert CONSTANT.formula() == "1" and CONSTANT.big_o() == "O(1)"
    assert Term(1, 2) > Term(1, 1) > Term(1) > Term(Fraction(3, 4), 2) > Term(0, 2) > CONSTANT
    assert np.allclose(Term(1, 1)([2.0, 4.0]), [2.0, 8.0])


@pytest.mark.parametrize(
    "x, y, match",
    [
        ([1, 2], [1, 2], "at least 3"),
        ([0, 1, 2, 3, 4], [1, 2, 3, 4, 5], "> 0"),
        ([1, 2, 3, 4, 5], [1, 2, 3], "one value per x"),
        ([1, 2, 3, 4, 5], [1, 2, float("nan"), 4, 5], "finite"),
        ([1, 2, 3], [[1], [2], []], "without any repetition"),
    ],
)
def test_bad_input_raises_cropscale_error(x, y, match):
    with pytest.raises(CropScaleError, match=match):
        fit_pmnf(x, y)
