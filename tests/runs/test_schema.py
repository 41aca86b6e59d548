"""The typed run.json records: a document in the documented schema (docs/run_json.md, written out by
hand here) reads into the records and writes back to the same JSON, key order included; optional
fields are left out while unset; unknown keys survive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cropscale import CropScaleError
from cropscale.runs.schema import (
    SUMMARY_TYPES,
    EnergySummary,
    LossScaleSummary,
    RunJson,
    StepTimingSummary,
    WindowStats,
)

DOC = {
    "schema": "cropscale.run/1", "evidence": "measured-run", "status": "finished",
    "started_utc": "2026-12-01T10:00:00+00:00", "finished_utc": "2026-12-01T10:05:00+00:00",
    "run_dir": "/tmp/r", "command": ["python", "-m", "cropscale", "fit"],
    "git": {"available": True, "repo": "/x", "commit": "abc", "dirty": False},
    "dataset": {"available": False, "reason": "none"}, "config": {"trainer": {"max_epochs": 2}},
    "config_source": "SaveConfigCallback", "host": {"hostname": "h", "platform": "p", "cpu_count": 2},
    "versions": {"python": "3.11.7", "torch": "2.13.0"}, "devices": [{"global_rank": 0, "device": "cpu"}],
    "topology": {"available": False, "reason": "nvidia-smi not found"},
    "distributed": {"world_size": 1, "strategy": "SingleDeviceStrategy"}, "precision": "32-true",
    "float32_matmul_precision": "highest", "seeds": {"PL_GLOBAL_SEED": "0"}, "trainer": {"max_epochs": 2},
    "callbacks": ["StepTimingCallback"], "extra": {"note": "kept"},
    "summary": {
        "step_timing": {
            "evidence": "measured-run", "clock": "perf_counter", "warmup_steps": 5, "sync_cuda": False,
            "steps_total": 12, "steps_measured": 4, "comm_timing": {"available": False, "reason": "1 rank"},
            "trace_path": None, "windows": ["data_wait", "step"],
            "epochs": [{"epoch": 1, "steps_measured": 4,
                        "windows_ms": {"step": {"median": 10.5, "p95": 12.0, "n": 4}},
                        "step_ms_per_rank": {"per_rank": [10.5], "max": 10.5, "median": 10.5, "slowest_rank": 0},
                        "window_median_ms_per_rank": {"step": [10.5]}, "first_batch_wait_ms_per_rank": [3.0]}],
        },
        "loss_scale": {"evidence": "measured-run", "precision": "32-true", "scaler_in_use": False,
                       "reason": "no GradScaler"},
        "energy": {"evidence": "measured-run", "available": False, "reason": "cpu", "devices": []},
        "future_section": {"x": 1},
    },
    "global_step": 12, "epochs_completed": 2,
}


def test_documented_document_round_trips_exactly():
    record = RunJson.from_json(json.loads(json.dumps(DOC)))
    assert isinstance(record.summary.step_timing, StepTimingSummary)
    assert record.summary.step_timing.epochs[0].windows_ms["step"] == WindowStats(10.5, 12.0, 4)
    assert record.summary.step_timing.epochs[0].step_ms_per_rank.slowest_rank == 0
    assert record.summary.throughput is None and record.extra == {"note": "kept"}
    out = record.to_json()
    assert out == DOC
    assert list(out) == list(DOC) and list(out["summary"]) == list(DOC["summary"])


def test_optional_fields_are_left_out_while_unset():
    no_scaler = LossScaleSummary(precision="bf16-mixed", reason="bf16 needs no loss scaling")
    assert no_scaler.to_json() == {"evidence": "measured-run", "precision": "bf16-mixed", "scaler_in_use": False,
                                   "reason": "bf16 needs no loss scaling"}
    unavailable = EnergySummary(reason="no CUDA device")
    assert set(unavailable.to_json()) == {"evidence", "available", "reason", "devices"}


def test_non_finite_numbers_become_null():
    stats = WindowStats(median=float("nan"), p95=float("inf"), n=0)
    assert stats.to_json() == {"median": None, "p95": None, "n": 0}
    json.dumps(stats.to_json(), allow_nan=False)


def test_every_summary_section_has_a_record_type():
    assert set(SUMMARY_TYPES) == {"step_timing", "throughput", "loss_scale", "nonfinite", "grad_norm", "energy",
                                  "memory", "trained", "checkpoint", "quality", "divergence"}


def test_a_section_that_is_not_an_object_is_refused():
    with pytest.raises(CropScaleError, match="StepTimingSummary: expected a JSON object"):
        StepTimingSummary.from_json([1, 2])


def test_benchmark_rows_are_named_with_their_own_label_and_compile(tmp_path):
    import json

    from cropscale.runs.record import load_benchmark

    rows = [{"precision": "32-true", "precision_label": "TF32", "batch_size": 4, "status": "ok", "compile": True},
            {"precision": "bf16-mixed", "batch_size": 8, "status": "skipped", "compile": False}]
    path = tmp_path / "bench_tf32.json"
    path.write_text(json.dumps({"schema": "cropscale.benchmark/1", "results": rows,
                                "environment": {"device": {"name": "NVIDIA H200"}}}))
    names = [r.name for r in load_benchmark(path)]
    assert names == ["bench_tf32.json: TF32 b4 compiled", "bench_tf32.json: AMP BF16 b8"]


def test_to_json_is_the_one_cleaning_pass_before_the_file():
    """run.json is written straight from ``to_json()``: NaN / inf -> null, tuples -> lists, keys -> str and any other
    object -> its ``str`` (a path, a numpy integer), so ``json.dumps(allow_nan=False)`` needs no second pass."""
    class Opaque:
        def __str__(self) -> str:
            return "opaque-object"

    record = RunJson(config={"model": {"lr": float("nan"), "root": Path("/data/x"), "sizes": (64, 32), 3: Opaque()}},
                     extra={"loss": float("-inf")})
    out = record.to_json()
    assert out["config"] == {"model": {"lr": None, "root": "/data/x", "sizes": [64, 32], "3": "opaque-object"}}
    assert out["extra"] == {"loss": None}
    assert json.loads(json.dumps(out, allow_nan=False)) == out
