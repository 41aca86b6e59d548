"""Two-parameter PMNF models (cropscale.scaling.multi): the line points and the selection by hand, and,
where the ``extrap`` package is installed, the same model as Extra-P's multi-parameter modeler on shared
seeded series (the count is printed)."""

from fractions import Fraction

import numpy as np
import pytest

from cropscale import CropScaleError
from cropscale.scaling.multi import EXTRAP_TERMS, aggregate_multi, fit_pmnf_multi, line_points
from cropscale.scaling.pmnf import CONSTANT, Term

DEVICES = (1.0, 2.0, 4.0, 8.0, 16.0)
BATCH = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def _grid(f, sigma: float, seed: int, reps: int = 5):
    rng = np.random.default_rng(seed)
    d, b = np.meshgrid(DEVICES, BATCH, indexing="ij")
    d, b = d.ravel(), b.ravel()
    y = f(d, b)[:, None] * (1 + sigma * rng.standard_normal((d.size, reps)))
    return d, b, y


SHARED = [
    ("product d b", lambda d, b: 2 + 0.5 * d * b),
    ("sum d + b", lambda d, b: 5 + 3 * d + 0.7 * b),
    ("d log d b + b", lambda d, b: 1 + 0.2 * d * np.log2(d + 1) * b + 0.5 * b),
    ("O(b), O(1) in d", lambda d, b: 4 + 0.8 * b + 0 * d),
    ("sqrt d + b^2", lambda d, b: 10 + 2 * d**0.5 + 0.01 * b**2),
    ("log d b", lambda d, b: 3 + b * (1 + np.log2(d))),
    ("constant", lambda d, b: 7 + 0 * d * b),
    ("d^(2/3) b^(4/3)", lambda d, b: 1 + 0.3 * d ** (2 / 3) * b ** (4 / 3)),
]


def test_line_points_on_a_full_grid_are_the_means_over_the_other_parameter():
    d, b, y = _grid(lambda d, b: 1 + d * b, 0.0, 0, reps=1)
    coords, _, values = aggregate_multi((d, b), y)
    (dx, dv), (bx, bv) = line_points(coords, values)
    np.testing.assert_array_equal(dx, DEVICES)
    np.testing.assert_allclose(dv, [1 + x * np.mean(BATCH) for x in DEVICES])
    np.testing.assert_allclose(bv, [1 + np.mean(DEVICES) * x for x in BATCH])


def test_line_points_on_a_sparse_grid_keep_the_longest_lines():
    """Devices 1..16 only at batch 2; batch 2..64 only at devices 1 (Extra-P's cross of lines)."""
    d = [1, 2, 4, 8, 16, 1, 1, 1, 1, 1]
    b = [2, 2, 2, 2, 2, 4, 8, 16, 32, 64]
    y = [float(x * z) for x, z in zip(d, b, strict=True)]
    coords, _, values = aggregate_multi((d, b), y)
    (dx, dv), (bx, bv) = line_points(coords, values)
    np.testing.assert_array_equal(dx, [1, 2, 4, 8, 16]) and np.testing.assert_allclose(dv, [2, 4, 8, 16, 32])
    np.testing.assert_array_equal(bx, [2, 4, 8, 16, 32, 64]) and np.testing.assert_allclose(bv, bx)


def test_exact_product_is_found_with_its_coefficients():
    d, b, y = _grid(lambda d, b: 2 + 0.5 * d * b, 0.0, 0, reps=1)
    m = fit_pmnf_multi((d, b), y[:, 0], variables=("devices", "batch"))
    assert m.structure == "a*b" and m.line_terms == (Term(1), Term(1))
    assert m.c0 == pytest.approx(2.0) and m.terms[0].coefficient == pytest.approx(0.5)
    assert m.lead_orders() == (Term(1), Term(1)) and m.smape < 1e-9
    assert m.formula == "2 + 0.5 * devices * batch"


def test_constant_in_one_parameter_gives_a_one_parameter_model():
    d, b, y = _grid(lambda d, b: 4 + 0.8 * b + 0 * d, 0.0, 0, reps=1)
    m = fit_pmnf_multi((d, b), y[:, 0], variables=("devices", "batch"))
    assert m.line_terms[0] == CONSTANT and m.lead_orders() == (CONSTANT, Term(1)) and m.structure == "b"


def test_extrap_terms_are_forty_two_in_extrap_order():
    assert len(EXTRAP_TERMS) == 42 and EXTRAP_TERMS[0] == Term(0, 1) and EXTRAP_TERMS[-1] == Term(3, 1)
    assert Term(Fraction(1, 2), 1) in EXTRAP_TERMS and Term(Fraction(3, 4), 2) in EXTRAP_TERMS


def test_bad_input_is_one_clear_error():
    with pytest.raises(CropScaleError, match="tuple of 2 or more"):
        fit_pmnf_multi(([1, 2, 3],), [1, 2, 3])
    with pytest.raises(CropScaleError, match="> 0"):
        fit_pmnf_multi(([0, 1, 2], [1, 2, 3]), [1, 2, 3])
    with pytest.raises(CropScaleError, match="entries for 3 coordinates"):
        fit_pmnf_multi(([1, 2, 3], [1, 2, 3]), [1, 2])


# ------------------------------------------------------------------------------ Extra-P itself


def _extrap_model(d, b, y):
    pytest.importorskip("extrap", reason="the extrap package is not installed (pip install extrap)")
    from extrap.entities.callpath import Callpath
    from extrap.entities.coordinate import Coordinate
    from extrap.entities.functions import MultiParameterFunction
    from extrap.entities.measurement import Measurement
    from extrap.entities.metric import Metric
    from extrap.modelers.multi_parameter.multi_parameter_modeler import MultiParameterModeler

    ms = [Measurement(Coordinate(float(x1), float(x2)), Callpath("c"), Metric("m"), [float(v) for v in vals])
          for x1, x2, vals in sorted(zip(d, b, y, strict=True), key=lambda t: (t[0], t[1]))]
    hyp = MultiParameterModeler().create_model(ms).hypothesis
    terms = {}
    for mt in hyp.function if isinstance(hyp.function, MultiParameterFunction) else []:
        factors = [CONSTANT, CONSTANT]
        for p, ct in mt.parameter_term_pairs:
            i, j = Fraction(0), 0
            for st in ct.simple_terms:
                if st.term_type == "polynomial":
                    i += Fraction(st.exponent).limit_denominator(100)
                else:
                    j += int(st.exponent)
            factors[p] = Term(i, j)
        terms[tuple(factors)] = mt.coefficient
    return float(hyp.function.constant_coefficient), terms, float(hyp.SMAPE)


def test_fits_equal_extrap_multi_parameter_modeler_on_shared_series(capsys):
    same, total = 0, 0
    diffs = []
    for name, f in SHARED:
        for sigma in (0.0, 0.02, 0.05):
            for seed in range(3):
                d, b, y = _grid(f, sigma, seed)
                c0, theirs, smape = _extrap_model(d, b, y)
                m = fit_pmnf_multi((d, b), y)
                ours = {t.factors: t.coefficient for t in m.terms}
                total += 1
                ok = (set(ours) == set(theirs) and m.c0 == pytest.approx(c0, rel=1e-6, abs=1e-9)
                      and all(ours[k] == pytest.approx(theirs[k], rel=1e-6) for k in ours)
                      and m.smape == pytest.approx(smape, rel=1e-6, abs=1e-9))
                same += ok
                if not ok:
                    diffs.append(f"{name} sigma {sigma} seed {seed}: ours {m}, Extra-P {c0} {theirs}")
    with capsys.disabled():
        print(f"\nmulti-parameter fits equal to Extra-P's: {same} of {total} shared series [count]")
    assert same == total, "\n".join(diffs)
