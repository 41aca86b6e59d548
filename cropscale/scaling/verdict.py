"""Does a measured series grow faster than an expected Landau class? A verdict with the noise in view.

After Shudler, Calotoiu, Hoefler, Strube and Wolf ("Exascaling your library: will your
implementation meet your expectations?", ICS 2015; TPDS 2019), who check empirical PMNF models
(Extra-P) against an expectation with a model search focused on the expected class and its
neighbours. :func:`judge` compares two families of one-term PMNF models ``c0 + c1 x^i log2^j x``
over the classes of :func:`cropscale.scaling.landau.search_space` (the ladder ``O(1) .. O(n^3)``):

- *within*: lead order ``<=`` the expectation (either sign of ``c1``), or any order with a falling
  fit (``c1 <= 0``: the metric does not grow);
- *above*: lead order ``>`` the expectation with a growing fit (``c1 > 0``).

Statistic
    Repetitions far from their point's median are first screened out by the rule of
    :mod:`cropscale.scaling.noise` (more than 7 robust standard deviations, at most ``r // 4`` per
    point; each one is reported). At each ``x`` the kept repetitions are summarised by their
    interquartile mean (the mean without the lowest and the highest quarter, ``r // 4`` values each
    side; the plain mean for ``r <= 3``). Each model is fitted by weighted least squares with weights
    ``1 / se^2``, ``se = c(r) sigma |centre| / sqrt(r)``: ``sigma`` is the relative noise of one
    repetition pooled over every point (noise proportional to the value, as for times; the root mean
    square of the kept repetitions' deviations, each clipped at 4 robust standard deviations),
    ``c(r)`` the standard error of the interquartile mean over that of a plain mean for Gaussian noise
    (1.065 for ``r = 5``; :func:`cropscale.scaling.noise.iqm_se_factor`). Without
    repetitions ``sigma`` is the relative residual scatter of the best model of the search space.
    ``sigma`` has a floor of :data:`NOISE_FLOOR`, so exact counts give decisive verdicts. With
    ``chi2`` a fit's weighted residual sum of squares, the statistic is
    ``D = (min chi2 within - min chi2 above) / phi``, ``phi = max(1, min chi2 / (points - 2))``: how
    much better the best growing model above the expectation explains the data than the best model
    within it, in noise units (``phi`` absorbs a misfit of every model).

Calibration: a residual bootstrap over the repetitions
    The relative deviations of the repetitions from their point's mean (times ``sqrt(r / (r - 1))``)
    are pooled; ``resamples`` synthetic series are drawn from a model ``m`` (each repetition
    ``m(x) (1 + e)``, ``e`` drawn from the pool; without repetitions the pool holds the best
    model's relative residuals) and ``D`` is recomputed on each, noise re-estimated:

    - ``p_within``: drawn from the best within model, the fraction whose ``D`` reaches the
      observed one: how often data that obeys the expectation shows as much excess;
    - ``p_above``: drawn from each alternative, the fraction whose ``D`` is at most the observed
      one: how often data with that excess looks as innocent; the alternatives are the best above
      model and the best models of the next :data:`NEIGHBOURS` classes above the expectation, each
      with its term raised, if needed, to rise by ``resolution`` times the largest centre over the
      measured range; ``p_above`` is the largest of these fractions.

    A plain bootstrap of the repetitions (each point's repetitions drawn with replacement) gives
    ``support``: the fraction of resamples whose ``D`` is positive (best class above the
    expectation).

Decision
    ``fail``: ``D > 0``, ``p_within < alpha_fail`` (0.05) and ``support >= 0.5`` (when there are
    repetitions): the data supports a lead order above the expectation. ``pass``: not a failure,
    at least :data:`MIN_POINTS` points, ``p_above < alpha_pass`` (0.005) and the best within model
    fits within the noise (its chi2 is reached by at least :data:`ALPHA_FIT` of the series drawn
    from it). Otherwise ``inconclusive``, with the reason: too few points, too narrow a range
    (``max x / min x <`` :data:`NARROW_RANGE`) or too much noise, the numbers behind it, and what
    would decide it (:mod:`cropscale.scaling.hints`: more repetitions, more points or a wider range,
    estimated from the observed noise and the two models that the data cannot separate).

The error rates of this rule on seeded synthetic series of known class are measured by
:mod:`cropscale.scaling.assert_bench` (``python -m cropscale scaling assert-bench``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cropscale.errors import CropScaleError
from cropscale.scaling.hints import decide
from cropscale.scaling.landau import excess_factor, search_space
from cropscale.scaling.noise import (
    Screened,
    deviations,
    interquartile_mean,
    iqm_se_factor,
    noise_of,
    pooled_noise,
    screen,
)
from cropscale.scaling.pmnf import Term

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
STATUSES: tuple[str, ...] = (PASS, FAIL, INCONCLUSIVE)
"""The three outcomes of a verdict."""


class AssertionOutcome:
    """What a performance assertion's verdict (one or more parameters) says from ``status``, ``label``, ``evidence``."""

    status: str
    label: str
    evidence: str

    @property
    def passed(self) -> bool:
        """The data excludes a growth above the expectation."""
        return self.status == PASS

    @property
    def failed(self) -> bool:
        """The data supports a growth above the expectation (in one parameter at least)."""
        return self.status == FAIL

    @property
    def inconclusive(self) -> bool:
        """The data cannot separate the expectation from the class above it (none failed)."""
        return self.status == INCONCLUSIVE

    def _heading(self) -> str:
        """``performance assertion held for <label> [<evidence>]``: the first line of ``message()``."""
        held = {PASS: "held", FAIL: "failed", INCONCLUSIVE: "was inconclusive"}[self.status]
        return (f"performance assertion {held}" + (f" for {self.label}" if self.label else "")
                + (f" [{self.evidence}]" if self.evidence else ""))
NOISE_FLOOR = 1e-6
"""Relative noise below which a series counts as exact (1 ppm of the value)."""
MIN_POINTS = 5
"""Distinct ``x`` values below which a verdict never passes (Extra-P's minimum for a model)."""
MIN_POINTS_HARD = 3
"""Distinct ``x`` values below which no verdict is possible (two coefficients and one check)."""
NARROW_RANGE = 8.0
"""``max x / min x`` below which an inconclusive verdict is blamed on the range."""
NEIGHBOURS = 2
"""Classes right above the expectation that a pass must exclude, besides the best model above."""
DEFAULT_RESOLUTION = 0.1
"""Smallest excess a pass vouches for: a term rising by 10 % of the largest centre over the range."""
DEFAULT_RESAMPLES = 1000
"""Synthetic series per bootstrap."""
ALPHA_FAIL = 0.05
"""Level of the failure test (``p_within`` below it fails)."""
ALPHA_PASS = 0.005
"""Level of the exclusion tests (``p_above`` below it passes)."""
ALPHA_FIT = 0.01
"""A best within model whose chi2 fewer than this fraction of its own series reach does not fit."""

_TIE = 1e-6
"""chi2 and ``D`` values closer than this (noise units squared) count as equal: round-off of exact data."""

@dataclass(frozen=True)
class ClassFit:
    """One model ``f(x) = c0 + c1 * term(x)`` fitted by weighted least squares.

    Attributes:
        term: the PMNF term; its order is the model's class.
        c0, c1: coefficients (unit of the metric).
        chi2: weighted residual sum of squares of the free fit, in noise units.
    """

    term: Term
    c0: float
    c1: float
    chi2: float

    def __call__(self, x) -> np.ndarray:
        """The fitted model at ``x`` (array of the same shape)."""
        x = np.asarray(x, dtype=np.float64)
        if self.term.is_constant:
            return np.full_like(x, self.c0)
        return self.c0 + self.c1 * self.term(x)

    def formula(self, var: str = "x") -> str:
        """E.g. ``"3.1 + 0.98 * x * log2(x)"``."""
        if self.term.is_constant or self.c1 == 0:
            return f"{self.c0:.4g}"
        sign = "-" if self.c1 < 0 else "+"
        return f"{self.c0:.4g} {sign} {abs(self.c1):.4g} * {self.term.formula(var)}"

    def order_text(self, var: str = "x") -> str:
        """The class, e.g. ``"O(x log x)"``, or ``"O(x^2), falling"`` for a term with ``c1 < 0``."""
        text = self.term.order.big_o(var)
        return f"{text}, falling" if self.c1 < 0 and not self.term.order.is_constant else text


@dataclass(frozen=True)
class ClassVerdict:
    """Outcome of :func:`judge` (the module docstring defines every number).

    Attributes:
        status: ``"pass"``, ``"fail"`` or ``"inconclusive"``.
        expected: the expected order.
        within: the best within model; above: the best model above the expectation (free fit; the
            alternatives of the exclusion tests, raised to ``resolution``, are in ``excluded``).
        statistic: ``D``, noise units (``-inf`` when nothing above grows).
        p_within: bootstrap fraction under ``within`` (0..1).
        p_above: the largest bootstrap fraction under the alternatives; excluded: each alternative
            (raised to ``resolution`` where needed) with its fraction.
        support: plain-bootstrap fraction with ``D > 0`` (``nan`` without repetitions).
        adequacy: fraction of the series drawn from ``within`` whose chi2 reaches the observed one.
        noise: relative noise of one repetition (0.03 = 3 %); noise_source: ``"repetitions"`` or
            ``"residuals"``.
        resamples: synthetic series per bootstrap; resolution: as passed.
        reason: why the verdict is inconclusive, ending with ``hint`` (empty otherwise).
        x, centres, repetitions: the data judged (distinct ``x`` ascending, interquartile means of
            the kept repetitions, kept repetitions per ``x``).
        screened: the repetitions screened out as outliers (:func:`cropscale.scaling.noise.screen`).
        hint: for an inconclusive verdict, what would decide it (:func:`cropscale.scaling.hints.decide`).
    """

    status: str
    expected: Term
    within: ClassFit
    above: ClassFit
    statistic: float
    p_within: float
    p_above: float
    excluded: tuple[tuple[ClassFit, float], ...]
    support: float
    adequacy: float
    noise: float
    noise_source: str
    resamples: int
    resolution: float
    reason: str = ""
    x: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    centres: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    repetitions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int), repr=False)
    screened: tuple[Screened, ...] = ()
    hint: str = ""

    def excess(self, var: str = "n") -> str:
        """The factor by which the best above model exceeds the expectation (``"log n"`` ...)."""
        return excess_factor(self.above.term, self.expected, var)

    def describe(self, var: str = "n") -> str:
        """One sentence in class terms: ``"exceeds O(n) by a factor log n: ..."``, ``"within ..."``."""
        e = self.expected.big_o(var)
        if self.status == FAIL:
            sup = "" if math.isnan(self.support) else (
                f"; {100 * self.support:.0f} % of bootstrap resamples of the repetitions fit best above {e}")
            return (
                f"exceeds {e} by a factor {self.excess(var)}: f({var}) = {self.above.formula(var)} explains the "
                f"data better than any model of {e} or below (D = {self.statistic:.3g}; p = {self.p_within:.3f}: "
                f"{_count(self.p_within, self.resamples)} of {self.resamples} series drawn from the best "
                f"{self.within.order_text(var)} model f({var}) = {self.within.formula(var)} show as much excess{sup})"
            )
        if self.status == PASS:
            alts = ", ".join(f"{a.term.order.big_o(var)} (p = {p:.3f})" for a, p in self.excluded)
            return (
                f"within {e}: best model f({var}) = {self.within.formula(var)} ({self.within.order_text(var)}); "
                f"a growing excess rising by {100 * self.resolution:.0f} % of the metric or more is excluded "
                f"for {alts} (fraction of {self.resamples} series drawn from each that look like the data)"
            )
        return f"inconclusive: {self.reason}"


def _count(p: float, n: int) -> int:
    return int(round(p * n))


# ----------------------------------------------------------------------------- input


def _rows(x, y) -> tuple[np.ndarray, list[np.ndarray]]:
    """Distinct ``x`` ascending and the repetitions at each (the layouts ``fit_pmnf`` accepts)."""
    xs = np.asarray(x, dtype=np.float64)
    if xs.ndim != 1 or xs.size == 0:
        raise CropScaleError(f"x must be a non-empty 1-D sequence of numbers, got shape {xs.shape}")
    if isinstance(y, np.ndarray) and y.ndim == 2:
        rows = [np.asarray(r, dtype=np.float64) for r in y]
    else:
        items = list(y)
        if any(isinstance(v, (Sequence, np.ndarray)) and not isinstance(v, str) for v in items):
            rows = [np.atleast_1d(np.asarray(v, dtype=np.float64)).ravel() for v in items]
        elif len(items) == xs.size:
            rows = [np.array([float(v)]) for v in items]
        else:
            raise CropScaleError(f"y must have one value per x ({xs.size}) or one sequence of repetitions per x")
    if len(rows) != xs.size:
        raise CropScaleError(f"y has {len(rows)} rows of repetitions for {xs.size} x values")
    if any(r.size == 0 for r in rows):
        raise CropScaleError("y has an x value without any repetition")
    if not np.all(np.isfinite(xs)) or not all(np.all(np.isfinite(r)) for r in rows):
        raise CropScaleError("x and y must be finite numbers (got nan or inf)")
    if np.any(xs <= 0):
        raise CropScaleError(f"x must be > 0 for the terms x^i log2(x)^j, got min {xs.min():g}")
    ux, inverse = np.unique(xs, return_inverse=True)
    grouped = [np.concatenate([rows[k] for k in np.flatnonzero(inverse == u)]) for u in range(ux.size)]
    return ux, grouped


# ----------------------------------------------------------------------------- fits


@dataclass(frozen=True)
class _Design:
    """Weighted least squares of ``c0 + c1 t(x)`` for every term at once (fixed ``x`` and weights)."""

    terms: tuple[Term, ...]
    within: np.ndarray  # [T] bool: order <= expectation
    q: np.ndarray  # [T, n, 2] orthonormal bases of the weighted columns (the constant's second column is 0)
    slope: np.ndarray  # [T, n]: c1 = slope @ centres (zeros for the constant)
    sw: np.ndarray  # [n] square roots of the relative weights

    @classmethod
    def build(cls, xs: np.ndarray, sw: np.ndarray, terms: tuple[Term, ...], expected: Term) -> _Design:
        n = xs.size
        qs = np.zeros((len(terms), n, 2))
        slope = np.zeros((len(terms), n))
        w = sw * sw
        for k, t in enumerate(terms):
            g = t(xs)
            cols = [np.ones(n)] if t.is_constant else [np.ones(n), g / np.max(np.abs(g))]
            q, _ = np.linalg.qr(np.stack(cols, axis=1) * sw[:, None])
            qs[k, :, : q.shape[1]] = q
            if not t.is_constant:
                gc = g - np.sum(w * g) / np.sum(w)
                slope[k] = w * gc / np.sum(w * gc * gc)
        within = np.array([t.order <= expected for t in terms])
        return cls(terms, within, qs, slope, sw)

    def chi2(self, centres: np.ndarray, sigma: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``[B, T]`` chi2 of every term for centres ``[B, n]`` and noise ``[B]``, and within-membership.

        The ``[B, T]`` membership of the within family: a falling fit above the expectation counts as
        within.
        """
        z = centres * self.sw[None, :]
        proj = np.einsum("tjk,bj->btk", self.q, z)  # [B, T, 2]
        res = z[:, None, :] - np.einsum("tjk,btk->btj", self.q, proj)  # residuals on the weighted scale
        c = np.sum(res * res, axis=2) / np.maximum(sigma, NOISE_FLOOR)[:, None] ** 2
        falling = (centres @ self.slope.T) <= 0
        return c, self.within[None, :] | falling

    @staticmethod
    def statistic(c: np.ndarray, within: np.ndarray, dof: int) -> np.ndarray:
        """``D`` for every row (``-inf`` when no term above grows)."""
        phi = np.maximum(1.0, c.min(axis=1) / dof)
        c_in = np.where(within, c, np.inf).min(axis=1)
        c_up = np.where(within, np.inf, c).min(axis=1)
        out = np.full(c.shape[0], -np.inf)
        ok = np.isfinite(c_up)
        out[ok] = (c_in[ok] - c_up[ok]) / phi[ok]
        return out

    def best(self, c: np.ndarray, within: np.ndarray, family: bool) -> int:
        """Index of the best term of the within (``family=True``) or the above family.

        Within, a falling term above the expectation is preferred to the best term of order <= the
        expectation only if it lowers chi2 by more than 1 (a noise unit). Above: the lowest class
        above the expectation when no term above grows.
        """
        mask = within if family else ~within
        if not mask.any():
            return int(np.flatnonzero(~self.within)[0])
        k = int(np.flatnonzero(mask)[np.argmin(c[mask])])
        if family and not self.within[k]:
            k_low = int(np.flatnonzero(self.within)[np.argmin(c[self.within])])
            k = k if c[k] < c[k_low] - 1.0 else k_low
        return k


def _wls(xs: np.ndarray, w: np.ndarray, term: Term, y: np.ndarray, c1: float | None = None) -> tuple[float, float]:
    """``(c0, c1)`` of ``c0 + c1 term`` by weighted least squares (``c1`` fixed when given)."""
    if term.is_constant:
        return float(np.sum(w * y) / np.sum(w)), 0.0
    g = term(xs)
    if c1 is None:
        gm, ym = np.sum(w * g) / np.sum(w), np.sum(w * y) / np.sum(w)
        c1 = float(np.sum(w * (g - gm) * (y - ym)) / np.sum(w * (g - gm) ** 2))
    return float(np.sum(w * (y - c1 * g)) / np.sum(w)), float(c1)


def _raised(xs, w, term: Term, y, floor: float, chi2: float) -> ClassFit:
    """The best model of ``term``, its term raised to rise by ``floor`` over the range if it rises less."""
    c0, c1 = _wls(xs, w, term, y)
    g = term(xs)
    span = float(g.max() - g.min())
    if c1 * span < floor and span > 0:
        c0, c1 = _wls(xs, w, term, y, c1=floor / span)
    return ClassFit(term, c0, c1, chi2)


# ----------------------------------------------------------------------------- verdict


def _check_args(expected: Term, resamples: int, resolution: float, alphas: tuple[float, float]) -> None:
    if not isinstance(expected, Term):
        raise CropScaleError(f"expected must be a Term (see landau.parse_order), got {expected!r}")
    if not isinstance(resamples, int) or isinstance(resamples, bool) or resamples < 100:
        raise CropScaleError(f"resamples must be an integer >= 100, got {resamples!r}")
    if not isinstance(resolution, (int, float)) or isinstance(resolution, bool) or not (0 < resolution <= 1):
        raise CropScaleError(f"resolution must be a fraction in (0, 1] (0.1 = 10 %), got {resolution!r}")
    for name, a in zip(("alpha_fail", "alpha_pass"), alphas, strict=True):
        if not (isinstance(a, (int, float)) and 0 < a < 0.5):
            raise CropScaleError(f"{name} must be in (0, 0.5), got {a!r}")


def judge(
    x,
    y,
    expected: Term,
    *,
    negative_exponents: bool = False,
    log_terms: bool | None = None,
    resolution: float = DEFAULT_RESOLUTION,
    resamples: int = DEFAULT_RESAMPLES,
    alpha_fail: float = ALPHA_FAIL,
    alpha_pass: float = ALPHA_PASS,
    seed: int = 0,
    variable: str = "n",
) -> ClassVerdict:
    """Judge whether the series ``(x, y)`` grows faster than ``expected`` (see the module docstring).

    Args:
        x: parameter values (> 0).
        y: one value per ``x`` entry (``x`` may repeat), or one sequence of repetitions per ``x``
            (ragged allowed), or a 2-D array ``[len(x), repetitions]``.
        expected: the expected order (:func:`cropscale.scaling.landau.parse_order`).
        negative_exponents: also model bounded terms ``x^-1/2, x^-1, x^-2`` (saturating curves).
        log_terms: search the log classes; default: when every ``x >= 1``.
        resolution: smallest excess a pass vouches for, a fraction of the largest centre (0.1 = 10 %).
        resamples: synthetic series per bootstrap (>= 100).
        alpha_fail: level of the failure test, in (0, 0.5).
        alpha_pass: level of the exclusion tests behind a pass, in (0, 0.5).
        seed: seed of the bootstrap: the verdict is reproducible.
        variable: the parameter's name in the reason of an inconclusive verdict.

    Returns:
        :class:`ClassVerdict`.

    Raises:
        CropScaleError: bad arguments; fewer than 3 distinct ``x``; non-finite values; ``x <= 0``;
            a log expectation or ``log_terms=True`` with some ``x < 1``.
    """
    _check_args(expected, resamples, resolution, (alpha_fail, alpha_pass))
    xs, rows = _rows(x, y)
    if xs.size < MIN_POINTS_HARD:
        raise CropScaleError(f"a verdict needs at least {MIN_POINTS_HARD} distinct x values, got {xs.size}")
    if log_terms is None:
        log_terms = bool(xs.min() >= 1.0)
    elif log_terms and xs.min() < 1.0:
        raise CropScaleError(f"log terms need every x >= 1, got min {xs.min():g}")
    expected = expected.order
    terms = search_space(expected, negative_exponents=negative_exponents, log_terms=log_terms)
    state = _State.build(xs, rows, terms, expected, resolution, resamples, seed)
    state.variable = str(variable)
    return state.verdict(alpha_fail, alpha_pass)


@dataclass
class _State:
    """The data, the design and the noise of one verdict, and its steps."""

    xs: np.ndarray
    rows: list[np.ndarray]
    centres: np.ndarray
    counts: np.ndarray
    scale: np.ndarray
    design: _Design
    expected: Term
    sigma: float
    pool: np.ndarray
    resolution: float
    resamples: int
    rng: np.random.Generator
    variable: str = "n"

    screened: tuple[Screened, ...] = ()

    @classmethod
    def build(cls, xs, rows, terms, expected, resolution, resamples, seed) -> _State:
        rows, screened = screen(xs, rows)
        counts = np.array([r.size for r in rows])
        centres = np.array([float(interquartile_mean(r)) for r in rows])
        top = float(np.max(np.abs(centres)))
        scale = np.maximum(np.abs(centres), max(top, 1e-300) * 1e-12)
        sw = np.sqrt(counts) / (np.array([iqm_se_factor(int(r)) for r in counts]) * scale)
        design = _Design.build(xs, sw, terms, expected)
        sigma, pool = pooled_noise(rows, scale)
        state = cls(xs, rows, centres, counts, scale, design, expected, sigma, pool, resolution, resamples,
                    np.random.default_rng(seed), screened=screened)
        if pool.size == 0:  # no repetitions: the best model's relative residuals are the noise
            c, _ = design.chi2(centres[None, :], np.array([1.0]))
            k = int(np.argmin(c[0]))
            best = ClassFit(terms[k], *_wls(xs, sw * sw, terms[k], centres), float(c[0, k]))
            state.pool = (centres - best(xs)) / scale * math.sqrt(xs.size / state.dof)
            state.sigma = math.sqrt(max(float(c[0, k]), 0.0) / state.dof)
        return state

    @property
    def dof(self) -> int:
        return max(self.xs.size - 2, 1)

    @property
    def replicated(self) -> bool:
        return bool(np.any(self.counts > 1))

    @property
    def floor(self) -> float:
        return self.resolution * float(np.max(np.abs(self.centres)))

    def chi2(self, centres: np.ndarray, sigma: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """chi2 and within-membership of every term (see :meth:`_Design.chi2`).

        Without repetitions each series' noise is its best model's residual scatter.
        """
        if self.replicated:
            return self.design.chi2(centres, sigma)
        c, within = self.design.chi2(centres, np.ones(centres.shape[0]))
        s = np.sqrt(np.maximum(c.min(axis=1), 0.0) / self.dof)
        return c / np.maximum(s, NOISE_FLOOR)[:, None] ** 2, within

    def draw(self, model: ClassFit) -> np.ndarray:
        """chi2 and within-membership of ``resamples`` series drawn from ``model`` (pooled deviations)."""
        b, n = self.resamples, self.xs.size
        centres, devs = np.empty((b, n)), []
        m = model(self.xs)
        for k, r in enumerate(self.counts):
            reps = m[k] * (1.0 + self.pool[self.rng.integers(0, self.pool.size, (b, r))])
            centres[:, k] = interquartile_mean(reps)
            if r > 1:
                devs.append(deviations(reps, self.scale[k]))
        sigma = noise_of(np.concatenate(devs, axis=1)) if devs else np.zeros(b)
        return self.chi2(centres, sigma)

    def support(self) -> float:
        """Plain bootstrap of the repetitions: fraction of resamples with ``D > 0``."""
        if not self.replicated:
            return math.nan
        b = self.resamples
        centres = np.empty((b, self.xs.size))
        for k, r in enumerate(self.rows):
            centres[:, k] = interquartile_mean(r[self.rng.integers(0, r.size, (b, r.size))])
        c, within = self.design.chi2(centres, np.full(b, max(self.sigma, NOISE_FLOOR)))
        return float(np.mean(self.design.statistic(c, within, self.dof) > 0))

    def alternatives(self, c: np.ndarray, k_up: int) -> list[ClassFit]:
        """The best above model and the next :data:`NEIGHBOURS` classes above, raised to the resolution."""
        above = np.flatnonzero(~self.design.within)
        picks = [k_up] + [int(k) for k in above[:NEIGHBOURS] if int(k) != k_up]
        w = self.design.sw**2
        return [_raised(self.xs, w, self.design.terms[k], self.centres, self.floor, float(c[k])) for k in picks]

    def verdict(self, alpha_fail: float, alpha_pass: float) -> ClassVerdict:
        c, inside = self.chi2(self.centres[None, :], np.array([max(self.sigma, NOISE_FLOOR)]))
        d_obs = float(self.design.statistic(c, inside, self.dof)[0])
        k_in = self.design.best(c[0], inside[0], True)
        k_up = self.design.best(c[0], inside[0], False)
        term = self.design.terms[k_in]
        within = ClassFit(term, *_wls(self.xs, self.design.sw**2, term, self.centres), float(c[0, k_in]))
        c_0, in_0 = self.draw(within)
        p_within = float(np.mean(self.design.statistic(c_0, in_0, self.dof) >= d_obs - _TIE))
        adequacy = float(np.mean(np.where(in_0, c_0, np.inf).min(axis=1) >= within.chi2 - _TIE))
        excluded = []
        for alt in self.alternatives(c[0], k_up):
            c_1, in_1 = self.draw(alt)
            excluded.append((alt, float(np.mean(self.design.statistic(c_1, in_1, self.dof) <= d_obs + _TIE))))
        p_above = max(p for _, p in excluded)
        t_up = self.design.terms[k_up]
        above = ClassFit(t_up, *_wls(self.xs, self.design.sw**2, t_up, self.centres), float(c[0, k_up]))
        support = self.support()
        status = INCONCLUSIVE
        if d_obs > 0 and p_within < alpha_fail and (math.isnan(support) or support >= 0.5):
            status = FAIL
        elif self.xs.size >= MIN_POINTS and p_above < alpha_pass and adequacy >= ALPHA_FIT:
            status = PASS
        reason, hint = "", ""
        if status == INCONCLUSIVE:
            alt = excluded[0][0]
            hint = decide(self.xs, self.counts, max(self.sigma, NOISE_FLOOR), alt,
                          [t for t, w in zip(self.design.terms, self.design.within, strict=True) if w], self.variable,
                          MIN_POINTS)
            reason = self.reason(within, alt, adequacy, p_within, p_above) + "; " + hint
        return ClassVerdict(
            status, self.expected, within, above, d_obs, p_within, p_above, tuple(excluded), support,
            adequacy, max(self.sigma, NOISE_FLOOR), "repetitions" if self.replicated else "residuals",
            self.resamples, self.resolution, reason, self.xs, self.centres, self.counts, self.screened, hint,
        )

    def reason(self, within: ClassFit, above: ClassFit, adequacy: float, p_within: float, p_above: float) -> str:
        v = self.variable
        e, a = self.expected.big_o(v), above.term.order.big_o(v)
        lo, hi, n = float(self.xs[0]), float(self.xs[-1]), self.xs.size
        if n < MIN_POINTS:
            why = f"too few points ({n} distinct {v} values; at least {MIN_POINTS} are needed to pass)"
        elif adequacy < ALPHA_FIT:
            why = (f"no model of {e} or below fits within the noise (its chi2 is reached by "
                   f"{100 * adequacy:.1f} % of the series drawn from it)")
        elif hi / lo < NARROW_RANGE:
            why = f"too narrow a range (max {v} / min {v} = {hi / lo:.3g} < {NARROW_RANGE:g})"
        else:
            why = "too much noise"
        diff = float(np.max(np.abs(within(self.xs) - above(self.xs)) / self.scale))
        noise = ("one repetition varies by" if self.replicated else "the best model's residuals scatter by")
        return (
            f"{why}: the data cannot separate {e} from {a} over {v} in [{lo:g}, {hi:g}] ({n} points, repetitions "
            f"{_reps_text(self.counts)}): the best {within.order_text(v)} model and the {a} alternative differ by at "
            f"most {100 * diff:.2g} % while {noise} {100 * max(self.sigma, NOISE_FLOOR):.2g} %; the excess is "
            f"not significant (p = {p_within:.3f}) and not excluded (p = {p_above:.3f})"
        )


def _reps_text(counts: np.ndarray) -> str:
    lo, hi = int(counts.min()), int(counts.max())
    return str(lo) if lo == hi else f"{lo}-{hi}"
