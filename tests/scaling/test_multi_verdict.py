"""Two-parameter assertions: the product notation, the lines' repetitions by hand, exact and noisy grids
decided per parameter, and ``assert_scaling((devices, batch), y, expected=...)`` raising with the parameter."""

from fractions import Fraction

import numpy as np
import pytest

from cropscale import CropScaleError
from cropscale.scaling.assertions import ScalingAssertionError, assert_scaling, check_scaling
from cropscale.scaling.multi import aggregate_multi
from cropscale.scaling.multi_verdict import lines_with_repetitions, parse_product_order, product_text
from cropscale.scaling.pmnf import CONSTANT, Term

NAMES = ("devices", "batch")
DEVICES = (1.0, 2.0, 4.0, 8.0, 16.0)
BATCH = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def _grid(f, sigma=0.0, seed=0, reps=5):
    d, b = np.meshgrid(DEVICES, BATCH, indexing="ij")
    d, b = d.ravel(), b.ravel()
    rng = np.random.default_rng(seed)
    return d, b, f(d, b)[:, None] * (1 + sigma * rng.standard_normal((d.size, reps)))


def test_product_notation_per_parameter():
    assert parse_product_order("O(batch)", NAMES) == (CONSTANT, Term(1))
    assert parse_product_order("O(log devices * batch)", NAMES) == (Term(0, 1), Term(1))
    assert parse_product_order("O(devices^(1/2) batch log batch)", NAMES) == (Term(Fraction(1, 2)), Term(1, 1))
    assert parse_product_order("O(1)", NAMES) == (CONSTANT, CONSTANT)
    assert parse_product_order(("O(1)", "O(n^2)"), NAMES) == (CONSTANT, Term(2))
    assert product_text((Term(0, 1), Term(1)), NAMES) == "O(log devices * batch)"
    with pytest.raises(CropScaleError, match="'nodes' is not one of the parameters"):
        parse_product_order("O(nodes * batch)", NAMES)
    with pytest.raises(CropScaleError, match="3 orders for the 2 parameters"):
        parse_product_order(("O(1)", "O(n)", "O(n)"), NAMES)


def test_line_repetitions_by_hand():
    """The j-th repetition of the batch line at b: mean over devices of the coordinate means, times
    1 + the mean over devices of y_kj / mean_j(y_k) - 1."""
    d, b, y = _grid(lambda d, b: 1 + d * b, sigma=0.05, seed=1)
    coords, reps, _ = aggregate_multi((d, b), y)
    (dx, dy), (bx, by) = lines_with_repetitions(coords, reps)
    np.testing.assert_array_equal(bx, BATCH)
    ybar = y.mean(axis=1).reshape(len(DEVICES), len(BATCH))  # [device, batch]
    per_device = ybar.mean(axis=1)
    cube = y.reshape(len(DEVICES), len(BATCH), 5)
    for i in range(len(BATCH)):
        expected = np.mean(cube[:, i, :] / per_device[:, None], axis=0)
        np.testing.assert_allclose(by[i], expected, rtol=1e-12)
    # for a product the normalised line keeps the class exactly: 1 + d b over d is affine in b
    d0, b0, y0 = _grid(lambda d, b: d * b, reps=2)
    _, (bx0, by0) = lines_with_repetitions(*aggregate_multi((d0, b0), y0)[:2])
    np.testing.assert_allclose(by0[:, 0], np.array(BATCH) / np.mean(BATCH), rtol=1e-12)
    assert dy.shape == (len(DEVICES), 5)


def test_exact_grid_is_decided_per_parameter():
    d, b, y = _grid(lambda d, b: 3 + 0.5 * b + 0 * d, reps=1)
    v = check_scaling((d, b), y[:, 0], "O(batch)", variables=NAMES)
    assert v.passed and [c.status for c in v.per_parameter] == ["pass", "pass"]
    assert v.model.structure == "b" and v.model.lead_orders() == (CONSTANT, Term(1))
    w = check_scaling((d, b), y[:, 0], "O(1)", variables=NAMES)
    assert w.failed and [c.status for c in w.per_parameter] == ["pass", "fail"]


def test_step_time_that_grows_with_devices_fails_naming_devices():
    d, b, y = _grid(lambda d, b: 2 + 0.3 * b * (1 + np.log2(d)), sigma=0.03, seed=2)
    with pytest.raises(ScalingAssertionError) as info:
        assert_scaling((d, b), y, expected="O(batch)", variables=NAMES)
    v = info.value.verdict
    assert v.failed and v.per_parameter[0].status == "fail" and v.per_parameter[1].status == "pass"
    msg = str(info.value)
    assert "devices: FAIL: expected O(1); exceeds O(1) by a factor" in msg and "PMNF fit : f(devices, batch)" in msg
    ok = assert_scaling((d, b), y, expected="O(log devices * batch)", variables=NAMES)
    assert ok.passed and "O(log devices * batch)" in ok.summary()


def test_bad_two_parameter_input_is_one_clear_error():
    d, b, y = _grid(lambda d, b: 1 + b + 0 * d, reps=1)
    with pytest.raises(CropScaleError, match="two distinct names"):
        check_scaling((d, b), y[:, 0], "O(x1)", variables=("a", "a"))
    with pytest.raises(CropScaleError, match="state the expectation"):
        check_scaling((d, b), y[:, 0])
    with pytest.raises(CropScaleError, match="unknown arguments"):
        check_scaling((d, b), y[:, 0], "O(batch)", variables=NAMES, min_term_contribution=0.1)


def test_an_undecided_parameter_is_named_in_the_reason():
    d, b = np.meshgrid((1.0, 2.0, 4.0), BATCH, indexing="ij")
    d, b = d.ravel(), b.ravel()
    y = (3 + 0.5 * b)[:, None] * (1 + 0.02 * np.random.default_rng(3).standard_normal((d.size, 5)))
    v = check_scaling((d, b), y, "O(batch)", variables=NAMES)
    assert v.inconclusive and v.per_parameter[1].status == "pass"
    assert v.reason.startswith("devices: too few points (3 distinct devices values")
    assert "to decide: measure at least 5 distinct devices values (now 3" in v.reason
