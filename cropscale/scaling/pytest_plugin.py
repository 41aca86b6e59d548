"""pytest plugin: performance assertions written as statements about scaling.

Installed with the package as the ``pytest11`` entry point ``cropscale_scaling`` (pytest loads it by
itself; ``-p no:cropscale_scaling`` turns it off). It provides

- the marker ``@pytest.mark.scaling(expected, *, inconclusive=None, resolution=0.1, resamples=1000,
  seed=0, variable=..., negative_exponents=..., log_terms=...)``, the test's statement;
- the fixture ``scaling``:

  - ``scaling(series)`` or ``scaling(x, y)`` judges measurements taken by the test against the
    marker's expectation (or ``expected=`` given in the call) with
    :func:`cropscale.scaling.assertions.check_scaling`;
  - ``scaling.measure(run, xs, repetitions=5, warmup=1, setup=None, use="time")`` runs them first:
    for each ``x``, ``run(setup(x))`` (or ``run(x)``) is timed with ``time.perf_counter``
    (``use="time"``, seconds) or its return value is taken (``use="return"``, e.g. a count), the
    repetitions round-robin over the ``x`` values after ``warmup`` untimed rounds;

  a ``fail`` verdict fails the test with the message (the excess factor, both models, the
  bootstrap evidence, the PMNF fit, the data); an ``inconclusive`` one is handled by the policy
  ``fail`` (default), ``skip``, ``xfail`` or ``pass``, taken from the call's ``inconclusive=``, else
  the marker's, else ``--scaling-inconclusive`` / the ini option ``scaling_inconclusive``; every
  verdict is recorded in the test report (``user_properties``, key ``scaling``) and returned;
- a "scaling assertions" section in the terminal summary with every verdict of the run.

Example::

    @pytest.mark.scaling("O(n log n)", inconclusive="skip")
    def test_sort_scales(scaling):
        scaling.measure(sorted, [2**k for k in range(10, 17)],
                        setup=lambda n: list(range(n, 0, -1)), repetitions=5)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import pytest

from cropscale.errors import CropScaleError
from cropscale.evidence import COUNT, MEASURED_MICROBENCHMARK
from cropscale.scaling.assertions import ScalingVerdict, check_scaling

_KEY = "scaling"
POLICIES: tuple[str, ...] = ("fail", "skip", "xfail", "pass")
"""What an inconclusive verdict does to the test."""


def pytest_addoption(parser) -> None:
    """Add ``--scaling-inconclusive`` (the default policy for undecided verdicts) to pytest's options."""
    group = parser.getgroup("scaling", "performance assertions (cropscale)")
    group.addoption(
        "--scaling-inconclusive", choices=POLICIES, default=None,
        help="what an inconclusive @pytest.mark.scaling verdict does: fail (default), skip, xfail or pass",
    )
    parser.addini("scaling_inconclusive", "default policy for inconclusive scaling verdicts", default="fail")


def pytest_configure(config) -> None:
    """Register the ``scaling`` marker."""
    config.addinivalue_line(
        "markers",
        "scaling(expected, inconclusive=None, resolution=0.1, **options): the test states that its measurements "
        "scale no worse than `expected` (Landau notation, e.g. 'O(n log n)'); checked by the `scaling` fixture "
        "(cropscale.scaling.pytest_plugin)",
    )


def _policy(value, where: str) -> str:
    if value not in POLICIES:
        raise pytest.UsageError(f"{where}: inconclusive must be one of {', '.join(POLICIES)}, got {value!r}")
    return value


class ScalingStatement:
    """Callable behind the ``scaling`` fixture (see the module docstring)."""

    def __init__(self, node, config=None) -> None:
        self.node = node
        marker = node.get_closest_marker(_KEY)
        self.expected = None
        self.inconclusive = None
        self.options: dict = {}
        if marker is not None:
            options = dict(marker.kwargs)
            self.expected = options.pop("expected", marker.args[0] if marker.args else None)
            self.inconclusive = options.pop("inconclusive", None)
            self.options = options
        default = "fail"
        if config is not None:
            default = config.getoption("scaling_inconclusive", None) or config.getini("scaling_inconclusive") or "fail"
        self.default_policy = _policy(default, "--scaling-inconclusive / scaling_inconclusive")
        self.verdicts: list[ScalingVerdict] = []

    def __call__(self, x, y=None, *, expected=None, inconclusive=None, label: str = "", evidence: str = "",
                 **options) -> ScalingVerdict:
        """Judge measurements; fails, skips or xfails the test as the verdict and the policy say."""
        expected = expected if expected is not None else self.expected
        if expected is None:
            raise pytest.UsageError(
                f"{self.node.nodeid}: no expectation: add @pytest.mark.scaling('O(...)') or pass expected="
            )
        policy = _policy(inconclusive or self.inconclusive or self.default_policy, self.node.nodeid)
        verdict = check_scaling(x, y, expected, label=label, evidence=evidence, **{**self.options, **options})
        self.verdicts.append(verdict)
        self.node.user_properties.append((_KEY, verdict.summary()))
        if verdict.failed:
            pytest.fail(verdict.message(), pytrace=False)
        if verdict.inconclusive:
            reason = f"scaling verdict inconclusive: {verdict.reason}"
            if policy == "fail":
                pytest.fail(verdict.message(), pytrace=False)
            if policy == "skip":
                pytest.skip(reason)
            if policy == "xfail":
                pytest.xfail(reason)
        return verdict

    def measure(
        self,
        run: Callable,
        xs: Sequence[float],
        *,
        repetitions: int = 5,
        warmup: int = 1,
        setup: Callable | None = None,
        use: str = "time",
        **kwargs,
    ) -> ScalingVerdict:
        """Run ``run`` at every ``x`` and judge the results (see the module docstring).

        Raises:
            CropScaleError: fewer than 3 ``x`` values, ``repetitions < 1``, ``warmup < 0``, ``use``
                not ``"time"`` or ``"return"``, or a non-numeric return value with ``use="return"``.
        """
        xs = list(xs)
        if len(xs) < 3 or repetitions < 1 or warmup < 0 or use not in ("time", "return"):
            raise CropScaleError(
                f"measure: need >= 3 x values, repetitions >= 1, warmup >= 0, use 'time' or 'return'; got "
                f"{len(xs)} x values, repetitions={repetitions}, warmup={warmup}, use={use!r}"
            )
        args = [setup(x) if setup is not None else x for x in xs]  # the caller's own x values
        rows: list[list[float]] = [[] for _ in xs]
        for rnd in range(warmup + repetitions):
            for k, arg in enumerate(args):
                t0 = time.perf_counter()
                out = run(arg)
                elapsed = time.perf_counter() - t0
                if rnd >= warmup:
                    rows[k].append(elapsed if use == "time" else _number(out))
        kwargs.setdefault("evidence", MEASURED_MICROBENCHMARK if use == "time" else COUNT)
        return self([float(x) for x in xs], rows, **kwargs)


def _number(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError) as err:
        raise CropScaleError(f"measure(use='return'): run must return a number, got {value!r}") from err


@pytest.fixture
def scaling(request) -> ScalingStatement:
    """Check measurements against the test's ``@pytest.mark.scaling`` statement (module docstring)."""
    return ScalingStatement(request.node, request.config)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Print every scaling verdict of the run in a "scaling assertions" section."""
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
