"""assert_scaling: catches a trend that exceeds the expectation, tolerates noise, explains itself;
parse_order; the pytest helper in tests/scaling_plugin.py."""

from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from cropscale import CropScaleError
from cropscale.scaling.assertions import (
    ScalingAssertionError,
    assert_scaling,
    check_scaling,
    excess_growth,
    parse_order,
)
from cropscale.scaling.pmnf import CONSTANT, Term, fit_pmnf
from cropscale.scaling.series import ScalingSeries

pytest_plugins = ["pytester"]

X = np.array([2, 4, 8, 16, 32, 64], dtype=float)


def _noisy(values, noise, seed, reps=5):
    rng = np.random.default_rng(seed)
    return np.asarray(values, dtype=float)[:, None] * (1 + noise * rng.standard_normal((len(values), reps)))


@pytest.mark.parametrize(
    "text, term",
    [
        ("O(1)", CONSTANT),
        ("O(log n)", Term(0, 1)),
        ("O(log2(p))", Term(0, 1)),
        ("O(log^2 n)", Term(0, 2)),
        ("O(sqrt n)", Term(Fraction(1, 2))),
        ("O(sqrt(x))", Term(Fraction(1, 2))),
        ("O(n)", Term(1)),
        ("O(n log n)", Term(1, 1)),
        ("O(p*log2(p))", Term(1, 1)),
        ("O(n^2)", Term(2)),
        ("O(n**2)", Term(2)),
        ("O(n^1.5)", Term(Fraction(3, 2))),
        ("O(n^(3/2) log n)", Term(Fraction(3, 2), 1)),
        ("O(batch_size)", Term(1)),
        ("O(n^-1)", CONSTANT),
    ],
)
def test_parse_order(text, term):
    assert parse_order(text) == term


@pytest.mark.parametrize("text", ["n", "O()", "O(n m)", "O(log)", "O(n^)", "O(n^(1/2)", "O(n + 1)", "O(log^0.5 n)"])
def test_parse_order_rejects_malformed_text(text):
    with pytest.raises(CropScaleError, match="expected"):
        parse_order(text)


def test_linear_trend_fails_an_o1_expectation_with_an_explaining_message():
    y = _noisy(10 + 2 * X, 0.01, seed=1)
    with pytest.raises(ScalingAssertionError) as info:
        assert_scaling(X, y, expected="O(1)", tolerance=0.1, variable="world_size", label="all-reduce time")
    msg = str(info.value)
    assert "expected : O(1)" in msg and "lead order O(1)" in msg
    assert "fitted   : f(world_size) = " in msg and "O(world_size)" in msg and "exceeds" in msg
    assert "SMAPE" in msg and "adjusted R^2" in msg and "all-reduce time" in msg
    verdict = info.value.verdict
    assert not verdict.passed and not verdict.order_ok and verdict.model.lead_order == Term(1)
    assert verdict.excess_growth > 0.5


def test_linear_trend_passes_o_n_and_above():
    y = _noisy(10 + 2 * X, 0.01, seed=1)
    for expected in ("O(n)", "O(n log n)", "O(n^2)"):
        model = assert_scaling(X, y, expected=expected)
        assert model.lead_order == Term(1)


def test_noisy_constant_does_not_fail_o1():
    """10 % noise on a constant: the fitter may pick a spurious term, the growth tolerance absorbs it."""
    spurious = 0
    for seed in range(20):
        y = _noisy(np.full(X.size, 42.0), 0.10, seed=seed)
        verdict = check_scaling(X, y, "O(1)", tolerance=0.25)
        assert verdict.passed, verdict.message()
        spurious += verdict.model.lead_order != CONSTANT
    assert spurious >= 1  # the tolerance was needed, not just the lead order


def test_small_real_growth_within_tolerance_passes_and_beyond_fails():
    y = 100 * (1 + 0.05 * np.log2(X) / 6)  # 100.83 -> 105 over x = 2..64, no noise
    v = check_scaling(X, y, "O(1)", tolerance=0.1)
    assert v.passed and not v.order_ok and v.model.lead_order == Term(0, 1)
    assert v.excess_growth == pytest.approx((105 - 100 * (1 + 0.05 / 6)) / 105, rel=1e-6)
    assert not check_scaling(X, y, "O(1)", tolerance=0.03).passed


def test_decreasing_curve_never_exceeds_an_expectation():
    y = 5.0 + 100.0 / X  # strong scaling: time falls with N
    v = check_scaling(X, y, "O(1)", tolerance=0.0)
    assert v.passed and v.excess_growth == pytest.approx(0.0, abs=1e-12)


def test_quadratic_fails_linear_expectation():
    y = _noisy(0.5 * X**2, 0.03, seed=3)
    v = check_scaling(X, y, "O(n)")
    assert not v.passed and v.model.lead_order > Term(1)


def test_excess_growth_of_constant_expectation_is_relative_growth():
    m = fit_pmnf(X, 50 + 0.5 * X)  # 51 -> 82
    assert excess_growth(m, CONSTANT) == pytest.approx((82 - 51) / 82, rel=1e-6)
    assert excess_growth(m, Term(1)) == pytest.approx(0.0, abs=1e-9)


def test_series_argument_and_negative_exponents():
    n = [2, 4, 8, 16, 32, 64]
    series = ScalingSeries("world_size", "allreduce_send_mib", "MiB", [float(v) for v in n],
                           [[2 * (v - 1) / v * 7.43] for v in n], "analytical-scenario", "ddp_gradient_allreduce")
    v = check_scaling(series, expected="O(1)", negative_exponents=True)
    assert v.passed and v.order_ok and v.model.variable == "world_size"
    assert v.label == "allreduce_send_mib vs world_size" and v.evidence == "analytical-scenario"
    assert "[analytical-scenario]" in v.summary()
    # Without the bounded x^-i terms, 7.43 -> 14.6 MiB over 2..64 ranks reads as growth.
    assert not check_scaling(series, expected="O(1)").passed


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"expected": "O(n)", "tolerance": -0.1}, "tolerance"),
        ({"expected": "n"}, "O\\(...\\)"),
        ({"expected": 3}, "expected must be"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(CropScaleError, match=match):
        check_scaling(X, X, **kwargs)


def test_check_scaling_needs_y_or_a_series():
    with pytest.raises(CropScaleError, match="ScalingSeries"):
        check_scaling([1, 2, 3, 4, 5])


# ---------------------------------------------------------------- the pytest helper


def test_plugin_marker_and_fixture_end_to_end(pytester):
    """A test written as a statement about scaling, run in a pytest session of its own."""
    pytester.makeconftest('pytest_plugins = ["tests.scaling_plugin"]')
    pytester.makepyfile(
        """
        import pytest

        X = [2, 4, 8, 16, 32, 64]

        @pytest.mark.scaling("O(n)", tolerance=0.1)
        def test_linear_is_o_n(scaling):
            verdict = scaling(X, [3 + x for x in X])
            assert verdict.passed and verdict.tolerance == 0.1

        @pytest.mark.scaling("O(1)")
        def test_linear_is_not_o_1(scaling):
            scaling(X, [3 + x for x in X])
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--strict-markers")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*fitted   : f(x) = 3 + 1 * x*", "*scaling assertions*",
                                 "*test_linear_is_o_n: PASS expected O(x)*",
                                 "*test_linear_is_not_o_1: FAIL expected O(1)*"])


def test_plugin_fixture_with_explicit_expectation_records_the_verdict(scaling, request):
    scaling(X, 7 + 0 * X, expected="O(1)", label="constant")
    assert any(k == "scaling" and "PASS constant" in v for k, v in request.node.user_properties)


def test_plugin_fails_the_test_with_the_message():
    from tests import scaling_plugin

    node = SimpleNamespace(get_closest_marker=lambda name: SimpleNamespace(args=("O(1)",), kwargs={}),
                           user_properties=[], nodeid="x")
    statement = scaling_plugin.ScalingStatement(node)
    with pytest.raises(pytest.fail.Exception, match="expected : O\\(1\\)"):
        statement(X, 1 + X)
    assert node.user_properties and node.user_properties[0][1].startswith("FAIL")


def test_plugin_without_expectation_is_a_usage_error(scaling):
    with pytest.raises(pytest.UsageError, match="no expectation"):
        scaling(X, X)


def test_the_expectation_must_be_stated():
    with pytest.raises(CropScaleError, match="state the expectation"):
        assert_scaling(X, X)
