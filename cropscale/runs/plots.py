"""Figures of runs shared by the report and the study (matplotlib, Agg backend, PNG written atomically).

Every figure's title carries its evidence label; axes say their units.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cropscale.evidence import MEASURED_RUN
from cropscale.files import atomic_write
from cropscale.runs.equivalence import Comparison
from cropscale.runs.record import RunRecord
from cropscale.runs.schema import STEP_WINDOWS


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

    x: speed-up of training samples/s (geometric-mean ratio, 95 % interval as a horizontal bar; dotted at 1);
    y: change of best validation macro IoU, other - base (95 % interval as a vertical bar); the grey band is
    the equivalence margin. A comparison without an interval is drawn as a hollow point without a bar.
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
        ax.set_xlabel("speed-up (x, training samples/s, other / base)")
        ax.set_ylabel("change of best val macro IoU (other - base)")
        ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
    else:
        no_data(ax, "no two configurations with a best macro IoU and samples/s to compare")
    ax.set_title(f"Quality change vs speed-up, 95 % intervals [{MEASURED_RUN}]", fontsize=10)
    fig.tight_layout()
    return save(fig, path)
