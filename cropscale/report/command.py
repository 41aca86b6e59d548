"""The quality-and-speed report: training runs and microbenchmarks side by side (Markdown, CSV, PNG).

``python -m cropscale report RUN_DIR_OR_BENCH_JSON ... [--output DIR] [--stem report]``; ``make report``
runs it on ``runs/``.

Inputs, any mix of run folders (or folders holding them, e.g. ``runs/``) and benchmark JSON files
(``python -m cropscale benchmark --json``), read by :mod:`cropscale.runs.record`; each figure
follows its rule in :mod:`cropscale.runs.rules` (the first epoch of a multi-epoch run is left out as
warm-up).

``<stem>.md`` leads with the verdicts, then what limits each run (its diagnosis: :mod:`cropscale.report.limits`),
then a comparison (:mod:`cropscale.report.comparison`): per run or benchmark
configuration its status, quality, speed, memory and energy, the mIoU change and speed-up against the
FP32 run of the same configuration (:mod:`cropscale.report.pairs`) and the efficiency against the same
configuration on one device (:mod:`cropscale.report.scaling`). Detail tables follow (quality, speed,
step decomposition in percent of the median step, memory / energy / numerics), then the precision
pairs, device scaling with the Amdahl fit, and the figures, each with the statistic it shows.

Files in ``--output`` (default ``reports/``): ``<stem>.md``; ``<stem>.csv`` (every figure of every run,
one row each), ``<stem>_comparison.csv``, ``<stem>_pairs.csv`` and ``<stem>_scaling.csv`` (when there
are pairs / device series); the figures of :data:`FIGURE_FILES`.

Every figure carries an evidence label (:mod:`cropscale.evidence`); a missing figure is "n/a" with
the reason in a footnote. A run's Status is its validity when it is no valid result (``not-trained``,
``diverged``, ``not-validated``: :mod:`cropscale.runs.validity`, the reason in the note), ``failed`` (the error in
the note) or ``incomplete`` when ``run.json`` was not finished (status ``failed`` or ``running``), ``unreadable``
when its folder could not be read (a malformed ``run.json``: the reason in the note; the other runs are reported);
such a run's n/a cells say so and it forms no precision pair and no verdict (the Verdicts section lists it with the
reason). A damaged TensorBoard events file is said (``events file unreadable: <file>, <error>``) in the
Verdicts section's list and in the n/a figures that needed it; the figures ``run.json`` holds do not. A run
without ``run.json`` shows its precision as ``<p> (requested)``: the configuration says what was requested, not
what Lightning ran (``16-mixed`` runs as ``bf16-mixed`` on CPU). Run folders that are no training run
(``validate`` / ``test`` folders) are skipped with one printed line. The Data warnings column counts
``run.json["data_warnings"]`` (the lines in the note).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from cropscale.evidence import LEGEND
from cropscale.files import atomic_write_text
from cropscale.numbers import TARGET_FRACTION
from cropscale.options import Options, parse_options
from cropscale.report.columns import NONFINITE_COLUMNS
from cropscale.report.comparison import (
    MAX_NONFINITE_ROWS,
    amdahl_rows,
    comparison_rows,
    nonfinite_rows,
    scaling_rows,
    step_rows,
    with_status,
)
from cropscale.report.equivalence import DEFAULT_MARGIN
from cropscale.report.limits import diagnosis_section, limit_changes
from cropscale.report.pairs import precision_pairs
from cropscale.report.plots import (
    plot_by_precision_and_batch,
    plot_device_scaling,
    plot_iou_by_epoch,
    plot_step_decomposition,
    plot_verdicts,
)
from cropscale.report.scaling import device_series
from cropscale.report.tables import TableRow, render_table
from cropscale.report.verdicts import comparisons, verdict_intro, verdict_row
from cropscale.runs.figures import (
    AMDAHL,
    COMPARISON,
    PAIRS,
    QUALITY,
    RESOURCES,
    RUNS,
    SCALING,
    SPEED,
    STEP,
    VERDICTS,
    table_columns,
)
from cropscale.runs.record import RunRecord, load_inputs

FIGURE_FILES = ("verdicts.png", "iou_by_epoch.png", "throughput.png", "peak_memory.png", "step_decomposition.png",
                "device_scaling.png")
"""The PNG figures of a report."""

FIGURE_CAPTIONS = {
    "verdicts.png": "Change of best macro IoU (other - base, 90 % interval: alpha = 0.05 per side) against speed-up"
                    " of training-loop samples/s (90 % interval over runs), one point per comparison; grey band: the"
                    " equivalence margin (the Verdicts table).",
    "iou_by_epoch.png": "Best val/mIoU so far at each epoch (running maximum of val/mIoU): the Best val/mIoU column"
                        " is its last point.",
    "throughput.png": "Training-loop samples/s by precision and global batch: training runs over their measured"
                      " epochs (the Samples/s (training loop) column), compute-only benchmarks from their median"
                      " step.",
    "peak_memory.png": "Peak GiB by precision and global batch: allocated GPU memory, or the host RSS of the"
                       " training process on a CPU (the Peak GiB column).",
    "step_decomposition.png": "Step decomposition in percent of the median step: each window's median over the"
                              " step median, as in the Step decomposition table (100 % = its Median step).",
    "device_scaling.png": "Speed-up and efficiency against the device count, measured points and the Amdahl curve"
                          " of the fitted serial fraction (the Device scaling tables).",
}
"""What each figure shows and which table column it agrees with."""

COMPARISON_INTRO = (
    "One row per run or benchmark configuration. mIoU change = best val/mIoU minus that of the FP32 run of the"
    " same configuration; speed-up vs FP32 = samples/s over the FP32 run's (the FP32 base itself shows 1.00 and"
    " +0.0000); efficiency = speed-up over the same configuration on 1 device / devices. Samples/s (training"
    " loop) of a run: training samples / the training loop's seconds over the measured epochs (the Speed table adds"
    " the epoch clock: / end-to-end epoch seconds); of a benchmark: batch / median step. J/sample: GPU board"
    " energy (NVML; no CPU, memory, network or cooling)."
    " A Status other than `finished` / `ok` says why the run is no valid result (the note gives the reason):"
    " its other figures describe such a run, and it forms no pair and no verdict."
)


def _detail(title: str, rows: Sequence[TableRow], columns, intro: str | None = None) -> str:
    table = render_table(rows, columns, intro=intro)
    return f"### {title}\n\n{table.markdown}"


def _nonfinite_detail(records: Sequence[RunRecord]) -> str:
    rows, left_out = nonfinite_rows(records)
    if not rows:
        return ("### Non-finite batches\n\nNo run recorded a non-finite batch (run.json summary.nonfinite.records;"
                " runs without NonFiniteCallback record none).\n")
    more = (f" {left_out} more (beyond {MAX_NONFINITE_ROWS} per run) are in the runs' run.json." if left_out else "")
    return _detail("Non-finite batches", rows, NONFINITE_COLUMNS, intro=(
        "Each batch whose loss, gradients or inputs were not finite, as NonFiniteCallback recorded it (run.json"
        " summary.nonfinite.records): the optimizer step, epoch, rank and micro-batch, the part that was not finite"
        " and the patch ids of the batch's samples (those with non-finite inputs apart)." + more))


def _scaling_section(records: Sequence[RunRecord], out: Path, stem: str, paths: dict[str, Path]) -> str:
    series = device_series(records)
    if not series:
        return ("## Device scaling\n\nNo configuration ran on 1 device and on more devices among the inputs"
                " (`python -m cropscale study` runs such sets).\n")
    table = render_table(scaling_rows(series), table_columns(SCALING), title="Device scaling", intro=(
        "Runs of one configuration on 1 and N devices (equal-global: the same global batch; equal-local: the"
        " same local batch). Speed-up = median samples/s on N / on 1; efficiency = speed-up / N; Karp-Flatt"
        " serial fraction e = (1/S - 1/N) / (1 - 1/N)."))
    amdahl = render_table(amdahl_rows(series), table_columns(AMDAHL), intro=(
        "The serial fraction fitted to each series' N > 1 points (least squares in 1/S; one point: Karp-Flatt) is"
        " a parameter of Amdahl's law and Amdahl's speed-up at that fraction on other device counts a model: both"
        " analytical-scenario (the per-N Karp-Flatt e above is an identity of the measured S_N: measured-run)."))
    paths["scaling_csv"] = atomic_write_text(out / f"{stem}_scaling.csv", table.csv)
    changes = limit_changes(series, records)
    return f"{table.markdown}\n{changes}\n{amdahl.markdown}" if changes else f"{table.markdown}\n{amdahl.markdown}"


def left_out(records: Sequence[RunRecord]) -> str:
    """The runs that take part in no comparison, each with why, and the damaged events files, as Markdown lines."""
    lines = [f"- {r.name}: {r.excluded}" for r in records if r.kind == "run" and r.excluded]
    lines += [f"- {r.name}: {problem}" for r in records for problem in r.events_problems]
    if not lines:
        return ""
    return "Left out of every comparison, or read in part:\n\n" + "\n".join(lines) + "\n\n"


def _verdicts_section(records: Sequence[RunRecord], out: Path, stem: str, paths: dict[str, Path], margin: float,
                      target_fraction: float) -> str:
    found = comparisons(records, margin, target_fraction)
    paths["verdicts"] = plot_verdicts(found, out / "verdicts.png", margin)
    if not found:
        return ("## Verdicts\n\n" + left_out(records) + "No two configurations differ in precision, device count or"
                " global batch alone among the usable runs (`make compare-cpu` trains such a set).\n")
    table = render_table([verdict_row(c) for c in found], table_columns(VERDICTS),
                         intro=verdict_intro(margin, target_fraction))
    paths["verdicts_csv"] = atomic_write_text(out / f"{stem}_verdicts.csv", table.csv)
    lines = "\n".join(f"- {c.line()}" for c in found)
    return f"## Verdicts\n\n{lines}\n\n{left_out(records)}{table.markdown}\n![verdicts.png](verdicts.png)\n"


def write_report(records: Sequence[RunRecord], out_dir: str | Path, stem: str = "report",
                 margin: float = DEFAULT_MARGIN, target_fraction: float = TARGET_FRACTION) -> dict[str, Path]:
    """Write the report's tables and figures into ``out_dir``.

    The report leads with the verdicts (:mod:`cropscale.report.verdicts`; equivalence ``margin`` in macro IoU,
    time to ``target_fraction`` of the base's best), then the comparison per run.

    Files: ``<stem>.md``, ``<stem>.csv`` (every figure, one row per record), ``<stem>_comparison.csv``,
    ``<stem>_pairs.csv`` and ``<stem>_scaling.csv`` (when there are pairs / device series) and the PNG
    figures of :data:`FIGURE_FILES`.

    Returns:
        ``{"markdown", "csv", "comparison_csv", ["pairs_csv"], ["scaling_csv"], <figure stem> ...}`` -> path.

    Raises:
        CropScaleError: ``out_dir`` cannot be created or written (named).
    """
    out = Path(out_dir)
    runs = [r for r in records if r.kind == "run"]
    full = render_table([with_status(r, table_columns(RUNS)) for r in records], table_columns(RUNS))
    paths: dict[str, Path] = {"csv": atomic_write_text(out / f"{stem}.csv", full.csv)}
    verdicts_md = _verdicts_section(records, out, stem, paths, margin, target_fraction)
    pairs = precision_pairs(records)
    series = device_series(records)
    lead = render_table(comparison_rows(records, pairs, series), table_columns(COMPARISON), title="Comparison",
                        intro=COMPARISON_INTRO)
    paths["comparison_csv"] = atomic_write_text(out / f"{stem}_comparison.csv", lead.csv)
    details = [
        _detail("Quality", [with_status(r, table_columns(QUALITY)) for r in runs], table_columns(QUALITY)),
        _detail("Speed", [TableRow.of(r, table_columns(SPEED)) for r in records], table_columns(SPEED), intro=(
            "Median and p95 step: median over the measured epochs of each epoch's statistic; epoch times"
            " (training-only, validation-only, end-to-end): median over the measured epochs. Two throughputs, named"
            " apart: Samples/s (training loop) = training samples / the training loop's seconds (loader start-up,"
            " first fetch, validation, barriers and checkpoint writes left out); Samples/s (epoch clock) = training"
            " samples / end-to-end epoch seconds.")),
        _detail("Step decomposition (% of the median step)", step_rows(records), table_columns(STEP), intro=(
            "Each window: median over the measured epochs of (the epoch's window median / its step median)."
            " Medians do not add up, so the sum is about, not exactly, 100 %.")),
        _detail("Memory, energy and numerics", [TableRow.of(r, table_columns(RESOURCES)) for r in records],
                table_columns(RESOURCES)),
        _nonfinite_detail(runs),
    ]
    if pairs:
        columns = table_columns(PAIRS)
        table = render_table([TableRow.of(p, columns) for p in pairs], columns, title="Precision pairs",
                             intro="Runs that differ only in precision (FP32 as the base). Speed-up = mixed "
                                   "samples/s / FP32 samples/s; IoU difference = mixed - FP32 best val/mIoU.")
        paths["pairs_csv"] = atomic_write_text(out / f"{stem}_pairs.csv", table.csv)
        pairs_md = table.markdown
    else:
        pairs_md = "## Precision pairs\n\nNo two inputs differ only in precision.\n"
    scaling_md = _scaling_section(records, out, stem, paths)
    paths["iou_by_epoch"] = plot_iou_by_epoch(records, out / "iou_by_epoch.png")
    paths["throughput"] = plot_by_precision_and_batch(records, "samples_per_s", out / "throughput.png")
    paths["peak_memory"] = plot_by_precision_and_batch(records, "peak_memory_gib", out / "peak_memory.png")
    paths["step_decomposition"] = plot_step_decomposition(records, out / "step_decomposition.png")
    paths["device_scaling"] = plot_device_scaling(series, out / "device_scaling.png")
    figures_md = "\n\n".join(f"![{name}]({name})\n\n{FIGURE_CAPTIONS[name]}" for name in FIGURE_FILES[1:])
    legend = f"{LEGEND} n/a cells name the reason in the notes under each table."
    text = (f"# cropscale report\n\n{legend}\n\n{verdicts_md}\n{diagnosis_section(records)}\n{lead.markdown}\n"
            "## Detail\n\n" + "\n".join(details)
            + f"\n{pairs_md}\n{scaling_md}\n## Figures\n\n{figures_md}\n")
    paths["markdown"] = atomic_write_text(out / f"{stem}.md", text)
    return {"markdown": paths.pop("markdown"), **paths}


@dataclasses.dataclass(kw_only=True)
class ReportOptions(Options):
    """Quality-and-speed report of training runs and benchmark JSONs (Markdown, CSV, PNG)."""

    POSITIONAL = ("inputs",)
    inputs: list[str]
    """run folders (or folders holding them) and benchmark JSON files"""
    output: str = "reports"
    """output folder"""
    stem: str = "report"
    """file name stem of the tables"""
    margin: float = DEFAULT_MARGIN
    """equivalence margin of macro IoU, absolute"""
    target_fraction: float = TARGET_FRACTION
    """time to target: this fraction of the base mean best macro IoU"""
    verdicts_only: bool = False
    """print only the verdict lines (the files as usual)"""

    RENAMED = {"--out": "output"}


def main(argv: list[str] | None = None) -> int:
    """``python -m cropscale report INPUT ... [--output DIR]``: writes the report, prints it.

    Raises:
        CropScaleError: an input that is neither a run folder nor a benchmark JSON (named).
        OptionError: a bad option (named).
    """
    args = parse_options(ReportOptions, argv, "python -m cropscale report")
    records = load_inputs(args.inputs)
    paths = write_report(records, args.output, args.stem, args.margin, args.target_fraction)
    if args.verdicts_only:
        found = comparisons(records, args.margin, args.target_fraction)
        print("\n".join(c.line() for c in found) or "no comparison among the usable runs")
    else:
        print(paths["markdown"].read_text(encoding="utf-8"))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
