"""The one registry of reported figures: key, header, unit, format, evidence and source, declared once.

Every figure the report, the study and the end-of-fit summary print is one :class:`FigureSpec` in
:data:`FIGURES`, under the one name it carries end to end: the key of
:attr:`cropscale.runs.record.RunRecord.figures`, the CSV column, the field of a study row. A table is a
list of keys (:func:`columns`); a cell's number is formatted with the entry's ``fmt`` wherever it is
printed; the summary writes ``value unit`` (:meth:`FigureSpec.text`).

``source`` says where the figure comes from: a path into ``run.json`` (``summary.<section>.<field>``,
``[]`` for "every entry of the list", a ``dict`` key after a dot) as the scaling callbacks write it
(:mod:`cropscale.runs.schema`), a TensorBoard tag (``tensorboard:<tag>``), or the figures it is
derived from (``derived:``). ``tests/runs/test_figures.py`` resolves every ``run.json`` path against
the typed records, so a field renamed in a callback's record without its entry here fails a test.
The rule that turns the source into the figure is the function named in ``rule`` (mostly in
:mod:`cropscale.runs.rules`).

Adding a reported figure: one entry here and its producer (a rule, and the record field a callback
writes when the figure needs a new one); a table shows it once its key is in that table's key list.
"""

from __future__ import annotations

from dataclasses import dataclass

from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_RUN, check_label
from cropscale.runs.rules import Figure
from cropscale.runs.schema import STEP_WINDOWS
from cropscale.runs.tables import Column


@dataclass(frozen=True)
class FigureSpec:
    """One reported figure (or descriptive value, ``figure=False``).

    Attributes:
        key: the one name of the figure (record key, CSV column, study-row field).
        header: the Markdown column header, unit in parentheses where it has one.
        unit: the unit the value is in (``ms``, ``s``, ``GiB``, ``J``, ``samples/s``; ``""``: a ratio or count).
        fmt: the ``format`` spec of a printed value (``d`` rounds to an integer).
        evidence: the label of the figure from a fit run (:mod:`cropscale.evidence`); a benchmark record
            labels its own (``measured-microbenchmark``).
        source: where the value comes from (see the module docstring).
        rule: the function that computes it from ``source``.
        figure: False for a descriptive value (no evidence label of its own).
    """

    key: str
    header: str
    unit: str = ""
    fmt: str = ""
    evidence: str | None = MEASURED_RUN
    source: str = ""
    rule: str = ""
    figure: bool = True

    def __post_init__(self) -> None:
        if self.evidence is not None:
            check_label(self.evidence, f"figure {self.key!r}")

    def column(self, header: str | None = None, *, qualifiers: bool = True) -> Column:
        """The table column of this figure (``header`` overrides the registry's where a table is terse)."""
        return Column(self.key, header or self.header, self.fmt, figure=self.figure, qualifiers=qualifiers)

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


def _descriptive(key: str, header: str, fmt: str = "", source: str = "") -> FigureSpec:
    return FigureSpec(key, header, fmt=fmt, evidence=None, source=source, figure=False)


FIGURES: dict[str, FigureSpec] = _specs(
    # ---------------------------------------------------------------- what ran (descriptive)
    _descriptive("name", "Run", source="the run folder"),
    _descriptive("status", "Status", source="run.json status"),
    _descriptive("kind", "Kind", source="run or microbenchmark"),
    _descriptive("precision", "Precision", source="run.json precision"),
    _descriptive("strategy", "Strategy", source="run.json distributed"),
    _descriptive("devices", "Devices", "d", source="run.json distributed"),
    _descriptive("global_batch", "Global batch", "d", source="tensorboard:optim/global_batch"),
    _descriptive("data_warning_count", "Data warnings", "d", source="run.json data_warnings"),
    # ---------------------------------------------------------------- quality
    FigureSpec("best_miou", "Best val/mIoU", fmt=".4f", source="tensorboard:val/mIoU", rule="rules.quality"),
    FigureSpec("best_epoch", "Best epoch", fmt="d", source="tensorboard:val/mIoU", rule="rules.quality"),
    FigureSpec("final_miou", "Final val/mIoU", fmt=".4f", source="tensorboard:val/mIoU", rule="rules.quality"),
    FigureSpec("final_train_loss", "Final train loss", fmt=".4f", source="tensorboard:train/loss_epoch",
               rule="record._figures (the last epoch's)"),
    # ---------------------------------------------------------------- speed
    FigureSpec("median_step_ms", "Median step (ms)", "ms", ",.1f", source=f"{_STEP}.median", rule="rules.step_time"),
    FigureSpec("p95_step_ms", "p95 step (ms)", "ms", ",.1f", source=f"{_STEP}.p95", rule="rules.step_time"),
    FigureSpec("samples_per_s", "Samples/s", "samples/s", ",.2f", source=f"{_THROUGHPUT}.samples",
               rule="rules.samples_per_s"),
    FigureSpec("train_epoch_s", "Train epoch (s)", "s", ",.2f", source=f"{_THROUGHPUT}.train_s",
               rule="rules.epoch_time"),
    FigureSpec("val_epoch_s", "Val epoch (s)", "s", ",.2f", source=f"{_THROUGHPUT}.val_s", rule="rules.epoch_time"),
    FigureSpec("epoch_s", "End-to-end epoch (s)", "s", ",.2f", source=f"{_THROUGHPUT}.wall_s",
               rule="rules.epoch_time"),
    FigureSpec("slowest_rank", "Slowest rank", fmt="d",
               source="summary.step_timing.epochs[].step_ms_per_rank.per_rank", rule="rules.slowest_rank"),
    FigureSpec("slowest_rank_step_ms", "Slowest rank's step (ms)", "ms", ",.1f",
               source="summary.step_timing.epochs[].step_ms_per_rank.per_rank", rule="rules.slowest_rank"),
    # ---------------------------------------------------------------- step decomposition
    *(FigureSpec(f"share_{w}", f"{w.replace('_', ' ')} (%)", "%", ".1f",
                 source=f"summary.step_timing.epochs[].windows_ms.{w}.median", rule="rules.step_shares")
      for w in STEP_WINDOWS),
    FigureSpec("share_sum", "Sum (%)", "%", ".1f", source="derived: the share_* figures", rule="comparison.step_rows"),
    FigureSpec("data_wait_host_ms", "Data wait, host clock (ms)", "ms", ",.2f",
               source="summary.step_timing.epochs[].host_windows_ms.data_wait_host.median", rule="rules.host_windows"),
    FigureSpec("transfer_host_ms", "Transfer, host clock (ms)", "ms", ",.2f",
               source="summary.step_timing.epochs[].host_windows_ms.transfer_host.median", rule="rules.host_windows"),
    FigureSpec("loader_wait_share", "Loader wait share", fmt=".1%",
               source="summary.step_timing.epochs[].windows_ms.data_wait.median", rule="rules.step_share"),
    FigureSpec("exposed_comm_share", "Exposed comm share", fmt=".1%",
               source="summary.step_timing.epochs[].windows_ms.comm_exposed.median", rule="rules.step_share"),
    # ---------------------------------------------------------------- resources and numerics
    FigureSpec("energy_j", "Energy (J)", "J", ",.0f", source=f"{_ENERGY}.energy_j", rule="rules.energy"),
    FigureSpec("energy_j_per_sample", "J/sample", "J/sample", ",.3f", source=f"{_ENERGY}.energy_j",
               rule="rules.energy"),
    FigureSpec("peak_memory_gib", "Peak GiB", "GiB", ".2f", source="summary.memory.peak_allocated_gib",
               rule="rules.peak_memory"),
    FigureSpec("nonfinite", "Non-finite batches", fmt="d", source="summary.nonfinite.per_rank[].nonfinite_batches",
               rule="rules.nonfinite_and_skipped"),
    FigureSpec("skipped_steps", "Skipped steps", fmt="d", source="summary.nonfinite.per_rank[].skipped_steps",
               rule="rules.nonfinite_and_skipped"),
    # ---------------------------------------------------------------- comparisons of runs
    FigureSpec("speedup", "Speed-up", fmt=".2f", source="derived: samples_per_s over the table's base run",
               rule="pairs.precision_pairs / scaling.device_series / study aggregate"),
    FigureSpec("efficiency", "Efficiency vs 1 device", fmt=".2f", source="derived: speedup / devices",
               rule="scaling.efficiency_of"),
    FigureSpec("karp_flatt", "Karp-Flatt serial fraction", fmt=".3f", source="derived: speedup, devices",
               rule="scaling.amdahl.karp_flatt"),
    FigureSpec("iou_difference", "mIoU change vs FP32", fmt="+.4f", source="derived: best_miou", rule="pairs._ratio"),
    FigureSpec("step_ratio", "Median step ratio", fmt=".3f", source="derived: median_step_ms", rule="pairs._ratio"),
    FigureSpec("memory_ratio", "Peak memory ratio", fmt=".3f", source="derived: peak_memory_gib", rule="pairs._ratio"),
    FigureSpec("serial_fraction", "Fitted serial fraction", fmt=".3f", evidence=ANALYTICAL_SCENARIO,
               source="derived: speedup of N > 1", rule="scaling.device_series (Amdahl fit)"),
    # ---------------------------------------------------------------- study only (over seeds)
    FigureSpec("train_epoch_cv", "Train epoch CV", fmt=".1%", source=f"{_THROUGHPUT}.train_s",
               rule="study.aggregate.measured_row"),
    FigureSpec("speedup_low", "S_N low (95 %)", fmt=".3f", source="derived: per-epoch samples/s",
               rule="runs.equivalence.ratio_interval"),
    FigureSpec("speedup_high", "S_N high (95 %)", fmt=".3f", source="derived: per-epoch samples/s",
               rule="runs.equivalence.ratio_interval"),
    FigureSpec("final_miou_sd", "Final mIoU sd", fmt=".4f", source="derived: final_miou over seeds",
               rule="numbers.mean_sd"),
    FigureSpec("best_miou_sd", "Best mIoU sd", fmt=".4f", source="derived: best_miou over seeds",
               rule="numbers.mean_sd"),
    FigureSpec("best_miou_delta", "vs baseline", fmt="+.4f", source="derived: best_miou minus the baseline's",
               rule="study.outputs.sweep_table_row"),
)
"""Every reported figure by key (see :class:`FigureSpec`)."""

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
