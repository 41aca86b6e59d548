"""The verdict against one outlier and on the fine ladder, and what an inconclusive verdict says would
decide it: counts over seeded series (never timed) and the separation by hand."""

from fractions import Fraction

import numpy as np
import pytest

from cropscale.scaling.assertions import check_scaling
from cropscale.scaling.hints import LAMBDA_NEEDED, decide, separation
from cropscale.scaling.noise import iqm_se_factor
from cropscale.scaling.pmnf import CONSTANT, Term
from cropscale.scaling.verdict import FAIL, INCONCLUSIVE, PASS, judge

X = 2.0 ** np.arange(2, 9)  # 4 .. 256


def _two_thirds(seed: int, outlier: bool) -> np.ndarray:
    """A(c0 + n^(2/3)) with 2-5 % noise, share of the term 0.5-0.95 at n = 256; optionally one repetition x3."""
    rng = np.random.default_rng([29, seed])
    sigma, share = rng.uniform(0.02, 0.05), rng.uniform(0.5, 0.95)
    g = X ** (2 / 3)
    f = g.max() * (1 - share) / share + g
    y = f[:, None] * (1 + sigma * rng.standard_normal((X.size, 5)))
    if outlier:
        y[rng.integers(X.size), rng.integers(5)] *= 3
    return y


def test_one_outlier_no_longer_lets_n_two_thirds_pass_as_square_root():
    """Old code: 27 of 30 passed with the outlier (4 of 30 without: O(n^(2/3)) was not on the ladder)."""
    counts = {True: {PASS: 0, FAIL: 0, INCONCLUSIVE: 0}, False: {PASS: 0, FAIL: 0, INCONCLUSIVE: 0}}
    for seed in range(30):
        for outlier in (False, True):
            v = judge(X, _two_thirds(seed, outlier), Term(Fraction(1, 2)), resamples=300)
            counts[outlier][v.status] += 1
            if outlier:
                assert len(v.screened) == 1 and v.screened[0].deviation > 1.5
    assert counts[True][PASS] == 0 and counts[False][PASS] == 0, counts
    assert counts[True][FAIL] >= 28 and counts[False][FAIL] >= 28, counts
    # and the true class is not rejected because of the outlier
    true = [judge(X, _two_thirds(s, True), Term(Fraction(2, 3)), resamples=300).status for s in range(10)]
    assert FAIL not in true, true


def test_the_message_names_the_screened_repetition():
    y = _two_thirds(3, outlier=False)
    y[2, 4] *= 3
    msg = check_scaling(X, y, "O(n^(2/3))", resamples=300).message()
    line = next(s for s in msg.splitlines() if s.startswith("  screened :"))
    assert f"{y[2, 4]:.4g} at n = 16 (+" in line and "robust sd" in line


def test_separation_against_the_constant_by_hand():
    """Within = {O(1)}: the chi2 of the alternative's values about their weighted mean."""
    x = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    alt = lambda v: 10.0 + 2.0 * v  # noqa: E731
    sigma, r = 0.05, 5
    a = alt(x)
    w = r / (iqm_se_factor(r) * sigma * a) ** 2
    mean = np.sum(w * a) / np.sum(w)
    by_hand = float(np.sum(w * (a - mean) ** 2))
    assert separation(x, np.full(5, r), sigma, alt, [CONSTANT]) == pytest.approx(by_hand, rel=1e-9)
    # lambda grows linearly in r (c(r) aside): the repetitions the hint names reach LAMBDA_NEEDED
    alt2 = lambda v: 10.0 + 0.05 * v  # noqa: E731
    assert separation(x, np.full(5, r), sigma, alt2, [CONSTANT]) < LAMBDA_NEEDED / 2
    text = decide(x, np.full(5, r), sigma, alt2, [CONSTANT])
    need = int(text.split("about ")[1].split(" repetitions")[0])
    assert separation(x, np.full(5, need), sigma, alt2, [CONSTANT]) >= LAMBDA_NEEDED
    assert separation(x, np.full(5, need - 1), sigma, alt2, [CONSTANT]) < LAMBDA_NEEDED


def test_an_inconclusive_verdict_says_what_would_decide_it():
    x4 = 2.0 ** np.arange(1, 5)
    rng = np.random.default_rng(7)
    y = (20 + x4)[:, None] * (1 + 0.05 * rng.standard_normal((4, 5)))
    v = judge(x4, y, Term(1), resamples=300)
    assert v.status == INCONCLUSIVE and v.hint and v.reason.endswith(v.hint)
    assert v.hint.startswith("to decide: measure at least 5 distinct n values (now 4")
    x6 = 2.0 ** np.arange(1, 7)
    y6 = (20 + x6)[:, None] * (1 + 0.3 * rng.standard_normal((6, 5)))  # 30 % noise
    w = judge(x6, y6, Term(1), resamples=300)
    assert w.status == INCONCLUSIVE and w.reason.startswith("too much noise")
    assert "repetitions per point (now 5)" in w.hint and "points over the same range" in w.hint
    assert "the range up to n = " in w.hint or "no range up to" in w.hint
