"""The study's outputs: the study table (Markdown and CSV) and its figures.

``study_table.md`` holds the measured-run block, then the analytical-scenario block, then the batch
sweep (when the spec has one); ``study_table.csv`` the device-scaling rows, ``batch_sweep.csv`` the
batch sweep's, each with one ``evidence`` column and per-figure evidence; the figures are
``figures/scaling.png``, ``figures/batch_sweep.png``, ``figures/iou_by_epoch.png`` and
``figures/step_decomposition.png``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_RUN
from cropscale.files import atomic_write_text
from cropscale.report.equivalence import ALPHA, CONFIDENCE, level_text
from cropscale.report.plots import plot_iou_by_epoch, plot_step_decomposition, plot_verdicts, pyplot, save
from cropscale.report.tables import TableRow, render_table
from cropscale.report.verdicts import Comparison, verdict_intro, verdict_row
from cropscale.runs.figures import STUDY, SWEEP, VERDICTS, table_columns
from cropscale.runs.record import RunRecord
from cropscale.runs.rules import Figure
from cropscale.study import protocol as P
from cropscale.study.aggregate import StudyRow, SweepSummary
from cropscale.study.assertions import write_scaling_assertions
from cropscale.study.spec import BatchSweepSpec, StudySpec

PREDICTED = ("train_epoch_s", "samples_per_s", "speedup_vs_1_device", "efficiency", "karp_flatt",
             "speedup_vs_1_device_low", "speedup_vs_1_device_high")
"""The figures an analytical-scenario row predicts (the others stay n/a)."""


def _why_missing(row: StudyRow, key: str) -> str:
    if row.evidence == ANALYTICAL_SCENARIO and key not in PREDICTED:
        return "not run: only epoch time, samples/s, S_N, E_N are predicted"
    if key == "karp_flatt" and row.world_size == 1:
        return "Karp-Flatt e is undefined at N = 1"
    if key in ("speedup_vs_1_device_low", "speedup_vs_1_device_high") and row.world_size == 1:
        return "the 1-rank base"
    if key in ("speedup_vs_1_device_low", "speedup_vs_1_device_high") and row["speedup_vs_1_device"] is not None:
        return "fewer than 2 measured epochs x seeds on a side: no interval"
    if key in ("speedup_vs_1_device", "efficiency", "karp_flatt"):
        return "no measured 1-rank training-epoch time of this protocol and precision"
    return "not recorded by the run(s)"


def table_row(row: StudyRow) -> TableRow:
    """A study row as a table row: every figure with its evidence and the reason when n/a.

    The row's notes are attached to the training-epoch time.
    """
    figures = {}
    columns = table_columns(STUDY)
    for col in columns:
        if not col.figure:
            continue
        value = row[col.key]
        why = row.why.get(col.key) or (None if value is not None else _why_missing(row, col.key))
        note = "; ".join(row.notes) if col.key == "train_epoch_s" and row.notes else row.figure_notes.get(col.key)
        figures[col.key] = Figure(value, row.evidence, why, note)
    values = {c.key: getattr(row, c.key) for c in columns if not c.figure}
    return TableRow(values=values, figures=figures, evidence=row.evidence)


def _describe(p) -> str:
    if isinstance(p, BatchSweepSpec):
        opts = ", ".join(f"{o.name} lr {o.lr:g} ({'/'.join(o.lr_scalings)})" for o in p.optimizers)
        return (f"{p.name} (G = {', '.join(str(g) for g in p.global_batches)} vs reference {p.reference};"
                f" L <= {p.max_local_batch}; A <= {p.max_accumulation or 'any'}; {opts}; LR warm-up"
                f" {p.lr_warmup_epochs:g} epoch(s), then {p.lr_schedule})")
    return (f"{p.name} (L = {p.local_batch}" + (f", G = {p.global_batch}" if p.global_batch else "")
            + f", LR rule {p.lr_scaling})")


def _header(spec: StudySpec) -> str:
    protocols = "; ".join(_describe(p) for p in spec.protocols)
    analytical = (f"; `{ANALYTICAL_SCENARIO}` = a model, not a measurement"
                  if any(not isinstance(p, BatchSweepSpec) for p in spec.protocols) else "")
    return (f"# Scaling study `{spec.name}`\n\nSpec: `{spec.source}`. Protocols: {protocols}. Strategy"
            f" {spec.strategy}; accelerator {spec.accelerator}. Evidence labels: `{MEASURED_RUN}` = recorded"
            f" by the fit run itself (scaling callbacks, TensorBoard){analytical}.\n")


def _blocks(rows: Sequence[TableRow], spec: StudySpec) -> list[str]:
    blocks = []
    for evidence, title, intro in (
        (MEASURED_RUN, f"Measured runs ({MEASURED_RUN})",
         f"Each row: the median over {len(spec.seeds)} seed(s) of per-run figures over the"
         f" {spec.measured_epochs} measured epoch(s) after {spec.warmup_epochs} warm-up epoch(s); macro IoU as"
         " mean and sample standard deviation over seeds. S_N = Q_N / Q_1 and E_N = S_N / N with Q the median"
         " training-loop samples/s (same samples per epoch for every N: the protocol's samples/s at equal work, the"
         " report's definition; the epoch-clock samples/s column is training samples / end-to-end epoch time),"
         " S_N low / high its 95 % interval over runs (Welch t on the log per-run geometric-mean samples/s of the"
         " N-rank and 1-rank runs; one run on a side gives none); GPU board J/sample is NVML board energy only"
         " (no CPU, memory, network or cooling); Karp-Flatt e = (1/S_N - 1/N) / (1 - 1/N), measured-run at the N it was"
         " measured (an identity of S_N, cropscale.evidence)."),
        (ANALYTICAL_SCENARIO, f"Analytical scenarios ({ANALYTICAL_SCENARIO}): not run, more devices than available",
         "Predicted, not measured: T_N = T_1 (e + (1 - e)/N) + U_N (t_c(N) - t_c(N_ref)) with the Karp-Flatt"
         " e of the largest measured N_ref and the ring all-reduce model t_c (assumptions in the notes). S_N low /"
         " high: the measured 95 % intervals of T_1 and of S at N_ref propagated through the formula. An e outside"
         " [0, 1] is refused, not extrapolated (the note says why)."),
    ):
        subset = [r for r in rows if r.evidence == evidence]
        if subset:
            blocks.append(render_table(subset, table_columns(STUDY), title=title, intro=intro).markdown)
    return blocks


def verdict_block(comparisons: Sequence[Comparison], spec: StudySpec) -> str:
    """``## Verdicts``: one line per comparison, then the table (:data:`cropscale.runs.figures.VERDICTS`)."""
    if not comparisons:
        return "## Verdicts\n\nNo two measured configurations to compare.\n"
    lines = "\n".join(f"- {c.line()}" for c in comparisons)
    table = render_table([verdict_row(c) for c in comparisons], table_columns(VERDICTS),
                         intro=verdict_intro(spec.equivalence_margin, spec.target_fraction))
    return f"## Verdicts\n\n{lines}\n\n{table.markdown}"


def write_outputs(rows: Sequence[StudyRow], out: Path, spec: StudySpec, runs: Sequence[RunRecord] = (),
                  sweep: SweepSummary | None = None, comparisons: Sequence[Comparison] = (),
                  checks: Sequence[str] = ()) -> dict[str, Path]:
    """Write the study table (Markdown, CSV), the batch sweep's table and the figures into ``out``.

    ``study_table.md`` leads with the verdicts of ``comparisons`` (``study_verdicts.csv``, ``figures/verdicts.png``)
    and the prediction ``checks`` (:mod:`cropscale.study.check`, one line each).

    Returns:
        ``{name: path}`` of every file written.
    """
    out = Path(out)
    scaling = [r for r in rows if r.protocol != P.BATCH_SWEEP]
    figures_dir = out / "figures"
    paths: dict[str, Path] = {}
    blocks: list[str] = [verdict_block(comparisons, spec)]
    if checks:
        blocks.append("## Prediction check (N = 1 -> N measured)\n\n" + "\n".join(f"- {c}" for c in checks) + "\n")
    if comparisons:
        verdicts = render_table([verdict_row(c) for c in comparisons], table_columns(VERDICTS))
        paths["verdicts_csv"] = atomic_write_text(out / "study_verdicts.csv", verdicts.csv)
        paths["verdicts"] = plot_verdicts(comparisons, figures_dir / "verdicts.png", spec.equivalence_margin)
    if scaling or sweep is None:
        table_rows = [table_row(r) for r in scaling]
        paths["csv"] = atomic_write_text(out / "study_table.csv", render_table(table_rows, table_columns(STUDY)).csv)
        paths["scaling"] = plot_scaling(scaling, figures_dir / "scaling.png")
        blocks += _blocks(table_rows, spec)
    if sweep is not None:
        sweep_rows = [sweep_table_row(r, sweep, spec.max_epochs) for c in sweep.curves for r in c.rows]
        sweep_csv = render_table(sweep_rows, table_columns(SWEEP)).csv
        paths["sweep_csv"] = atomic_write_text(out / "batch_sweep.csv", sweep_csv)
        paths["batch_sweep"] = plot_batch_sweep(sweep, figures_dir / "batch_sweep.png")
        blocks.append(sweep_block(sweep_rows, sweep, spec))
    if runs:
        paths["iou_by_epoch"] = plot_iou_by_epoch(runs, figures_dir / "iou_by_epoch.png")
        paths["step_decomposition"] = plot_step_decomposition(runs, figures_dir / "step_decomposition.png")
    paths.update(write_scaling_assertions(scaling, out))  # scaling_assertions.md: step time O(local batch)
    figs = "\n".join(f"![{p.stem}](figures/{p.name})" for p in paths.values() if p.suffix == ".png")
    text = _header(spec) + "\n" + "\n".join(blocks) + "\n## Figures\n\n" + figs + "\n"
    return {"markdown": atomic_write_text(out / "study_table.md", text), **paths}


def _plot_group(axes, rows: Sequence[StudyRow], label: str, color: str) -> None:
    measured = [r for r in rows if r.evidence == MEASURED_RUN]
    for ax, key in ((axes[0], "speedup_vs_1_device"), (axes[1], "efficiency")):
        pts = [(r.world_size, r[key]) for r in measured if r[key] is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), "o-", color=color, label=f"{label} [{MEASURED_RUN}]")
        last = pts[-1:] if pts else []
        pred = last + [(r.world_size, r[key]) for r in rows
                       if r.evidence == ANALYTICAL_SCENARIO and r[key] is not None]
        if len(pred) > len(last):
            ax.plot(*zip(*pred, strict=True), "o--", color=color, markerfacecolor="none",
                    label=f"{label} [{ANALYTICAL_SCENARIO}]")
    iou = [(r.world_size, r["final_miou"], r["final_miou_sd"] or 0.0) for r in measured if r["final_miou"] is not None]
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
    labels = ("speed-up S_N = Q_N / Q_1 (samples/s)", "efficiency E_N = S_N / N", "final val macro IoU")
    for ax, label in zip(axes, labels, strict=True):
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


# ------------------------------------------------------------------------------------------ batch sweep
def sweep_table_row(row: StudyRow, sweep: SweepSummary, epochs: int) -> TableRow:
    """A batch-sweep row: the plan (counts), the measured figures and the comparison with the baseline.

    ``epochs``: the epochs of every run (updates in the run = updates per epoch x epochs).
    """
    base = table_row(row)
    values = {c.key: getattr(row, c.key, None) for c in table_columns(SWEEP) if not c.figure}
    values["updates_total"] = row.updates_per_epoch * epochs if row.updates_per_epoch is not None else None
    figures = {c.key: base.figures.get(c.key) or Figure(row[c.key], row.evidence, row.why.get(c.key))
               for c in table_columns(SWEEP) if c.figure}
    curve = next((c for c in sweep.curves if row in c.rows), None)
    point = curve.points.get(row.global_batch) if curve is not None else None
    if sweep.baseline is None or point is None:
        figures["best_miou_delta"] = Figure(None, MEASURED_RUN, sweep.why or "no measured best macro IoU")
        values["holds"] = values["best_miou_delta_ci"] = None
    else:
        figures["best_miou_delta"] = Figure(point.estimate, MEASURED_RUN, point.text or "no interval")
        values["holds"] = point.verdict
        values["best_miou_delta_ci"] = (f"{point.low:+.4f}..{point.high:+.4f}" if point.low is not None
                                        else "n/a" if point.verdict == "baseline" else f"n/a ({point.text})")
    return TableRow(values=values, figures=figures, evidence=MEASURED_RUN)


def sweep_block(rows: Sequence[TableRow], sweep: SweepSummary, spec: StudySpec) -> str:
    """The batch sweep's Markdown: baseline and tolerance, verdict per curve, the table, the points not run."""
    lines = ["## Batch sweep", ""]
    b = sweep.baseline
    if b is None:
        lines.append(f"No baseline: {sweep.why}.")
    else:
        best, best_sd = b["best_miou"], b["best_miou_sd"]
        sd = "n/a (one seed)" if best_sd is None else f"{best_sd:.4f}"
        lines.append(
            f"Baseline: {b.optimizer}, LR rule {b.lr_scaling}, G = {b.global_batch}: best macro IoU {best:.4f}"
            f" (mean over {b.seeds} seed(s), sd {sd}) [{MEASURED_RUN}]. Each point's best macro IoU is compared with"
            f" the baseline's by the verdicts' one rule: equivalent when the {level_text(CONFIDENCE)} of the"
            f" difference lies inside +-{sweep.tolerance:g} (the sweep's tolerance as the margin; TOST at alpha ="
            f" {ALPHA:g}). A curve holds to the largest G up to which every point is equivalent; where the first"
            " point that is not is inconclusive, it cannot say beyond, and the seeds per side that would decide are"
            " named.")
    lines.append("")
    for c in sweep.curves:
        lines.append(f"- {c.optimizer}, LR rule {c.lr_scaling}, {c.precision}: {c.verdict}")
    intro = (f"Every G trains {spec.max_epochs} epoch(s) (the same samples), so the optimizer updates fall as G"
             " grows. G = L x N x A; G, L, N, A, LR and updates are the plan (counts), checked against each run's"
             " printed batch line and global step. Best mIoU: best validation macro IoU of a run, mean and sample sd"
             f" over seeds; vs baseline: the difference of mean best macro IoU with its {level_text(CONFIDENCE)} and"
             f" the verdict (alpha = {ALPHA:g} per side); samples/s (training loop and epoch clock) and"
             f" training-epoch time: median over seeds of the {spec.measured_epochs} measured epoch(s) after"
             f" {spec.warmup_epochs} excluded.")
    table = render_table(rows, table_columns(SWEEP), title=f"Batch sweep table ({MEASURED_RUN})", intro=intro)
    lines += ["", table.markdown]
    if sweep.not_run:
        lines += ["## Batch sweep: not run", "", "Listed, not measured, nothing predicted:", ""]
        lines += [f"- G = {g}, {opt}, LR rule {rule}: {reason}" for _, g, opt, rule, reason in sweep.not_run]
        lines.append("")
    return "\n".join(lines)


def plot_batch_sweep(sweep: SweepSummary, path: Path) -> Path:
    """Plot best macro IoU (mean +- sd over seeds) and samples/s against the global batch G.

    One line per optimiser x LR rule x precision, its label ending in the curve's "holds to G"; the baseline's mean
    +- sd as a grey band, the baseline minus the margin as a dashed line (a guide: the verdicts compare the 90 %
    interval of the difference with the margin); the G not run as dotted vertical lines.
    """
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.4))
    gs = sorted({r.global_batch for c in sweep.curves for r in c.rows} | {g for _, g, *_ in sweep.not_run})
    b = sweep.baseline
    if b is not None:
        sd = b["best_miou_sd"] or 0.0
        axes[0].axhspan(b["best_miou"] - sd, b["best_miou"] + sd, color="grey", alpha=0.25,
                        label=f"baseline {b.optimizer} {b.lr_scaling} G={b.global_batch}: mean +- sd")
        axes[0].axhline(b["best_miou"] - sweep.tolerance, color="grey", ls="--", lw=1,
                        label=f"baseline - margin {sweep.tolerance:g}")
    for i, c in enumerate(sweep.curves):
        label = f"{c.optimizer} {c.lr_scaling} {c.precision}" + (f": holds to G = {c.holds_to}" if c.holds_to else "")
        iou = [(r.global_batch, r["best_miou"], r["best_miou_sd"] or 0.0) for r in c.rows if r["best_miou"] is not None]
        if iou:
            x, y, e = zip(*iou, strict=True)
            axes[0].errorbar(x, y, yerr=e, fmt="o-", color=f"C{i}", capsize=3, label=label)
        rate = [(r.global_batch, r["samples_per_s"]) for r in c.rows if r["samples_per_s"] is not None]
        if rate:
            axes[1].plot(*zip(*rate, strict=True), "s-", color=f"C{i}", label=label)
    skipped = sorted({g for _, g, *_ in sweep.not_run})
    for ax in axes:
        for k, g in enumerate(skipped):
            ax.axvline(g, color="black", ls=":", lw=1, label="not run (too large here)" if k == 0 else None)
        ax.set_xscale("log", base=2)
        if gs:
            ax.set_xticks(gs, [str(g) for g in gs])
        ax.set_xlabel("global batch G = L x N x A (samples per optimizer update)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    axes[0].set_ylabel("best val macro IoU (0..1)")
    axes[0].set_title(f"Quality vs global batch, mean +- sd over seeds [{MEASURED_RUN}]", fontsize=9)
    axes[1].set_ylim(bottom=0)
    axes[1].set_ylabel("training-loop samples/s (median over seeds)")
    axes[1].set_title(f"Throughput vs global batch [{MEASURED_RUN}]", fontsize=9)
    fig.tight_layout()
    return save(fig, path)
