"""The verdict on the lead order: the three cases the excess-growth rule let through now fail and
name the excess term; the true classes of the same data pass or, where a class of the fine ladder right
above stays unseparated, are inconclusive with what would decide it."""

import numpy as np
import pytest

from cropscale.scaling.assertions import check_scaling

X64 = 2.0 ** np.arange(1, 7)  # 2 .. 64
X16 = 2.0 ** np.arange(0, 5)  # 1 .. 16


def _noisy(f: np.ndarray, sigma: float, seed: int, reps: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return f[:, None] * (1.0 + sigma * rng.standard_normal((f.size, reps)))


CASES = {
    # name: (x, y, asserted (one class too low), excess named, true class)
    "n log n asserted O(n)": (X64, lambda s: _noisy(30 + X64 * np.log2(X64), 0.03, s), "O(n)", "log n", "O(n log n)"),
    "n^1.5 asserted O(n log^2 n)": (X64, lambda s: _noisy(30 + X64**1.5, 0.03, s), "O(n log^2 n)",
                                    "n^(1/2) / log^2 n", "O(n^1.5)"),
    "noise-free 10000 + n^2 asserted O(1)": (X16, lambda s: 10000 + X16**2, "O(1)", "n^2", "O(n^2)"),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_lead_order_above_the_expectation_fails_and_names_the_excess(name, seed):
    x, make, asserted, excess, true_class = CASES[name]
    y = make(seed)
    verdict = check_scaling(x, y, asserted, variable="n")
    assert verdict.failed  # fail, not inconclusive: each excess is decided at these noise levels
    msg = verdict.message()
    assert f"exceeds {asserted} by a factor {excess}" in msg, msg
    true = check_scaling(x, y, true_class, variable="n")
    # the true class passes, but in the one draw where O(n^(5/4)) of the fine ladder stays unseparated from
    # O(n log n) (seed 2): that one is inconclusive and says what would decide it (seeded data and bootstrap)
    if (name, seed) == ("n log n asserted O(n)", 2):
        assert true.inconclusive and "to decide (estimates from the observed noise" in true.classes.reason
    else:
        assert true.passed, true.message()
