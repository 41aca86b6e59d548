"""Multi-parameter PMNF models, selected as Extra-P's multi-parameter modeler selects them.

The method (Extra-P 4.2.5, ``MultiParameterModeler``; Calotoiu, Beckingsale, Earl, Hoefler, Karlin,
Schulz and Wolf, "Fast multi-parameter performance modeling", CLUSTER 2016), for ``P`` parameters:

1. The value of each coordinate is the *mean* of its repetitions (Extra-P's default measure for
   this modeler; ``measure="median"`` for the median).
2. Single-parameter lines (:func:`line_points`): for parameter ``p``, the measurements are grouped
   by their coordinates in the other parameters; the longest groups (most values of ``p``) are kept;
   they are regrouped by the value of ``p``, keeping only the measurements whose other coordinates
   occur in the first such group (insertion order of the measurements, here ascending coordinates);
   the line's value at each ``p`` is the mean over its group. On a full grid: the mean over every
   value of the other parameters.
3. A single-parameter model per line: the constant model (scored by its in-sample SMAPE) against
   every one-term hypothesis of :data:`EXTRAP_TERMS` (Extra-P's 42 default terms, in its order; the 19
   polynomial terms when some value is below 1), scored by leave-one-out SMAPE, a term discarded
   when it contributes less than ``min_term_contribution`` (0.05 %) of the value at every point,
   a hypothesis replacing the best only with a strictly lower score
   (:func:`cropscale.scaling.pmnf.select_hypothesis`).
4. The lead terms ``a(x_1)``, ``b(x_2)`` of the non-constant line models are combined into the
   hypotheses ``c0 + c1 a b``, ``c0 + c1 a + c2 b``, ``c0 + c1 a + c2 a b``, ``c0 + c1 b + c2 a b``
   (two parameters), each fitted by ordinary least squares on every coordinate and scored by its
   in-sample SMAPE; a hypothesis with a zero coefficient or a term contributing less than
   ``min_term_contribution`` is skipped; the first, ``a b``, is the starting best and a later one
   replaces the best only with a strictly lower SMAPE. With one non-constant line the line's own
   coefficients compete with a refit on every coordinate (lower SMAPE wins); with none, the model is
   the mean.

Only two parameters are supported (the three-parameter hypothesis list is not implemented).
Layer 1: numpy only.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from cropscale.errors import CropScaleError
from cropscale.scaling.pmnf import CONSTANT, PMNFWarning, Term, _smape, select_hypothesis

_LOG_TERMS = (
    (0, 1, 1), (0, 1, 2), (1, 4, 0), (1, 3, 0), (1, 4, 1), (1, 3, 1), (1, 4, 2), (1, 3, 2), (1, 2, 0), (1, 2, 1),
    (1, 2, 2), (2, 3, 0), (3, 4, 0), (2, 3, 1), (3, 4, 1), (4, 5, 0), (2, 3, 2), (3, 4, 2), (1, 1, 0), (1, 1, 1),
    (1, 1, 2), (5, 4, 0), (5, 4, 1), (4, 3, 0), (4, 3, 1), (3, 2, 0), (3, 2, 1), (3, 2, 2), (5, 3, 0), (7, 4, 0),
    (2, 1, 0), (2, 1, 1), (2, 1, 2), (9, 4, 0), (7, 3, 0), (5, 2, 0), (5, 2, 1), (5, 2, 2), (8, 3, 0), (11, 4, 0),
    (3, 1, 0), (3, 1, 1),
)
EXTRAP_TERMS: tuple[Term, ...] = tuple(Term(Fraction(a, b), j) for a, b, j in _LOG_TERMS)
"""Extra-P's default single-parameter search space, in its order (``x^(a/b) log2^j x``)."""
EXTRAP_POLY_TERMS: tuple[Term, ...] = tuple(t for t in EXTRAP_TERMS if t.j == 0)
"""The same without log terms (Extra-P's list when a value is below 1)."""
MIN_TERM_CONTRIBUTION = 0.0005
"""Extra-P's minimum term contribution (0.05 % of the value at one point at least)."""
MEASURES = ("mean", "median")


@dataclass(frozen=True)
class MultiTerm:
    """``coefficient * prod_p factors[p](x_p)`` (a factor ``CONSTANT`` where a parameter is absent)."""

    coefficient: float
    factors: tuple[Term, ...]

    def basis(self, coords: np.ndarray) -> np.ndarray:
        """``[m]`` the product of the factors at ``coords`` ``[m, P]`` (without the coefficient)."""
        out = np.ones(coords.shape[0])
        for p, t in enumerate(self.factors):
            if not t.is_constant:
                out = out * t(coords[:, p])
        return out


@dataclass(frozen=True)
class MultiModel:
    """A fitted multi-parameter model ``c0 + sum_k terms[k]``.

    Attributes:
        c0: constant coefficient (unit of the metric).
        terms: the terms; empty for the constant model.
        structure: ``"a*b"``, ``"a+b"``, ``"a*b+a"``, ``"a*b+b"``, ``"a"``, ``"b"`` or ``"constant"``
            (``a``, ``b``: the lead terms of the first and second parameter's line models).
        smape: in-sample SMAPE (%) on every coordinate; rss: residual sum of squares.
        variables: the parameters' names.
        lines: the single-parameter line points and values per parameter, ``(x [k], value [k])``.
        line_terms: the lead term of each line model (``CONSTANT`` when constant).
        coords, values: ``[m, P]`` distinct coordinates and ``[m]`` their mean (or median) values.
    """

    c0: float
    terms: tuple[MultiTerm, ...]
    structure: str
    smape: float
    rss: float
    variables: tuple[str, ...]
    lines: tuple[tuple[np.ndarray, np.ndarray], ...] = field(repr=False)
    line_terms: tuple[Term, ...] = ()
    coords: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)), repr=False)
    values: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    def __call__(self, *xs) -> np.ndarray:
        """The model at ``x_1, .., x_P`` (arrays of one shape)."""
        coords = np.stack([np.asarray(x, dtype=np.float64).ravel() for x in xs], axis=1)
        out = np.full(coords.shape[0], self.c0)
        for t in self.terms:
            out = out + t.coefficient * t.basis(coords)
        return out.reshape(np.shape(xs[0]))

    def lead_orders(self) -> tuple[Term, ...]:
        """Per parameter, the highest order of its factors over the terms (``CONSTANT`` if absent)."""
        return tuple(max((t.factors[p].order for t in self.terms if t.coefficient != 0), default=CONSTANT)
                     for p in range(len(self.variables)))

    @property
    def formula(self) -> str:
        """E.g. ``"0.31 + 0.052 * devices * log2(devices) * batch"``."""
        parts = [f"{self.c0:.4g}"]
        for t in self.terms:
            fac = [f.formula(v) for f, v in zip(t.factors, self.variables, strict=True) if not f.is_constant]
            sign = "-" if t.coefficient < 0 else "+"
            parts.append(f"{sign} {abs(t.coefficient):.4g} * {' * '.join(fac)}")
        return " ".join(parts)

    def __str__(self) -> str:
        return f"f({', '.join(self.variables)}) = {self.formula}  [{self.structure}, SMAPE {self.smape:.2f} %]"


def aggregate_multi(x, y, measure: str = "mean") -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """Distinct coordinates (ascending, lexicographic), their repetitions and their value.

    Args:
        x: a tuple of ``P`` sequences of parameter values of one length ``m`` (one entry per measurement,
            coordinates may repeat; or one per coordinate with ``y`` holding the repetitions).
        y: one value per entry, or one sequence of repetitions per entry.
        measure: ``"mean"`` (Extra-P's default) or ``"median"`` of the repetitions.

    Returns:
        ``(coords [k, P], repetitions per coordinate, value [k])``.

    Raises:
        CropScaleError: fewer than 2 parameters, mismatched lengths, non-finite or non-positive values.
    """
    if measure not in MEASURES:
        raise CropScaleError(f"measure must be one of {MEASURES}, got {measure!r}")
    cols = [np.asarray(c, dtype=np.float64) for c in x]
    if len(cols) < 2 or any(c.ndim != 1 for c in cols) or len({c.size for c in cols}) != 1 or cols[0].size == 0:
        raise CropScaleError("x must be a tuple of 2 or more 1-D sequences of parameter values of one length, "
                             f"got lengths {[c.size for c in cols]}")
    m = cols[0].size
    items = list(y)
    if len(items) != m:
        raise CropScaleError(f"y has {len(items)} entries for {m} coordinates")
    rows = [np.atleast_1d(np.asarray(v, dtype=np.float64)).ravel() for v in items]
    if any(r.size == 0 for r in rows):
        raise CropScaleError("y has a coordinate without any repetition")
    coords = np.stack(cols, axis=1)
    if not (np.all(np.isfinite(coords)) and all(np.all(np.isfinite(r)) for r in rows)):
        raise CropScaleError("x and y must be finite numbers (got nan or inf)")
    if np.any(coords <= 0):
        raise CropScaleError(f"parameter values must be > 0 for the terms x^i log2(x)^j, got min {coords.min():g}")
    uniq, inverse = np.unique(coords, axis=0, return_inverse=True)
    inverse = np.asarray(inverse).ravel()
    reps = [np.concatenate([rows[k] for k in np.flatnonzero(inverse == u)]) for u in range(uniq.shape[0])]
    agg = np.mean if measure == "mean" else np.median
    return uniq, reps, np.array([float(agg(r)) for r in reps])


def line_groups(coords: np.ndarray) -> list[list[tuple[float, list[int]]]]:
    """Per parameter, its line as ``[(x_p, indices of the coordinates averaged there)]``, ``x_p`` ascending.

    Step 2 of the module docstring; ``coords`` ``[m, P]`` in the order of the measurements.
    """
    out = []
    for p in range(coords.shape[1]):
        groups: dict[tuple, list[int]] = {}
        for k, c in enumerate(coords):
            groups.setdefault(tuple(np.delete(c, p)), []).append(k)
        longest = max(len(g) for g in groups.values())
        by_value: dict[float, list[int]] = {}
        for g in groups.values():
            if len(g) == longest:
                for k in g:
                    by_value.setdefault(float(coords[k, p]), []).append(k)
        members = list(by_value.values())
        common = {tuple(np.delete(coords[k], p)) for k in members[0]}
        line = [(v, [k for k in ks if tuple(np.delete(coords[k], p)) in common]) for v, ks in by_value.items()]
        out.append(sorted(((v, ks) for v, ks in line if ks), key=lambda t: t[0]))
    return out


def line_points(coords: np.ndarray, values: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per parameter, the line ``(x [k] ascending, value [k])``: the mean of ``values`` over each group."""
    return [(np.array([v for v, _ in line]), np.array([float(np.mean(values[ks])) for _, ks in line]))
            for line in line_groups(coords)]


def _line_term(xs: np.ndarray, ys: np.ndarray, eps: float, var: str) -> tuple[Term, float, float]:
    """The line model's ``(term, c0, c1)`` (step 3); ``(CONSTANT, mean, 0)`` for the constant model."""
    if xs.size < 3:
        raise CropScaleError(f"a multi-parameter model needs at least 3 values of {var} on a line, got {xs.size}")
    if xs.size < 5:
        warnings.warn(f"multi-parameter model: {xs.size} values of {var} on its line (Extra-P needs 5)",
                      PMNFWarning, stacklevel=3)
    terms = EXTRAP_TERMS if xs.min() >= 1.0 else EXTRAP_POLY_TERMS
    best, _ = select_hypothesis(xs, ys, terms, eps)
    return best.term, best.c0, best.c1


def _ols(coords: np.ndarray, values: np.ndarray, bases: list[tuple[Term, ...]]) -> tuple[float, list[MultiTerm]]:
    a = np.stack([np.ones(coords.shape[0])] + [MultiTerm(1.0, b).basis(coords) for b in bases], axis=1)
    coef, _, rank, _ = np.linalg.lstsq(a, values, rcond=None)
    if rank < a.shape[1]:
        coef, *_ = np.linalg.lstsq(a, values, rcond=-1)
    return float(coef[0]), [MultiTerm(float(c), b) for c, b in zip(coef[1:], bases, strict=True)]


def _predict(c0: float, terms: list[MultiTerm], coords: np.ndarray) -> np.ndarray:
    return c0 + sum((t.coefficient * t.basis(coords) for t in terms), np.zeros(coords.shape[0]))


def _contributes(terms: list[MultiTerm], coords: np.ndarray, values: np.ndarray, eps: float) -> bool:
    with np.errstate(divide="ignore", invalid="ignore"):
        return all(t.coefficient != 0 and float(np.max(np.abs(t.coefficient * t.basis(coords) / values))) >= eps
                   for t in terms)


def fit_pmnf_multi(x, y, *, variables: tuple[str, ...] = ("x1", "x2"), measure: str = "mean",
                   min_term_contribution: float = MIN_TERM_CONTRIBUTION) -> MultiModel:
    """Fit a two-parameter PMNF model as Extra-P's multi-parameter modeler does (module docstring).

    Args:
        x: ``(x1, x2)``: two sequences of parameter values (> 0) of one length, one entry per
            measurement or per coordinate.
        y: one value per entry, or one sequence of repetitions per entry.
        variables: the two parameters' names (formulas, messages).
        measure: ``"mean"`` (Extra-P's default for this modeler) or ``"median"``.
        min_term_contribution: Extra-P's epsilon (0.05 %).

    Returns:
        The selected :class:`MultiModel`.

    Raises:
        CropScaleError: not two parameters, bad values, fewer than 3 values of a parameter on its line.

    Warns:
        PMNFWarning: fewer than 5 values of a parameter on its line.
    """
    coords, _, values = aggregate_multi(x, y, measure)
    if coords.shape[1] != 2:
        raise CropScaleError(f"only two-parameter models are implemented, got {coords.shape[1]} parameters")
    variables = tuple(str(v) for v in variables)
    if len(variables) != 2:
        raise CropScaleError(f"variables must name the 2 parameters, got {variables!r}")
    lines = line_points(coords, values)
    fits = [_line_term(lx, ly, min_term_contribution, v) for (lx, ly), v in zip(lines, variables, strict=True)]
    line_terms = tuple(f[0] for f in fits)
    active = [p for p, f in enumerate(fits) if not f[0].is_constant]

    def factors(*ps: int) -> tuple[Term, ...]:
        return tuple(line_terms[p] if p in ps else CONSTANT for p in range(2))

    def model(c0: float, terms: list[MultiTerm], structure: str) -> MultiModel:
        pred = _predict(c0, terms, coords)
        return MultiModel(c0, tuple(terms), structure, float(_smape(pred, values)),
                          float(np.sum((values - pred) ** 2)), variables, tuple(lines), line_terms, coords, values)

    if not active:
        return model(float(np.mean(values)), [], "constant")
    if len(active) == 1:
        p = active[0]
        _, c0, c1 = fits[p]
        reused = model(c0, [MultiTerm(c1, factors(p))], "ab"[p])
        rc0, rterms = _ols(coords, values, [factors(p)])
        refit = model(rc0, rterms, "ab"[p])
        return refit if refit.smape < reused.smape else reused
    hypotheses = (("a*b", [factors(0, 1)]), ("a+b", [factors(0), factors(1)]),
                  ("a*b+a", [factors(0), factors(0, 1)]), ("a*b+b", [factors(1), factors(0, 1)]))
    best = None
    for name, bases in hypotheses:
        c0, terms = _ols(coords, values, bases)
        cand = model(c0, terms, name)
        if best is None:
            best = cand
            continue
        if _contributes(terms, coords, values, min_term_contribution) and cand.smape < best.smape:
            best = cand
    return best
