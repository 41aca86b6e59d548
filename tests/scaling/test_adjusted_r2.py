"""The adjusted R^2 of a PMNF fit against scipy (issue 27): for a one-term model ``c0 + c1 t(x)``, R^2 is that
of the straight line through ``(t(x), y)`` (``scipy.stats.linregress``), adjusted for one term:
``1 - (1 - R^2) (n - 1) / (n - 2)``."""

import numpy as np
import pytest
from scipy import stats

from cropscale.scaling.pmnf import fit_pmnf


def test_adjusted_r2_of_a_one_term_fit_matches_scipy():
    x = 2.0 ** np.arange(1, 9)
    y = 5.0 + 3.0 * x + np.array([0.4, -0.3, 0.5, -0.6, 0.2, -0.4, 0.6, -0.2])
    model = fit_pmnf(x, y)
    assert not model.term.is_constant  # the premise: one term and a constant
    t = x ** float(model.term.i) * np.log2(x) ** model.term.j  # the selected term, x^i log2(x)^j
    line = stats.linregress(t, y)
    assert model.c1 == pytest.approx(line.slope, rel=1e-6)  # the same least-squares line
    n = x.size
    assert model.adjusted_r2 == pytest.approx(1 - (1 - line.rvalue**2) * (n - 1) / (n - 2), rel=1e-9)
    assert model.adjusted_r2 < line.rvalue**2 < 1.0
