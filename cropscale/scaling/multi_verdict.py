"""Two-parameter performance assertions: does a metric of ``(x1, x2)`` grow faster than a product class?

The expectation is a product of single-parameter classes, ``O(a(x1) b(x2))``: in Landau notation
over the two parameters' names (``"O(batch)"``: O(1) in devices and O(batch) in batch;
``"O(log devices * batch)"``), or one order per parameter (``("O(1)", "O(batch)")``). A parameter
the notation does not name is expected O(1).

Method: as Extra-P's multi-parameter modeler (:mod:`cropscale.scaling.multi`), each parameter is
first modelled on its *line*: at each value ``x_p`` the mean over the line's group of coordinates
(on a full grid: over every value of the other parameter; Extra-P's points). For every PMNF form
that modeler selects (``c0 + c1 a b``, ``c0 + c1 a + c2 b``, ``c0 + c1 a + c2 a b``, ``c0 + c1 b + c2 a b``) the line of
parameter ``p`` is ``c + c' t_p(x_p)``: the class in ``x_p`` is kept. The line is judged by the
single-parameter verdict (:func:`cropscale.scaling.verdict.judge`) against that parameter's class,
on the *normalised* line: each coordinate's value is divided by the mean, over the line, of the
values at its coordinate in the other parameter (on a full grid: ``y(x1, x2) / mean_x1 y(., x2)``
for the ``x1`` line), then averaged over the group. Where the metric is affine in ``t_p(x_p)`` at
every value of the other parameter (all four forms above) the normalised line is too, so the class
in ``x_p`` is kept; and every coordinate weighs about the same, so the line has the same relative
noise at every ``x_p`` (``sigma / sqrt(group size)``), as the verdict assumes (a plain mean weights
the largest values, and its noise, most: the verdict then sees too little noise where the other
parameter spans a wide range, and false rejects rise to 30 % on the two-parameter benchmark). With
the same number ``r >= 2`` of repetitions at every coordinate, the ``j``-th repetition of the line
at ``x_p`` is the mean over the group of the normalised ``j``-th repetitions; otherwise the line
holds the normalised means (noise from the residuals). The product class

- fails when the verdict of either parameter fails, each at level ``alpha_fail / 2`` (Bonferroni over the
  two parameters, so that the product class is falsely rejected at most at ``alpha_fail``);
- passes when both pass;
- is inconclusive otherwise, with the undecided parameter's reason and what would decide it.

The reported model is :func:`cropscale.scaling.multi.fit_pmnf_multi` (Extra-P's selection). The error
rates of this rule on seeded two-parameter series are in ``python -m cropscale scaling assert-bench``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from cropscale.errors import CropScaleError
from cropscale.scaling.landau import _SEPARATOR, _read_factor, parse_order
from cropscale.scaling.multi import MultiModel, aggregate_multi, fit_pmnf_multi, line_groups
from cropscale.scaling.pmnf import CONSTANT, Term
from cropscale.scaling.verdict import (
    ALPHA_FAIL,
    DEFAULT_RESAMPLES,
    DEFAULT_RESOLUTION,
    FAIL,
    INCONCLUSIVE,
    PASS,
    AssertionOutcome,
    ClassVerdict,
    judge,
)


def parse_product_order(expected, variables: tuple[str, ...]) -> tuple[Term, ...]:
    """The expected order per parameter.

    Args:
        expected: ``"O(log devices * batch)"`` (a product over the names in ``variables``), or one
            order (text or :class:`Term`) per parameter.
        variables: the parameters' names, in the order of ``x``.

    Raises:
        CropScaleError: malformed notation, a name that is not one of ``variables``, a wrong count.
    """
    if isinstance(expected, (tuple, list)):
        if len(expected) != len(variables):
            raise CropScaleError(f"expected has {len(expected)} orders for the {len(variables)} parameters "
                                 f"{list(variables)}")
        return tuple(parse_order(e) for e in expected)
    if not isinstance(expected, str):
        raise CropScaleError(f"expected must be Landau notation such as 'O(batch)' or one order per parameter, "
                             f"got {expected!r}")
    m = re.fullmatch(r"\s*[Oo]\s*\((.*)\)\s*", expected)
    if not m:
        raise CropScaleError(f"expected {expected!r}: write it as O(...), e.g. 'O(batch)', 'O(log devices * batch)'")
    inner = m.group(1)
    orders = {v: [Term(0, 0).i, 0] for v in variables}
    if inner.strip() != "1":
        pos = 0
        try:
            while True:
                pos = _SEPARATOR.match(inner, pos).end()
                if pos >= len(inner):
                    break
                pos, name, di, dj = _read_factor(inner, pos)
                if name not in orders:
                    raise ValueError(f"{name!r} is not one of the parameters {list(variables)}")
                orders[name][0] += di
                orders[name][1] += dj
        except ValueError as err:
            raise CropScaleError(f"expected {expected!r}: {err}") from None
    return tuple(CONSTANT if i < 0 else Term(i, j) for i, j in orders.values())


def product_text(orders: tuple[Term, ...], variables: tuple[str, ...]) -> str:
    """E.g. ``"O(batch)"``, ``"O(log devices * batch)"`` (``"O(1)"`` when every order is constant)."""
    parts = [o.big_o(v)[2:-1] for o, v in zip(orders, variables, strict=True) if not o.is_constant]
    return f"O({' * '.join(parts)})" if parts else "O(1)"


@dataclass(frozen=True)
class MultiVerdict(AssertionOutcome):
    """The outcome of a two-parameter assertion.

    Attributes:
        status: ``"pass"``, ``"fail"`` or ``"inconclusive"`` (module docstring).
        expected: the expected order per parameter; expected_text: as written.
        variables: the parameters' names.
        per_parameter: the single-parameter verdict of each parameter's line.
        lines: per parameter, ``(x [k], repetitions [k, r] or values [k, 1])`` of the normalised line judged.
        model: the two-parameter PMNF model (Extra-P's selection).
        label, evidence: what was measured and its evidence label, for messages.
    """

    status: str
    expected: tuple[Term, ...]
    expected_text: str
    variables: tuple[str, ...]
    per_parameter: tuple[ClassVerdict, ...]
    lines: tuple[tuple[np.ndarray, np.ndarray], ...] = field(repr=False)
    model: MultiModel = field(repr=False, default=None)
    label: str = ""
    evidence: str = ""

    @property
    def reason(self) -> str:
        """The undecided parameters' reasons (empty unless inconclusive)."""
        if self.status != INCONCLUSIVE:
            return ""
        return "; ".join(f"{v}: {c.reason}" for v, c in zip(self.variables, self.per_parameter, strict=True)
                         if c.status == INCONCLUSIVE)

    def _parameter_text(self, p: int) -> str:
        v, c = self.variables[p], self.per_parameter[p]
        text = c.reason if c.status == INCONCLUSIVE else c.describe(v)
        return f"{v}: {c.status.upper()}: expected {self.expected[p].big_o(v)}; {text}"

    def summary(self) -> str:
        """One line: status, what, expectation, each parameter's verdict, evidence label."""
        what = f"{self.label}: " if self.label else ""
        ev = f" [{self.evidence}]" if self.evidence else ""
        per = "; ".join(f"{v} {c.status}" for v, c in zip(self.variables, self.per_parameter, strict=True))
        return f"{self.status.upper()} {what}expected {product_text(self.expected, self.variables)} ({per}){ev}"

    def message(self) -> str:
        """Multi-line explanation (the message of :func:`cropscale.scaling.assertions.assert_scaling`)."""
        lines = [
            self._heading(),
            f"  expected : {self.expected_text} -> {product_text(self.expected, self.variables)}",
        ]
        lines += [f"  {self._parameter_text(p)}" for p in range(len(self.variables))]
        if self.model is not None:
            lines.append(f"  PMNF fit : {self.model} (Extra-P's multi-parameter selection on the means)")
        for v, (x, reps) in zip(self.variables, self.lines, strict=True):
            pts = ", ".join(f"{a:g}: {float(np.mean(r)):.4g}" for a, r in zip(x, reps, strict=True))
            lines.append(f"  line {v} (normalised): {pts}")
        return "\n".join(lines)


def lines_with_repetitions(coords: np.ndarray, reps: list[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per parameter, ``(x [k], [k, r])``: the normalised line's repetitions (module docstring).

    ``[k, 1]`` (the normalised means) when the coordinates have different repetition counts or one each.
    """
    counts = {r.size for r in reps}
    same = len(counts) == 1 and counts.pop() >= 2
    means = np.array([float(np.mean(r)) for r in reps])
    out = []
    for p, line in enumerate(line_groups(coords)):
        key = [tuple(np.delete(c, p)) for c in coords]
        members = [k for _, ks in line for k in ks]
        norm = {key[k]: float(np.mean([means[m] for m in members if key[m] == key[k]])) for k in members}
        x = np.array([v for v, _ in line])
        if same:
            y = np.stack([np.mean(np.stack([reps[k] / norm[key[k]] for k in ks]), axis=0) for _, ks in line])
        else:
            y = np.array([[float(np.mean([means[k] / norm[key[k]] for k in ks]))] for _, ks in line])
        out.append((x, y))
    return out


def check_scaling_multi(
    x,
    y,
    expected,
    resolution: float = DEFAULT_RESOLUTION,
    *,
    variables: tuple[str, ...] | None = None,
    label: str = "",
    evidence: str = "",
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    fit: bool = True,
    **judge_kwargs,
) -> MultiVerdict:
    """Judge two-parameter measurements against a product class (module docstring); never raises on it.

    Args:
        x: ``(x1, x2)``: two sequences of parameter values (> 0) of one length.
        y: one value per entry, or one sequence of repetitions per entry.
        expected: Landau notation over ``variables`` or one order per parameter.
        resolution: as for the single-parameter verdict (0.1 = 10 % of the largest line value).
        variables: the two names (default ``("x1", "x2")``).
        label: what was measured, carried into the messages.
        evidence: the measurements' evidence label, carried into the messages.
        resamples: bootstrap resamples of each parameter's verdict.
        seed: seed of the bootstrap (parameter ``p`` uses ``seed + p``).
        fit: also fit the two-parameter PMNF model for the report.
        **judge_kwargs: ``negative_exponents``, ``log_terms``, ``alpha_fail`` (of the product class: each
            parameter is judged at half of it), ``alpha_pass``.

    Raises:
        CropScaleError: bad measurements or expectation, not two parameters, fewer than 3 values of a
            parameter on its line, an unknown argument.
    """
    unknown = set(judge_kwargs) - {"negative_exponents", "log_terms", "alpha_fail", "alpha_pass"}
    if unknown:
        raise CropScaleError(f"two-parameter check_scaling: unknown arguments {sorted(unknown)}")
    coords, reps, _ = aggregate_multi(x, y)
    if coords.shape[1] != 2:
        raise CropScaleError(f"two-parameter assertions need 2 parameters, got {coords.shape[1]}")
    variables = tuple(variables) if variables is not None else ("x1", "x2")
    if len(variables) != 2 or len(set(variables)) != 2:
        raise CropScaleError(f"variables must be two distinct names, got {variables!r}")
    orders = parse_product_order(expected, variables)
    judge_kwargs["alpha_fail"] = judge_kwargs.get("alpha_fail", ALPHA_FAIL) / 2  # Bonferroni over 2 parameters
    lines = lines_with_repetitions(coords, reps)
    verdicts = []
    for p, ((lx, ly), v) in enumerate(zip(lines, variables, strict=True)):
        if lx.size < 3:
            raise CropScaleError(f"{v} has {lx.size} values on its line; a verdict needs at least 3")
        verdicts.append(judge(lx, ly, orders[p], resolution=resolution, resamples=resamples, seed=seed + p,
                              variable=v, **judge_kwargs))
    statuses = [c.status for c in verdicts]
    status = FAIL if FAIL in statuses else PASS if all(s == PASS for s in statuses) else INCONCLUSIVE
    model = fit_pmnf_multi(x, y, variables=variables) if fit else None
    text = expected if isinstance(expected, str) else product_text(orders, variables)
    return MultiVerdict(status, orders, text, variables, tuple(verdicts), tuple(lines), model, label, evidence)


def is_multi(x) -> bool:
    """Whether ``x`` holds several parameters: a tuple of two or more sequences (not of numbers)."""
    return (isinstance(x, tuple) and len(x) >= 2
            and all(isinstance(c, (list, tuple, np.ndarray)) and np.ndim(c) == 1 for c in x))
