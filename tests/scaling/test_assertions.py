"""assert_scaling / check_scaling: a trend above the expectation fails with an explaining message,
noise alone does not fail, an undecidable series is reported as inconclusive and the caller decides;
the pytest plugin (cropscale.scaling.pytest_plugin, a pytest11 entry point)."""

from types import SimpleNamespace

import numpy as np
import pytest

from cropscale import CropScaleError
from cropscale.scaling import pytest_plugin
from cropscale.scaling.assertions import (
    ScalingAssertionError,
    ScalingInconclusiveError,
    assert_scaling,
    check_scaling,
)
from cropscale.scaling.pmnf import CONSTANT, Term, fit_pmnf
from cropscale.scaling.series import ScalingSeries

pytest_plugins = ["pytester"]

X = np.array([2, 4, 8, 16, 32, 64], dtype=float)


def _noisy(values, noise, seed, reps=5):
    rng = np.random.default_rng(seed)
    return np.asarray(values, dtype=float)[:, None] * (1 + noise * rng.standard_normal((len(values), reps)))


def test_linear_trend_fails_an_o1_expectation_with_an_explaining_message():
    y = _noisy(10 + 2 * X, 0.01, seed=1)
    with pytest.raises(ScalingAssertionError) as info:
        assert_scaling(X, y, expected="O(1)", variable="world_size", label="all-reduce time")
    msg = str(info.value)
    assert "performance assertion failed for all-reduce time" in msg
    assert "expected : O(1) -> O(1)" in msg
    assert "exceeds O(1) by a factor world_size" in msg
    assert "PMNF fit : f(world_size) = " in msg and "lead order O(world_size)" in msg and "SMAPE" in msg
    assert "noise    : " in msg and "per repetition (from the repetitions)" in msg
    verdict = info.value.verdict
    assert verdict.failed and not verdict.order_ok and verdict.model.lead_order == Term(1)
    assert not isinstance(info.value, ScalingInconclusiveError)
    assert verdict.classes.above.term == Term(1) and verdict.classes.within.term == CONSTANT


def test_linear_trend_passes_o_n_and_above():
    y = _noisy(10 + 2 * X, 0.01, seed=1)
    for expected in ("O(n)", "O(n log n)", "O(n^2)"):
        verdict = assert_scaling(X, y, expected=expected)
        assert verdict.passed and verdict.model.lead_order == Term(1)
        assert verdict.classes.within.term == Term(1)


@pytest.mark.parametrize("noise, least_passed", [(0.10, 0), (0.03, 18)])
def test_noise_alone_does_not_fail_o1(noise, least_passed):
    """A noisy constant: the PMNF fit picks a spurious term now and then; the verdict does not fail.
    At 10 % noise a 10 % growth cannot be excluded either (inconclusive); at 3 % it can (pass)."""
    spurious, statuses = 0, []
    for seed in range(20):
        y = _noisy(np.full(X.size, 42.0), noise, seed=seed)
        verdict = check_scaling(X, y, "O(1)", resamples=400)
        statuses.append(verdict.status)
        spurious += verdict.model.lead_order != CONSTANT
    assert spurious >= 1  # the PMNF lead term alone would have rejected these
    assert statuses.count("fail") <= 1, statuses  # a 5 % test: at most 1 of 20 by chance
    assert statuses.count("pass") >= least_passed, statuses


def test_a_small_but_exact_growth_fails_o1_and_a_noisy_one_does_not():
    y = 100 * (1 + 0.05 * np.log2(X) / 6)  # 100.8 -> 105 over x = 2..64, no noise
    v = check_scaling(X, y, "O(1)", variable="n")
    assert v.failed and "exceeds O(1) by a factor log n" in v.message()
    noisy = _noisy(y, 0.03, seed=4)
    assert not check_scaling(X, noisy, "O(1)").failed


def test_decreasing_curve_never_fails():
    y = _noisy(5.0 + 100.0 / X, 0.02, seed=2)  # strong scaling: time falls with N
    v = check_scaling(X, y, "O(1)")
    assert not v.failed and v.classes.statistic < 0
    assert check_scaling(X, y, "O(1)", negative_exponents=True).passed


def test_quadratic_fails_linear_expectation():
    y = _noisy(0.5 * X**2, 0.03, seed=3)
    v = check_scaling(X, y, "O(n)")
    assert v.failed and v.classes.above.term.order > Term(1) and v.model.lead_order > Term(1)


def test_inconclusive_is_reported_and_the_caller_decides():
    x = np.array([100, 102, 104, 106, 108, 110], dtype=float)  # a 10 % range: n and n log n look alike
    y = _noisy(5 + x * np.log2(x), 0.03, seed=5)
    v = check_scaling(x, y, "O(n)")
    assert v.inconclusive and not v.passed and not v.failed
    assert "too narrow a range" in v.classes.reason and v.message().count("inconclusive") >= 1
    with pytest.raises(ScalingInconclusiveError) as info:
        assert_scaling(x, y, "O(n)")
    assert info.value.verdict.inconclusive and isinstance(info.value, ScalingAssertionError)
    assert assert_scaling(x, y, "O(n)", inconclusive="pass").inconclusive
    with pytest.raises(CropScaleError, match="inconclusive must be one of"):
        assert_scaling(x, y, "O(n)", inconclusive="skip")


def test_series_argument_and_negative_exponents():
    n = [2, 4, 8, 16, 32, 64]
    series = ScalingSeries("world_size", "allreduce_send_mib", "MiB", [float(v) for v in n],
                           [[2 * (v - 1) / v * 7.43] for v in n], "analytical-scenario", "ddp_gradient_allreduce")
    v = check_scaling(series, expected="O(1)", negative_exponents=True)
    assert v.passed and v.order_ok and v.model.variable == "world_size"
    assert v.label == "allreduce_send_mib vs world_size" and v.evidence == "analytical-scenario"
    assert "[analytical-scenario]" in v.summary() and v.classes.noise_source == "residuals"
    # Without the bounded x^-i terms, 7.43 -> 14.6 MiB over 2..64 ranks reads as growth.
    assert check_scaling(series, expected="O(1)").failed


def test_a_prefitted_model_is_reported_and_its_medians_judged():
    y = _noisy(3 + X, 0.02, seed=6)
    m = fit_pmnf(X, y, variable="n")
    v = check_scaling(X, y, "O(n)", model=m)
    assert v.model is m and v.passed
    w = check_scaling(None, None, "O(1)", model=m)
    assert w.failed and w.classes.noise_source == "residuals" and list(w.classes.repetitions) == [1] * X.size


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"expected": "O(n)", "tolerance": 0.1}, "tolerance= is gone"),
        ({"expected": "n"}, "O\\(...\\)"),
        ({"expected": 3}, "expected must be"),
        ({"expected": "O(n)", "resolution": 0}, "resolution must be"),
        ({"expected": "O(n)", "resamples": 10}, "resamples must be"),
        ({"expected": "O(n)", "colour": "red"}, "unknown arguments \\['colour'\\]"),
        ({"expected": "O(n)", "model": "m"}, "model must be a PMNFModel"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(CropScaleError, match=match):
        check_scaling(X, X, **kwargs)


def test_check_scaling_needs_y_or_a_series_and_an_expectation():
    with pytest.raises(CropScaleError, match="ScalingSeries"):
        check_scaling([1, 2, 3, 4, 5])
    with pytest.raises(CropScaleError, match="state the expectation"):
        assert_scaling(X, X)


# ---------------------------------------------------------------- the pytest plugin


def test_plugin_is_loaded_through_its_entry_point(pytestconfig):
    assert pytestconfig.pluginmanager.get_plugin("cropscale_scaling") is pytest_plugin


def test_plugin_marker_fixture_and_inconclusive_policies_end_to_end(pytester):
    """Tests written as statements about scaling, in a pytest session of their own (entry point only)."""
    pytester.makepyfile(
        """
        import pytest

        X = [2, 4, 8, 16, 32, 64]
        NARROW = [100, 102, 104, 106, 108, 110]

        def nlogn(xs):
            import math
            return [[(5 + x * math.log2(x)) * (1 + 0.03 * e) for e in (-1.2, -0.4, 0.1, 0.6, 1.1)] for x in xs]

        @pytest.mark.scaling("O(n)")
        def test_linear_is_o_n(scaling):
            verdict = scaling(X, [3 + x for x in X])
            assert verdict.passed

        @pytest.mark.scaling("O(1)")
        def test_linear_is_not_o_1(scaling):
            scaling(X, [3 + x for x in X])

        @pytest.mark.scaling("O(n)")
        def test_narrow_fails_by_default(scaling):
            scaling(NARROW, nlogn(NARROW))

        @pytest.mark.scaling("O(n)", inconclusive="skip")
        def test_narrow_skips(scaling):
            scaling(NARROW, nlogn(NARROW))

        @pytest.mark.scaling("O(n)", inconclusive="xfail")
        def test_narrow_xfails(scaling):
            scaling(NARROW, nlogn(NARROW))

        @pytest.mark.scaling("O(n)", inconclusive="pass")
        def test_narrow_accepted(scaling):
            assert scaling(NARROW, nlogn(NARROW)).inconclusive

        @pytest.mark.scaling("O(n^2)")
        def test_measure_counts(scaling):
            verdict = scaling.measure(lambda n: n * (n - 1) // 2, [4, 8, 16, 32, 64], use="return", repetitions=1)
            assert verdict.passed and verdict.evidence == "count"
        """
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--strict-markers", "-rsx")
    result.assert_outcomes(passed=3, failed=2, skipped=1, xfailed=1)
    result.stdout.fnmatch_lines([
        "*exceeds O(1) by a factor x*",
        "*scaling assertions*",
        "*test_linear_is_o_n: PASS expected O(n)*",
        "*test_linear_is_not_o_1: FAIL expected O(1)*",
        "*SKIPPED*scaling verdict inconclusive: too narrow a range*",
        "*XFAIL*scaling verdict inconclusive: too narrow a range*",
    ])
    # the command-line option changes the default policy: the failing narrow test now skips
    again = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--scaling-inconclusive=skip",
                                         "-k", "narrow_fails_by_default")
    again.assert_outcomes(skipped=1)


def test_plugin_fixture_with_explicit_expectation_records_the_verdict(scaling, request):
    scaling(X, 7 + 0 * X, expected="O(1)", label="constant")
    assert any(k == "scaling" and v.startswith("PASS constant") for k, v in request.node.user_properties)


def test_plugin_fails_the_test_with_the_message():
    node = SimpleNamespace(get_closest_marker=lambda name: SimpleNamespace(args=("O(1)",), kwargs={}),
                           user_properties=[], nodeid="x")
    statement = pytest_plugin.ScalingStatement(node)
    with pytest.raises(pytest.fail.Exception, match="exceeds O\\(1\\) by a factor x"):
        statement(X, 1 + X)
    assert node.user_properties and node.user_properties[0][1].startswith("FAIL")


def test_plugin_measure_passes_the_callers_own_values(scaling):
    seen = []
    verdict = scaling.measure(lambda n: seen.append(n) or n * n, [4, 8, 16, 32, 64], use="return", repetitions=1,
                              warmup=0, setup=lambda n: n, expected="O(n^2)")
    assert verdict.passed and seen == [4, 8, 16, 32, 64] and all(type(v) is int for v in seen)


def test_messages_use_the_expectations_variable_unless_told_otherwise():
    x = np.array([100, 102, 104, 106, 108, 110], dtype=float)
    y = _noisy(5 + x * np.log2(x), 0.03, seed=5)
    v = check_scaling(x, y, "O(p)")
    assert v.model.variable == "p" and "max p / min p" in v.classes.reason
    assert "over p in [100, 110]" in v.classes.reason
    assert "separate O(p) from O(p" in v.classes.reason
    assert "max batch / min batch" in check_scaling(x, y, "O(n)", variable="batch").classes.reason
    assert check_scaling(x, y, "O(1)").model.variable == "x"


def test_plugin_usage_errors(scaling):
    with pytest.raises(pytest.UsageError, match="no expectation"):
        scaling(X, X)
    with pytest.raises(pytest.UsageError, match="inconclusive must be one of"):
        scaling(X, X, expected="O(n)", inconclusive="maybe")
    with pytest.raises(CropScaleError, match="need >= 3 x values"):
        scaling.measure(len, [1, 2], expected="O(n)")
    with pytest.raises(CropScaleError, match="must return a number"):
        scaling.measure(lambda n: "many", [1, 2, 3, 4, 5], expected="O(n)", use="return")
