"""Error rates of the scaling verdict on seeded synthetic series of known class.

``python -m cropscale scaling assert-bench [--seed 0] [--per-cell 3] [--multi 96] [--resamples 1000]
[--class-step 1] [--json F]``

Three cases, each a count of verdict outcomes on seeded series (evidence label ``count``).

``base`` (:func:`generate`): for each class ``g`` of :data:`cropscale.scaling.landau.LADDER` (24
classes, ``O(1) .. O(n^3)``: every polynomial exponent the PMNF fitter can choose and the log
classes), each point set of :data:`POINT_SETS` (``{1, 2, 4, 8, 16}``, ``{2, 4, ..., 64}``,
``{4, 8, ..., 256}``) and ``per_cell`` series each:

    y_kj = A (c0 + g(x_k)) (1 + sigma e_kj),   e_kj ~ N(0, 1),   j = 1 .. 5 repetitions,

``sigma`` uniform in [2 %, 5 %], the share ``s = g(x_max) / (c0 + g(x_max))`` of the term at the
largest ``x`` uniform in [0.5, 0.95] (``c0 = g(x_max) (1 - s) / s``; ``y = A`` for ``O(1)``), the
amplitude ``A = 10^u``, ``u`` uniform in [-3, 3]. Series ``(g, set, i)`` draws from
``numpy.random.default_rng([seed, g, set, i])``.

``outlier``: the same series with one repetition, at a point and a repetition drawn from
``default_rng([seed, g, set, i, 1])``, multiplied by 3.

Each series is asserted (:func:`cropscale.scaling.verdict.judge`) against its true class, the class
right below it on the ladder (``next-lower``, counted per adjacent pair), the class two below and
one class drawn uniformly from those three or more below (``two-or-more-lower``).

``two-parameter`` (:func:`generate_multi`): ``multi`` series on the grid devices {1, 2, 4, 8, 16} x
batch {2, 4, ..., 64}, 5 repetitions, 2-5 % noise, from ``default_rng([seed, 2, i])``: classes
``a`` (devices) and ``b`` (batch) drawn from the ladder up to ``O(n^2)``, the form drawn from
``c0 + a b``, ``c0 + a + b``, ``c0 + b + a b`` (each term's share of the largest value in
[0.5, 0.95] of the non-constant part), asserted (:func:`cropscale.scaling.multi_verdict.check_scaling_multi`)
against the true product class and the product with one parameter's class one lower (each parameter
where its class is not ``O(1)``).

Rates and targets: false reject (true class fails) <= 5 % per case; next-lower accepted <= 2 % for
every adjacent pair of every case (and per parameter in the two-parameter case); two or more lower
accepted 0 %. Inconclusive rates are reported per kind, without a target. Same seed, same figures on
any machine with the same NumPy random streams.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from cropscale.errors import CropScaleError
from cropscale.evidence import COUNT, MEASURED_MICROBENCHMARK
from cropscale.files import atomic_write_json
from cropscale.scaling.landau import LADDER
from cropscale.scaling.multi_verdict import check_scaling_multi
from cropscale.scaling.pmnf import Term
from cropscale.scaling.verdict import FAIL, INCONCLUSIVE, PASS, judge

POINT_SETS: tuple[tuple[float, ...], ...] = (
    tuple(2.0**k for k in range(0, 5)),
    tuple(2.0**k for k in range(1, 7)),
    tuple(2.0**k for k in range(2, 9)),
)
"""The three point sets: {1..16}, {2..64}, {4..256} in powers of two."""
DEVICES = tuple(2.0**k for k in range(0, 5))
BATCH = tuple(2.0**k for k in range(1, 7))
MULTI_TOP = LADDER.index(Term(2))
"""Highest ladder index of a class in the two-parameter case (``O(n^2)``)."""
REPETITIONS = 5
NOISE_RANGE = (0.02, 0.05)
SHARE_RANGE = (0.5, 0.95)
OUTLIER_FACTOR = 3.0
CASES = ("base", "outlier", "two-parameter")
KINDS = ("true", "next-lower", "two-or-more-lower")
TARGETS = {"false_reject": 0.05, "next_lower_accepted_per_pair": 0.02, "two_or_more_lower_accepted": 0.0}
"""Upper bounds of the rates (fractions), for every case."""
DEFAULT_PER_CELL = 3
DEFAULT_MULTI = 96
DEFAULT_BENCH_RESAMPLES = 1000


@dataclass(frozen=True)
class Series:
    """One synthetic series of known class: ``x`` [n], ``y`` [n, repetitions]."""

    truth: int  # index into LADDER
    point_set: int
    index: int
    x: np.ndarray = field(repr=False)
    y: np.ndarray = field(repr=False)
    noise: float = 0.0
    share: float = 0.0


def _shape(term: Term, x: np.ndarray, share: float) -> np.ndarray:
    if term.is_constant:
        return np.ones_like(x)
    g = term(x)
    return g.max() * (1 - share) / share + g


def generate(seed: int = 0, per_cell: int = DEFAULT_PER_CELL, outlier: bool = False,
             classes: tuple[int, ...] | None = None) -> list[Series]:
    """The ``base`` (or ``outlier``) series of the module docstring, ``24 x 3 x per_cell`` of them.

    ``classes`` (ladder indices) restricts the true classes (a subset for quick checks).

    Raises:
        CropScaleError: ``per_cell`` < 1.
    """
    if not isinstance(per_cell, int) or per_cell < 1:
        raise CropScaleError(f"per_cell must be a positive integer, got {per_cell!r}")
    out = []
    for g, term in enumerate(LADDER):
        if classes is not None and g not in classes:
            continue
        for p, points in enumerate(POINT_SETS):
            x = np.asarray(points)
            for i in range(per_cell):
                rng = np.random.default_rng([int(seed), g, p, i])
                sigma = rng.uniform(*NOISE_RANGE)
                share = rng.uniform(*SHARE_RANGE)
                amplitude = 10.0 ** rng.uniform(-3.0, 3.0)
                f = amplitude * _shape(term, x, share)
                y = f[:, None] * (1.0 + sigma * rng.standard_normal((x.size, REPETITIONS)))
                if outlier:
                    o = np.random.default_rng([int(seed), g, p, i, 1])
                    y[o.integers(x.size), o.integers(REPETITIONS)] *= OUTLIER_FACTOR
                out.append(Series(g, p, i, x, y, float(sigma), float(share)))
    return out


@dataclass(frozen=True)
class MultiSeries:
    """One two-parameter series: ``devices``, ``batch`` ``[m]`` per coordinate, ``y`` ``[m, 5]``."""

    truth: tuple[int, int]  # ladder indices (devices, batch)
    form: str
    index: int
    devices: np.ndarray = field(repr=False)
    batch: np.ndarray = field(repr=False)
    y: np.ndarray = field(repr=False)


def generate_multi(seed: int = 0, count: int = DEFAULT_MULTI) -> list[MultiSeries]:
    """The ``two-parameter`` series: ``y = A (c0 + part) (1 + sigma e)`` on the grid (module docstring).

    With ``g_a = a(d) / a(16)`` and ``g_b = b(batch) / b(64)`` (1 for ``O(1)``), ``part`` is ``g_a g_b``
    (form ``a*b``), ``(g_a + g_b) / 2`` (``a+b``) or ``(g_b + g_a g_b) / 2`` (``a*b+b``);
    ``c0 = max(part) (1 - s) / s``, ``s`` uniform in [0.5, 0.95].
    """
    d, b = np.meshgrid(DEVICES, BATCH, indexing="ij")
    d, b = d.ravel(), b.ravel()
    out = []
    for i in range(count):
        rng = np.random.default_rng([int(seed), 2, i])
        ta, tb = int(rng.integers(0, MULTI_TOP + 1)), int(rng.integers(0, MULTI_TOP + 1))
        form = ("a*b", "a+b", "a*b+b")[int(rng.integers(0, 3))]
        sigma, share = rng.uniform(*NOISE_RANGE), rng.uniform(*SHARE_RANGE)
        amplitude = 10.0 ** rng.uniform(-3.0, 3.0)
        ga = LADDER[ta](d) / LADDER[ta](np.array([DEVICES[-1]]))[0]
        gb = LADDER[tb](b) / LADDER[tb](np.array([BATCH[-1]]))[0]
        part = {"a*b": ga * gb, "a+b": (ga + gb) / 2, "a*b+b": (gb + ga * gb) / 2}[form]
        f = amplitude * (part.max() * (1 - share) / share + part)
        y = f[:, None] * (1 + sigma * rng.standard_normal((d.size, REPETITIONS)))
        out.append(MultiSeries((ta, tb), form, i, d, b, y))
    return out


def _empty() -> dict[str, list[dict[str, int]]]:
    return {k: [{PASS: 0, FAIL: 0, INCONCLUSIVE: 0} for _ in LADDER] for k in KINDS}


@dataclass
class BenchResult:
    """Outcome counts ``counts[case][kind][truth class index][status]`` and the settings.

    In the two-parameter case the ``next-lower`` rows are indexed by the lowered parameter's true
    class, ``true`` rows by the batch class.
    """

    seed: int
    per_cell: int
    multi: int
    resamples: int
    series: dict[str, int]
    counts: dict[str, dict[str, list[dict[str, int]]]]
    seconds: float = 0.0

    def total(self, case: str, kind: str, status: str | None = None) -> int:
        """Assertions of ``kind`` in ``case``, or those with ``status``."""
        rows = self.counts[case][kind]
        return sum(sum(r.values()) if status is None else r.get(status, 0) for r in rows)

    def rate(self, case: str, kind: str, status: str) -> float:
        """Fraction of the assertions of ``kind`` in ``case`` with ``status`` (0 when there are none)."""
        n = self.total(case, kind)
        return self.total(case, kind, status) / n if n else 0.0

    def pair_rates(self, case: str) -> list[tuple[int, int, int]]:
        """``(true class index, next-lower passes, assertions)`` per adjacent pair with assertions."""
        rows = self.counts[case]["next-lower"]
        return [(g, r[PASS], sum(r.values())) for g, r in enumerate(rows) if sum(r.values())]

    def rates(self, case: str) -> dict[str, float]:
        """The headline rates of ``case`` and its inconclusive rate per kind."""
        pairs = self.pair_rates(case)
        out = {
            "false_reject": self.rate(case, "true", FAIL),
            "next_lower_accepted": self.rate(case, "next-lower", PASS),
            "next_lower_accepted_per_pair": max((k / n for _, k, n in pairs), default=0.0),
            "two_or_more_lower_accepted": self.rate(case, "two-or-more-lower", PASS),
        }
        out.update({f"inconclusive_{k}": self.rate(case, k, INCONCLUSIVE) for k in KINDS})
        return out

    def missed(self) -> list[str]:
        """``case: rate`` for every rate of :data:`TARGETS` above its bound."""
        return [f"{c}: {k}" for c in CASES for k, t in TARGETS.items() if self.rates(c)[k] > t + 1e-12]


def _lower(g: int, rng: np.random.Generator) -> list[tuple[str, int]]:
    """The assertions below class ``g``: next lower, two lower, one drawn from three or more lower."""
    out = []
    if g >= 1:
        out.append(("next-lower", g - 1))
    if g >= 2:
        out.append(("two-or-more-lower", g - 2))
    if g >= 3:
        out.append(("two-or-more-lower", int(rng.integers(0, g - 2))))
    return out


def _run_single(series: list[Series], counts: dict, resamples: int, seed: int) -> None:
    for s in series:
        rng = np.random.default_rng([int(seed), s.truth, s.point_set, s.index, 2])
        for kind, e in [("true", s.truth), *_lower(s.truth, rng)]:
            counts[kind][s.truth][judge(s.x, s.y, LADDER[e], resamples=resamples).status] += 1


def _run_multi(series: list[MultiSeries], counts: dict, resamples: int) -> None:
    names = ("devices", "batch")
    for s in series:
        ta, tb = s.truth
        asserts = [("true", (ta, tb), tb)]
        asserts += [("next-lower", (ta - 1, tb), ta)] if ta else []
        asserts += [("next-lower", (ta, tb - 1), tb)] if tb else []
        for kind, (ea, eb), row in asserts:
            v = check_scaling_multi((s.devices, s.batch), s.y, (LADDER[ea], LADDER[eb]), variables=names,
                                    resamples=resamples, fit=False)
            counts[kind][row][v.status] += 1


def run(seed: int = 0, per_cell: int = DEFAULT_PER_CELL, resamples: int = DEFAULT_BENCH_RESAMPLES,
        multi: int = DEFAULT_MULTI, cases: tuple[str, ...] = CASES,
        classes: tuple[int, ...] | None = None) -> BenchResult:
    """Judge every generated series of ``cases`` (module docstring); ``classes`` as for :func:`generate`.

    Raises:
        CropScaleError: an unknown case, ``per_cell`` < 1 or ``multi`` < 0.
    """
    if set(cases) - set(CASES):
        raise CropScaleError(f"cases must be among {CASES}, got {cases!r}")
    if not isinstance(multi, int) or multi < 0:
        raise CropScaleError(f"multi must be a non-negative integer, got {multi!r}")
    counts = {c: _empty() for c in CASES}
    sizes = dict.fromkeys(CASES, 0)
    t0 = time.perf_counter()
    for case in ("base", "outlier"):
        if case in cases:
            series = generate(seed, per_cell, outlier=case == "outlier", classes=classes)
            sizes[case] = len(series)
            _run_single(series, counts[case], resamples, seed)
    if "two-parameter" in cases and multi:
        mseries = generate_multi(seed, multi)
        sizes["two-parameter"] = len(mseries)
        _run_multi(mseries, counts["two-parameter"], resamples)
    return BenchResult(seed, per_cell, multi, resamples, sizes, counts, time.perf_counter() - t0)


def _pct(k: int, n: int) -> str:
    return f"{k}/{n} ({100 * k / n:.1f} %)" if n else "-"


def _case_lines(res: BenchResult, case: str) -> list[str]:
    r = res.rates(case)
    pairs = res.pair_rates(case)
    worst = max(pairs, key=lambda t: (t[1] / t[2], t[2]), default=None)
    label = "pair (true class -> next lower)" if case != "two-parameter" else "true class of the lowered parameter"
    worst_text = "-" if worst is None else f"{worst[1]}/{worst[2]} ({100 * worst[1] / worst[2]:.1f} %) at " \
        f"{LADDER[worst[0]].big_o()}"
    lines = [
        f"[{case}] {res.series[case]} series",
        f"  false reject (true class fails)          {_pct(res.total(case, 'true', FAIL), res.total(case, 'true'))}"
        f"  target <= {100 * TARGETS['false_reject']:.0f} %  [{COUNT}]",
        f"  next-lower class accepted, all pairs     "
        f"{_pct(res.total(case, 'next-lower', PASS), res.total(case, 'next-lower'))}  [{COUNT}]",
        f"  next-lower accepted, worst {label}: {worst_text}  target <= "
        f"{100 * TARGETS['next_lower_accepted_per_pair']:.0f} % every pair  [{COUNT}]",
    ]
    if case != "two-parameter":
        lines.append(f"  two or more classes lower accepted       "
                     f"{_pct(res.total(case, 'two-or-more-lower', PASS), res.total(case, 'two-or-more-lower'))}"
                     f"  target 0 %  [{COUNT}]")
    for k in KINDS if case != "two-parameter" else KINDS[:2]:
        lines.append(f"  inconclusive, {k:<26}{_pct(res.total(case, k, INCONCLUSIVE), res.total(case, k))}  "
                     f"[{COUNT}]")
    del r
    return lines


def format_result(res: BenchResult) -> str:
    """Per case: the rates against their targets; then next-lower acceptance per adjacent pair."""
    lines = [
        f"Scaling-verdict benchmark [{COUNT}: verdict outcomes on seeded synthetic series, seed {res.seed}, "
        f"{res.per_cell} per class and point set, {res.multi} two-parameter series; {res.resamples} bootstrap "
        "resamples per test]",
        f"classes {len(LADDER)} ({LADDER[0].big_o()} .. {LADDER[-1].big_o()}): "
        + ", ".join(t.big_o() for t in LADDER),
        f"point sets {{1..16}}, {{2..64}}, {{4..256}} (powers of 2); two-parameter grid devices {{1..16}} x batch "
        f"{{2..64}}; noise {100 * NOISE_RANGE[0]:.0f}-{100 * NOISE_RANGE[1]:.0f} %; {REPETITIONS} repetitions; "
        f"outlier: one repetition x{OUTLIER_FACTOR:g}",
        "",
    ]
    for case in CASES:
        if res.series[case]:
            lines += _case_lines(res, case)
    lines += ["", "next-lower accepted per adjacent pair (passes / assertions; base | outlier | two-parameter):"]
    cells = []
    for g in range(1, len(LADDER)):
        per = []
        for case in CASES:
            row = res.counts[case]["next-lower"][g]
            n = sum(row.values())
            per.append(f"{row[PASS]}/{n}" if n else "-")
        cells.append(f"{LADDER[g].big_o()}->{LADDER[g - 1].big_o()} {' | '.join(per)}")
    lines += ["  " + "; ".join(cells[k : k + 4]) for k in range(0, len(cells), 4)]
    missed = res.missed()
    n_all = sum(res.total(c, k) for c in CASES for k in KINDS)
    lines += [
        f"wall time {res.seconds:.1f} s for {n_all} assertions [{MEASURED_MICROBENCHMARK}]",
        "targets: all met" if not missed else "targets MISSED: " + ", ".join(missed),
    ]
    return "\n".join(lines)


def write_json(path: str | Path, res: BenchResult) -> None:
    """Write the counts, rates, targets and missed targets of ``res`` to the JSON file ``path`` (atomically)."""
    payload = {**asdict(res), "rates": {c: res.rates(c) for c in CASES}, "targets": TARGETS, "missed": res.missed(),
               "evidence": COUNT}
    atomic_write_json(path, payload)
