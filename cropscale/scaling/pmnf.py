"""Empirical performance models of one parameter in the performance model normal form (PMNF).

The PMNF (Calotoiu, Hoefler, Poke and Wolf, SC 2013; the Extra-P tool) writes a metric ``f`` of
one parameter ``x`` (batch size, patch area, number of dates, world size ...) as a sum of terms
``x^i log2^j(x)``. Like Extra-P's single-parameter search, :func:`fit_pmnf` considers the constant
model ``f(x) = c0`` and every one-term hypothesis

    f(x) = c0 + c1 * x^i * log2(x)^j,
    i in {0, 1/4, 1/3, 1/2, 2/3, 3/4, 4/5, 1, 5/4, 4/3, 3/2, 5/3, 7/4, 2, 9/4, 7/3, 5/2, 8/3, 11/4, 3},
    j in {0, 1, 2},  (i, j) != (0, 0)

(59 hypotheses: the full product of the two sets; Extra-P's default list is a subset of it).
Repetitions at one ``x`` are aggregated by their median. Coefficients come from ordinary least
squares; the hypothesis is chosen by leave-one-out cross-validation (LOO) on the symmetric mean
absolute percentage error (SMAPE); a hypothesis whose term contributes less than ``min_term_contribution`` of
the measured value at every point is discarded; a one-term hypothesis replaces the constant model (or a
simpler term) only if its LOO SMAPE is strictly lower. The constant model is scored by its in-sample SMAPE (as
Extra-P does), which gives it a margin against one-term hypotheses that fit noise. Fewer than 5 distinct ``x``
values give a :class:`PMNFWarning` (Extra-P's minimum), fewer than 3 an error. With
``negative_exponents=True`` (Extra-P's option for strong scaling) the hypotheses ``x^-i`` (``j = 0``) are
added: a curve that saturates, such as the per-rank ring all-reduce volume ``2 (N - 1) M / N``, is then
modelled exactly; such a term is bounded, so its lead order is O(1).

The selected exponent drifts with noise (about 10 % relative noise in the study's trials): assert
on the lead order with a growth tolerance (:func:`cropscale.scaling.assertions.assert_scaling`),
not on exact terms.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from cropscale.errors import CropScaleError

POLY_EXPONENTS: tuple[Fraction, ...] = tuple(
    Fraction(f)
    for f in (
        "0", "1/4", "1/3", "1/2", "2/3", "3/4", "4/5", "1", "5/4", "4/3", "3/2", "5/3", "7/4", "2",
        "9/4", "7/3", "5/2", "8/3", "11/4", "3",
    )
)
"""Polynomial exponents ``i`` of the PMNF search (Extra-P's single-parameter set)."""
LOG_EXPONENTS: tuple[int, ...] = (0, 1, 2)
"""Logarithm exponents ``j`` of the PMNF search."""
MIN_POINTS = 5
"""Distinct ``x`` values below which the fit warns (Extra-P needs at least 5)."""
MIN_POINTS_HARD = 3
"""Distinct ``x`` values below which a fit with leave-one-out validation is impossible."""


class PMNFWarning(UserWarning):
    """A PMNF fit on too few points, or with logarithmic terms dropped."""


@dataclass(frozen=True, order=True)
class Term:
    """One PMNF term ``x^i log2(x)^j``; ``Term(0, 0)`` is the constant ``1``.

    Terms order by asymptotic growth for ``i >= 0``: ``(i, j)`` lexicographically.
    """

    i: Fraction
    j: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "i", Fraction(self.i).limit_denominator(1000))
        if not isinstance(self.j, int) or self.j < 0:
            raise CropScaleError(f"log exponent j must be a non-negative integer, got {self.j!r}")

    @property
    def is_constant(self) -> bool:
        """True for the constant term ``x^0 log^0 x``."""
        return self.i == 0 and self.j == 0

    @property
    def order(self) -> Term:
        """Asymptotic order: the term itself, or ``Term(0, 0)`` (bounded) for a negative exponent."""
        return Term(Fraction(0), 0) if self.i < 0 else self

    def __call__(self, x) -> np.ndarray:
        """``x^i log2(x)^j`` for ``x > 0`` (array in, float64 array out)."""
        x = np.asarray(x, dtype=np.float64)
        out = np.power(x, float(self.i)) if self.i != 0 else np.ones_like(x)
        if self.j:
            out = out * np.log2(x) ** self.j
        return out

    def formula(self, var: str = "x") -> str:
        """E.g. ``"x^(3/2) * log2(x)^2"``, ``"x"``, ``"log2(x)"``, ``"1"``."""
        parts = []
        if self.i == 1:
            parts.append(var)
        elif self.i != 0:
            parts.append(f"{var}^({self.i})" if self.i.denominator != 1 or self.i < 0 else f"{var}^{self.i}")
        if self.j == 1:
            parts.append(f"log2({var})")
        elif self.j > 1:
            parts.append(f"log2({var})^{self.j}")
        return " * ".join(parts) if parts else "1"

    def big_o(self, var: str = "n") -> str:
        """Landau notation of the order: ``"O(1)"``, ``"O(n log n)"``, ``"O(n^(3/2) log^2 n)"``."""
        t = self.order
        parts = []
        if t.i == 1:
            parts.append(var)
        elif t.i != 0:
            parts.append(f"{var}^{t.i}" if t.i.denominator == 1 else f"{var}^({t.i})")
        if t.j == 1:
            parts.append(f"log {var}")
        elif t.j > 1:
            parts.append(f"log^{t.j} {var}")
        return f"O({' '.join(parts) if parts else '1'})"


CONSTANT = Term(Fraction(0), 0)


def hypotheses(negative_exponents: bool = False, log_terms: bool = True) -> list[Term]:
    """The one-term hypotheses searched, simplest (lowest order) first.

    Args:
        negative_exponents: add ``x^-i`` for every non-zero ``i`` (``j = 0``), ahead of the others.
        log_terms: include ``j = 1, 2`` (requires every ``x >= 1``).
    """
    js = LOG_EXPONENTS if log_terms else (0,)
    terms = [Term(i, j) for i in POLY_EXPONENTS for j in js if not (i == 0 and j == 0)]
    terms.sort()
    if negative_exponents:
        terms = [Term(-i, 0) for i in reversed(POLY_EXPONENTS) if i != 0] + terms
    return terms


@dataclass(frozen=True)
class PMNFModel:
    """A fitted single-parameter PMNF model ``f(x) = c0 + c1 * term(x)``.

    Attributes:
        c0: constant coefficient (unit of the metric).
        c1: coefficient of ``term`` (0 for the constant model).
        term: the selected term; ``CONSTANT`` for the constant model.
        smape: leave-one-out SMAPE of the selected hypothesis, in percent (selection criterion).
        smape_fit: in-sample SMAPE of the final fit on all points, in percent.
        adjusted_r2: adjusted coefficient of determination of the final fit (``nan`` if undefined).
        rss: residual sum of squares of the final fit (metric unit squared).
        x: distinct parameter values, ascending.
        y: median of the repetitions at each ``x``.
        repetitions: number of repetitions behind each median.
        variable: parameter name used in formulas.
        ranking: the best few hypotheses as ``(term, LOO SMAPE %)``, best first (the constant
            model included), for diagnosis.
    """

    c0: float
    c1: float
    term: Term
    smape: float
    smape_fit: float
    adjusted_r2: float
    rss: float
    x: np.ndarray = field(repr=False)
    y: np.ndarray = field(repr=False)
    repetitions: np.ndarray = field(repr=False)
    variable: str = "x"
    ranking: tuple[tuple[Term, float], ...] = field(default=(), repr=False)

    def __call__(self, x) -> np.ndarray:
        """Evaluate the model at ``x`` (> 0)."""
        x = np.asarray(x, dtype=np.float64)
        if self.c1 == 0 or self.term.is_constant:
            return np.full_like(x, self.c0)
        return self.c0 + self.c1 * self.term(x)

    @property
    def lead_order(self) -> Term:
        """The lead-order term (``CONSTANT`` for a constant model or a bounded negative power)."""
        return CONSTANT if self.c1 == 0 else self.term.order

    @property
    def big_o(self) -> str:
        """Landau notation of the lead order, in the model's variable: e.g. ``"O(x log x)"``."""
        return self.lead_order.big_o(self.variable)

    @property
    def formula(self) -> str:
        """Human-readable model, e.g. ``"2.31 + 0.0153 * x^(3/2) * log2(x)"``."""
        if self.c1 == 0 or self.term.is_constant:
            return f"{self.c0:.4g}"
        sign = "-" if self.c1 < 0 else "+"
        return f"{self.c0:.4g} {sign} {abs(self.c1):.4g} * {self.term.formula(self.variable)}"

    def __str__(self) -> str:
        r2 = "nan" if math.isnan(self.adjusted_r2) else f"{self.adjusted_r2:.4f}"
        return (
            f"f({self.variable}) = {self.formula}  [lead order {self.big_o}, LOO SMAPE {self.smape:.2f} %, "
            f"adj. R^2 {r2}, {len(self.x)} points]"
        )


def aggregate(x, y) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Median of the repetitions at each distinct ``x``.

    Accepted layouts:

    - ``y`` of the same length as ``x``, one value per entry (``x`` may repeat: long format);
    - ``y`` a sequence with one entry per ``x``, each a sequence of repetitions (ragged allowed),
      or a 2-D array ``[len(x), repetitions]``.

    Returns:
        ``(x_distinct ascending, median y, repetition count)`` as float64 / int arrays.

    Raises:
        CropScaleError: mismatched lengths, empty or non-finite values.
    """
    xs = np.asarray(x, dtype=np.float64)
    if xs.ndim != 1 or xs.size == 0:
        raise CropScaleError(f"x must be a non-empty 1-D sequence of numbers, got shape {xs.shape}")
    if isinstance(y, np.ndarray):
        rows = [np.atleast_1d(np.asarray(r, dtype=np.float64)) for r in y] if y.ndim == 2 else None
        flat = y.astype(np.float64) if y.ndim == 1 else None
    else:
        y = list(y)
        if any(isinstance(v, (Sequence, np.ndarray)) and not isinstance(v, str) for v in y):
            rows = [np.atleast_1d(np.asarray(v, dtype=np.float64)).ravel() for v in y]
            flat = None
        else:
            rows, flat = None, np.asarray(y, dtype=np.float64)
    if rows is not None:
        if len(rows) != xs.size:
            raise CropScaleError(f"y has {len(rows)} rows of repetitions for {xs.size} x values")
        if any(r.size == 0 for r in rows):
            raise CropScaleError("y has an x value without any repetition")
        long_x = np.concatenate([np.full(r.size, xv) for xv, r in zip(xs, rows, strict=True)])
        long_y = np.concatenate(rows)
    else:
        if flat is None or flat.ndim != 1 or flat.size != xs.size:
            raise CropScaleError(
                f"y must have one value per x ({xs.size}) or one sequence of repetitions per x"
            )
        long_x, long_y = xs, flat
    if not (np.all(np.isfinite(long_x)) and np.all(np.isfinite(long_y))):
        raise CropScaleError("x and y must be finite numbers (got nan or inf)")
    ux, inverse, counts = np.unique(long_x, return_inverse=True, return_counts=True)
    med = np.array([np.median(long_y[inverse == k]) for k in range(ux.size)])
    return ux, med, counts


def _smape(pred: np.ndarray, actual: np.ndarray, axis: int = -1) -> np.ndarray:
    """Symmetric mean absolute percentage error ``mean(200 |p - a| / (|p| + |a|))`` in percent."""
    num = np.abs(pred - actual)
    den = np.abs(pred) + np.abs(actual)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(den > 0, 2.0 * num / np.where(den > 0, den, 1.0), 0.0)
    return 100.0 * ratio.mean(axis=axis)


def _adjusted_r2(rss: float, y: np.ndarray, n_terms: int) -> float:
    n = y.size
    tss = float(np.sum((y - y.mean()) ** 2))
    if tss == 0.0:
        r2 = 1.0 if rss <= 1e-24 else 0.0
    else:
        r2 = 1.0 - rss / tss
    dof = n - n_terms - 1
    if dof <= 0:
        return float("nan")
    return 1.0 - (1.0 - r2) * (n - 1) / dof


@dataclass(frozen=True)
class Hypothesis:
    """A scored hypothesis ``f(x) = c0 + c1 * term(x)``.

    Attributes:
        term: the hypothesis' term (``CONSTANT`` for the constant model).
        c0, c1: least-squares coefficients on all points (``c1 = 0`` for the constant model).
        smape: its score in percent: leave-one-out SMAPE, or in-sample SMAPE for the constant model.
    """

    term: Term
    c0: float
    c1: float
    smape: float

    def beats(self, other: Hypothesis) -> bool:
        """Strictly lower SMAPE: on a tie the earlier (simpler) hypothesis stays selected."""
        return self.smape < other.smape


@dataclass(frozen=True)
class DesignMatrix:
    """Term values of every hypothesis at the points, each row scaled to max ``|.| = 1``.

    Attributes:
        t: scaled term values ``[H, n]`` (``H`` hypotheses, ``n`` points): ``term_h(x_k) / scale[h]``.
        scale: ``[H]`` the row maxima of ``|term_h(x)|`` (1 where that is 0 or not finite).
        ok: ``[H]`` whether the row scale was finite and positive.
    """

    t: np.ndarray
    scale: np.ndarray
    ok: np.ndarray


@dataclass(frozen=True)
class LooFits:
    """Full and leave-one-out least-squares fits of ``y = a + b t_h`` for every hypothesis ``h``.

    Attributes:
        slope: ``[H]`` slope ``b`` of the full fit, per unit of scaled term (0 where undefined).
        loo_smape: ``[H]`` SMAPE (%) of the leave-one-out predictions.
        valid: ``[H]`` every leave-one-out fit is defined and finite.
    """

    slope: np.ndarray
    loo_smape: np.ndarray
    valid: np.ndarray


def design_matrix(terms: Sequence[Term], xs: np.ndarray) -> DesignMatrix:
    """The scaled term values of ``terms`` at ``xs`` (``[n]``, > 0); scaling is for conditioning only."""
    raw = np.stack([t(xs) for t in terms])  # [H, n]
    scale = np.max(np.abs(raw), axis=1)
    ok = np.isfinite(scale) & (scale > 0)
    scale = np.where(ok, scale, 1.0)
    return DesignMatrix(t=raw / scale[:, None], scale=scale, ok=ok)


def loo_fits(t: np.ndarray, ys: np.ndarray) -> LooFits:
    """Closed-form leave-one-out of the one-term least-squares fit, all hypotheses at once.

    With ``u = t - mean(t)`` and ``v = y - mean(y)`` (the slope is shift invariant), the sums without
    point ``k`` follow from the full sums: ``sum_u = -u_k``, ``sum_v = -v_k``,
    ``S_uu = S_uu - u_k^2 - u_k^2 / (n - 1)``, ``S_uv = S_uv - u_k v_k - u_k v_k / (n - 1)``, so every
    refit costs O(1) instead of a least-squares solve (Extra-P refits in a loop). A refit whose
    ``S_uu`` is below ``1e-12`` of the full one (the term is constant without point ``k``) is invalid.

    Args:
        t: ``[H, n]`` scaled term values (:func:`design_matrix`).
        ys: ``[n]`` the medians.
    """
    n = ys.size
    u = t - t.mean(axis=1, keepdims=True)
    v = ys - ys.mean()
    suu = np.sum(u * u, axis=1)
    suv = u @ v
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(suu > 0, suv / suu, 0.0)  # per unit of scaled term
    m = n - 1
    su_k = -u  # sum over the other points of u (sum u = 0)
    sv_k = -v[None, :]
    suu_k = suu[:, None] - u * u - su_k * su_k / m
    suv_k = suv[:, None] - u * v[None, :] - su_k * sv_k / m
    tiny = 1e-12 * np.maximum(suu[:, None], 1e-300)
    valid_k = suu_k > tiny
    with np.errstate(divide="ignore", invalid="ignore"):
        slope_k = np.where(valid_k, suv_k / np.where(valid_k, suu_k, 1.0), 0.0)
    pred_k = ys.mean() + sv_k / m + slope_k * (u - su_k / m)
    valid = np.all(valid_k, axis=1) & np.all(np.isfinite(pred_k), axis=1) & (suu > 0)
    return LooFits(slope=slope, loo_smape=_smape(pred_k, ys[None, :], axis=1), valid=valid)


def term_contributes(slope: np.ndarray, t: np.ndarray, ys: np.ndarray, minimum: float) -> np.ndarray:
    """``[H]``: the fitted term reaches ``minimum`` of ``|y|`` at one point at least (and is not zero)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        contrib = np.abs(slope[:, None] * t) / np.where(ys != 0, np.abs(ys), np.inf)[None, :]
    return (np.max(contrib, axis=1) >= minimum) & (slope != 0)


def constant_hypothesis(ys: np.ndarray) -> Hypothesis:
    """The constant model ``c0 = mean(y)``, scored by its in-sample SMAPE (as Extra-P does).

    A one-term hypothesis must beat it in leave-one-out: a margin against alternatives fitting noise.
    """
    ymean = ys.mean()
    return Hypothesis(CONSTANT, float(ymean), 0.0, float(_smape(np.full_like(ys, ymean), ys)))


def select_hypothesis(
    xs: np.ndarray, ys: np.ndarray, terms: Sequence[Term], min_term_contribution: float
) -> tuple[Hypothesis, list[tuple[Term, float]]]:
    """Score the constant model and every term of ``terms`` (in order); keep the first strictly best.

    A term is scored only when its leave-one-out fits are valid and it contributes
    ``min_term_contribution`` (:func:`term_contributes`). Without variation in ``ys`` (residual sum of
    squares of the constant model below ``1e-24 n max|y|^2``) only the constant model is scored.

    Returns:
        ``(selected, scored)``: the selected :class:`Hypothesis` and every scored ``(term, SMAPE %)``,
        the constant model first.
    """
    best = constant_hypothesis(ys)
    scored: list[tuple[Term, float]] = [(CONSTANT, best.smape)]
    const_rss = float(np.sum((ys - ys.mean()) ** 2))
    yspan = float(np.max(np.abs(ys)))
    if not (const_rss > 1e-24 * max(yspan, 1e-300) ** 2 * ys.size and terms):
        return best, scored
    design = design_matrix(terms, xs)
    fits = loo_fits(design.t, ys)
    eligible = design.ok & fits.valid & term_contributes(fits.slope, design.t, ys, min_term_contribution)
    for h, term in enumerate(terms):
        if not eligible[h]:
            continue
        candidate = Hypothesis(term, c0=float(ys.mean() - fits.slope[h] * design.t[h].mean()),
                               c1=float(fits.slope[h] / design.scale[h]), smape=float(fits.loo_smape[h]))
        scored.append((term, candidate.smape))
        if candidate.beats(best):
            best = candidate
    return best, scored


def _check_points(xs: np.ndarray, variable: str, min_term_contribution: float, log_terms: bool | None) -> bool:
    """Raise or warn on unusable points (see :func:`fit_pmnf`); return whether log terms are searched."""
    if np.any(xs <= 0):
        raise CropScaleError(f"x ({variable}) must be > 0 for PMNF terms x^i log2(x)^j, got min {xs.min():g}")
    n = xs.size
    if n < MIN_POINTS_HARD:
        raise CropScaleError(
            f"a PMNF fit needs at least {MIN_POINTS_HARD} distinct {variable} values "
            f"(leave-one-out cross-validation), got {n}"
        )
    if n < MIN_POINTS:
        warnings.warn(
            f"PMNF fit on {n} distinct {variable} values: at least {MIN_POINTS} are needed for a "
            "reliable model (Extra-P's minimum)",
            PMNFWarning,
            stacklevel=3,
        )
    if min_term_contribution < 0:
        raise CropScaleError(f"min_term_contribution must be >= 0, got {min_term_contribution!r}")
    if log_terms is None:
        log_terms = bool(xs.min() >= 1.0)
        if not log_terms:
            warnings.warn(
                f"{variable} has values below 1: logarithmic PMNF terms are not searched",
                PMNFWarning,
                stacklevel=3,
            )
    elif log_terms and xs.min() < 1.0:
        raise CropScaleError(f"log terms need every {variable} >= 1, got min {xs.min():g}")
    return log_terms


def fit_pmnf(
    x,
    y,
    *,
    variable: str = "x",
    min_term_contribution: float = 1e-3,
    negative_exponents: bool = False,
    log_terms: bool | None = None,
) -> PMNFModel:
    """Fit a single-parameter PMNF model to measurements (see the module docstring).

    Steps: :func:`aggregate` (medians), :func:`hypotheses` (generation), :func:`select_hypothesis`
    (:func:`design_matrix`, closed-form :func:`loo_fits`, :func:`term_contributes`, selection), then
    the final model's figures on all points.

    Args:
        x: parameter values (> 0), one per measurement or one per row of repetitions.
        y: measured metric: one value per ``x`` entry, or one sequence of repetitions per ``x``
            (medians are modelled; see :func:`aggregate`).
        variable: parameter name for formulas (``"batch_size"``, ``"world_size"`` ...).
        min_term_contribution: a hypothesis is discarded unless ``|c1 term(x)| / |y|`` reaches
            this fraction at one point at least (default 0.1 %).
        negative_exponents: also search ``x^-i`` terms (bounded, for strong scaling / saturation).
        log_terms: search ``log2`` terms; default: only if every ``x >= 1`` (else dropped with a
            :class:`PMNFWarning`).

    Returns:
        The selected :class:`PMNFModel` (model, lead-order term, LOO SMAPE, adjusted R^2).

    Raises:
        CropScaleError: ``x <= 0``, non-finite values, mismatched shapes, fewer than 3 distinct
            ``x`` values, or a negative ``min_term_contribution``.

    Warns:
        PMNFWarning: fewer than 5 distinct ``x`` values; log terms dropped because ``x < 1``.
    """
    xs, ys, reps = aggregate(x, y)
    log_terms = _check_points(xs, variable, min_term_contribution, log_terms)
    terms = hypotheses(negative_exponents=negative_exponents, log_terms=log_terms)
    best, scored = select_hypothesis(xs, ys, terms, min_term_contribution)
    return _model(best, scored, xs, ys, reps, variable)


def _model(best: Hypothesis, scored: list[tuple[Term, float]], xs: np.ndarray, ys: np.ndarray,
           reps: np.ndarray, variable: str) -> PMNFModel:
    """The :class:`PMNFModel` of the selected hypothesis, with its in-sample figures on all points."""
    term, c0, c1, smape = best.term, best.c0, best.c1, best.smape
    if c1 != 0 and abs(c0) <= 1e-9 * float(np.max(np.abs(ys))):
        c0 = 0.0  # round-off of a model without constant
    model_y = np.full_like(ys, c0) if c1 == 0 else c0 + c1 * term(xs)
    rss = float(np.sum((ys - model_y) ** 2))
    return PMNFModel(
        c0=c0,
        c1=c1,
        term=term,
        smape=smape,
        smape_fit=float(_smape(model_y, ys)),
        adjusted_r2=_adjusted_r2(rss, ys, 0 if c1 == 0 else 1),
        rss=rss,
        x=xs,
        y=ys,
        repetitions=reps,
        variable=variable,
        ranking=tuple(sorted(scored, key=lambda ts: ts[1])[:5]),
    )
