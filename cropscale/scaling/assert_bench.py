"""Error rates of the scaling verdict on seeded synthetic series of known class.

``python -m cropscale scaling assert-bench [--seed 0] [--per-cell 11] [--resamples 1000] [--json F]``

Ground truth (:func:`generate`): for each class ``g`` of :data:`cropscale.scaling.landau.LADDER`
(``O(1) .. O(n^3)``, ten classes), each point set of :data:`POINT_SETS` (``{1, 2, 4, 8, 16}``,
``{2, 4, ..., 64}``, ``{4, 8, ..., 256}``) and ``per_cell`` series each:

    y_kj = A (c0 + g(x_k)) (1 + sigma e_kj),   e_kj ~ N(0, 1),   j = 1 .. 5 repetitions,

with ``sigma`` drawn uniformly from [2 %, 5 %], the share ``s = g(x_max) / (c0 + g(x_max))`` of
the term at the largest ``x`` drawn uniformly from [0.5, 0.95] (``c0 = g(x_max) (1 - s) / s``;
``y = A`` for ``O(1)``) and the amplitude ``A = 10^u``, ``u`` uniform in [-3, 3] (it cancels: the
noise is relative). Series ``(g, set, i)`` draws from ``numpy.random.default_rng([seed, g, set, i])``,
so a series does not depend on how many others are generated.

Each series is asserted (:func:`cropscale.scaling.verdict.judge`, its defaults) against its true
class, the class right below it on the ladder and every class two or more below. Rates:

- false reject: true class asserted, verdict ``fail`` (target <= 5 %);
- next-lower accepted: class right below asserted, verdict ``pass`` (target <= 10 %);
- two-or-more-lower accepted: verdict ``pass`` (target 0 %);
- inconclusive: verdict ``inconclusive`` over all assertions (target <= 10 %), and per kind of
  assertion (reported, no target).

The rates are exact counts of verdict outcomes for the stated seed (evidence label ``count``):
the same seed gives the same figures on any machine with the same NumPy random streams.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from cropscale.errors import CropScaleError
from cropscale.evidence import COUNT, MEASURED_MICROBENCHMARK
from cropscale.files import atomic_write_json
from cropscale.scaling.landau import LADDER
from cropscale.scaling.verdict import DEFAULT_RESAMPLES, FAIL, INCONCLUSIVE, PASS, judge

POINT_SETS: tuple[tuple[float, ...], ...] = (
    tuple(2.0**k for k in range(0, 5)),
    tuple(2.0**k for k in range(1, 7)),
    tuple(2.0**k for k in range(2, 9)),
)
"""The three point sets: {1..16}, {2..64}, {4..256} in powers of two."""
REPETITIONS = 5
NOISE_RANGE = (0.02, 0.05)
SHARE_RANGE = (0.5, 0.95)
KINDS = ("true", "next-lower", "two-or-more-lower")
"""Kinds of assertion: the true class, the class right below it, any class two or more below."""
TARGETS = {
    "false_reject": 0.05,
    "next_lower_accepted": 0.10,
    "two_or_more_lower_accepted": 0.0,
    "inconclusive": 0.10,
}
"""Upper bounds of the rates (fractions)."""


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


def generate(seed: int = 0, per_cell: int = 11) -> list[Series]:
    """The ground-truth series of the module docstring, ``10 x 3 x per_cell`` of them.

    Raises:
        CropScaleError: ``per_cell`` < 1.
    """
    if not isinstance(per_cell, int) or per_cell < 1:
        raise CropScaleError(f"per_cell must be a positive integer, got {per_cell!r}")
    out = []
    for g, term in enumerate(LADDER):
        for p, points in enumerate(POINT_SETS):
            x = np.asarray(points)
            for i in range(per_cell):
                rng = np.random.default_rng([int(seed), g, p, i])
                sigma = rng.uniform(*NOISE_RANGE)
                share = rng.uniform(*SHARE_RANGE)
                amplitude = 10.0 ** rng.uniform(-3.0, 3.0)
                if term.is_constant:
                    f = np.full_like(x, amplitude)
                else:
                    gx = term(x)
                    f = amplitude * (gx.max() * (1 - share) / share + gx)
                y = f[:, None] * (1.0 + sigma * rng.standard_normal((x.size, REPETITIONS)))
                out.append(Series(g, p, i, x, y, float(sigma), float(share)))
    return out


@dataclass
class BenchResult:
    """Outcome counts ``counts[kind][truth class index][status]`` and the settings."""

    seed: int
    per_cell: int
    resamples: int
    series: int
    counts: dict[str, list[dict[str, int]]]
    seconds: float = 0.0

    def total(self, kind: str, status: str | None = None) -> int:
        """Assertions of ``kind`` (``true``, ``next-lower``, ``two-or-more-lower``), or those with ``status``."""
        rows = self.counts[kind]
        return sum(sum(r.values()) if status is None else r.get(status, 0) for r in rows)

    def rate(self, kind: str, status: str) -> float:
        """Fraction of the assertions of ``kind`` whose verdict is ``status`` (0 when there are none)."""
        n = self.total(kind)
        return self.total(kind, status) / n if n else 0.0

    @property
    def rates(self) -> dict[str, float]:
        """The four headline rates plus the inconclusive rate of each kind."""
        n_all = sum(self.total(k) for k in KINDS)
        inc_all = sum(self.total(k, INCONCLUSIVE) for k in KINDS)
        out = {
            "false_reject": self.rate("true", FAIL),
            "next_lower_accepted": self.rate("next-lower", PASS),
            "two_or_more_lower_accepted": self.rate("two-or-more-lower", PASS),
            "inconclusive": inc_all / n_all if n_all else 0.0,
        }
        out.update({f"inconclusive_{k}": self.rate(k, INCONCLUSIVE) for k in KINDS})
        return out

    def missed(self) -> list[str]:
        """The rates of :data:`TARGETS` above their bound (the per-kind inconclusive rates are reported only)."""
        r = self.rates
        return [k for k, t in TARGETS.items() if r[k] > t + 1e-12]


def run(seed: int = 0, per_cell: int = 11, resamples: int = DEFAULT_RESAMPLES) -> BenchResult:
    """Judge every generated series against its true class and every class below (module docstring)."""
    series = generate(seed, per_cell)
    counts = {k: [{PASS: 0, FAIL: 0, INCONCLUSIVE: 0} for _ in LADDER] for k in KINDS}
    t0 = time.perf_counter()
    for s in series:
        for e in range(s.truth + 1):
            kind = KINDS[min(s.truth - e, 2)]
            status = judge(s.x, s.y, LADDER[e], resamples=resamples).status
            counts[kind][s.truth][status] += 1
    return BenchResult(seed, per_cell, resamples, len(series), counts, time.perf_counter() - t0)


def _pct(k: int, n: int) -> str:
    return f"{k}/{n} ({100 * k / n:.1f} %)" if n else "-"


def format_result(res: BenchResult) -> str:
    """The table per true class and the rates against their targets, every figure labelled."""
    lines = [
        f"Scaling-verdict benchmark [{COUNT}: verdict outcomes on {res.series} seeded synthetic series, seed "
        f"{res.seed}, {res.per_cell} per class and point set; {res.resamples} bootstrap resamples per test]",
        f"classes {len(LADDER)} (O(1) .. O(n^3)); point sets {{1..16}}, {{2..64}}, {{4..256}} (powers of 2); "
        f"noise {100 * NOISE_RANGE[0]:.0f}-{100 * NOISE_RANGE[1]:.0f} %; {REPETITIONS} repetitions",
        "",
        "| true class | true: fail / inconcl. | next lower: pass / inconcl. | >=2 lower: pass / inconcl. |",
        "| --- | --- | --- | --- |",
    ]
    for g, term in enumerate(LADDER):
        cells = []
        for kind, bad in zip(KINDS, (FAIL, PASS, PASS), strict=True):
            row = res.counts[kind][g]
            n = sum(row.values())
            cells.append("-" if n == 0 else f"{row[bad]} / {row[INCONCLUSIVE]} of {n}")
        lines.append(f"| {term.big_o()} | " + " | ".join(cells) + " |")
    n_all = sum(res.total(k) for k in KINDS)
    lines += [
        "",
        f"false reject (true class fails)        {_pct(res.total('true', FAIL), res.total('true'))}  "
        f"target <= {100 * TARGETS['false_reject']:.0f} %  [{COUNT}]",
        f"next-lower class accepted              {_pct(res.total('next-lower', PASS), res.total('next-lower'))}  "
        f"target <= {100 * TARGETS['next_lower_accepted']:.0f} %  [{COUNT}]",
        f"two or more classes lower accepted     "
        f"{_pct(res.total('two-or-more-lower', PASS), res.total('two-or-more-lower'))}  target 0 %  [{COUNT}]",
        f"inconclusive, all assertions           "
        f"{_pct(sum(res.total(k, INCONCLUSIVE) for k in KINDS), n_all)}  "
        f"target <= {100 * TARGETS['inconclusive']:.0f} %  [{COUNT}]",
    ]
    for k in KINDS:
        lines.append(f"  inconclusive, {k:<24}{_pct(res.total(k, INCONCLUSIVE), res.total(k))}  [{COUNT}]")
    missed = res.missed()
    lines += [
        f"wall time {res.seconds:.1f} s for {n_all} verdicts [{MEASURED_MICROBENCHMARK}]",
        "targets: all met" if not missed else "targets MISSED: " + ", ".join(missed),
    ]
    return "\n".join(lines)


def _write_json(path: Path, res: BenchResult) -> None:
    payload = {**asdict(res), "rates": res.rates, "targets": TARGETS, "missed": res.missed(), "evidence": COUNT}
    atomic_write_json(path, payload)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cropscale scaling assert-bench",
        description="Error rates of the scaling verdict on seeded synthetic series of known class "
        "(false reject, next-lower and two-or-more-lower accepted, inconclusive).",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the generated series (default 0)")
    p.add_argument("--per-cell", type=int, default=11, help="series per class and point set (default 11: 330)")
    p.add_argument("--resamples", type=int, default=DEFAULT_RESAMPLES, help="bootstrap resamples per test")
    p.add_argument("--json", default=None, help="also write counts and rates to this JSON file")
    return p


def main(argv: list[str] | None = None) -> int:
    """Print the benchmark; exit status 0 when every target is met, 1 otherwise.

    Raises:
        CropScaleError: bad arguments.
    """
    args = _parser().parse_args(argv)
    if args.resamples < 100:
        raise CropScaleError(f"--resamples must be >= 100, got {args.resamples}")
    res = run(args.seed, args.per_cell, args.resamples)
    print(format_result(res))
    if args.json:
        _write_json(Path(args.json), res)
    return 0 if not res.missed() else 1
