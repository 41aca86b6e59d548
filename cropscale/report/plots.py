"""The report's figures (matplotlib, Agg backend, PNG written atomically), shared with the study.

Per run: best macro IoU by epoch, the step decomposition, quality change against speed-up of the verdicts.
Across runs: throughput and peak memory against global batch size by precision; speed-up and efficiency
against the device count with the Amdahl curves of the fitted serial fractions. Every figure's title carries
its evidence label; axes say their units.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_MICROBENCHMARK, MEASURED_RUN
from cropscale.files import atomic_write
from cropscale.numbers import median
from cropscale.report.equivalence import CONFIDENCE, level_text
from cropscale.report.scaling import DeviceSeries
from cropscale.report.verdicts import Comparison
from cropscale.runs.figures import FIGURES
from cropscale.runs.record import RunRecord
from cropscale.runs.schema import STEP_WINDOWS
from cropscale.scaling.amdahl import amdahl_speedup


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically and close it."""
    try:
        return atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=dpi), binary=True)
    finally:
        pyplot().close(fig)


def no_data(ax: Any, text: str, width: int = 40) -> None:
    """Mark ``ax`` as empty with ``text`` in its middle, wrapped at ``width`` characters to stay inside the axes."""
    ax.text(0.5, 0.5, textwrap.fill(text, width), ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def run_label(record: RunRecord) -> str:
    """``name (precision)``, with `` - diverged`` for a run whose training loss ended non-finite."""
    diverged = record.divergence is not None and record.divergence.diverged
    return f"{record.name} ({record.precision_label}){' - diverged' if diverged else ''}"


def plot_iou_by_epoch(records: Sequence[RunRecord], path: str | Path) -> Path:
    """Plot the best macro IoU available at each epoch (running maximum of ``val/mIoU``), one line per run.

    A "no data" panel when no run has validation. A diverged run is marked in the legend.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    runs = [r for r in records if r.iou_by_epoch]
    for r in runs:
        epochs, values = zip(*r.iou_by_epoch, strict=True)
        ax.plot(epochs, values, marker="o", label=run_label(r))
    if runs:
        ax.set_xlabel("epoch (0-based)")
        ax.set_ylabel("best val macro IoU so far (0..1)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    else:
        no_data(ax, "no run with val/mIoU")
    ax.set_title(f"Best macro IoU by epoch [{MEASURED_RUN}]", fontsize=11)
    fig.tight_layout()
    return save(fig, path)


def plot_step_decomposition(records: Sequence[RunRecord], path: str | Path) -> Path:
    """Plot each run's step decomposition in percent of its median step, as stacked horizontal bars.

    Per window the share is :func:`cropscale.runs.rules.step_shares` (median over measured epochs of the
    window median / the step median): 100 % is the median step that the report's tables give, printed
    beside each bar in ms. The windows' shares are medians and sum to about, not exactly, 100 %; the
    sum is printed at the end of each bar.
    """
    plt = pyplot()
    runs = [r for r in records if r.step_shares]
    fig, ax = plt.subplots(figsize=(9.5, max(3.2, 1.6 + 0.7 * len(runs))))
    if runs:
        names = [run_label(r) for r in runs]
        lefts = [0.0] * len(runs)
        for window in STEP_WINDOWS:
            widths = [100.0 * r.step_shares.get(window, 0.0) for r in runs]
            bars = ax.barh(names, widths, left=lefts, label=window.replace("_", " "))
            for bar, width in zip(bars, widths, strict=True):
                if width >= 6.0:  # label the segments wide enough to hold a number
                    ax.text(bar.get_x() + width / 2, bar.get_y() + bar.get_height() / 2, f"{width:.0f} %",
                            ha="center", va="center", fontsize=8, color="white")
            lefts = [a + b for a, b in zip(lefts, widths, strict=True)]
        for i, (r, total) in enumerate(zip(runs, lefts, strict=True)):
            step = r.figures["median_step_ms"].value
            text = f"sum {total:.0f} %" + (f"\nmedian step\n{step:,.0f} ms" if step is not None else "")
            ax.text(max(total, 100.0) + 1.5, i, text, va="center", fontsize=8)
        ax.axvline(100.0, color="black", linewidth=0.8, linestyle=":")
        ax.set_xlim(0, max(125.0, max(lefts) + 25.0))
        ax.set_xlabel("percent of the median step (%); per window: median over measured epochs of window / step")
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=8)
        ax.legend(fontsize=8, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
        ax.grid(alpha=0.3, axis="x")
    else:
        no_data(ax, "no run with a step decomposition in run.json (StepTimingCallback)")
    ax.set_title(f"Step decomposition, percent of the median step [{MEASURED_RUN}]", fontsize=11)
    fig.tight_layout()
    return save(fig, path)


def plot_verdicts(comparisons: Sequence[Comparison], path: str | Path, margin: float) -> Path:
    """Quality difference with its interval against speed-up with its interval, one point per comparison.

    x: speed-up of training-loop samples/s (ratio of per-run geometric means, the verdicts' 90 % interval as a
    horizontal bar; dotted at 1); y: change of best validation macro IoU, other - base (the verdicts' 90 % interval,
    alpha = 0.05 per side, as a vertical bar); the grey band is the equivalence margin. A comparison without an
    interval is drawn as a hollow point without a bar.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.2))
    drawn = [c for c in comparisons if c.best.interval.estimate is not None and c.speedup.estimate is not None]
    if drawn:
        ax.axhspan(-margin, margin, color="grey", alpha=0.2, label=f"equivalence margin +-{margin:g}")
        ax.axvline(1.0, color="grey", ls=":", lw=1)
        ax.axhline(0.0, color="grey", lw=0.8)
        for i, c in enumerate(drawn):
            q, s = c.best.interval, c.speedup
            x, y = s.estimate, q.estimate
            xerr = [[x - s.low], [s.high - x]] if s.low is not None else None
            yerr = [[y - q.low], [q.high - y]] if q.low is not None else None
            full = xerr is not None and yerr is not None
            ax.errorbar([x], [y], xerr=xerr, yerr=yerr, fmt="o", color=f"C{i}", capsize=3,
                        markerfacecolor=f"C{i}" if full else "none", label=f"{c.label}: {c.best.verdict}")
        ax.set_xlabel("speed-up (x, training-loop samples/s, other / base; runs as the unit)")
        ax.set_ylabel("change of best val macro IoU (other - base)")
        ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
    else:
        no_data(ax, "no two configurations with a best macro IoU and samples/s to compare")
    ax.set_title(f"Quality change vs speed-up, {level_text(CONFIDENCE)}s (alpha = 0.05 per side) [{MEASURED_RUN}]",
                 fontsize=10)
    fig.tight_layout()
    return save(fig, path)


def _left_out(record: RunRecord) -> str | None:
    if record.divergence is not None and record.divergence.diverged:
        return "diverged"
    if record.status in ("failed", "running", "oom", "error", "unsupported", "skipped"):
        return str(record.status)
    return None


def plot_by_precision_and_batch(records: Sequence[RunRecord], key: str, path: str | Path) -> Path:
    """Plot ``figures[key]`` against global batch size and write a PNG to ``path``.

    The y axis and the title name the figure by its registry header (:data:`cropscale.runs.figures.FIGURES`,
    the tables' column header). One line per (precision, kind: run or microbenchmark, what was measured: the
    figure's note, e.g. host RSS vs GPU memory); x on a log2 axis. The title names the evidence labels shown.
    Runs that diverged or failed are left out, and the figure says which.

    Raises:
        KeyError: ``key`` is not a registered figure.
    """
    ylabel = FIGURES[key].header
    title = f"{ylabel} by precision and global batch"
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    series: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    left_out = []
    for r in records:
        value = r.value(key)
        if value is None or r.global_batch is None:
            continue
        why = _left_out(r)
        if why:
            left_out.append(f"{r.name} ({why})")
            continue
        note = r.figures[key].note if key in r.figures else None
        what = "host RSS" if note and "RSS" in note else ("GPU" if note and "GPU" in note else "")
        series.setdefault((r.precision_label, r.kind, what), []).append((int(r.global_batch), float(value)))
    labels = []
    for i, ((label, kind, what), points) in enumerate(sorted(series.items())):
        bench = kind == "microbenchmark"
        evidence = MEASURED_MICROBENCHMARK if bench else MEASURED_RUN
        labels.append(evidence)
        kind_text = "compute-only benchmark" if bench else "training run"
        xs = sorted({x for x, _ in points})
        mids = [median(y for x, y in points if x == b) for b in xs]  # the line joins the medians per batch
        ax.plot(xs, mids, linestyle="-" if bench else "--", marker="o" if bench else "s", color=f"C{i}",
                label=f"{label}, {kind_text}{', ' + what if what else ''} [{evidence}]")
        if len(points) > len(xs):  # several runs at one batch: each as a small hollow marker
            ax.plot([x for x, _ in points], [y for _, y in points], "o" if bench else "s", color=f"C{i}",
                    markerfacecolor="none", markersize=4)
    if series:
        batches = sorted({x for points in series.values() for x, _ in points})
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.set_xlabel("global batch (samples per optimiser step, log2 axis)")
        ax.set_ylabel(ylabel)
        top = max(y for points in series.values() for _, y in points)
        ax.set_ylim(0, top * 1.3 if top > 0 else 1.0)  # room above the highest point for the legend
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    else:
        no_data(ax, f"no record with {key} and a batch size")
    if left_out:
        fig.text(0.01, 0.01, "left out: " + "; ".join(left_out), fontsize=7)
    shown = ", ".join(dict.fromkeys(labels)) or MEASURED_RUN
    ax.set_title(f"{title} [{shown}]", fontsize=11)
    fig.tight_layout(rect=(0, 0.04 if left_out else 0, 1, 1))
    return save(fig, path)


def plot_device_scaling(series: Sequence[DeviceSeries], path: str | Path) -> Path:
    """Speed-up (left) and parallel efficiency (right) against the device count, one colour per series.

    Points: measured speed-ups over the 1-device run (``measured-run``). Dashed: Amdahl's law at the
    series' fitted serial fraction in [0, 1] (else refused; ``analytical-scenario``) out to 8 devices or the
    largest count measured. Dotted: ideal scaling.
    """
    plt = pyplot()
    fig, (ax_s, ax_e) = plt.subplots(1, 2, figsize=(12, 4.8))
    if series:
        top = max(8, *(p.devices for s in series for p in s.points))
        grid = [1 + i * (top - 1) / 100 for i in range(101)]
        ax_s.plot(grid, grid, ":", color="grey", label="ideal (S = N)")
        ax_e.axhline(1.0, linestyle=":", color="grey", label="ideal (E = 1)")
        for i, s in enumerate(series):
            color = f"C{i}"
            ns = [p.devices for p in s.points]
            ax_s.plot(ns, [p.speedup_vs_1_device for p in s.points], "o", color=color, markersize=7,
                      label=f"{s.label} [{MEASURED_RUN}]")
            ax_e.plot(ns, [p.efficiency for p in s.points], "o", color=color, markersize=7)
            fit = s.serial_fraction
            if fit is not None and not 0.0 <= fit <= 1.0:
                ax_s.plot([], [], "--", color=color, label=f"Amdahl refused: fitted s = {fit:.2f} outside [0, 1]")
            elif fit is not None:
                curve = [amdahl_speedup(n, fit) for n in grid]
                ax_s.plot(grid, curve, "--", color=color,
                          label=f"Amdahl, fitted s = {fit:.2f} [{ANALYTICAL_SCENARIO}]")
                ax_e.plot(grid, [c / n for c, n in zip(curve, grid, strict=True)], "--", color=color)
        for ax in (ax_s, ax_e):
            ax.set_xlabel("devices (processes / GPUs)")
            ax.set_xlim(0.8, top + 0.2)
            ax.grid(alpha=0.3)
        ax_s.set_ylabel("speed-up over 1 device (x, training-loop samples/s)")
        ax_e.set_ylabel("parallel efficiency (speed-up / devices)")
        ax_e.set_ylim(0, 1.15)
        ax_s.legend(fontsize=8, loc="upper left")
    else:
        for ax in (ax_s, ax_e):
            no_data(ax, "no configuration ran on 1 device and on more devices among the inputs")
    ax_s.set_title(f"Speed-up vs devices [{MEASURED_RUN}; curves {ANALYTICAL_SCENARIO}]", fontsize=10)
    ax_e.set_title(f"Efficiency vs devices [{MEASURED_RUN}; curves {ANALYTICAL_SCENARIO}]", fontsize=10)
    fig.tight_layout()
    return save(fig, path)
