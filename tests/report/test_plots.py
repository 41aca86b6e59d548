"""The report's figures take a figure's name from the registry (cropscale.runs.figures): the axis of the
samples/s and peak-memory plots is the registry entry's header, the same words as the tables' column."""

from __future__ import annotations

import dataclasses

from cropscale.report import plots
from cropscale.runs.figures import FIGURES
from cropscale.runs.record import load_run
from tests.report.test_report import _fake_run


def test_a_plot_names_its_figure_by_the_registry_header(tmp_path, monkeypatch):
    run = load_run(_fake_run(tmp_path / "a" / "version_0", "32-true", [0.2, 0.3], samples=40, step_ms=100.0,
                             train_s=[4.0, 4.0], val_s=[1.0, 1.0]), warmup_epochs=1)
    renamed = dataclasses.replace(FIGURES["samples_per_s"], header="Training samples per second (test)")
    monkeypatch.setitem(FIGURES, "samples_per_s", renamed)  # the plot must follow the registry, not a copy
    shown = {}

    def keep(fig, path):
        (ax,) = fig.axes
        shown[path.name] = (ax.get_ylabel(), ax.get_title(), [tuple(line.get_ydata()) for line in ax.lines])
        return path

    monkeypatch.setattr(plots, "save", keep)
    plots.plot_by_precision_and_batch([run], "samples_per_s", tmp_path / "throughput.png")
    plots.plot_by_precision_and_batch([run], "peak_memory_gib", tmp_path / "peak_memory.png")
    ylabel, title, lines = shown["throughput.png"]
    assert ylabel == "Training samples per second (test)"
    assert title.startswith("Training samples per second (test) by precision and global batch [")
    assert lines == [(10.0,)]  # 40 samples / 4 s in the measured epoch, by hand
    assert shown["peak_memory.png"][0] == FIGURES["peak_memory_gib"].header
