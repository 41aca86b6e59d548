"""The class verdict (cropscale.scaling.verdict.judge): its pieces against hand computations, exact
data decided exactly, the three reasons for an inconclusive verdict, reproducibility, bad input."""

import math

import numpy as np
import pytest

from cropscale import CropScaleError
from cropscale.scaling.landau import parse_order
from cropscale.scaling.pmnf import CONSTANT, Term
from cropscale.scaling.verdict import (
    FAIL,
    INCONCLUSIVE,
    NOISE_FLOOR,
    PASS,
    interquartile_mean,
    iqm_se_factor,
    judge,
)

X = 2.0 ** np.arange(1, 7)


def _noisy(f, sigma, seed, reps=5):
    rng = np.random.default_rng(seed)
    return np.asarray(f, dtype=float)[:, None] * (1.0 + sigma * rng.standard_normal((len(f), reps)))


def test_interquartile_mean_by_hand():
    assert interquartile_mean(np.array([5.0, 1.0, 100.0, 3.0, 4.0])) == pytest.approx((3 + 4 + 5) / 3)
    assert interquartile_mean(np.array([2.0, 9.0, 4.0])) == pytest.approx(5.0)  # r <= 3: plain mean
    assert interquartile_mean(np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 80.0])) == pytest.approx(4.5)


@pytest.mark.parametrize("r", [3, 5, 8])
def test_iqm_se_factor_matches_a_simulation(r):
    z = np.random.default_rng(r).standard_normal((200_000, r))
    assert iqm_se_factor(r) == pytest.approx(float(interquartile_mean(z).std() * math.sqrt(r)), rel=0.02)


def _noise_by_hand(y: np.ndarray) -> float:
    """Relative deviations from the mean, times sqrt(r / (r - 1)), clipped at 4 robust standard
    deviations (1.4826 x median absolute deviation), root mean square."""
    r = y.shape[1]
    centres = np.array([interquartile_mean(row) for row in y])
    dev = ((y - y.mean(axis=1, keepdims=True)) / centres[:, None] * math.sqrt(r / (r - 1))).ravel()
    limit = 4.0 * 1.4826 * np.median(np.abs(dev))
    return math.sqrt(np.mean(np.minimum(np.abs(dev), limit) ** 2))


def test_the_noise_is_the_pooled_relative_scatter_of_the_repetitions():
    y = _noisy(3 + X, 0.04, seed=1)
    v = judge(X, y, Term(1), resamples=200)
    assert v.noise == pytest.approx(_noise_by_hand(y), rel=1e-12) and v.noise_source == "repetitions"
    assert v.noise == pytest.approx(0.04, rel=0.3)
    np.testing.assert_allclose(v.centres, [interquartile_mean(r) for r in y])


def _screen_by_hand(y: np.ndarray) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
    """Relative deviations from each row's median; robust sd = 0.978 (r = 5) x 1.4826 x median of the non-zero
    |deviations| pooled; a repetition beyond 7 robust sd is dropped, at most r // 4 per row (the largest first)."""
    med = np.median(y, axis=1, keepdims=True)
    dev = (y - med) / np.abs(med)
    pool = np.abs(dev).ravel()
    s = 0.978 * 1.4826 * np.median(pool[pool > 0])
    kept, dropped = [], []
    for k, row in enumerate(dev):
        worst = np.argsort(-np.abs(row))[: y.shape[1] // 4]
        out = [int(j) for j in worst if abs(row[j]) > 7 * s]
        dropped += [(k, j) for j in out]
        kept.append(np.delete(y[k], out))
    return kept, dropped


def _noise_of_rows_by_hand(rows: list[np.ndarray]) -> float:
    devs = []
    for r in rows:
        centre = interquartile_mean(r)
        devs.append((r - r.mean()) / centre * math.sqrt(r.size / (r.size - 1)))
    dev = np.concatenate(devs)
    limit = 4.0 * 1.4826 * np.median(np.abs(dev))
    return math.sqrt(np.mean(np.minimum(np.abs(dev), limit) ** 2))


def test_one_outlier_is_screened_and_reported_and_leaves_the_noise_as_it_was():
    y = _noisy(3 + X, 0.02, seed=2)
    z = y.copy()
    z[3, 0] *= 10  # one repetition ten times too slow
    a, b = judge(X, y, Term(1), resamples=200), judge(X, z, Term(1), resamples=200)
    kept, dropped = _screen_by_hand(z)
    assert dropped == [(3, 0)] and _screen_by_hand(y)[1] == []
    assert [(s.x, s.value) for s in b.screened] == [(X[3], z[3, 0])] and a.screened == ()
    assert b.screened[0].deviation == pytest.approx(z[3, 0] / np.median(z[3]) - 1)
    assert b.noise == pytest.approx(_noise_of_rows_by_hand(kept), rel=1e-12)
    assert list(b.repetitions) == [5, 5, 5, 4, 5, 5]
    unclipped = math.sqrt(np.mean(((z - z.mean(axis=1, keepdims=True)) / b.centres[:, None]) ** 2) * 5 / 4)
    assert b.noise < 0.2 * unclipped  # the plain estimate would be swamped by the outlier
    assert b.noise == pytest.approx(a.noise, rel=0.15)  # four of five repetitions at one point: nearly unchanged
    assert b.centres[3] == pytest.approx(a.centres[3], rel=0.02) and b.status == a.status == PASS


def test_exact_data_is_decided_exactly():
    for f, within, above in ((3 + X, "O(n)", "O(1)"), (7 * X * np.log2(X), "O(n log n)", "O(n)"),
                             (2 + X**2, "O(n^2)", "O(n^(3/2))")):
        assert judge(X, f, parse_order(within)).status == PASS
        v = judge(X, f, parse_order(above))
        assert v.status == FAIL and v.noise == NOISE_FLOOR and v.p_within == 0.0
    const = judge(X, np.full(X.size, 7.0), CONSTANT)
    assert const.status == PASS and const.within.term == CONSTANT and const.statistic == -math.inf


def test_the_reported_models_are_the_free_fits():
    """The excess is reported as fitted (10000 + n^2), not as the alternative raised to the resolution."""
    x = 2.0 ** np.arange(0, 5)
    v = judge(x, 10000 + x**2, CONSTANT)
    assert v.status == FAIL and v.above.term == Term(2)
    assert (v.above.c0, v.above.c1) == (pytest.approx(10000.0), pytest.approx(1.0))
    assert "f(n) = 1e+04 + 1 * n^2 explains the data" in v.describe()
    raised, _ = v.excluded[0]
    assert raised.c1 * (x[-1] ** 2 - 1) == pytest.approx(0.1 * (10000 + 256))  # the pass test's alternative


def test_the_within_model_is_the_weighted_least_squares_fit():
    y = _noisy(10 + 2 * X, 0.02, seed=3)
    v = judge(X, y, Term(1))
    c = np.array([interquartile_mean(r) for r in y])
    w = 1.0 / c**2  # equal repetitions: weights ~ 1 / centre^2
    a = np.stack([np.ones_like(X), X], axis=1) * np.sqrt(w)[:, None]
    coef, *_ = np.linalg.lstsq(a, c * np.sqrt(w), rcond=None)
    assert (v.within.c0, v.within.c1) == pytest.approx(tuple(coef), rel=1e-9)


def test_falling_terms_never_count_as_excess():
    y = _noisy(50 - 3 * X**0.5, 0.01, seed=4)  # falls like sqrt n
    v = judge(X, y, CONSTANT)
    assert v.status != FAIL and v.statistic == -math.inf


def test_too_few_points_never_pass_but_can_fail():
    x4 = X[:4]
    v = judge(x4, _noisy(3 + x4, 0.02, seed=5), Term(1))
    assert v.status == INCONCLUSIVE and v.reason.startswith("too few points (4 distinct n values")
    assert judge(x4, 3 + x4**2, Term(1)).status == FAIL


def test_too_narrow_a_range_and_too_much_noise_are_named():
    narrow = np.array([100.0, 102, 104, 106, 108, 110])
    v = judge(narrow, _noisy(5 + narrow * np.log2(narrow), 0.03, seed=6), Term(1), variable="batch")
    assert v.status == INCONCLUSIVE
    assert v.reason.startswith("too narrow a range (max batch / min batch = 1.1 < 8)")
    assert "cannot separate O(batch) from O(batch log batch) over batch in [100, 110]" in v.reason
    noisy = judge(X, _noisy(20 + X, 0.30, seed=0), Term(1))
    assert noisy.status == INCONCLUSIVE and noisy.reason.startswith("too much noise")


def test_without_repetitions_the_residuals_are_the_noise():
    y = (3 + X * np.log2(X)) * (1 + 0.02 * np.random.default_rng(8).standard_normal(X.size))
    v = judge(X, y, Term(1))
    assert v.noise_source == "residuals" and math.isnan(v.support)
    assert v.status == FAIL


def test_reproducible_for_a_seed():
    y = _noisy(20 + X * np.log2(X), 0.05, seed=9)
    a, b = judge(X, y, Term(1, 1), seed=3), judge(X, y, Term(1, 1), seed=3)
    assert (a.status, a.p_within, a.p_above, a.support) == (b.status, b.p_within, b.p_above, b.support)


def test_pass_excludes_the_best_model_above_and_the_next_two_classes():
    v = judge(X, _noisy(3 + X, 0.02, seed=10), Term(1))
    assert v.status == PASS
    classes = [alt.term.order for alt, _ in v.excluded]
    assert Term(1, 1) in classes and Term(1, 2) in classes and all(p < 0.005 for _, p in v.excluded)
    assert "excluded for" in v.describe()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"x": [1, 2], "y": [1, 2]}, "at least 3 distinct x"),
        ({"x": [0, 1, 2, 3, 4], "y": [1, 2, 3, 4, 5]}, "x must be > 0"),
        ({"x": [1, 2, 3, 4, 5], "y": [1, 2, 3]}, "one value per x"),
        ({"x": [1, 2, 3, 4, 5], "y": [1, 2, float("nan"), 4, 5]}, "finite"),
        ({"x": [1, 2, 3, 4, 5], "y": [[1], [2], [], [4], [5]]}, "without any repetition"),
        ({"x": [0.5, 1, 2, 3, 4], "y": [1, 2, 3, 4, 5], "expected": Term(1, 1)}, "log factor"),
        ({"x": [0.5, 1, 2, 3, 4], "y": [1, 2, 3, 4, 5], "log_terms": True}, "log terms need"),
        ({"resamples": 50}, "resamples must be"),
        ({"resolution": 1.5}, "resolution must be"),
        ({"alpha_fail": 0.7}, "alpha_fail must be"),
        ({"expected": "O(n)"}, "expected must be a Term"),
    ],
)
def test_bad_input_is_one_clear_error(kwargs, match):
    args = {"x": X, "y": 1 + X, "expected": Term(1), **kwargs}
    x, y, expected = args.pop("x"), args.pop("y"), args.pop("expected")
    with pytest.raises(CropScaleError, match=match):
        judge(x, y, expected, **args)
