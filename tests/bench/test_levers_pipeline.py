"""lever-bench (each lever vs eager in one run) and pipeline-bench (end-to-end / compute-only samples/s)."""

from __future__ import annotations

import json

import pytest
import torch

from cropscale.bench import levers, pipeline
from cropscale.evidence import MEASURED_MICROBENCHMARK

TINY = ["--t2", "2", "--t1", "1", "--crop-size", "8", "--warmup", "0", "--iterations", "2", "--device", "cpu"]


def test_lever_bench_ratios_and_unavailable_levers(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(levers, "compile_unavailable_reason", lambda device_type: "no C++ compiler (test)")
    order = []
    real_step = levers.train_step

    def recording_step(model, *args):
        order.append(id(model))
        return real_step(model, *args)

    monkeypatch.setattr(levers, "train_step", recording_step)
    out = tmp_path / "levers.json"
    assert levers.main([*TINY, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = {r["lever"]: r for r in doc["levers"]}
    assert list(rows) == ["eager", "channels_last", "fused", "compile", "pinned"]
    eager = rows["eager"]
    assert eager["samples_per_s"] == pytest.approx(2 / (eager["median_step_ms"] / 1e3))  # default batch 2
    for name in ("channels_last", "fused"):
        assert rows[name]["ratio"] == pytest.approx(rows[name]["samples_per_s"] / eager["samples_per_s"])
    assert rows["compile"] == {"lever": "compile", "status": "unavailable", "reason": "no C++ compiler (test)"}
    assert "no host-to-device copy on a cpu run" in rows["pinned"]["reason"]
    captured = capsys.readouterr()
    assert f"| fused | {rows['fused']['median_step_ms']:.1f} ms |" in captured.out
    assert MEASURED_MICROBENCHMARK in captured.out
    assert "lever-bench: [1/1] eager, channels_last, fused interleaved (2 steps)" in captured.err
    # no warm-up here: the measured steps alternate eager, channels_last, fused, eager, channels_last, fused
    assert len(order) == 6 and order[:3] == order[3:] and len(set(order)) == 3


def test_pinned_transfer_needs_cuda():
    assert "reason" in levers.measure_transfer({"x": torch.zeros(2)}, torch.device("cpu"), 3)


def test_pipeline_bench_ratio_is_end_to_end_over_compute(tmp_path, capsys, flanders_root):
    out = tmp_path / "pipeline.json"
    assert pipeline.main(["--root", str(flanders_root), "--batch-size", "2", "--steps", "2", "--warmup", "1",
                          "--crop-size", "16", "--t2", "2", "--t1", "1", "--device", "cpu", "--threads", "1",
                          "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    e2e, comp = doc["end_to_end"], doc["compute_only"]
    assert e2e["steps"] == 2 and comp["steps"] == 2
    assert e2e["samples_per_s"] == pytest.approx(2 * 2 / (e2e["mean_step_ms"] * 2 / 1e3))
    assert doc["ratio"] == pytest.approx(e2e["samples_per_s"] / comp["samples_per_s"])
    assert doc["not_compute_share"] == pytest.approx(1 - doc["ratio"])
    assert e2e["fused_optimizer"][0] is True  # the task's auto choice on a CPU, used for the compute step too
    text = capsys.readouterr()
    assert f"ratio end-to-end / compute-only: {doc['ratio']:.2f}" in text.out
    assert "pipeline-bench: [3/3] data only" in text.err
