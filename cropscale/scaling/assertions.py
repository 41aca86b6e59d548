"""Performance assertions: check an asymptotic trend, not a brittle exact number.

After Shudler, Calotoiu, Hoefler, Strube and Wolf ("Exascaling your library: will your
implementation meet your expectations?", ICS 2015; TPDS 2019): fit a PMNF model to measurements
(:func:`cropscale.scaling.pmnf.fit_pmnf`) and compare its lead order with the expectation, e.g.
"step time is O(n) in the batch size", "per-rank all-reduce volume is O(1) in the world size".

:func:`check_scaling` passes when

1. the fitted lead order does not exceed the expected one, **or**
2. the fitted model's *excess growth* over the measured range stays within ``tolerance``.

Excess growth (dimensionless): fit the expectation's own form ``e(x) = a + b g(x)`` (``g`` the
expected term; ``a`` alone for O(1)) to the medians and take the largest *rise* of the difference
``f(x) - e(x)`` between the selected PMNF model ``f`` and it along increasing ``x``, as a fraction
of the largest measured value (:func:`excess_growth`). For an O(1) expectation this is the fitted
model's growth across the measured range relative to the metric, so a noisy constant whose noise
happens to select a spurious term (a 3 % "growth") still passes a 10 % tolerance, while a real
linear trend does not. A decreasing curve never fails: only growth beyond the expectation counts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from cropscale.errors import CropScaleError
from cropscale.scaling.pmnf import CONSTANT, PMNFModel, Term, fit_pmnf

DEFAULT_TOLERANCE = 0.1
"""Default allowed excess growth over the measured range (10 %)."""


class ScalingAssertionError(AssertionError):
    """A performance assertion failed; the message prints the fitted model and the expectation."""

    def __init__(self, message: str, verdict: ScalingVerdict | None = None) -> None:
        super().__init__(message)
        self.verdict = verdict


_TOKEN = re.compile(r"\s*(log2|log|ln|sqrt|-?\d+(?:\.\d+)?(?:/\d+)?|[A-Za-z_]\w*|\*\*|\^|\*|\(|\)|·)")


def parse_order(expected: str | Term) -> Term:
    """Parse Landau notation into the lead-order :class:`~cropscale.scaling.pmnf.Term`.

    Accepted: ``"O(1)"``, ``"O(log n)"``, ``"O(log^2 n)"``, ``"O(sqrt n)"``, ``"O(n)"``,
    ``"O(n log n)"``, ``"O(n^2)"``, ``"O(n^1.5)"``, ``"O(n^(3/2) log n)"``, ``"O(p*log2(p))"``
    (any one variable name; ``log``, ``log2`` and ``ln`` differ by a constant factor only).

    Raises:
        CropScaleError: the text is not of that form (the message quotes it).
    """
    if isinstance(expected, Term):
        return expected.order
    if not isinstance(expected, str):
        raise CropScaleError(f"expected must be a string such as 'O(n)' or a Term, got {expected!r}")
    text = expected.strip()
    m = re.fullmatch(r"[Oo]\s*\((.*)\)", text)
    if not m:
        raise CropScaleError(f"expected {expected!r}: write it as O(...), e.g. 'O(1)', 'O(n)', 'O(n log n)'")
    inner = m.group(1)
    tokens, pos = [], 0
    while pos < len(inner):
        tm = _TOKEN.match(inner, pos)
        if not tm or tm.end() == pos:
            if inner[pos:].strip() == "":
                break
            raise CropScaleError(f"expected {expected!r}: cannot read {inner[pos:]!r}")
        tokens.append(tm.group(1))
        pos = tm.end()
    tokens = [t for t in tokens if t not in ("*", "·")]
    var: list[str] = []
    i_exp, j_exp, k = Fraction(0), 0, 0

    def bad(why: str) -> CropScaleError:
        return CropScaleError(f"expected {expected!r}: {why}")

    def number(tok: str) -> Fraction:
        try:
            return Fraction(tok)
        except (ValueError, ZeroDivisionError) as err:
            raise bad(f"{tok!r} is not an exponent") from err

    def read_power() -> Fraction | None:
        nonlocal k
        if k < len(tokens) and tokens[k] in ("^", "**"):
            k += 1
            if k < len(tokens) and tokens[k] == "(":
                if k + 2 >= len(tokens) or tokens[k + 2] != ")":
                    raise bad("unbalanced parenthesis in an exponent")
                val = number(tokens[k + 1])
                k += 3
                return val
            if k >= len(tokens):
                raise bad("missing exponent after '^'")
            val = number(tokens[k])
            k += 1
            return val
        return None

    def read_variable() -> None:
        nonlocal k
        paren = k < len(tokens) and tokens[k] == "("
        if paren:
            k += 1
        if k >= len(tokens) or not re.fullmatch(r"[A-Za-z_]\w*", tokens[k]) or tokens[k] in ("log", "log2", "ln", "sqrt"):
            raise bad("a variable is missing after log/sqrt")
        take_variable(tokens[k])
        k += 1
        if paren:
            if k >= len(tokens) or tokens[k] != ")":
                raise bad("unbalanced parenthesis")
            k += 1

    def take_variable(name: str) -> None:
        if var and var[0] != name:
            raise bad(f"more than one variable ({var[0]!r} and {name!r}); only one parameter is modelled")
        if not var:
            var.append(name)

    while k < len(tokens):
        tok = tokens[k]
        if tok in ("log", "log2", "ln"):
            k += 1
            p = read_power()
            if p is not None and (p.denominator != 1 or p < 1):
                raise bad("a log power must be a positive integer")
            read_variable()
            j_exp += int(p) if p is not None else 1
        elif tok == "sqrt":
            k += 1
            read_variable()
            i_exp += Fraction(1, 2)
        elif tok == "1" and len(tokens) == 1:
            k += 1
        elif re.fullmatch(r"[A-Za-z_]\w*", tok):
            take_variable(tok)
            k += 1
            p = read_power()
            i_exp += p if p is not None else 1
        else:
            raise bad(f"unexpected {tok!r}")
    if not tokens:
        raise bad("empty O()")
    if i_exp < 0:
        return CONSTANT
    return Term(i_exp, j_exp)


@dataclass(frozen=True)
class ScalingVerdict:
    """The outcome of one performance assertion.

    Attributes:
        passed: the assertion holds.
        expected: the expected lead order as a term; ``expected_text`` as written.
        tolerance: allowed excess growth (fraction; 0.1 = 10 %).
        model: the fitted PMNF model.
        excess_growth: largest rise of the fitted model relative to the expectation's best fit
            across the measured range (:func:`excess_growth`; 0.1 = 10 %).
        order_ok: the fitted lead order does not exceed the expectation.
        label: what was measured (metric vs parameter), for messages.
        evidence: evidence label of the measurements (``measured-run`` ...), if known.
    """

    passed: bool
    expected: Term
    expected_text: str
    tolerance: float
    model: PMNFModel
    excess_growth: float
    order_ok: bool
    label: str = ""
    evidence: str = ""

    def summary(self) -> str:
        """One line: verdict, expectation, fitted model, excess growth."""
        what = f"{self.label}: " if self.label else ""
        ev = f" [{self.evidence}]" if self.evidence else ""
        status = "PASS" if self.passed else "FAIL"
        return (
            f"{status} {what}expected {self.expected.big_o(self.model.variable)} "
            f"(tolerance {100 * self.tolerance:.0f} %); fitted {self.model}; "
            f"excess growth {100 * self.excess_growth:.1f} % over {self.model.variable} in "
            f"[{self.model.x.min():g}, {self.model.x.max():g}]{ev}"
        )

    def message(self) -> str:
        """Multi-line explanation, used as the failure message of :func:`assert_scaling`."""
        m = self.model
        var = m.variable
        lines = [
            f"performance assertion {'held' if self.passed else 'failed'}"
            + (f" for {self.label}" if self.label else "")
            + (f" [{self.evidence}]" if self.evidence else ""),
            f"  expected : {self.expected_text} -> lead order {self.expected.big_o(var)}, "
            f"excess growth tolerance {100 * self.tolerance:.1f} %",
            f"  fitted   : f({var}) = {m.formula}",
            f"  lead     : {m.big_o} ({'within' if self.order_ok else 'exceeds'} the expectation)",
            f"  quality  : LOO SMAPE {m.smape:.2f} %, adjusted R^2 {m.adjusted_r2:.4f}, "
            f"{len(m.x)} distinct {var} values, repetitions {list(map(int, m.repetitions))}",
            f"  growth   : {100 * self.excess_growth:.1f} % beyond the expectation's best fit, "
            f"over {var} in [{m.x.min():g}, {m.x.max():g}]",
            "  data     : " + ", ".join(f"{xv:g}: {yv:.4g}" for xv, yv in zip(m.x, m.y, strict=True)),
            "  runners-up: " + ", ".join(f"{t.formula(var)} ({s:.2f} %)" for t, s in m.ranking[1:4]),
        ]
        return "\n".join(lines)


def excess_growth(model: PMNFModel, expected: Term, grid_points: int = 129) -> float:
    """Largest rise of ``model`` over the expectation's best fit across the measured range.

    The expectation's form ``e(x) = a + b g(x)`` (``a`` alone for O(1)) is fitted to the medians
    by least squares. On a geometric grid over ``[min x, max x]`` (plus the measured ``x``) the
    difference ``r = f - e`` between the selected PMNF model ``f`` and it is formed, and its
    largest rise ``max over x' <= x of r(x) - r(x')`` is divided by the largest measured value
    ``max |y|``: the growth the expectation cannot explain, as a fraction of the metric's scale.

    Returns:
        Dimensionless excess growth (0.1 = 10 %); 0 when the model grows no faster than expected.
    """
    xs, ys = model.x, model.y
    lo, hi = float(xs.min()), float(xs.max())
    grid = np.unique(np.concatenate([np.geomspace(lo, hi, grid_points), xs]))
    if expected.is_constant:
        exp_fit = np.full_like(grid, ys.mean())
    else:
        design = np.stack([np.ones_like(xs), expected(xs)], axis=1)
        coef, *_ = np.linalg.lstsq(design, ys, rcond=None)
        exp_fit = coef[0] + coef[1] * expected(grid)
    r = model(grid) - exp_fit
    rise = float(np.max(r - np.minimum.accumulate(r)))
    scale = float(np.max(np.abs(ys)))
    if scale == 0.0:
        return 0.0 if rise <= 0.0 else math.inf
    return rise / scale


def check_scaling(
    x,
    y=None,
    expected: str | Term | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    *,
    label: str = "",
    evidence: str = "",
    model: PMNFModel | None = None,
    **fit_kwargs,
) -> ScalingVerdict:
    """Fit a PMNF model and judge it against ``expected``; never raises on a failed expectation.

    Args:
        x: parameter values, or a :class:`cropscale.bench.measure.ScalingSeries` (then ``y``
            is omitted and its variable name, label and evidence are used).
        y: measurements: one value per ``x`` entry or one sequence of repetitions per ``x``.
        expected: Landau notation (``"O(n)"``, ``"O(1)"``, ``"O(n log n)"`` ...) or a ``Term``
            (required).
        tolerance: allowed excess growth, a fraction (>= 0; 0.1 = 10 %).
        label, evidence: descriptions carried into the messages.
        model: a model already fitted to these measurements (``x``, ``y`` and ``fit_kwargs`` are
            then ignored), to judge one fit against several expectations.
        **fit_kwargs: passed to :func:`cropscale.scaling.pmnf.fit_pmnf` (``variable``,
            ``negative_exponents``, ``min_term_contribution``, ``log_terms``).

    Raises:
        CropScaleError: bad expectation, tolerance or measurements.
    """
    if model is not None:
        if not isinstance(model, PMNFModel):
            raise CropScaleError(f"model must be a PMNFModel, got {type(model).__name__}")
    elif y is None:
        if not hasattr(x, "x") or not hasattr(x, "y"):
            raise CropScaleError("check_scaling needs x and y, or a ScalingSeries as its first argument")
        series = x
        x, y = series.x, series.y
        fit_kwargs.setdefault("variable", series.parameter)
        label = label or f"{series.metric} vs {series.parameter}"
        evidence = evidence or series.evidence
    if not isinstance(tolerance, (int, float)) or isinstance(tolerance, bool) or not (tolerance >= 0):
        raise CropScaleError(f"tolerance must be a fraction >= 0 (0.1 = 10 %), got {tolerance!r}")
    if expected is None:
        raise CropScaleError("state the expectation: expected='O(1)', 'O(n)', 'O(n log n)' ...")
    order = parse_order(expected)
    if model is None:
        model = fit_pmnf(x, y, **fit_kwargs)
    order_ok = model.lead_order <= order
    growth = excess_growth(model, order)
    passed = bool(order_ok or growth <= tolerance)
    text = expected if isinstance(expected, str) else order.big_o(model.variable)
    return ScalingVerdict(passed, order, text, float(tolerance), model, growth, bool(order_ok), label, evidence)


def assert_scaling(
    x,
    y=None,
    expected: str | Term | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    **kwargs,
) -> PMNFModel:
    """Assert that measurements scale no worse than ``expected`` (see :func:`check_scaling`).

    Returns:
        The fitted :class:`~cropscale.scaling.pmnf.PMNFModel` when the assertion holds.

    Raises:
        ScalingAssertionError: the fitted lead order exceeds the expectation and the excess
            growth exceeds ``tolerance``; the message prints the fitted model, its lead order,
            SMAPE, adjusted R^2, the expectation and the data.
        CropScaleError: bad arguments.
    """
    verdict = check_scaling(x, y, expected, tolerance, **kwargs)
    if not verdict.passed:
        raise ScalingAssertionError(verdict.message(), verdict)
    return verdict.model
