"""The study's outputs: the study table (Markdown and CSV) and its figures.

``study_table.md`` holds the measured-run block, then the analytical-scenario block;
``study_table.csv`` all rows, with one ``evidence`` column and per-figure evidence; the figures are
``figures/scaling.png``, ``figures/iou_by_epoch.png`` and ``figures/step_decomposition.png``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_RUN
from cropscale.files import atomic_write_text
from cropscale.runs.plots import plot_iou_by_epoch, plot_step_decomposition, pyplot, save
from cropscale.runs.record import RunRecord
from cropscale.runs.rules import Figure
from cropscale.runs.tables import Column, TableRow, render_table
from cropscale.study.aggregate import StudyRow
from cropscale.study.spec import StudySpec

COLUMNS: tuple[Column, ...] = (
    Column("protocol", "Protocol", figure=False),
    Column("precision", "Precision", figure=False),
    Column("world_size", "N", "d", figure=False),
    Column("local_batch", "L", "d", figure=False),
    Column("accumulation", "A", "d", figure=False),
    Column("global_batch", "G", "d", figure=False),
    Column("lr", "LR", ".4g", figure=False),
    Column("updates_per_epoch", "Updates/epoch", "g", figure=False),
    Column("seeds", "Seeds", "d", figure=False),
    Column("step_median_ms", "Median step (ms)", ".1f"),
    Column("step_p95_ms", "p95 step (ms)", ".1f"),
    Column("samples_per_s", "Samples/s", ".3f"),
    Column("train_epoch_s", "Train epoch (s)", ".2f"),
    Column("train_epoch_cv", "Train epoch CV", ".1%"),
    Column("val_epoch_s", "Val epoch (s)", ".2f"),
    Column("e2e_epoch_s", "End-to-end epoch (s)", ".2f"),
    Column("speedup", "S_N", ".3f"),
    Column("efficiency", "E_N", ".1%"),
    Column("serial_fraction", "Karp-Flatt e", ".3f"),
    Column("loader_wait_share", "Loader wait share", ".1%"),
    Column("exposed_comm_share", "Exposed comm share", ".1%"),
    Column("energy_per_sample_j", "J/sample", ".3f"),
    Column("miou_final", "Final mIoU", ".4f"),
    Column("miou_final_sd", "Final mIoU sd", ".4f"),
    Column("miou_best", "Best mIoU", ".4f"),
    Column("miou_best_sd", "Best mIoU sd", ".4f"),
)
"""Columns of the study table, in order."""

PREDICTED = ("train_epoch_s", "samples_per_s", "speedup", "efficiency", "serial_fraction")
"""The figures an analytical-scenario row predicts (the others stay n/a)."""


def _why_missing(row: StudyRow, key: str) -> str:
    if row.evidence == ANALYTICAL_SCENARIO and key not in PREDICTED:
        return "not run: only epoch time, samples/s, S_N, E_N are predicted"
    if key == "serial_fraction" and row.world_size == 1:
        return "Karp-Flatt e is undefined at N = 1"
    if key in ("speedup", "efficiency", "serial_fraction"):
        return "no measured 1-rank training-epoch time of this protocol and precision"
    return "not recorded by the run(s)"


def table_row(row: StudyRow) -> TableRow:
    """A study row as a table row: every figure with its evidence and the reason when n/a.

    The row's notes are attached to the training-epoch time.
    """
    figures = {}
    for col in COLUMNS:
        if not col.figure:
            continue
        value = getattr(row, col.key)
        why = row.why.get(col.key) or (None if value is not None else _why_missing(row, col.key))
        note = "; ".join(row.notes) if col.key == "train_epoch_s" and row.notes else row.figure_notes.get(col.key)
        figures[col.key] = Figure(value, row.evidence, why, note)
    values = {c.key: getattr(row, c.key) for c in COLUMNS if not c.figure}
    return TableRow(values=values, figures=figures, evidence=row.evidence)


def _header(spec: StudySpec) -> str:
    protocols = "; ".join(f"{p.name} (L = {p.local_batch}" + (f", G = {p.global_batch}" if p.global_batch else "")
                          + f", LR rule {p.lr_scaling})" for p in spec.protocols)
    return (f"# Scaling study `{spec.name}`\n\nSpec: `{spec.source}`. Protocols: {protocols}. Strategy"
            f" {spec.strategy}; accelerator {spec.accelerator}. Evidence labels: `{MEASURED_RUN}` = recorded"
            f" by the fit run itself (scaling callbacks, TensorBoard); `{ANALYTICAL_SCENARIO}` = a model, not a"
            " measurement.\n")


def _blocks(rows: Sequence[TableRow], spec: StudySpec) -> list[str]:
    blocks = []
    for evidence, title, intro in (
        (MEASURED_RUN, f"Measured runs ({MEASURED_RUN})",
         f"Each row: the median over {len(spec.seeds)} seed(s) of per-run figures over the"
         f" {spec.measured_epochs} measured epoch(s) after {spec.warmup_epochs} warm-up epoch(s); macro IoU as"
         " mean and sample standard deviation over seeds. S_N = T_1 / T_N and E_N = S_N / N with T the median"
         " training-epoch time (same samples per epoch for every N); Karp-Flatt e = (1/S_N - 1/N) / (1 - 1/N)."),
        (ANALYTICAL_SCENARIO, f"Analytical scenarios ({ANALYTICAL_SCENARIO}): not run, more devices than available",
         "Predicted, not measured: T_N = T_1 (e + (1 - e)/N) + U_N (t_c(N) - t_c(N_ref)) with the Karp-Flatt"
         " e of the largest measured N_ref and the ring all-reduce model t_c (assumptions in the notes)."),
    ):
        subset = [r for r in rows if r.evidence == evidence]
        if subset:
            blocks.append(render_table(subset, COLUMNS, title=title, intro=intro).markdown)
    return blocks


def write_outputs(rows: Sequence[StudyRow], out: Path, spec: StudySpec,
                  runs: Sequence[RunRecord] = ()) -> dict[str, Path]:
    """Write the study table (Markdown, CSV) and the figures into ``out``; return ``{name: path}``."""
    out = Path(out)
    table_rows = [table_row(r) for r in rows]
    csv_path = atomic_write_text(out / "study_table.csv", render_table(table_rows, COLUMNS).csv)
    figures_dir = out / "figures"
    paths = {"csv": csv_path, "scaling": plot_scaling(rows, figures_dir / "scaling.png")}
    if runs:
        paths["iou_by_epoch"] = plot_iou_by_epoch(runs, figures_dir / "iou_by_epoch.png")
        paths["step_decomposition"] = plot_step_decomposition(runs, figures_dir / "step_decomposition.png")
    figs = "\n".join(f"![{p.stem}](figures/{p.name})" for k, p in paths.items() if k != "csv")
    text = _header(spec) + "\n" + "\n".join(_blocks(table_rows, spec)) + "\n## Figures\n\n" + figs + "\n"
    return {"markdown": atomic_write_text(out / "study_table.md", text), **paths}


def _plot_group(axes, rows: Sequence[StudyRow], label: str, color: str) -> None:
    measured = [r for r in rows if r.evidence == MEASURED_RUN]
    for ax, key in ((axes[0], "speedup"), (axes[1], "efficiency")):
        pts = [(r.world_size, getattr(r, key)) for r in measured if getattr(r, key) is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), "o-", color=color, label=f"{label} [{MEASURED_RUN}]")
        last = pts[-1:] if pts else []
        pred = last + [(r.world_size, getattr(r, key)) for r in rows
                       if r.evidence == ANALYTICAL_SCENARIO and getattr(r, key) is not None]
        if len(pred) > len(last):
            ax.plot(*zip(*pred, strict=True), "o--", color=color, markerfacecolor="none",
                    label=f"{label} [{ANALYTICAL_SCENARIO}]")
    iou = [(r.world_size, r.miou_final, r.miou_final_sd or 0.0) for r in measured if r.miou_final is not None]
    if iou:
        x, y, e = zip(*iou, strict=True)
        axes[2].errorbar(x, y, yerr=e, fmt="o-", color=color, capsize=3, label=f"{label} [{MEASURED_RUN}]")


def plot_scaling(rows: Sequence[StudyRow], path: Path) -> Path:
    """Plot speed-up S_N (with the ideal S = N), efficiency E_N and final macro IoU against N.

    Final macro IoU as mean +- sd over seeds. One line per (protocol, precision); measured-run points
    filled and solid, analytical-scenario points hollow and dashed.
    """
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    ns = sorted({r.world_size for r in rows})
    axes[0].plot(ns, ns, ":", color="grey", label="ideal S = N")
    for i, (proto, prec) in enumerate(sorted({(r.protocol, r.precision) for r in rows})):
        mine = sorted((r for r in rows if (r.protocol, r.precision) == (proto, prec)), key=lambda r: r.world_size)
        _plot_group(axes, mine, f"{proto} {prec}", f"C{i}")
    for ax, label in zip(axes, ("speed-up S_N = T_1 / T_N", "efficiency E_N = S_N / N", "final val macro IoU"),
                         strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("devices N (ranks)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    axes[0].set_title(f"Speed-up (hollow, dashed: {ANALYTICAL_SCENARIO})", fontsize=9)
    axes[1].set_title("Efficiency", fontsize=9)
    axes[2].set_title(f"Quality (mean +- sd over seeds) [{MEASURED_RUN}]", fontsize=9)
    fig.tight_layout()
    return save(fig, path)
