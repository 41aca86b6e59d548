"""Issue 24: the compute-only benchmark's NVML energy of the measured steps (J, J/sample, W), or why not."""

from __future__ import annotations

import json

import pytest
import torch

from cropscale.bench.step import command as bm
from cropscale.bench.step import energy as step_energy
from cropscale.bench.step import rows as step_rows


class _FakeCounter:
    """An NVML device whose total-energy counter reads the values given, in order (J)."""

    def __init__(self, readings: list[float]) -> None:
        self.readings = list(readings)

    def has_energy_counter(self):
        return True, None

    def energy_j(self) -> float:
        return self.readings.pop(0)


def test_energy_of_the_measured_window_by_hand(monkeypatch):
    dev = _FakeCounter([100.0, 130.0])
    monkeypatch.setattr(step_energy.nvml, "open_device_for", lambda device: (dev, None))
    clock = iter([10.0, 12.0])  # perf_counter at the start and at the end: a 2 s window
    monkeypatch.setattr(step_energy.time, "perf_counter", lambda: next(clock))
    row = step_rows.empty_row(bm.BenchmarkConfig(), "32-true", 2, torch.device("cpu"))
    start = step_energy.energy_start(torch.device("cpu"), row)
    step_energy.energy_end(start, row, samples=3 * 2)  # 3 measured steps of batch 2
    # 30 J over 2 s for 6 samples: 5 J a sample, 15 W
    assert row["energy_j"] == 30.0 and row["energy_j_per_sample"] == 5.0 and row["avg_power_w"] == 15.0
    assert row["energy_window_s"] == 2.0 and row["energy_method"] == "nvml-counter" and row["energy_reason"] is None


def test_counter_going_backwards_gives_no_energy_and_says_why(monkeypatch):
    dev = _FakeCounter([100.0, 50.0])
    monkeypatch.setattr(step_energy.nvml, "open_device_for", lambda device: (dev, None))
    row = step_rows.empty_row(bm.BenchmarkConfig(), "32-true", 2, torch.device("cpu"))
    step_energy.energy_end(step_energy.energy_start(torch.device("cpu"), row), row, samples=6)
    assert row["energy_j"] is None and "backwards" in row["energy_reason"]


def test_a_cpu_row_has_no_energy_and_the_reason():
    config = bm.BenchmarkConfig(precision=["32-true"], batch_sizes=[1], warmup=0, iterations=1, device="cpu",
                                t2=2, t1=1, crop_size=8)
    row = bm.run_benchmark(config, argv=[])["results"][0]
    assert row["status"] == "ok"
    assert row["energy_j"] is None and row["energy_j_per_sample"] is None
    assert "not on a CUDA GPU" in row["energy_reason"]


@pytest.mark.parametrize("seconds,flagged", [(0.2, True), (1.5, False)])
def test_a_window_under_a_second_is_flagged_coarse(monkeypatch, seconds, flagged):
    dev = _FakeCounter([0.0, 1.0])
    monkeypatch.setattr(step_energy.nvml, "open_device_for", lambda device: (dev, None))
    clock = iter([0.0, seconds])
    monkeypatch.setattr(step_energy.time, "perf_counter", lambda: next(clock))
    row = step_rows.empty_row(bm.BenchmarkConfig(), "32-true", 1, torch.device("cpu"))
    step_energy.energy_end(step_energy.energy_start(torch.device("cpu"), row), row, samples=1)
    assert (row["energy_reason"] is not None) == flagged and row["energy_j"] == 1.0


def test_the_row_names_each_figure_as_the_registry_does():
    """One name end to end: a benchmark row's figure keys are the keys of :data:`cropscale.runs.figures.FIGURES`.

    A row key made of the same words as a registry key in another order (``energy_j_per_sample`` against
    ``energy_j_per_sample``) is a second name for that figure.
    """
    from cropscale.runs.figures import FIGURES

    row = step_rows.empty_row(bm.BenchmarkConfig(), "32-true", 1, torch.device("cpu"))
    assert {"median_step_ms", "p95_step_ms", "samples_per_s", "peak_memory_gib", "energy_j",
            "energy_j_per_sample"} <= set(row) & set(FIGURES)
    words = {frozenset(key.split("_")): key for key in FIGURES}
    renamed = {key: words[frozenset(key.split("_"))] for key in row
               if frozenset(key.split("_")) in words and key not in FIGURES}
    assert renamed == {}


def test_the_report_reads_the_energy_of_a_benchmark_row(tmp_path):
    from cropscale.runs.record import load_benchmark

    row = step_rows.empty_row(bm.BenchmarkConfig(), "32-true", 2, torch.device("cuda", 0))
    row.update(median_step_ms=100.0, p95_step_ms=110.0, samples_per_s=20.0, peak_memory_gib=1.0,
               peak_memory_kind="cuda-max-allocated", nonfinite_steps=0)
    dev = _FakeCounter([100.0, 130.0])
    step_energy.energy_end((dev, dev.energy_j(), 0.0), row, samples=3 * 2)  # 30 J for 6 samples
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"schema": bm.SCHEMA, "environment": {"device": {"name": "GPU"}}, "results": [row]}))
    (record,) = load_benchmark(path)
    assert record.figures["energy_j"].value == 30.0
    assert record.figures["energy_j_per_sample"].value == 5.0
    assert record.figures["energy_j"].evidence == "measured-microbenchmark"


def test_a_cpu_row_reads_as_no_energy_with_the_reason(tmp_path):
    from cropscale.runs.record import load_benchmark

    row = step_rows.empty_row(bm.BenchmarkConfig(), "32-true", 1, torch.device("cpu"))
    row.update(median_step_ms=100.0, samples_per_s=10.0, energy_reason="not on a CUDA GPU")
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"schema": bm.SCHEMA, "environment": {"device": {"name": "CPU"}}, "results": [row]}))
    (record,) = load_benchmark(path)
    fig = record.figures["energy_j_per_sample"]
    assert fig.value is None and fig.why == "not on a CUDA GPU" and fig.note is None
