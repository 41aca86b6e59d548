"""The report's own figures: figures by precision and global batch, and scaling with the device count.

Throughput and peak memory against global batch size by precision; speed-up and efficiency against
the device count with the Amdahl curves of the fitted serial fractions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cropscale.evidence import ANALYTICAL_SCENARIO, MEASURED_MICROBENCHMARK, MEASURED_RUN
from cropscale.numbers import median
from cropscale.report.scaling import DeviceSeries
from cropscale.runs.figures import FIGURES
from cropscale.runs.plots import no_data, pyplot, save
from cropscale.runs.record import RunRecord
from cropscale.scaling.amdahl import amdahl_speedup


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
        ax_s.set_ylabel("speed-up over 1 device (x, training samples/s)")
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
