"""Figures of runs shared by the report and the study (matplotlib, Agg backend, PNG written atomically).

Every figure's title carries its evidence label; axes say their units.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cropscale.evidence import MEASURED_RUN
from cropscale.files import atomic_write
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


def no_data(ax: Any, text: str) -> None:
    """Mark ``ax`` as empty with ``text`` in its middle."""
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def plot_iou_by_epoch(records: Sequence[RunRecord], path: str | Path) -> Path:
    """Plot the best macro IoU available at each epoch (running maximum of ``val/mIoU``), one line per run.

    A "no data" panel when no run has validation.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    runs = [r for r in records if r.iou_by_epoch]
    for r in runs:
        epochs, values = zip(*r.iou_by_epoch, strict=True)
        ax.plot(epochs, values, marker="o", label=f"{r.name} ({r.precision_label})")
    if runs:
        ax.set_xlabel("epoch (0-based)")
        ax.set_ylabel("best val macro IoU so far (0..1)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    else:
        no_data(ax, "no run with val/mIoU")
    ax.set_title(f"Best macro IoU by epoch [{MEASURED_RUN}]", fontsize=10)
    fig.tight_layout()
    return save(fig, path)


def plot_step_decomposition(records: Sequence[RunRecord], path: str | Path) -> Path:
    """Plot the step windows (ms) of each run as stacked bars.

    Windows: data wait, transfer, forward, backward, optimizer, remainder. A bar from TensorBoard
    interval means (warm-up included) is starred.
    """
    plt = pyplot()
    runs = [r for r in records if r.step_windows_ms]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(runs) + 3), 4.5))
    if runs:
        bottoms = [0.0] * len(runs)
        names = [f"{r.name}\n{r.precision_label}"
                 f"{'' if (r.step_windows_source or '').startswith('StepTiming') else ' *'}" for r in runs]
        for window in STEP_WINDOWS:
            heights = [float(r.step_windows_ms.get(window, 0.0)) for r in runs]
            ax.bar(names, heights, bottom=bottoms, label=window)
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        ax.set_ylabel("ms per optimiser step")
        ax.legend(fontsize=7)
        ax.tick_params(axis="x", labelsize=7)
        if any(n.endswith("*") for n in names):
            ax.text(0.0, -0.28, "* mean of TensorBoard log intervals incl. warm-up (no post-warm-up median)",
                    transform=ax.transAxes, fontsize=7)
    else:
        no_data(ax, "no run with a step decomposition (StepTimingCallback)")
    ax.set_title(f"Step decomposition [{MEASURED_RUN}]", fontsize=10)
    fig.tight_layout()
    return save(fig, path)
