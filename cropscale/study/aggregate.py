"""Rows of the study table: seeds aggregated, and speed-up, efficiency and Karp-Flatt against 1 rank.

Each measured configuration's seeds are aggregated into one row; speed-up, efficiency and the
Karp-Flatt serial fraction are taken against the measured 1-rank row.

Per run, every figure follows its rule in :mod:`cropscale.runs.rules` over the spec's measured
epochs (the run reader :func:`cropscale.runs.record.load_run` with ``warmup_epochs``); per
configuration: each figure over seeds by its registry rule (``over_seeds`` of
:data:`cropscale.runs.figures.FIGURES`: the median for times, steps, rates, shares; the mean and sample
standard deviation for macro IoU).

Batch sweep (:func:`sweep_summary`): one curve of best macro IoU against the global batch per optimiser,
LR rule and precision, each point compared with the small-batch baseline by the one decision rule
(:func:`cropscale.report.equivalence.decide`, through the study's comparisons); :func:`holds_to` gives the largest
``G`` up to which every point's verdict is ``equivalent``, and where it cannot say more.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from cropscale.evidence import MEASURED_RUN
from cropscale.numbers import mean_sd, median, speedup
from cropscale.report.equivalence import EQUIVALENT, INCONCLUSIVE, mean_interval, ratio_interval, run_rate
from cropscale.report.verdicts import Comparison
from cropscale.runs.figures import FIGURES, MEAN_SD, MEDIAN, SEED_TABLES, over_seeds, table_columns
from cropscale.runs.record import RunRecord
from cropscale.runs.rules import BOARD_ENERGY
from cropscale.scaling.amdahl import karp_flatt
from cropscale.study import protocol as P
from cropscale.study.plan import Configuration
from cropscale.study.spec import PRECISION_LABELS


@dataclass
class StudyRow:
    """One configuration of the study table: the planned (exact) columns and the figures by key.

    ``figures``: registry key (:data:`cropscale.runs.figures.FIGURES`) -> value in the figure's unit (times in
    s, steps in ms, shares as fractions), the sample sd of a :data:`~cropscale.runs.figures.MEAN_SD` figure as
    ``<key>_sd``; ``row[key]`` reads one (None: not measured or not predicted, with the reason in
    ``why[<key>]``) and ``row[key] = value`` sets one. ``notes`` hold what qualifies the row,
    ``figure_notes`` what qualifies one figure. ``train_epoch_s_low`` / ``_high``: the 95 % interval of the
    training-epoch time over runs (each run's median measured epoch) that the predictions propagate (not a column).
    """

    evidence: str
    protocol: str
    precision: str
    world_size: int
    local_batch: int
    accumulation: int
    global_batch: int
    lr: float
    lr_scaling: str
    updates_per_epoch: float | None
    seeds: int = 0
    optimizer: str = "adamw"
    figures: dict[str, float | None] = field(default_factory=dict)
    train_epoch_s_low: float | None = None
    train_epoch_s_high: float | None = None
    config_key: str = ""
    notes: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)
    figure_notes: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, key: str) -> float | None:
        """The figure ``key``; None when not set. Raises KeyError: ``key`` is no registered figure."""
        return self.figures.get(_registered(key))

    def __setitem__(self, key: str, value: float | None) -> None:
        """Set the figure ``key``. Raises KeyError: ``key`` is no registered figure."""
        self.figures[_registered(key)] = value

    def to_json(self) -> dict:
        """The row as ``study.json`` holds it: the planned fields and every figure of the study's tables by key."""
        doc = asdict(self)
        figures = doc.pop("figures")
        keys = dict.fromkeys(c.key for table in SEED_TABLES for c in table_columns(table) if c.figure)
        return {**doc, **{k: figures.get(k) for k in keys}, **figures}


def _registered(key: str) -> str:
    base = key.removesuffix("_sd")
    if key in FIGURES or (base != key and base in FIGURES and FIGURES[base].over_seeds == MEAN_SD):
        return key
    raise KeyError(f"{key!r} is no figure of cropscale.runs.figures.FIGURES (nor the sd of a mean_sd figure)")


def base_row(config: Configuration, evidence: str) -> StudyRow:
    """The planned (exact) columns of a configuration's row."""
    plan = config.plan
    return StudyRow(
        evidence=evidence, protocol=config.protocol, precision=PRECISION_LABELS[config.precision],
        world_size=config.world_size, local_batch=plan.local_batch, accumulation=plan.accumulation,
        global_batch=plan.global_batch, lr=plan.lr, lr_scaling=plan.lr_scaling,
        updates_per_epoch=config.updates_per_epoch, optimizer=plan.optimizer, config_key=config.key,
    )


def run_notes(record: RunRecord) -> tuple[list[str], dict[str, str]]:
    """What qualifies one run (``notes``) and why some of its figures are n/a (``why``, by row field)."""
    notes, why = [], {}
    if record.run_json is None:
        notes.append(f"no run.json in {record.path} (fit without the scaling callbacks)")
    elif record.status != "finished":
        notes.append(f"run.json status {record.status!r}")
    for key in (*over_seeds(MEDIAN), *over_seeds(MEAN_SD)):  # one name: the run's figure and the row's figure
        fig = record.figures.get(key)
        if fig is None or fig.value is None:
            why[key] = fig.why if fig is not None else "not recorded by the run"
    if record.value("exposed_comm_share") is None and record.run_json is not None:
        comm = record.run_json.summary.step_timing.comm_timing if record.run_json.summary.step_timing else {}
        why["exposed_comm_share"] = (
            "no gradient all-reduce on 1 rank" if record.devices == 1
            else f"not timed: {comm.get('reason') or comm or 'no comm_exposed window in run.json'}")
    return notes, why


def _seed_figures(row: StudyRow, runs: Sequence[RunRecord]) -> None:
    """Each run's figure (itself over the measured epochs) over seeds, by its registry rule (``over_seeds``)."""
    for key in over_seeds(MEDIAN):
        row[key] = median(r.value(key) for r in runs)
    for key in over_seeds(MEAN_SD):
        row[key], row[f"{key}_sd"] = mean_sd(r.value(key) for r in runs)


def measured_row(config: Configuration, runs: Sequence[RunRecord], train_samples: int | None,
                 extra_notes: Sequence[str] = ()) -> StudyRow:
    """Aggregate the seeds of one measured configuration into a table row.

    ``train_epoch_cv`` is the coefficient of variation of all measured training-epoch times (seeds x
    epochs): the dispersion. ``extra_notes`` (e.g. a batch mismatch found in the logs) are added. A run that is no
    valid result (:mod:`cropscale.runs.validity`) or did not finish is left out, a note saying which and why.
    """
    left_out = [f"left out {r.path}: {r.excluded}" for r in runs if r.excluded]
    runs = [r for r in runs if not r.excluded]
    row = base_row(config, MEASURED_RUN)
    row.seeds = len(runs)
    _seed_figures(row, runs)
    pooled = [t for r in runs for t in r.epoch_seconds.get("train_s", [])]
    if len(pooled) > 1 and statistics.fmean(pooled) > 0:
        row["train_epoch_cv"] = statistics.stdev(pooled) / statistics.fmean(pooled)
    elif len(pooled) == 1:
        row.why["train_epoch_cv"] = "one measured epoch in all: no dispersion"
    if row["energy_j_per_sample"] is not None:
        row.figure_notes["energy_j_per_sample"] = (
            f"{BOARD_ENERGY}; of the measured epochs, their validation included, per training sample")
    measured_updates = median(r.updates_per_epoch for r in runs)
    if measured_updates is not None:
        if config.updates_per_epoch is None:
            row.updates_per_epoch = measured_updates
        elif not math.isclose(measured_updates, config.updates_per_epoch):
            row.notes.append(
                f"measured {measured_updates:g} optimizer updates/epoch, planned {config.updates_per_epoch}")
    if row["samples_per_s"] is None and train_samples and row["train_epoch_s"]:
        row["samples_per_s"] = train_samples / row["train_epoch_s"]
        row.notes.append("samples/s = training samples per epoch / median training-epoch time")
    row.notes.extend(n for n in [*left_out, *extra_notes] if n not in row.notes)
    for r in runs:
        notes, why = run_notes(r)
        row.notes.extend(n for n in notes if n not in row.notes)
        for key, text in why.items():
            row.why.setdefault(key, text)
    if len(runs) < 2:
        row.why.setdefault("final_miou_sd", "one seed: no spread")
        row.why.setdefault("best_miou_sd", "one seed: no spread")
    return row


def add_speedups(rows: list[StudyRow]) -> None:
    """Set S_N, E_N = S_N / N and the Karp-Flatt fraction of measured rows, in place.

    ``S_N = Q_N / Q_1`` (:func:`cropscale.numbers.speedup`, the report's definition too): the median training
    samples/s over seeds against the measured 1-rank row of the same protocol and precision (the same samples
    per epoch for every N, so it is the protocol's samples/s at equal work). Batch-sweep rows are left alone
    (their runs differ in the global batch, not the world size).
    """
    scaling = [r for r in rows if r.protocol in P.PROTOCOLS]
    q1 = {(r.protocol, r.precision): r["samples_per_s"] for r in scaling
          if r.evidence == MEASURED_RUN and r.world_size == 1}
    for r in scaling:
        base = q1.get((r.protocol, r.precision))
        if r.evidence != MEASURED_RUN or not r["samples_per_s"] or not base:
            continue
        r["speedup_vs_1_device"] = speedup(r["samples_per_s"], base)
        r["efficiency"] = P.efficiency(r["speedup_vs_1_device"], r.world_size)
        if r.world_size > 1:
            r["karp_flatt"] = karp_flatt(r["speedup_vs_1_device"], r.world_size)


SPEEDUP_CONFIDENCE = 0.95
"""Two-sided level of the study table's S_N and training-epoch intervals (propagated into the predictions; no
verdict is read from them)."""


def add_speedup_intervals(rows: Sequence[StudyRow], records: dict[str, Sequence[RunRecord]]) -> None:
    """Set the 95 % interval of each measured S_N (and of its training-epoch time), in place; the run is the unit.

    S_N: :func:`cropscale.report.equivalence.ratio_interval` of the per-run geometric-mean training-loop samples/s
    (:func:`~cropscale.report.equivalence.run_rate`) of the N-rank runs against the 1-rank runs of the same protocol
    and precision. Training-epoch time: the t-interval of the mean over runs of each run's median measured epoch
    (``scipy.stats.t``). Epochs of one run are no repeats (they share the machine's state): one run per side gives
    no interval. ``records``: ``config_key`` -> the runs of that configuration.
    """
    ones = {(r.protocol, r.precision): r for r in rows
            if r.evidence == MEASURED_RUN and r.world_size == 1 and r.protocol in P.PROTOCOLS}
    for r in rows:
        runs = [run for run in records.get(r.config_key) or () if not run.excluded]
        times = [median(run.epoch_seconds.get("train_s", [])) for run in runs]
        times = [t for t in times if t is not None]
        if r.evidence == MEASURED_RUN and len(times) > 1:
            r.train_epoch_s_low, r.train_epoch_s_high = mean_interval(times, SPEEDUP_CONFIDENCE)
        one = ones.get((r.protocol, r.precision))
        if one is None or r.evidence != MEASURED_RUN or r.protocol not in P.PROTOCOLS or r.world_size == 1:
            continue
        base = [run_rate(run).rate for run in records.get(one.config_key) or ()]
        ci = ratio_interval(base, [run_rate(run).rate for run in runs], SPEEDUP_CONFIDENCE)
        r["speedup_vs_1_device_low"], r["speedup_vs_1_device_high"] = ci.low, ci.high
        if ci.low is None:
            r.why["speedup_vs_1_device_low"] = r.why["speedup_vs_1_device_high"] = ci.why or "no interval"


# ------------------------------------------------------------------------------------------ batch sweep
BASELINE = "baseline"
"""The verdict word of the baseline point itself (it holds by definition)."""


def holds_to(points: Sequence[tuple[int, str | None]]) -> tuple[int | None, int | None]:
    """The largest ``G`` up to which every point's verdict is ``equivalent``, and the first ``G`` where it is not.

    Walking ``G`` upwards, the quality holds to the last point before the first whose verdict against the baseline
    (:func:`cropscale.report.equivalence.decide`) is not ``equivalent`` (``worse``, ``better``, ``inconclusive``,
    or None: no verdict); a larger ``G`` that is equivalent again does not count (nothing between is known to
    hold). The baseline point itself (:data:`BASELINE`) holds.

    Args:
        points: ``(G, verdict)`` pairs, any order.

    Returns:
        ``(holds_to, stops_at)``: None for the first when even the smallest ``G`` does not hold; None for the second
        when every point holds.
    """
    last = None
    for g, verdict in sorted(points, key=lambda p: p[0]):
        if verdict not in (EQUIVALENT, BASELINE):
            return last, g
        last = g
    return last, None


@dataclass
class SweepPoint:
    """One point's comparison with the baseline: the verdict word and the text it rests on (with its interval).

    Attributes:
        verdict: ``baseline``, ``equivalent``, ``worse``, ``better``, ``inconclusive``, or ``no verdict``.
        estimate, low, high: best macro IoU minus the baseline's, with its 90 % interval (None where none).
        text: the quality verdict's text (:meth:`~cropscale.report.equivalence.QualityVerdict.text`) or why none.
        at_budget: the comparison's convergence note says a run was still improving.
    """

    verdict: str
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    text: str = ""
    at_budget: bool = False


def sweep_point(comparison: Comparison | None) -> SweepPoint:
    """The :class:`SweepPoint` of a batch-sweep comparison (None: the point has no comparison)."""
    if comparison is None:
        return SweepPoint("no verdict", text="no comparison with the baseline (no usable runs)")
    b = comparison.best
    budget = comparison.convergence is not None and comparison.convergence.at_budget
    return SweepPoint(b.verdict, b.interval.estimate, b.interval.low, b.interval.high, b.text(), budget)


@dataclass
class SweepCurve:
    """One curve of a batch sweep: an optimiser, LR rule and precision over the global batches.

    Attributes:
        rows: the measured rows, by ``G``; points: ``G`` -> :class:`SweepPoint`; holds_to / stops_at: from
        :func:`holds_to`; verdict: one sentence.
    """

    optimizer: str
    lr_scaling: str
    precision: str
    rows: list[StudyRow]
    points: dict[int, SweepPoint] = field(default_factory=dict)
    holds_to: int | None = None
    stops_at: int | None = None
    verdict: str = ""


@dataclass
class SweepSummary:
    """The batch sweep's comparison with its small-batch baseline.

    Attributes:
        baseline: the baseline row (None when it has no measured macro IoU; ``why`` says so).
        tolerance: the equivalence margin of the sweep's verdicts (absolute macro IoU, 0..1).
        curves: one per optimiser x LR rule x precision.
        not_run: ``(configuration key, G, optimizer, LR rule, reason)`` of the points not run.
    """

    baseline: StudyRow | None
    tolerance: float
    curves: list[SweepCurve]
    not_run: list[tuple[str, int, str, str, str]]
    why: str = ""


def _verdict(curve: SweepCurve, not_run: Sequence[int]) -> str:
    """The curve's sentence: holds to G (from the verdicts), where it stops or cannot say more, and why."""
    held = [curve.points[g] for g in sorted(curve.points) if curve.holds_to is not None and g <= curve.holds_to]
    budget = " at this budget (a run still improving)" if any(p.at_budget for p in held) else ""
    stop = curve.points.get(curve.stops_at) if curve.stops_at is not None else None
    if curve.holds_to is None:
        text = (f"cannot say at any G: at its smallest G = {curve.stops_at}" if stop and stop.verdict == INCONCLUSIVE
                else f"does not hold even at its smallest G = {curve.stops_at}:")
    elif stop is None:
        text = f"holds to G = {curve.holds_to}{budget}, the largest G run"
    elif stop.verdict == INCONCLUSIVE:
        text = f"holds to G = {curve.holds_to}{budget}; cannot say beyond G = {curve.holds_to}: at G = {curve.stops_at}"
    else:
        text = f"holds to G = {curve.holds_to}{budget}; at G = {curve.stops_at}"
    if stop is not None:
        text += f" {stop.text}"
    larger = [g for g in not_run if g > max((r.global_batch for r in curve.rows), default=0)]
    if larger:
        text += f" (not run: G = {', '.join(str(g) for g in larger)})"
    return text + f" [{MEASURED_RUN}]"


def sweep_summary(rows: Sequence[StudyRow], configs: Sequence[Configuration], baseline: tuple[str, str, int],
                  tolerance: float, comparisons: Sequence[Comparison] = ()) -> SweepSummary:
    """Curves, baseline and verdicts of the batch sweep.

    Args:
        rows: the study rows (only ``batch-sweep`` rows are used).
        configs: the planned configurations (the batch sweep's unrunnable ones are listed as not run).
        baseline: ``(optimizer, LR rule, G)`` of the small-batch baseline (:attr:`BatchSweepSpec.baseline`).
        tolerance: the equivalence margin of the sweep's verdicts (absolute macro IoU).
        comparisons: the study's comparisons; those of kind ``batch sweep`` give each point's verdict, found by the
            point's configuration key (``other_key``).
    """
    sweep_rows = [r for r in rows if r.protocol == P.BATCH_SWEEP and r.evidence == MEASURED_RUN]
    not_run = [(c.key, c.plan.global_batch, c.plan.optimizer, c.plan.lr_scaling, c.reason) for c in configs
               if c.protocol == P.BATCH_SWEEP and not c.runnable]
    opt, rule, g0 = baseline
    base = next((r for r in sweep_rows if (r.optimizer, r.lr_scaling, r.global_batch) == (opt, rule, g0)), None)
    summary = SweepSummary(base, tolerance, [], not_run)
    if base is None or base["best_miou"] is None:
        summary.baseline = None
        summary.why = f"the baseline ({opt}, {rule}, G = {g0}) has no measured best macro IoU"
    by_key = {c.other_key: c for c in comparisons if c.kind == "batch sweep"}
    runs_of = {c.key: c.runs_as or c.key for c in configs}
    same = {k for k, runs in runs_of.items() if base is not None and runs == runs_of.get(base.config_key)}
    keys = list(dict.fromkeys((c.plan.optimizer, c.plan.lr_scaling, PRECISION_LABELS[c.precision]) for c in configs
                              if c.protocol == P.BATCH_SWEEP))  # the spec's order
    for optimizer, lr_scaling, precision in keys:
        mine = sorted((r for r in sweep_rows if (r.optimizer, r.lr_scaling, r.precision)
                       == (optimizer, lr_scaling, precision)), key=lambda r: r.global_batch)
        if not mine:
            continue
        curve = SweepCurve(optimizer, lr_scaling, precision, mine)
        if summary.baseline is not None:
            curve.points = {r.global_batch: SweepPoint(BASELINE, 0.0, text="the baseline") if r.config_key in same
                            else sweep_point(by_key.get(r.config_key)) for r in mine}
            curve.holds_to, curve.stops_at = holds_to([(g, p.verdict) for g, p in curve.points.items()])
            skipped = [g for _, g, o, lr, _ in not_run if (o, lr) == (optimizer, lr_scaling)]
            curve.verdict = _verdict(curve, skipped)
        else:
            curve.verdict = f"no verdict: {summary.why}"
        summary.curves.append(curve)
    return summary
