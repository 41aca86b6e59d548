"""pytest helper: performance assertions that read as statements about scaling.

Register it once, in ``tests/conftest.py``::

    pytest_plugins = ["scaling_plugin"]

(a test module may also list it in its own ``pytest_plugins``). It provides

- the marker ``@pytest.mark.scaling(expected, tolerance=0.1, **fit_kwargs)``, the test's statement;
- the fixture ``scaling``: ``scaling(series)`` or ``scaling(x, y)`` fits a PMNF model and checks it
  against the marker's expectation (or ``expected=`` / ``tolerance=`` given in the call), fails the
  test with the fitted model and the expectation in the message, records the verdict in the test
  report (``user_properties``) and returns the :class:`~cropscale.scaling.assertions.ScalingVerdict`;
- a "scaling assertions" section in the terminal summary with every verdict of the run.

Example::

    @pytest.mark.perf
    @pytest.mark.scaling("O(n)", tolerance=0.1)
    def test_step_time_is_linear_in_batch(scaling):
        scaling(step_time_vs_batch((1, 2, 4, 8, 16, 32), crop_size=8))
"""

from __future__ import annotations

import pytest

from cropscale.scaling.assertions import DEFAULT_TOLERANCE, ScalingVerdict, check_scaling

_KEY = "scaling"


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "scaling(expected, tolerance=0.1, **fit_kwargs): the test states that its measurements scale no worse "
        "than `expected` (Landau notation, e.g. 'O(n)'); checked by the `scaling` fixture (tests/scaling_plugin.py)",
    )


class ScalingStatement:
    """Callable behind the ``scaling`` fixture (see the module docstring)."""

    def __init__(self, node) -> None:
        self.node = node
        marker = node.get_closest_marker(_KEY)
        self.expected = None
        self.tolerance = DEFAULT_TOLERANCE
        self.fit_kwargs: dict = {}
        if marker is not None:
            kwargs = dict(marker.kwargs)
            if marker.args:
                self.expected = marker.args[0]
            self.expected = kwargs.pop("expected", self.expected)
            self.tolerance = kwargs.pop("tolerance", self.tolerance)
            self.fit_kwargs = kwargs
        self.verdicts: list[ScalingVerdict] = []

    def __call__(self, x, y=None, *, expected=None, tolerance=None, label: str = "", evidence: str = "",
                 **fit_kwargs) -> ScalingVerdict:
        expected = expected if expected is not None else self.expected
        if expected is None:
            raise pytest.UsageError(
                f"{self.node.nodeid}: no expectation: add @pytest.mark.scaling('O(...)') or pass expected="
            )
        tol = tolerance if tolerance is not None else self.tolerance
        kwargs = {**self.fit_kwargs, **fit_kwargs}
        verdict = check_scaling(x, y, expected, tol, label=label, evidence=evidence, **kwargs)
        self.verdicts.append(verdict)
        self.node.user_properties.append((_KEY, verdict.summary()))
        if not verdict.passed:
            pytest.fail(verdict.message(), pytrace=False)
        return verdict


@pytest.fixture
def scaling(request) -> ScalingStatement:
    """Check measurements against the test's ``@pytest.mark.scaling`` statement (see module docstring)."""
    return ScalingStatement(request.node)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    lines = []
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if getattr(rep, "when", None) != "call":
                continue
            for key, value in getattr(rep, "user_properties", ()):
                if key == _KEY:
                    lines.append(f"{rep.nodeid}: {value}")
    if lines:
        terminalreporter.write_sep("-", "scaling assertions")
        for line in lines:
            terminalreporter.write_line(line)
