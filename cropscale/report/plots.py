"""The report's own figure: a figure against global batch size by precision (throughput, memory)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cropscale.evidence import MEASURED_MICROBENCHMARK, MEASURED_RUN
from cropscale.runs.plots import no_data, pyplot, save
from cropscale.runs.record import RunRecord


def plot_by_precision_and_batch(records: Sequence[RunRecord], key: str, ylabel: str, path: str | Path,
                                title: str) -> Path:
    """Plot ``figures[key]`` against global batch size and write a PNG to ``path``.

    One line per (precision, kind: run or microbenchmark); x on a log2 axis.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in records:
        value = r.value(key)
        if value is None or r.global_batch is None:
            continue
        series.setdefault((r.precision_label, r.kind), []).append((int(r.global_batch), float(value)))
    for (label, kind), points in sorted(series.items()):
        xs, ys = zip(*sorted(points), strict=True)
        bench = kind == "microbenchmark"
        ax.plot(xs, ys, marker="o" if bench else "s", linestyle="-" if bench else "--",
                label=f"{label} [{MEASURED_MICROBENCHMARK if bench else MEASURED_RUN}]")
    if series:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("global batch (samples per optimiser step)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    else:
        no_data(ax, f"no record with {key} and a batch size")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return save(fig, path)
