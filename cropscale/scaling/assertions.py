"""Performance assertions: check the asymptotic class of a measured trend, with the noise in view.

After Shudler, Calotoiu, Hoefler, Strube and Wolf ("Exascaling your library: will your
implementation meet your expectations?", ICS 2015; TPDS 2019): state the expectation in Landau
notation ("step time is O(n) in the batch size", "per-rank all-reduce volume is O(1) in the world
size") and check the measurements against it:

- :func:`check_scaling` returns a :class:`ScalingVerdict` and never raises on a failed
  expectation; :func:`assert_scaling` raises :class:`ScalingAssertionError` on ``fail``, and on
  ``inconclusive`` unless the caller passes ``inconclusive="pass"``.
- The decision is :func:`cropscale.scaling.verdict.judge`: the lead-order class of the best model
  above the expectation against the best model within it, calibrated by a residual bootstrap over
  the repetitions. It fails only when the data supports a lead order above the expectation, passes
  only when it excludes one (of a size set by ``resolution``), and is ``inconclusive`` otherwise
  (too few points, too narrow a range, too much noise), saying which.
- The message reports the deviation in class terms ("exceeds O(n) by a factor log n"), both
  families' best models with the bootstrap fractions behind the decision, and the PMNF model that
  :func:`cropscale.scaling.pmnf.fit_pmnf` (Extra-P's selection) fits to the medians.

Landau notation is read by :func:`cropscale.scaling.landau.parse_order`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cropscale.errors import CropScaleError
from cropscale.scaling.landau import order_variable, parse_order
from cropscale.scaling.multi_verdict import MultiVerdict, check_scaling_multi, is_multi
from cropscale.scaling.pmnf import PMNFModel, Term, fit_pmnf
from cropscale.scaling.verdict import (
    DEFAULT_RESAMPLES,
    DEFAULT_RESOLUTION,
    AssertionOutcome,
    ClassVerdict,
    judge,
)

INCONCLUSIVE_POLICIES: tuple[str, ...] = ("fail", "pass")
"""What :func:`assert_scaling` does with an inconclusive verdict: raise, or accept it."""

__all__ = [
    "DEFAULT_RESOLUTION", "INCONCLUSIVE_POLICIES", "ScalingAssertionError", "ScalingInconclusiveError",
    "ScalingVerdict", "assert_scaling", "check_scaling", "parse_order",
]


@dataclass(frozen=True)
class ScalingVerdict(AssertionOutcome):
    """The outcome of one performance assertion.

    Attributes:
        status: ``"pass"``, ``"fail"`` or ``"inconclusive"``.
        expected: the expected order; ``expected_text`` as written.
        classes: the class verdict (:class:`cropscale.scaling.verdict.ClassVerdict`): both
            families' best models, the statistic, the bootstrap fractions, the noise, the reason.
        model: the PMNF model of the medians (:func:`cropscale.scaling.pmnf.fit_pmnf`), for the report.
        label: what was measured (metric vs parameter), for messages.
        evidence: evidence label of the measurements (``measured-run`` ...), if known.
    """

    status: str
    expected: Term
    expected_text: str
    classes: ClassVerdict
    model: PMNFModel
    label: str = ""
    evidence: str = ""

    @property
    def order_ok(self) -> bool:
        """The PMNF model's lead order does not exceed the expectation (informative only)."""
        return self.model.lead_order <= self.expected

    @property
    def reason(self) -> str:
        """Why the verdict is inconclusive, and what would decide it (empty otherwise)."""
        return self.classes.reason

    @property
    def variable(self) -> str:
        """Name of the fitted parameter (``n``, ``batch`` ...)."""
        return self.model.variable

    def summary(self) -> str:
        """One line: status, what, expectation, the verdict in class terms, evidence label."""
        what = f"{self.label}: " if self.label else ""
        ev = f" [{self.evidence}]" if self.evidence else ""
        return f"{self.status.upper()} {what}expected {self.expected.big_o(self.variable)}; {self._verdict_text()}{ev}"

    def _verdict_text(self) -> str:
        """The class verdict's sentence (its reason alone when inconclusive: the status says it)."""
        return self.classes.reason if self.inconclusive else self.classes.describe(self.variable)

    def message(self) -> str:
        """Multi-line explanation, used as the message of :func:`assert_scaling`'s errors."""
        c, m, var = self.classes, self.model, self.variable
        sup = "n/a (no repetitions)" if math.isnan(c.support) else f"{100 * c.support:.0f} %"
        lines = [
            self._heading(),
            f"  expected : {self.expected_text} -> {self.expected.big_o(var)}",
            f"  verdict  : {self.status.upper()}: {self._verdict_text()}",
            f"  within   : best model of {self.expected.big_o(var)} or below: f({var}) = {c.within.formula(var)} "
            f"({c.within.order_text(var)}, chi2 {c.within.chi2:.3g})",
            f"  above    : best {'growing ' if c.above.c1 > 0 else ''}model above it: f({var}) = "
            f"{c.above.formula(var)} ({c.above.order_text(var)}, chi2 {c.above.chi2:.3g})",
            f"  evidence : D = {c.statistic:.3g}; excess reached by {100 * c.p_within:.1f} % of {c.resamples} "
            f"series drawn from the within model; data matched by at most {100 * c.p_above:.1f} % of those drawn "
            f"from the alternatives; bootstrap support for a class above: {sup}",
            f"  noise    : {100 * c.noise:.2g} % per repetition (from the {c.noise_source}); "
            f"{len(c.x)} distinct {var} values in [{c.x.min():g}, {c.x.max():g}], "
            f"repetitions {sorted(set(map(int, c.repetitions)))}",
            "  screened : " + ("; ".join(r.text(var) for r in c.screened) if c.screened else "none")
            + " (repetitions beyond 7 robust sd of their point's median, at most r // 4 per point)",
            f"  PMNF fit : f({var}) = {m.formula}  [lead order {m.big_o}, LOO SMAPE {m.smape:.2f} %, "
            f"adjusted R^2 {m.adjusted_r2:.4f}] (Extra-P's selection on the medians)",
            "  data     : " + ", ".join(f"{xv:g}: {yv:.4g}" for xv, yv in zip(c.x, c.centres, strict=True))
            + " (interquartile means)",
        ]
        return "\n".join(lines)


class ScalingAssertionError(AssertionError):
    """A performance assertion failed; the message prints the verdict, both models and the data."""

    def __init__(self, message: str, verdict: ScalingVerdict | MultiVerdict | None = None) -> None:
        super().__init__(message)
        self.verdict = verdict


class ScalingInconclusiveError(ScalingAssertionError):
    """A performance assertion could not be decided (``inconclusive="fail"``, the default)."""


_FIT_KEYS = frozenset({"variable", "negative_exponents", "log_terms", "min_term_contribution"})
_JUDGE_KEYS = frozenset({"variable", "negative_exponents", "log_terms", "alpha_fail", "alpha_pass"})


def _split_kwargs(kwargs: dict) -> tuple[dict, dict]:
    """``(fit_pmnf options, judge options)`` from ``check_scaling``'s keyword arguments."""
    if "tolerance" in kwargs:
        raise CropScaleError(
            "tolerance= is gone: a significant excess above the expectation always fails now; "
            "resolution= sets the smallest excess a pass vouches for (default 0.1 = 10 % of the metric)"
        )
    unknown = set(kwargs) - _FIT_KEYS - _JUDGE_KEYS
    if unknown:
        raise CropScaleError(
            f"check_scaling: unknown arguments {sorted(unknown)}; options are {sorted(_FIT_KEYS | _JUDGE_KEYS)}"
        )
    return ({k: v for k, v in kwargs.items() if k in _FIT_KEYS}, {k: v for k, v in kwargs.items() if k in _JUDGE_KEYS})


def check_scaling(
    x,
    y=None,
    expected: str | Term | None = None,
    resolution: float = DEFAULT_RESOLUTION,
    *,
    label: str = "",
    evidence: str = "",
    model: PMNFModel | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    **fit_kwargs,
) -> ScalingVerdict | MultiVerdict:
    """Judge measurements against ``expected``; never raises on a failed or undecided expectation.

    Args:
        x: parameter values (> 0), or a :class:`cropscale.scaling.series.ScalingSeries` (then ``y``
            is omitted and its parameter name, label and evidence are used), or a tuple of two
            sequences ``(x1, x2)`` (two parameters: ``expected`` is a product class such as
            ``"O(batch)"`` over ``variables=("devices", "batch")``; returns a
            :class:`cropscale.scaling.multi_verdict.MultiVerdict`, see
            :func:`cropscale.scaling.multi_verdict.check_scaling_multi`).
        y: measurements: one value per ``x`` entry, or one sequence of repetitions per ``x``
            (repetitions give the verdict its noise estimate; without them it is the scatter of
            the best model's residuals).
        expected: Landau notation (``"O(n)"``, ``"O(1)"``, ``"O(n log n)"`` ...) or a ``Term``
            (required).
        resolution: smallest excess a pass vouches for, a fraction of the largest value (0.1 = 10 %).
        label: what was measured, carried into the messages.
        evidence: the measurements' evidence label, carried into the messages.
        model: a PMNF model already fitted to these measurements, reported instead of a new fit;
            with ``y`` omitted its medians (one value per ``x``) are judged.
        resamples: bootstrap resamples of the verdict.
        seed: seed of the bootstrap (the verdict is reproducible for a seed).
        **fit_kwargs: ``variable`` (default: a series' parameter, else the name in ``expected``,
            else ``"x"``), ``negative_exponents``, ``log_terms`` (fit and verdict),
            ``min_term_contribution`` (fit only; :func:`cropscale.scaling.pmnf.fit_pmnf`),
            ``alpha_fail``, ``alpha_pass`` (verdict only; :func:`cropscale.scaling.verdict.judge`).

    Raises:
        CropScaleError: a missing or malformed expectation, bad measurements, an unknown argument.
    """
    if is_multi(x):
        if model is not None:
            raise CropScaleError("model= is for one parameter; a two-parameter assertion fits its own model")
        if expected is None:
            raise CropScaleError("state the expectation: expected='O(batch)', 'O(log devices * batch)' ...")
        variables = fit_kwargs.pop("variables", None)
        return check_scaling_multi(x, y, expected, resolution, variables=variables, label=label, evidence=evidence,
                                   resamples=resamples, seed=seed, **fit_kwargs)
    if model is not None and not isinstance(model, PMNFModel):
        raise CropScaleError(f"model must be a PMNFModel, got {type(model).__name__}")
    if y is None and model is not None:
        x, y = model.x, model.y
        fit_kwargs.setdefault("variable", model.variable)
    elif y is None:
        if not hasattr(x, "x") or not hasattr(x, "y"):
            raise CropScaleError("check_scaling needs x and y, or a ScalingSeries as its first argument")
        series = x
        x, y = series.x, series.y
        fit_kwargs.setdefault("variable", series.parameter)
        label = label or f"{series.metric} vs {series.parameter}"
        evidence = evidence or series.evidence
    if expected is None:
        raise CropScaleError("state the expectation: expected='O(1)', 'O(n)', 'O(n log n)' ...")
    order = parse_order(expected)
    if "variable" not in fit_kwargs and order_variable(expected):
        fit_kwargs["variable"] = order_variable(expected)  # the name the expectation uses
    fit_options, judge_options = _split_kwargs(fit_kwargs)
    if model is None:
        model = fit_pmnf(x, y, **fit_options)
    judge_options["variable"] = model.variable
    classes = judge(x, y, order, resolution=resolution, resamples=resamples, seed=seed, **judge_options)
    text = expected if isinstance(expected, str) else order.big_o(model.variable)
    return ScalingVerdict(classes.status, order, text, classes, model, label, evidence)


def assert_scaling(
    x,
    y=None,
    expected: str | Term | None = None,
    resolution: float = DEFAULT_RESOLUTION,
    *,
    inconclusive: str = "fail",
    **kwargs,
) -> ScalingVerdict | MultiVerdict:
    """Assert that measurements scale no worse than ``expected`` (see :func:`check_scaling`).

    Args:
        x: parameter values, or a series (as for :func:`check_scaling`).
        y: measurements (as for :func:`check_scaling`).
        expected: the expected order in Landau notation (as for :func:`check_scaling`).
        resolution: smallest excess a pass vouches for (as for :func:`check_scaling`).
        inconclusive: ``"fail"`` (default) raises :class:`ScalingInconclusiveError` when the data
            cannot decide; ``"pass"`` returns the inconclusive verdict.
        **kwargs: further arguments of :func:`check_scaling`.

    Returns:
        The :class:`ScalingVerdict` (status ``"pass"``, or ``"inconclusive"`` when accepted).

    Raises:
        ScalingAssertionError: the data supports a lead order above ``expected``; the message names
            the excess factor and prints both models, the bootstrap evidence, the PMNF fit and the data.
        ScalingInconclusiveError: undecided and ``inconclusive="fail"``.
        CropScaleError: bad arguments.
    """
    if inconclusive not in INCONCLUSIVE_POLICIES:
        raise CropScaleError(f"inconclusive must be one of {INCONCLUSIVE_POLICIES}, got {inconclusive!r}")
    verdict = check_scaling(x, y, expected, resolution, **kwargs)
    if verdict.failed:
        raise ScalingAssertionError(verdict.message(), verdict)
    if verdict.inconclusive and inconclusive == "fail":
        raise ScalingInconclusiveError(verdict.message(), verdict)
    return verdict
