"""The one registry of reported figures: key, header, unit, format, evidence, source, tables, seeds, producer.

Every figure the report, the study and the end-of-fit summary print is one :class:`FigureSpec` in
:data:`FIGURES`, under the one name it carries end to end: the key of
:attr:`cropscale.runs.record.RunRecord.figures`, the CSV column, the key of a study row's ``figures``. A
cell's number is formatted with the entry's ``fmt`` wherever it is printed; the summary writes ``value unit``
(:meth:`FigureSpec.text`).

Tables: each entry names the tables it appears in (``tables``: a table name of :data:`TABLES`, or a
:class:`Place` where the table gives it a terse header, reads it under another row key, leaves its qualifiers
out, or shows a base and an other column). :func:`table_columns` derives a table's columns from the registry,
in registry order, when the table is rendered: no table lists its keys by hand.

Seeds: ``over_seeds`` says how a study row aggregates a run's figure over the configuration's seeds
(:data:`MEDIAN`, :data:`MEAN_SD`: the mean, and the sample sd as ``<key>_sd``, which the study's tables show
after it; ``""``: not aggregated, e.g. a figure of the row itself).

``source`` says where the figure comes from: a path into ``run.json`` (``summary.<section>.<field>``,
``[]`` for "every entry of the list", a ``dict`` key after a dot) as the scaling callbacks write it
(:mod:`cropscale.runs.schema`), a TensorBoard tag (``tensorboard:<tag>``), or the figures it is
derived from (``derived:``). ``tests/runs/test_figures.py`` resolves every ``run.json`` path against
the typed records, so a field renamed in a callback's record without its entry here fails a test.
A figure of one run is computed by its ``producer`` (a function of :class:`~cropscale.runs.rules.RunInputs`,
mostly a rule of :mod:`cropscale.runs.rules`); a figure of several runs (a ratio, an interval, a verdict) by
the function named in ``rule``.

Adding a reported figure: one entry here, with its tables and its seed rule, and its producer (and the record
field a callback writes when the figure needs a new one). ``tests/runs/test_figures.py`` adds one that way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_RUN, check_label
from cropscale.runs import rules
from cropscale.runs.rules import Figure, RunInputs
from cropscale.runs.schema import STEP_WINDOWS

# ------------------------------------------------------------------------------------ tables
RUNS = "runs"
"""``report.csv``: every figure of a run in one row (for machines)."""
COMPARISON = "comparison"
"""The comparison the report leads with (qualifiers of present values are in the detail tables and the CSV)."""
QUALITY = "quality"
SPEED = "speed"
STEP = "step"
RESOURCES = "resources"
"""The report's detail tables: quality, speed, step decomposition, memory / energy / numerics / data checks."""
PAIRS = "pairs"
"""Precision pairs: an FP32 base against each other precision (a :attr:`Place.paired` figure: both runs')."""
SCALING = "scaling"
AMDAHL = "amdahl"
"""Device scaling: one row per device count of a series; Amdahl's law at each series' fitted serial fraction."""
VERDICTS = "verdicts"
"""The verdicts of configurations compared over their seeds (report and study)."""
STUDY = "study"
SWEEP = "sweep"
"""The study table and the batch-sweep table: rows aggregated over seeds."""
TABLES = (RUNS, COMPARISON, QUALITY, SPEED, STEP, RESOURCES, PAIRS, SCALING, AMDAHL, VERDICTS, STUDY, SWEEP)
"""Every table whose columns :func:`table_columns` derives from the registry."""
SEED_TABLES = (STUDY, SWEEP)
"""Tables whose rows aggregate seeds: a :data:`MEAN_SD` figure brings its ``<key>_sd`` column."""

MEDIAN = "median"
"""``over_seeds``: the median over seeds (times, steps, rates, shares)."""
MEAN_SD = "mean_sd"
"""``over_seeds``: the mean over seeds, and the sample standard deviation as ``<key>_sd`` (macro IoU)."""
AMDAHL_DEVICES = (2, 4, 8)
"""The device counts of the Amdahl table."""



@dataclass(frozen=True)
class Column:
    """One table column.

    Attributes:
        key: the row's figure or value; header: the Markdown header; fmt: a ``format`` spec for
            numbers; figure: True for a figure with an evidence label, False for a descriptive value;
            qualifiers: False to leave a present value's note out of the Markdown footnotes (a short
            table whose detail tables carry them); an n/a cell's reason is always footnoted, and the
            CSV keeps every note.
    """

    key: str
    header: str
    fmt: str = ""
    figure: bool = True
    qualifiers: bool = True

    def with_key(self, key: str) -> Column:
        """The same column reading the row's ``key`` (e.g. the base run's figure under the figure's header)."""
        return dataclasses.replace(self, key=key)

@dataclass(frozen=True)
class Place:
    """Where a figure sits in one table, when not plainly (its registry header and key).

    Attributes:
        table: a name of :data:`TABLES`.
        header: the table's (terse) header instead of the registry's.
        key: the row's key when the table's rows name the value otherwise (a study row's ``world_size``).
        qualifiers: False to leave a present value's note out of the Markdown footnotes
            (:attr:`cropscale.report.tables.Column.qualifiers`).
        paired: two columns, ``base_<key>`` (header ``FP32 ...``) and ``other_<key>`` (``Mixed ...``).
    """

    table: str
    header: str | None = None
    key: str | None = None
    qualifiers: bool = True
    paired: bool = False

    def __post_init__(self) -> None:
        if self.table not in TABLES:
            raise ValueError(f"unknown table {self.table!r}; tables: {', '.join(TABLES)}")


Producer = Callable[[RunInputs], Figure]
"""A figure of one run from what the run folder holds."""


@dataclass(frozen=True)
class FigureSpec:
    """One reported figure (or descriptive value, ``figure=False``).

    Attributes:
        key: the one name of the figure (record key, CSV column, key of a study row's figures).
        header: the Markdown column header, unit in parentheses where it has one.
        unit: the unit the value is in (``ms``, ``s``, ``GiB``, ``J``, ``samples/s``; ``""``: a ratio or count).
        fmt: the ``format`` spec of a printed value (``d`` rounds to an integer).
        evidence: the label of the figure from a fit run (:mod:`cropscale.evidence`); a benchmark record
            labels its own (``measured-microbenchmark``).
        source: where the value comes from (see the module docstring).
        rule: the function that computes a figure of several runs (documentation).
        figure: False for a descriptive value (no evidence label of its own).
        tables: the tables it appears in (a name of :data:`TABLES`, or a :class:`Place`).
        over_seeds: how a study row aggregates it over seeds (:data:`MEDIAN`, :data:`MEAN_SD`, ``""``: not).
        producer: the function that computes it for one run (:class:`~cropscale.runs.rules.RunInputs`);
            None for a figure of several runs or a descriptive value.

    Raises:
        ValueError: an unknown evidence label, table or seed rule.
    """

    key: str
    header: str
    unit: str = ""
    fmt: str = ""
    evidence: str | None = MEASURED_RUN
    source: str = ""
    rule: str = ""
    figure: bool = True
    tables: tuple[str | Place, ...] = ()
    over_seeds: str = ""
    producer: Producer | None = None

    def __post_init__(self) -> None:
        if self.evidence is not None:
            check_label(self.evidence, f"figure {self.key!r}")
        if self.over_seeds not in ("", MEDIAN, MEAN_SD):
            raise ValueError(f"figure {self.key!r}: over_seeds {self.over_seeds!r} is none of {MEDIAN!r},"
                             f" {MEAN_SD!r} or ''")
        object.__setattr__(self, "tables", tuple(t if isinstance(t, Place) else Place(t) for t in self.tables))

    def place(self, table: str) -> Place | None:
        """Where it sits in ``table``; None when it is no column of it."""
        return next((p for p in self.tables if isinstance(p, Place) and p.table == table), None)

    def column(self, header: str | None = None, *, qualifiers: bool = True) -> Column:
        """The table column of this figure (``header`` overrides the registry's where a table is terse)."""
        return Column(self.key, header or self.header, self.fmt, figure=self.figure, qualifiers=qualifiers)

    def columns_in(self, table: str) -> tuple[Column, ...]:
        """Its columns in ``table`` (none, one, a base and an other, or the value and its sd over seeds)."""
        place = self.place(table)
        if place is None:
            return ()
        col = self.column(place.header, qualifiers=place.qualifiers).with_key(place.key or self.key)
        if place.paired:
            return (Column(f"base_{self.key}", f"FP32 {col.header}", col.fmt, col.figure, col.qualifiers),
                    Column(f"other_{self.key}", f"Mixed {col.header}", col.fmt, col.figure, col.qualifiers))
        if self.over_seeds == MEAN_SD and table in SEED_TABLES:
            return col, Column(f"{self.key}_sd", f"{col.header} sd", self.fmt, qualifiers=place.qualifiers)
        return (col,)

    def text(self, fig: Figure, unit: str | None = None) -> str:
        """``value unit`` formatted with :attr:`fmt`, or ``n/a (why)`` (``unit`` overrides :attr:`unit`)."""
        if fig.value is None:
            return f"n/a ({fig.why})"
        value = int(fig.value) if self.fmt.endswith("d") else fig.value
        return f"{format(value, self.fmt)} {self.unit if unit is None else unit}".rstrip()


def _specs(*specs: FigureSpec) -> dict[str, FigureSpec]:
    out: dict[str, FigureSpec] = {}
    for spec in specs:
        if spec.key in out:
            raise ValueError(f"figure {spec.key!r} declared twice in cropscale.runs.figures")
        out[spec.key] = spec
    return out


_STEP = "summary.step_timing.epochs[].windows_ms.step"
_THROUGHPUT = "summary.throughput.epochs[]"
_ENERGY = "summary.energy.epochs[]"
_RANKS = "summary.step_timing.epochs[].step_ms_per_rank.per_rank"
_QUIET = {"qualifiers": False}
_QUALITY = "run.json:summary.quality, else tensorboard:val/mIoU"


def _descriptive(key: str, header: str, fmt: str = "", source: str = "",
                 tables: tuple[str | Place, ...] = ()) -> FigureSpec:
    return FigureSpec(key, header, fmt=fmt, evidence=None, source=source, figure=False, tables=tables)


def _quality(which: str) -> Producer:
    return lambda i: getattr(i.once(rules.quality, i.summary, i.scalars, i.events_problem), which)


def _final_train_loss(i: RunInputs) -> Figure:
    losses = i.scalars.get("train/loss_epoch", [])
    return Figure(losses[-1][1]) if losses else Figure(
        None, why=i.events_problem or "no train/loss_epoch in the TensorBoard events")


def _epoch_time(field: str) -> Producer:
    return lambda i: rules.epoch_time(i.summary, field, i.warmup, i.no_json)


def _named(rule: Callable[..., tuple[Figure, ...]], name: str) -> Producer:
    """The figure ``name`` of a rule that gives several as a named tuple (``rule(summary, warmup, no_json)``)."""
    return lambda i: getattr(i.once(rule, i.summary, i.warmup, i.no_json), name)


def _nth(rule: Callable[..., tuple[Figure, ...]], n: int, *, warmup: bool = True) -> Producer:
    """The ``n``-th figure of a rule that gives several (``rule(summary, [warmup,] no_json)``)."""
    return lambda i: (i.once(rule, i.summary, i.warmup, i.no_json) if warmup else i.once(rule, i.summary, i.no_json))[n]


FIGURES: dict[str, FigureSpec] = _specs(
    # ---------------------------------------------------------------- what ran (descriptive)
    _descriptive("name", "Run", source="the run folder", tables=(RUNS, COMPARISON, QUALITY, SPEED, STEP, RESOURCES)),
    _descriptive("series", "Configuration", source="report.scaling.DeviceSeries.label", tables=(SCALING, AMDAHL)),
    _descriptive("label", "Comparison", source="report.equivalence.Comparison.label", tables=(VERDICTS,)),
    _descriptive("base", "FP32 run", source="report.pairs.PrecisionPair.base", tables=(PAIRS,)),
    _descriptive("other", "Mixed-precision run", source="report.pairs.PrecisionPair.other", tables=(PAIRS,)),
    _descriptive("protocol", "Protocol", source="the study spec", tables=(STUDY,)),
    _descriptive("optimizer", "Optimizer", source="the study spec", tables=(SWEEP,)),
    _descriptive("lr_scaling", "LR rule", source="the study spec", tables=(SWEEP,)),
    _descriptive("status", "Status", source="run.json status", tables=(RUNS, Place(COMPARISON, **_QUIET), QUALITY)),
    _descriptive("kind", "Kind", source="run or microbenchmark", tables=(RUNS, SPEED)),
    _descriptive("compared", "Compared",
                 source="report.equivalence.Comparison.kind: precision, devices or global batch",
                 tables=(VERDICTS,)),
    _descriptive("precision", "Precision", source="run.json precision", tables=(RUNS, COMPARISON, PAIRS, STUDY, SWEEP)),
    _descriptive("strategy", "Strategy", source="run.json distributed", tables=(RUNS, SPEED)),
    _descriptive("devices", "Devices", "d", source="run.json distributed",
                 tables=(RUNS, COMPARISON, SCALING, Place(STUDY, "N", "world_size"), Place(SWEEP, "N", "world_size"))),
    _descriptive("local_batch", "Local batch", "d", source="the study plan", tables=(Place(STUDY, "L"),
                                                                                     Place(SWEEP, "L"))),
    _descriptive("accumulation", "Accumulation", "d", source="the study plan", tables=(Place(STUDY, "A"),
                                                                                       Place(SWEEP, "A"))),
    _descriptive("global_batch", "Global batch", "d", source="tensorboard:optim/global_batch",
                 tables=(RUNS, COMPARISON, PAIRS, Place(STUDY, "G"), Place(SWEEP, "G"))),
    _descriptive("lr", "LR", ".4g", source="the study plan", tables=(STUDY, SWEEP)),
    _descriptive("updates_per_epoch", "Updates/epoch", "g", source="the study plan, checked against global_step",
                 tables=(STUDY, SWEEP)),
    _descriptive("updates_total", "Updates in run", "g", source="updates_per_epoch x epochs", tables=(SWEEP,)),
    _descriptive("seeds", "Seeds", "d", source="the runs of a configuration",
                 tables=(STUDY, SWEEP, Place(VERDICTS, "Seeds base / other"))),
    _descriptive("runs", "Runs", "d", source="the runs of a device count", tables=(SCALING,)),
    # ---------------------------------------------------------------- quality
    FigureSpec("best_miou", "Best val/mIoU", fmt=".4f", source=_QUALITY, rule="rules.quality",
               tables=(RUNS, Place(COMPARISON, **_QUIET), QUALITY, Place(PAIRS, "best mIoU", paired=True), STUDY,
                       SWEEP),
               over_seeds=MEAN_SD, producer=_quality("best")),
    FigureSpec("best_miou_delta", "vs baseline", fmt="+.4f", source="derived: best_miou minus the baseline's",
               rule="report.equivalence.difference_interval", tables=(SWEEP,)),
    _descriptive("best_miou_delta_ci", "vs baseline 90 % CI", source="report.equivalence.difference_interval",
                 tables=(SWEEP,)),
    _descriptive("holds", "Verdict vs baseline (alpha = 0.05)",
                 source="report.equivalence.decide: the batch sweep's comparison with its baseline", tables=(SWEEP,)),
    FigureSpec("best_epoch", "Best epoch", fmt="d", source=_QUALITY, rule="rules.quality",
               tables=(RUNS, QUALITY), producer=_quality("best_epoch")),
    FigureSpec("final_miou", "Final val/mIoU", fmt=".4f", source=_QUALITY, rule="rules.quality",
               tables=(RUNS, QUALITY, STUDY), over_seeds=MEAN_SD, producer=_quality("final")),
    FigureSpec("final_train_loss", "Final train loss", fmt=".4f", source="tensorboard:train/loss_epoch",
               rule="the last epoch's", tables=(RUNS, QUALITY), producer=_final_train_loss),
    FigureSpec("iou_difference", "mIoU change vs FP32", fmt="+.4f", source="derived: best_miou", rule="pairs._ratio",
               tables=(Place(COMPARISON, **_QUIET), PAIRS)),
    FigureSpec("best_diff", "Best mIoU change", fmt="+.4f", source="derived: best_miou over seeds, other - base",
               rule="report.equivalence.quality_verdict", tables=(VERDICTS,)),
    _descriptive("best_ci", "90 % CI (alpha = 0.05 per side)", source="report.equivalence.difference_interval",
                 tables=(VERDICTS,)),
    _descriptive("best_verdict", "Quality verdict (TOST / one-sided t, alpha = 0.05)",
                 source="report.equivalence.decide", tables=(VERDICTS,)),
    FigureSpec("final_diff", "Final mIoU change", fmt="+.4f", source="derived: final_miou over seeds, other - base",
               rule="report.equivalence.quality_verdict", tables=(VERDICTS,)),
    _descriptive("final_verdict", "Final verdict (alpha = 0.05)", source="report.equivalence.decide",
                 tables=(VERDICTS,)),
    _descriptive("convergence", "Convergence", source="report.convergence.convergence_note: 'at this budget' when a"
                 " run of either side was still improving", tables=(VERDICTS,)),
    _descriptive("classes", "Classes moving > margin", source="report.equivalence.compare_runs", tables=(VERDICTS,)),
    # ---------------------------------------------------------------- speed
    FigureSpec("median_step_ms", "Median step (ms)", "ms", ",.1f", source=f"{_STEP}.median", rule="rules.step_time",
               tables=(RUNS, SPEED, Place(STEP, "Median step (ms) = 100 %"), STUDY), over_seeds=MEDIAN,
               producer=_named(rules.step_time, "median")),
    FigureSpec("p95_step_ms", "p95 step (ms)", "ms", ",.1f", source=f"{_STEP}.p95", rule="rules.step_time",
               tables=(RUNS, SPEED, STUDY), over_seeds=MEDIAN, producer=_named(rules.step_time, "p95")),
    FigureSpec("samples_per_s", "Samples/s (training loop)", "training-loop samples/s", ",.2f",
               source=f"{_THROUGHPUT}.samples", rule="rules.samples_per_s",
               tables=(RUNS, Place(COMPARISON, **_QUIET), SPEED, Place(PAIRS, "training-loop samples/s", paired=True),
                       Place(SCALING, "Samples/s (training loop, median)"), STUDY, SWEEP),
               over_seeds=MEDIAN, producer=lambda i: rules.samples_per_s(i.summary, i.warmup, i.no_json)),
    FigureSpec("samples_per_s_epoch_clock", "Samples/s (epoch clock)", "epoch-clock samples/s", ",.2f",
               source=f"{_THROUGHPUT}.samples_per_s_epoch_clock", rule="rules.samples_per_s_epoch_clock",
               tables=(RUNS, SPEED, STUDY, SWEEP), over_seeds=MEDIAN,
               producer=lambda i: rules.samples_per_s_epoch_clock(i.summary, i.warmup, i.no_json)),
    FigureSpec("train_epoch_s", "Train epoch (s)", "s", ",.2f", source=f"{_THROUGHPUT}.train_s",
               rule="rules.epoch_time", tables=(RUNS, SPEED, STUDY, SWEEP), over_seeds=MEDIAN,
               producer=_epoch_time("train_s")),
    FigureSpec("train_epoch_cv", "Train epoch CV", fmt=".1%", source=f"{_THROUGHPUT}.train_s",
               rule="study.aggregate.measured_row (seeds x epochs pooled)", tables=(STUDY,)),
    FigureSpec("val_epoch_s", "Val epoch (s)", "s", ",.2f", source=f"{_THROUGHPUT}.val_s", rule="rules.epoch_time",
               tables=(RUNS, SPEED, STUDY), over_seeds=MEDIAN, producer=_epoch_time("val_s")),
    FigureSpec("epoch_s", "End-to-end epoch (s)", "s", ",.2f", source=f"{_THROUGHPUT}.wall_s",
               rule="rules.epoch_time", tables=(RUNS, SPEED, STUDY), over_seeds=MEDIAN,
               producer=_epoch_time("wall_s")),
    FigureSpec("slowest_rank", "Slowest rank", fmt="d", source=_RANKS, rule="rules.slowest_rank",
               tables=(RUNS, SPEED), producer=_named(rules.slowest_rank, "rank")),
    FigureSpec("slowest_rank_step_ms", "Slowest rank's step (ms)", "ms", ",.1f", source=_RANKS,
               rule="rules.slowest_rank", tables=(RUNS, SPEED), producer=_named(rules.slowest_rank, "step_ms")),
    # ---------------------------------------------------------------- speed against a base
    FigureSpec("speedup_vs_fp32", "Speed-up vs FP32", fmt=".2f",
               source="derived: samples_per_s over the FP32 run's of the same configuration",
               rule="report.pairs.precision_pairs (numbers.speedup)",
               tables=(Place(COMPARISON, **_QUIET), PAIRS)),
    FigureSpec("step_ratio", "Median step ratio", fmt=".3f", source="derived: median_step_ms", rule="pairs._ratio",
               tables=(PAIRS,)),
    FigureSpec("speedup_vs_base", "Speed-up vs base", fmt=".2f",
               source="derived: per-run geometric-mean training-loop samples/s, other over base (the run is the unit)",
               rule="report.equivalence.speedup_interval",
               tables=(Place(VERDICTS, "Speed-up vs base (training-loop samples/s)"),)),
    _descriptive("speedup_vs_base_ci", "Speed-up 90 % CI (over runs)", source="report.equivalence.ratio_interval",
                 tables=(VERDICTS,)),
    FigureSpec("speedup_vs_1_device", "Speed-up vs 1 device", fmt=".2f",
               source="derived: median samples_per_s over seeds on N devices over that on 1 device",
               rule="report.scaling.device_series / study.aggregate.add_speedups (numbers.speedup)",
               tables=(SCALING, Place(STUDY, "S_N"))),
    FigureSpec("speedup_vs_1_device_low", "S_N low (95 %)", fmt=".3f",
               source="derived: per-run geometric-mean training-loop samples/s",
               rule="report.equivalence.ratio_interval", tables=(STUDY,)),
    FigureSpec("speedup_vs_1_device_high", "S_N high (95 %)", fmt=".3f",
               source="derived: per-run geometric-mean training-loop samples/s",
               rule="report.equivalence.ratio_interval", tables=(STUDY,)),
    FigureSpec("efficiency", "Efficiency vs 1 device", fmt=".2f", source="derived: speedup_vs_1_device / devices",
               rule="scaling.efficiency_of",
               tables=(Place(COMPARISON, **_QUIET), SCALING, Place(VERDICTS, "Efficiency"), Place(STUDY, "E_N"))),
    FigureSpec("karp_flatt", "Karp-Flatt serial fraction", fmt=".3f", source="derived: speedup_vs_1_device, devices",
               rule="scaling.amdahl.karp_flatt", tables=(SCALING, Place(STUDY, "Karp-Flatt e"))),
    FigureSpec("samples_to_target_ratio", "Samples to target (other / base)", fmt=".2f",
               source="derived: olympic mean training samples to the target macro IoU, every run counted",
               rule="report.convergence.compare_to_target", tables=(VERDICTS,)),
    _descriptive("to_target_verdict", "Samples-to-target verdict (one-sided t, alpha = 0.05)",
                 source="report.convergence.compare_to_target", tables=(VERDICTS,)),
    _descriptive("runs_needed", "Runs needed (CV of samples to target)", source="report.convergence.runs_needed",
                 tables=(VERDICTS,)),
    FigureSpec("time_ratio", "Time to target (other / base)", fmt=".2f",
               source="derived: olympic mean end-to-end wall time to the target macro IoU, every run counted",
               rule="report.convergence.compare_to_target", tables=(VERDICTS,)),
    FigureSpec("serial_fraction", "Fitted serial fraction", fmt=".3f", evidence=ANALYTICAL_SCENARIO,
               source="derived: speedup_vs_1_device of N > 1", rule="scaling.device_series (Amdahl fit)",
               tables=(AMDAHL,)),
    *(FigureSpec(f"amdahl_speedup_{n}", f"Amdahl speed-up on {n}", fmt=".2f", evidence=ANALYTICAL_SCENARIO,
                 source="derived: serial_fraction", rule="scaling.amdahl.amdahl_speedup", tables=(AMDAHL,))
      for n in AMDAHL_DEVICES),
    # ---------------------------------------------------------------- step decomposition
    *(FigureSpec(f"share_{w}", f"{w.replace('_', ' ')} (%)", "%", ".1f",
                 source=f"summary.step_timing.epochs[].windows_ms.{w}.median", rule="rules.step_shares",
                 tables=(STEP,))
      for w in STEP_WINDOWS),
    FigureSpec("share_sum", "Sum (%)", "%", ".1f", source="derived: the share_* figures", rule="comparison.step_rows",
               tables=(STEP,)),
    FigureSpec("data_wait_host_ms", "Data wait, host clock (ms)", "ms", ",.2f",
               source="summary.step_timing.epochs[].host_windows_ms.data_wait_host.median", rule="rules.host_windows",
               tables=(STEP,)),
    FigureSpec("transfer_host_ms", "Transfer, host clock (ms)", "ms", ",.2f",
               source="summary.step_timing.epochs[].host_windows_ms.transfer_host.median", rule="rules.host_windows",
               tables=(STEP,)),
    FigureSpec("loader_wait_share", "Loader wait share", fmt=".1%",
               source="summary.step_timing.epochs[].windows_ms.data_wait.median", rule="rules.step_share",
               tables=(STUDY,), over_seeds=MEDIAN,
               producer=lambda i: rules.step_share_figure(i.summary, "data_wait", i.warmup, i.no_json)),
    FigureSpec("exposed_comm_share", "Exposed comm share", fmt=".1%",
               source="summary.step_timing.epochs[].windows_ms.comm_exposed.median", rule="rules.step_share",
               tables=(STUDY,), over_seeds=MEDIAN,
               producer=lambda i: rules.step_share_figure(i.summary, "comm_exposed", i.warmup, i.no_json)),
    # ---------------------------------------------------------------- resources, numerics, data checks
    FigureSpec("peak_memory_gib", "Peak GiB", "GiB", ".2f", source="summary.memory.peak_allocated_gib",
               rule="rules.peak_memory", tables=(RUNS, COMPARISON, RESOURCES),
               producer=lambda i: rules.peak_memory(i.summary, i.no_json)),
    FigureSpec("memory_ratio", "Peak memory ratio", fmt=".3f", source="derived: peak_memory_gib", rule="pairs._ratio",
               tables=(PAIRS,)),
    FigureSpec("energy_j", "GPU board energy (J)", "J", ",.0f", source=f"{_ENERGY}.energy_j", rule="rules.energy",
               tables=(RUNS, RESOURCES), producer=_nth(rules.energy, 0)),
    FigureSpec("energy_j_per_sample", "GPU board J/sample", "J/sample", ",.3f", source=f"{_ENERGY}.energy_j",
               rule="rules.energy", tables=(RUNS, Place(COMPARISON, **_QUIET), RESOURCES, STUDY), over_seeds=MEDIAN,
               producer=_nth(rules.energy, 1)),
    FigureSpec("nonfinite", "Non-finite batches", fmt="d", source="summary.nonfinite.per_rank[].nonfinite_batches",
               rule="rules.nonfinite_and_skipped", tables=(RUNS, RESOURCES),
               producer=_nth(rules.nonfinite_and_skipped, 0, warmup=False)),
    FigureSpec("skipped_steps", "Skipped steps", fmt="d", source="summary.nonfinite.per_rank[].skipped_steps",
               rule="rules.nonfinite_and_skipped", tables=(RUNS, RESOURCES),
               producer=_nth(rules.nonfinite_and_skipped, 1, warmup=False)),
    _descriptive("data_warning_count", "Data warnings", "d", source="run.json data_warnings",
                 tables=(RUNS, RESOURCES)),
)
"""Every reported figure by key (see :class:`FigureSpec`), in the order the tables show them."""


def table_columns(table: str) -> tuple[Column, ...]:
    """The columns of ``table``: every entry of :data:`FIGURES` that names it, in registry order.

    Read when the table is rendered, so an entry added to the registry shows at once.

    Raises:
        ValueError: ``table`` is not in :data:`TABLES`.
    """
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
    return tuple(c for spec in FIGURES.values() for c in spec.columns_in(table))


def produced() -> dict[str, FigureSpec]:
    """The entries with a producer: the figures of one run (:func:`cropscale.runs.record.load_run`)."""
    return {k: s for k, s in FIGURES.items() if s.producer is not None}


def over_seeds(rule: str) -> tuple[str, ...]:
    """The keys a study row aggregates over seeds by ``rule`` (:data:`MEDIAN` or :data:`MEAN_SD`)."""
    return tuple(k for k, s in FIGURES.items() if s.over_seeds == rule)


def column(key: str, header: str | None = None, *, qualifiers: bool = True) -> Column:
    """The table column of figure ``key`` (see :meth:`FigureSpec.column`).

    Raises:
        KeyError: ``key`` is not in :data:`FIGURES` (declare the figure there first).
    """
    try:
        spec = FIGURES[key]
    except KeyError:
        raise KeyError(f"figure {key!r} is not declared in cropscale.runs.figures.FIGURES") from None
    return spec.column(header, qualifiers=qualifiers)


def columns(*keys: str) -> tuple[Column, ...]:
    """The columns of ``keys``, in order, headers and formats from the registry."""
    return tuple(column(k) for k in keys)
