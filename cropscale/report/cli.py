"""The quality-and-speed report: training runs and microbenchmarks side by side (Markdown, CSV, PNG).

``python -m cropscale report RUN_DIR_OR_BENCH_JSON ... [--out DIR] [--stem report]``.

Inputs, any mix of run folders (or folders holding them, e.g. ``runs/``) and benchmark JSON files
(``python -m cropscale benchmark --output``), read by :mod:`cropscale.runs.record`; each figure
follows its rule in :mod:`cropscale.runs.rules` (the first epoch of a multi-epoch run is left out as
warm-up). Outputs in ``--out`` (default ``reports/``): ``<stem>.md`` and ``<stem>.csv`` (one row
per run or benchmark configuration), ``<stem>_pairs.csv`` (runs that differ only in precision,
:mod:`cropscale.report.pairs`), and the figures ``iou_by_epoch.png``, ``throughput.png``,
``peak_memory.png`` and ``step_decomposition.png``.

Every figure carries an evidence label (:mod:`cropscale.evidence`); a missing figure is "n/a" with
the reason in a footnote. A run without ``run.json`` shows its precision as ``<p> (requested)``: the
configuration says what was requested, not what Lightning ran (``16-mixed`` runs as ``bf16-mixed``
on CPU). Run folders that are no training run (``validate`` / ``test`` folders) are skipped with one
printed line. A fit that did not finish (``run.json`` status ``failed`` or ``running``) is listed with
Status ``failed`` (the error in the note) or ``incomplete``, its n/a cells say so, and it forms no
precision pair. The Data warnings column counts ``run.json["data_warnings"]`` (the lines in the note).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from cropscale.evidence import LEGEND
from cropscale.files import atomic_write_text
from cropscale.report.columns import COLUMNS, PAIR_COLUMNS
from cropscale.report.pairs import precision_pairs
from cropscale.report.plots import plot_by_precision_and_batch
from cropscale.runs.plots import plot_iou_by_epoch, plot_step_decomposition
from cropscale.runs.record import RunRecord, load_inputs
from cropscale.runs.tables import TableRow, render_table

FIGURE_FILES = ("iou_by_epoch.png", "throughput.png", "peak_memory.png", "step_decomposition.png")
"""The PNG figures of a report."""


def write_report(records: Sequence[RunRecord], out_dir: str | Path, stem: str = "report") -> dict[str, Path]:
    """Write the report's tables and figures into ``out_dir``.

    Files: ``<stem>.md``, ``<stem>.csv``, ``<stem>_pairs.csv`` (when there are pairs) and the four PNG
    figures of :data:`FIGURE_FILES`.

    Returns:
        ``{"markdown", "csv", ["pairs_csv"], "iou_by_epoch", "throughput", "peak_memory",
        "step_decomposition"}`` -> path.

    Raises:
        CropScaleError: ``out_dir`` cannot be created or written (named).
    """
    out = Path(out_dir)
    runs = render_table([TableRow.of(r, COLUMNS) for r in records], COLUMNS, title="Runs")
    paths: dict[str, Path] = {"csv": atomic_write_text(out / f"{stem}.csv", runs.csv)}
    pairs = precision_pairs(records)
    if pairs:
        table = render_table([TableRow.of(p, PAIR_COLUMNS) for p in pairs], PAIR_COLUMNS, title="Precision pairs",
                             intro="Runs that differ only in precision (FP32 as the base). Speed-up = mixed "
                                   "samples/s / FP32 samples/s; IoU difference = mixed - FP32 best val/mIoU.")
        paths["pairs_csv"] = atomic_write_text(out / f"{stem}_pairs.csv", table.csv)
        pairs_md = table.markdown
    else:
        pairs_md = "## Precision pairs\n\nNo two inputs differ only in precision.\n"
    paths["iou_by_epoch"] = plot_iou_by_epoch(records, out / "iou_by_epoch.png")
    paths["throughput"] = plot_by_precision_and_batch(records, "samples_per_s", "samples/s", out / "throughput.png",
                                                      "Throughput by precision and batch size")
    paths["peak_memory"] = plot_by_precision_and_batch(
        records, "peak_memory_gib", "peak memory (GiB)", out / "peak_memory.png",
        "Peak memory by precision and batch size")
    paths["step_decomposition"] = plot_step_decomposition(records, out / "step_decomposition.png")
    figures_md = "\n".join(f"![{name}]({name})" for name in FIGURE_FILES)
    legend = f"{LEGEND} n/a cells name the reason in the notes under the table."
    text = f"# cropscale report\n\n{legend}\n\n{runs.markdown}\n{pairs_md}\n## Figures\n\n{figures_md}\n"
    paths["markdown"] = atomic_write_text(out / f"{stem}.md", text)
    return {"markdown": paths.pop("markdown"), **paths}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cropscale report",
        description="Quality-and-speed report of training runs and benchmark JSONs (Markdown, CSV, PNG).",
    )
    p.add_argument("inputs", nargs="+", help="run folders (or folders holding them) and benchmark JSON files")
    p.add_argument("--out", default="reports", help="output folder (default: reports)")
    p.add_argument("--stem", default="report", help="file name stem of the tables (default: report)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``python -m cropscale report INPUT ... [--out DIR]``: writes the report, prints it.

    Raises:
        CropScaleError: an input that is neither a run folder nor a benchmark JSON (named).
    """
    args = _parser().parse_args(argv)
    records = load_inputs(args.inputs)
    paths = write_report(records, args.out, args.stem)
    print(paths["markdown"].read_text(encoding="utf-8"))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
