"""PMNF fitter: the behaviours that the mutation run of issue 36 (sample s5) showed untested, each against a
hand-worked value, a brute-force refit or scipy (the equivalent mutants are listed in
notes/mutation/equivalents_s5_scaling.md)."""

import warnings
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from cropscale import CropScaleError
from cropscale.scaling.pmnf import (
    CONSTANT,
    PMNFModel,
    PMNFWarning,
    Term,
    _smape,
    aggregate,
    constant_hypothesis,
    design_matrix,
    fit_pmnf,
    hypotheses,
    loo_fits,
    term_contributes,
)

X = 2.0 ** np.arange(1, 9)


def _brute_loo_smape(term: Term, x: np.ndarray, y: np.ndarray) -> float:
    """LOO SMAPE (%) of ``c0 + c1 term`` by refitting with numpy's least squares, one left-out point at a time."""
    ratios = []
    for k in range(x.size):
        keep = np.arange(x.size) != k
        coef, *_ = np.linalg.lstsq(np.stack([np.ones(keep.sum()), term(x[keep])], axis=1), y[keep], rcond=None)
        p = coef[0] + coef[1] * term(x[k : k + 1])[0]
        ratios.append(2 * abs(p - y[k]) / (abs(p) + abs(y[k])))
    return 100 * float(np.mean(ratios))


def test_a_negative_log_exponent_is_refused_with_its_value():
    with pytest.raises(CropScaleError, match=r"log exponent j must be a non-negative integer, got -1"):
        Term(Fraction(1), -1)
    with pytest.raises(CropScaleError, match=r"got 1\.5"):
        Term(Fraction(1), 1.5)


def test_formula_and_big_o_default_variables():
    assert Term(1).formula() == "x" and Term(Fraction(1, 2), 1).formula() == "x^(1/2) * log2(x)"
    assert Term(2, 2).big_o() == "O(n^2 log^2 n)"


def test_model_with_a_zero_coefficient_is_written_as_its_constant():
    # c1 = 0 on a growing term: the model is the constant c0 (as its __call__ says), not "2.5 + 0 * x"
    m = PMNFModel(c0=2.5, c1=0.0, term=Term(1), smape=0.0, smape_fit=0.0, adjusted_r2=float("nan"), rss=0.0,
                  x=X, y=np.full(X.size, 2.5), repetitions=np.ones(X.size, dtype=int))
    assert m.formula == "2.5" and np.array_equal(m(X), np.full(X.size, 2.5))
    assert m.big_o == "O(1)"


def test_aggregate_of_a_float32_array_takes_medians_in_float64():
    # the median of 1 and 1 + 2^-23 (both float32) is 1 + 2^-24, which float32 cannot hold
    y = np.array([[1.0, 1.0 + 2.0**-23]] * 3, dtype=np.float32)
    xs, med, counts = aggregate([1, 2, 3], y)
    assert med.dtype == np.float64 and med.tolist() == [1.0 + 2.0**-24] * 3 and counts.tolist() == [2, 2, 2]


@pytest.mark.parametrize("y", [np.zeros((3, 2, 2)), np.array(4.0)], ids=["3-D", "0-D"])
def test_aggregate_refuses_an_array_of_other_rank_with_a_clear_error(y):
    with pytest.raises(CropScaleError, match="one value per x"):
        aggregate([1, 2, 3], y)


def test_smape_of_zero_against_zero_counts_as_no_error():
    # by hand: points (0, 0) -> 0; (2, 1) -> 200 * 1 / 3; (1, 1) -> 0
    assert float(_smape(np.array([0.0, 1.0]), np.array([0.0, 1.0]))) == 0.0
    assert float(_smape(np.array([0.0, 2.0, 1.0]), np.array([0.0, 1.0, 1.0]))) == pytest.approx(200 / 9)
    out = _smape(np.array([[0.0, 2.0], [0.0, 0.0]]), np.array([0.0, 1.0]), axis=1)
    assert out.dtype == np.float64 and out.tolist() == pytest.approx([100 / 3, 100.0])  # (0, 1) -> 200


def test_adjusted_r2_on_three_points_has_one_degree_of_freedom():
    x = np.array([1.0, 2.0, 4.0])
    y = 1.0 + 2.0 * x + np.array([0.1, -0.2, 0.1])
    with pytest.warns(PMNFWarning, match="at least 5"):
        m = fit_pmnf(x, y)
    assert not m.term.is_constant
    line = stats.linregress(m.term(x), y)
    assert m.adjusted_r2 == pytest.approx(1 - (1 - line.rvalue**2) * 2 / 1, rel=1e-9)  # n - 1 = 2, dof = 1


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_design_matrix_marks_overflowing_and_all_zero_terms_unusable():
    # x^3 at 1e200 overflows to inf; log2(x) at x = 1 alone is 0: both rows keep scale 1 and ok False
    d = design_matrix([Term(3), Term(1)], np.array([1.0, 1e200]))
    assert d.ok.tolist() == [False, True]
    assert d.scale.tolist() == [1.0, 1e200]
    d = design_matrix([Term(0, 1), Term(1)], np.array([1.0]))
    assert d.ok.tolist() == [False, True] and d.scale.tolist() == [1.0, 1.0] and d.t.tolist() == [[0.0], [1.0]]


def test_loo_fit_of_a_term_with_a_small_spread_is_valid():
    # t = [0, 1e-7, 1e-3]: every pair still defines a line; the refit without the last point has S_uu = 5e-15,
    # far above 1e-12 of the full S_uu (6.7e-7). Predictions by hand from the line through the two others.
    t, y = np.array([0.0, 1e-7, 1e-3]), np.array([1.0, 2.0, 3.0])
    preds = [2.0 - 1e-7 / (1e-3 - 1e-7), 1.0 + 2000.0 * 1e-7, 1.0 + 1e7 * 1e-3]
    fits = loo_fits(t[None, :], y)
    assert fits.valid.tolist() == [True]
    assert fits.loo_smape[0] == pytest.approx(float(np.mean([200 * abs(p - a) / (abs(p) + a)
                                                             for p, a in zip(preds, y, strict=True)])), rel=1e-6)


def test_term_contribution_ignores_a_zero_measurement():
    # slope 2 on t = [0.5, 1]: at y = 0 no ratio; at y = 1000 the contribution is 2 / 1000 = 0.2 %
    t = np.array([[0.5, 1.0]])
    assert term_contributes(np.array([2.0]), t, np.array([0.0, 1000.0]), minimum=0.002).tolist() == [True]
    assert term_contributes(np.array([2.0]), t, np.array([0.0, 1000.0]), minimum=0.0021).tolist() == [False]
    m = fit_pmnf(X / 2, 20 * np.log2(X / 2))  # y = 0 at x = 1
    assert m.term == Term(0, 1) and m.c1 == pytest.approx(20.0)


def test_constant_model_has_no_term_coefficient_and_its_own_residuals():
    y = np.array([9.8, 10.14, 9.91, 9.58, 9.84, 9.52, 10.0, 9.44, 9.45, 10.73])
    x = np.arange(1.0, 11.0)
    mean = sum(y) / 10
    h = constant_hypothesis(y)
    assert h.term == CONSTANT and h.c1 == 0.0 and h.c0 == pytest.approx(mean)
    m = fit_pmnf(x, y)
    assert m.term == CONSTANT and m.c1 == 0.0
    assert m.rss == pytest.approx(sum((v - mean) ** 2 for v in y), rel=1e-12)
    # the constant model's score is its in-sample SMAPE: the same number as smape_fit, to the last bit (a sum in
    # another order, e.g. over Python floats, differs here in the last digit: 2.8582171204193427)
    assert m.smape == m.smape_fit == pytest.approx(100 * np.mean([2 * abs(mean - v) / (mean + v) for v in y]))


@pytest.mark.parametrize("scale", [1e-9, 1.0, 1e9])
def test_the_selection_does_not_depend_on_the_metric_unit(scale):
    # 1 + x/2 in any unit: the linear term; a unit of 1e-9 (ns in s) must not read as "no variation"
    m = fit_pmnf(X, scale * (1.0 + 0.5 * X))
    assert m.term == Term(1) and m.c1 == pytest.approx(0.5 * scale) and m.c0 == pytest.approx(scale)


def test_no_variation_means_the_constant_model_only():
    # eight values one ulp apart at 1e6 (2^-33): residual sum of squares 42 * 2^-66 < 1e-24 * 8 * (1e6)^2
    y = 1e6 + np.arange(1, 9) * 2.0**-33
    m = fit_pmnf(X, y, min_term_contribution=0.0)
    assert m.term == CONSTANT and len(m.ranking) == 1


def test_explicit_log_terms_accept_x_equal_to_one():
    x = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = fit_pmnf(x, 3 + 2 * x * np.log2(x), log_terms=True)
    assert m.term == Term(1, 1) and m.c1 == pytest.approx(2.0)


def test_in_sample_smape_of_the_final_fit():
    y = 5.0 + 3.0 * X + np.array([0.4, -0.3, 0.5, -0.6, 0.2, -0.4, 0.6, -0.2])
    m = fit_pmnf(X, y)
    coef, *_ = np.linalg.lstsq(np.stack([np.ones(X.size), m.term(X)], axis=1), y, rcond=None)
    pred = coef[0] + coef[1] * m.term(X)
    assert m.smape_fit == pytest.approx(100 * np.mean(2 * np.abs(pred - y) / (np.abs(pred) + np.abs(y))), rel=1e-9)
    assert 0 < m.smape_fit < m.smape  # in-sample beats leave-one-out


def test_ranking_is_the_five_best_scores_from_brute_force():
    rng = np.random.default_rng(7)
    y = (100 + 5 * X) * (1 + 0.05 * rng.standard_normal(X.size))
    m = fit_pmnf(X, y)
    scores = [(t, _brute_loo_smape(t, X, y)) for t in hypotheses()]
    scores.append((CONSTANT, 100 * float(np.mean(2 * np.abs(y.mean() - y) / (y.mean() + y)))))
    best5 = sorted(scores, key=lambda ts: ts[1])[:5]
    assert [t for t, _ in m.ranking] == [t for t, _ in best5]
    assert [s for _, s in m.ranking] == pytest.approx([s for _, s in best5], rel=1e-8)
    assert m.ranking[0] == (m.term, m.smape)
