"""The compute-only microbenchmark (issue 7): the CLI run on CPU, the JSON schema, exact derived
figures, OOM handling, the real GradScaler under 16-mixed, argument errors."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch

from cropscale import CropScaleError
from cropscale.bench.measure import speedup_and_karp_flatt
from cropscale.bench.step import command as bm
from cropscale.bench.step import config as step_config
from cropscale.bench.step import mfu as step_mfu
from cropscale.bench.step import run as step_run
from cropscale.runs.figures import FIGURES

COMMAND = ["benchmark", "--precision", "32-true", "bf16-mixed", "--batch-sizes", "1", "2",
           "--warmup", "2", "--iterations", "5"]

ROW_FIELDS = {
    "precision": str, "precision_label": str, "batch_size": int, "status": str, "evidence": str,
    "step_times_ms": list, "warmup_step_times_ms": list, "median_step_ms": float, "p95_step_ms": float,
    "mean_step_ms": float, "min_step_ms": float, "max_step_ms": float, "samples_per_s": float,
    "peak_memory_gib": float, "peak_memory_kind": str, "flops_per_sample": float, "achieved_tflops": float,
    "nonfinite_steps": int, "nonfinite_warmup_steps": int, "tf32": dict, "grad_scaler": bool,
}
NULLABLE_ROW_FIELDS = ("error", "peak_reserved_gib", "peak_tflops", "mfu", "mfu_reason", "loss_scale_initial",
                       "loss_scale_final", "autocast_dtype", "final_loss")

# The default suite runs the issue's command on a smaller sample shape (T2 = 4, T1 = 2, 16 x 16 pixels)
# so that it stays fast on a shared 2-core machine; the full-size command is the `slow` test below.
SMALL = ["--t2", "4", "--t1", "2", "--crop-size", "16"]
TINY = dict(t2=2, t1=1, crop_size=8, warmup=0, iterations=1, device="cpu")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: on a loaded 2-core machine OpenMP's spinning threads slow steps tenfold."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _run_cli(argv: list[str], out: Path) -> tuple[int, str, dict]:
    """``python -m cropscale <argv> --json out`` in this process (the CLI's dispatcher)."""
    from cropscale.cli.main import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit) as exit_info:
        main([*argv, "--json", str(out)])
    return exit_info.value.code, buf.getvalue(), json.loads(out.read_text())


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory, one_thread):
    """The issue's command (smaller sample shape), once for the module."""
    return _run_cli([*COMMAND, *SMALL], tmp_path_factory.mktemp("bench") / "bench.json")


@pytest.mark.slow
def test_issue_command_full_size(tmp_path):
    """The issue's exact command at the study's sample shape (T2 = 16, T1 = 4, 32 x 32)."""
    run = _run_cli(COMMAND, tmp_path / "bench.json")
    test_cli_exit_status_and_table(run)
    test_json_schema(run, argv=COMMAND)
    assert run[2]["settings"]["crop_size"] == 32 and run[2]["settings"]["t2"] == 16


def test_cli_exit_status_and_table(cli_run):
    code, stdout, doc = cli_run
    assert code == 0
    lines = stdout.strip().splitlines()
    header = lines.index("| Precision | Batch | Median step | p95 step | Samples/s | Peak GiB |")
    table = lines[header + 2: header + 6]
    assert [row.split("|")[1:3] for row in table] == [
        [" FP32 ", " 1 "], [" FP32 ", " 2 "], [" AMP BF16 ", " 1 "], [" AMP BF16 ", " 2 "]]
    # the printed cells are the JSON figures, rounded as the study prints them
    for row, result in zip(table, doc["results"], strict=True):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[2] == f"{result['median_step_ms']:.2f} ms"
        assert cells[3] == f"{result['p95_step_ms']:.2f} ms"
        assert cells[4] == f"{result['samples_per_s']:.1f}"
        assert cells[5] == f"{result['peak_memory_gib']:.2f}"
    assert "evidence: measured-microbenchmark" in stdout
    assert "AMP BF16 vs FP32 at batch 1:" in stdout and "AMP BF16 vs FP32 at batch 2:" in stdout


def test_json_schema(cli_run, argv=(*COMMAND, *SMALL)):
    _, _, doc = cli_run
    assert doc["schema"] == bm.SCHEMA
    assert doc["evidence"] == "measured-microbenchmark"
    settings = doc["settings"]
    assert settings["precisions"] == ["32-true", "bf16-mixed"] and settings["batch_sizes"] == [1, 2]
    assert (settings["warmup"], settings["iterations"], settings["device"]) == (2, 5, "cpu")
    assert settings["clip_grad_norm"] == 1.0 and settings["optimizer"] == "AdamW"
    assert set(doc["flops_per_sample"]) == {"forward", "backward", "total"}
    assert doc["flops_per_sample"]["total"] == doc["flops_per_sample"]["forward"] + doc["flops_per_sample"]["backward"]
    assert doc["flops_evidence"] == "count"  # FlopCounterMode counts, not measurements
    assert set(doc["flops_by_class"]) == {"convolution", "matmul", "attention"}
    assert all(v > 0 for v in doc["flops_by_class"].values())

    env = doc["environment"]
    # every module of the measured code path, the timed step's own (step/run.py) included, by its SHA-256
    package = Path(bm.__file__).resolve().parents[2]
    files = env["source_files"]
    assert {f"cropscale/bench/step/{m}.py" for m in ("command", "run", "config", "energy", "mfu", "rows")} <= set(files)
    assert "cropscale/model/network.py" in files and "cropscale/model/losses.py" in files
    for name, digest in files.items():
        assert digest == hashlib.sha256((package.parent / name).read_bytes()).hexdigest(), name
    listing = "".join(f"{files[name]}  {name}\n" for name in sorted(files))
    assert env["source_files_sha256"] == hashlib.sha256(listing.encode()).hexdigest()
    assert env["invocation"]["argv"] == [*argv[1:], "--json", env["invocation"]["argv"][-1]]
    assert env["host"]["hostname"]
    assert len(env["host"]["load_average_1_5_15_min"]) == 3 and len(env["host"]["load_average_1_5_15_min_end"]) == 3
    if env["git"]["available"]:
        assert len(env["git"]["commit"]) == 40 and isinstance(env["git"]["dirty"], bool)
    else:
        assert env["git"]["reason"]
    dev = env["device"]
    assert dev["type"] == "cpu" and dev["name"]
    for key in ("index", "driver", "power_limit_w", "persistence_mode"):
        assert key in dev
    assert dev["driver"] is None and dev["nvml_reason"]  # no GPU: null with a reason
    assert env["libraries"]["torch"] == torch.__version__

    assert [(r["precision"], r["batch_size"]) for r in doc["results"]] == [
        ("32-true", 1), ("32-true", 2), ("bf16-mixed", 1), ("bf16-mixed", 2)]
    for r in doc["results"]:
        for key, kind in ROW_FIELDS.items():
            assert isinstance(r[key], kind), (key, r[key])
        for key in NULLABLE_ROW_FIELDS:
            assert key in r
        assert r["status"] == "ok" and r["evidence"] == "measured-microbenchmark"
        assert len(r["step_times_ms"]) == 5 and len(r["warmup_step_times_ms"]) == 2
        assert all(t > 0 for t in r["step_times_ms"])
        assert r["median_step_ms"] == statistics.median(r["step_times_ms"])
        assert r["p95_step_ms"] == pytest.approx(float(np.percentile(r["step_times_ms"], 95)), rel=1e-12)
        assert r["samples_per_s"] == r["batch_size"] / (r["median_step_ms"] / 1000)
        assert r["achieved_tflops"] == pytest.approx(
            doc["flops_per_sample"]["total"] * r["batch_size"] / (r["median_step_ms"] / 1000) / 1e12, rel=1e-12)
        assert r["mfu"] is None and "CPU" in r["mfu_reason"]
        dtype = {"32-true": "fp32", "bf16-mixed": "bf16"}[r["precision"]]  # TF32 is off in every row
        assert r["dtypes_by_class"] == {"convolution": dtype, "matmul": dtype, "attention": dtype}
        assert r["peak_memory_kind"] == "host-rss-process" and 0 < r["peak_memory_gib"] < 64
        assert r["tf32"] == {"matmul": False, "cudnn": False}
        assert r["loss_scale_final"] is None and r["grad_scaler"] is False  # no scaler outside 16-mixed
        assert r["nonfinite_steps"] == 0
    bf16 = [r for r in doc["results"] if r["precision"] == "bf16-mixed"]
    assert all(r["autocast_dtype"] == "bfloat16" for r in bf16)
    ratios = doc["amp_vs_fp32"]
    assert [(a["precision"], a["batch_size"]) for a in ratios] == [("bf16-mixed", 1), ("bf16-mixed", 2)]
    by = {(r["precision"], r["batch_size"]): r for r in doc["results"]}
    for a in ratios:
        assert a["speedup_vs_fp32"] == by[(a["precision"], a["batch_size"])]["samples_per_s"] / by[
            ("32-true", a["batch_size"])]["samples_per_s"]


def test_oom_at_one_batch_size_is_reported_and_the_rest_run():
    calls = []

    def oom_at_two(model, loss_fn, optimizer, scaler, batch, device_type, dtype):
        calls.append(batch["s2"].shape[0])
        if batch["s2"].shape[0] == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (fake)")
        return bm.train_step(model, loss_fn, optimizer, scaler, batch, device_type, dtype)

    config = bm.BenchmarkConfig(precision=["32-true"], batch_sizes=[1, 2, 3], **TINY)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = True, True
    try:
        doc = bm.run_benchmark(config, argv=[], step_fn=oom_at_two)
        # TF32 was off inside every configuration and the user's setting is back afterwards
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    assert all(r["tf32"] == {"matmul": False, "cudnn": False} for r in doc["results"] if r["status"] == "ok")
    statuses = [(r["batch_size"], r["status"]) for r in doc["results"]]
    assert statuses == [(1, "ok"), (2, "oom"), (3, "ok")]
    assert calls == [1, 2, 3]
    oom = doc["results"][1]
    assert "out of memory" in oom["error"] and oom["step_times_ms"] == [] and oom["samples_per_s"] is None
    table = bm.format_table(doc)
    assert "| FP32 | 2 | OOM | OOM | OOM | OOM |" in table
    assert "FP32 batch 2: oom" in table


def test_other_errors_are_recorded_and_exit_status_is_one(monkeypatch, tmp_path, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(step_run, "train_step", broken)
    status = bm.main(["--precision", "32-true", "--batch-sizes", "1", "--t2", "2", "--t1", "1", "--crop-size", "8",
                      "--warmup", "0", "--iterations", "1", "--device", "cpu", "--json", str(tmp_path / "b.json")])
    assert status == 1
    row = json.loads((tmp_path / "b.json").read_text())["results"][0]
    assert row["status"] == "error" and row["error"] == "RuntimeError: kernel exploded"
    assert "FP32 batch 1: error — RuntimeError: kernel exploded" in capsys.readouterr().out


def test_fp16_uses_a_real_grad_scaler_on_cpu():
    """An inf loss on the first step: the scaler skips that step and halves the scale (65536 -> 32768);
    the step is counted as non-finite; the next steps are finite and keep the scale."""
    seen = {"n": 0}

    def inf_first(model, loss_fn, optimizer, scaler, batch, device_type, dtype):
        seen["n"] += 1
        if seen["n"] == 1:
            def poisoned(outputs, b):
                loss, terms = loss_fn(outputs, b)
                return loss * float("inf"), terms
            before = [p.detach().clone() for p in model.parameters()]
            out = bm.train_step(model, poisoned, optimizer, scaler, batch, device_type, dtype)
            assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))  # skipped
            return out
        return bm.train_step(model, loss_fn, optimizer, scaler, batch, device_type, dtype)

    config = bm.BenchmarkConfig(precision=["16-mixed"], batch_sizes=[1], **{**TINY, "warmup": 1, "iterations": 2})
    row = bm.run_benchmark(config, argv=[], step_fn=inf_first)["results"][0]
    assert row["status"] == "ok", row["error"]
    assert row["grad_scaler"] is True and row["autocast_dtype"] == "float16"
    assert row["loss_scale_initial"] == 65536.0 and row["loss_scale_final"] == 32768.0
    assert row["nonfinite_warmup_steps"] == 1 and row["nonfinite_steps"] == 0


def test_amp_ratios_exact():
    rows = [
        {"precision": "32-true", "batch_size": 4, "status": "ok", "samples_per_s": 38.1, "peak_memory_gib": 3.29},
        {"precision": "16-mixed", "batch_size": 4, "status": "ok", "samples_per_s": 54.3, "peak_memory_gib": 2.50},
        {"precision": "16-mixed", "batch_size": 8, "status": "ok", "samples_per_s": 60.0, "peak_memory_gib": 4.0},
        {"precision": "bf16-mixed", "batch_size": 4, "status": "oom", "samples_per_s": None, "peak_memory_gib": None},
    ]
    (ratio,) = bm.amp_ratios(rows)  # batch 8 has no FP32 row, the BF16 row ran out of memory
    assert ratio["batch_size"] == 4 and ratio["precision"] == "16-mixed"
    assert ratio["speedup_vs_fp32"] == 54.3 / 38.1
    assert round(ratio["throughput_gain_pct"], 1) == 42.5  # the study's 42.6 % is from unrounded figures
    assert round(ratio["memory_saving_pct"], 1) == 24.0  # the study: 22.7-24.0 % less peak memory


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--batch-sizes", "0"], "--batch-sizes"),
        (["--iterations", "0"], "--iterations"),
        (["--crop-size", "30"], "--crop-size"),
        (["--device", "cuda:7"] if not torch.cuda.is_available() else ["--device", "cuda:99"], "--device"),
        (["--device", "banana"], "--device"),
        (["--net-kwargs", "{bad json"], "--net-kwargs"),
        (["--net-kwargs", "[1, 2]"], "--net-kwargs"),
    ],
)
def test_bad_arguments_raise_cropscale_error(argv, match):
    with pytest.raises(CropScaleError, match=match):
        bm.main([*argv, "--warmup", "0", "--iterations", str(1 if "--iterations" not in argv else 0)])


def test_peak_tflops_from_the_callbacks_table_override_and_reason():
    from cropscale.env.peaks import peak_tflops as table_peak

    assert table_peak("NVIDIA H200", "bf16") is not None
    assert bm.peak_tflops("NVIDIA H200", "bf16") == (table_peak("NVIDIA H200", "bf16"), None)
    assert bm.peak_tflops("NVIDIA H200", "fp32") == (table_peak("NVIDIA H200", "fp32"), None)
    assert bm.peak_tflops("NVIDIA H200", "bf16", override=500.0) == (500.0, None)
    value, reason = bm.peak_tflops("Imaginary Accelerator 9000", "bf16")
    assert value is None and reason


@pytest.mark.gpu
def test_cuda_rows_memory_mfu_and_scaler():
    """On a CUDA device: peak allocated memory (not RSS), TF32 off, a real GradScaler, MFU from the peak
    table when the GPU is in it, the NVML record (driver, power limit, persistence mode) or its reason."""
    if not torch.cuda.is_available():
        pytest.fail("marked gpu: run this where torch sees a CUDA device (scripts/gpu_check.sh)")
    from cropscale.env.peaks import peak_tflops as table_peak

    config = bm.BenchmarkConfig(precision=["32-true", "16-mixed", "bf16-mixed"], batch_sizes=[2], warmup=2,
                                iterations=3, device="cuda", t2=4, t1=2, crop_size=16)
    doc = bm.run_benchmark(config, argv=[])
    name = torch.cuda.get_device_name(0)
    dev = doc["environment"]["device"]
    assert dev["type"] == "cuda" and dev["name"] == name
    assert dev["driver"] is not None or dev.get("nvml_reason")
    for r in doc["results"]:
        assert r["status"] == "ok", r["error"]
        assert r["peak_memory_kind"] == "cuda-max-allocated"
        assert 0 < r["peak_memory_gib"] <= r["peak_reserved_gib"]
        assert r["tf32"] == {"matmul": False, "cudnn": False}
        assert len(r["step_times_ms"]) == 3
        dtype = {"32-true": "fp32", "16-mixed": "fp16", "bf16-mixed": "bf16"}[r["precision"]]
        peak = table_peak(name, dtype)
        if peak is None:
            assert r["mfu"] is None and r["mfu_reason"]
        else:
            assert r["peak_tflops"] == peak and r["mfu"] == r["achieved_tflops"] / peak
    fp16 = doc["results"][1]
    skipped = fp16["nonfinite_steps"] + fp16["nonfinite_warmup_steps"]
    assert fp16["loss_scale_final"] == fp16["loss_scale_initial"] * 0.5**skipped


def test_mfu_divides_by_the_attainable_peak_of_the_row(monkeypatch):
    """Issue 12, item 4, in the benchmark JSON: the row's dtypes come from torch's switches when it runs. With
    the benchmark's TF32-off rows, 32-true is FP32 throughout (67 TFLOP/s on an H200); were cuDNN TF32 on,
    convolutions would run in TF32: 1000 / (600 / 494.5 + 400 / 67) by hand. BF16: 989.5."""
    monkeypatch.setattr(step_mfu, "_device_name", lambda device: "NVIDIA H200")
    split = {"convolution": 600.0, "matmul": 300.0, "attention": 100.0}
    config = bm.BenchmarkConfig(precision=["32-true"], batch_sizes=[1], device="cpu")
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    try:
        for cudnn, precision, expected in ((False, "32-true", 67.0), (True, "32-true", 1000 / (600 / 494.5 + 400 / 67)),
                                           (True, "bf16-mixed", 989.5)):
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = cudnn
            row = {"median_step_ms": 10.0}
            step_mfu.mfu_figures(row, config, precision, 2, torch.device("cuda"), 1000.0, split)
            assert row["peak_tflops"] == pytest.approx(expected, rel=1e-12), (cudnn, precision)
            assert row["mfu"] == pytest.approx(row["achieved_tflops"] / expected, rel=1e-12)
            assert row["dtypes_by_class"]["convolution"] == {(False, "32-true"): "fp32", (True, "32-true"): "tf32",
                                                             (True, "bf16-mixed"): "bf16"}[(cudnn, precision)]
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_stop_at_oom_skips_larger_batches_and_progress_goes_to_stderr(capsys):
    calls = []

    def oom_from_two(model, loss_fn, optimizer, scaler, batch, device_type, dtype):
        calls.append(batch["s2"].shape[0])
        if batch["s2"].shape[0] >= 2:
            raise torch.OutOfMemoryError("out of memory (fake)")
        return bm.train_step(model, loss_fn, optimizer, scaler, batch, device_type, dtype)

    config = bm.BenchmarkConfig(precision=["32-true"], batch_sizes=[1, 2, 4, 8], stop_at_oom=True, **TINY)
    doc = bm.run_benchmark(config, argv=[], step_fn=oom_from_two)
    assert [(r["batch_size"], r["status"]) for r in doc["results"]] == [(1, "ok"), (2, "oom"), (4, "skipped"),
                                                                        (8, "skipped")]
    assert calls == [1, 2]  # 4 and 8 never built
    assert "batch 2 already ran out of memory" in doc["results"][2]["error"]
    assert "| FP32 | 4 | not run | not run |" in bm.format_table(doc)
    captured = capsys.readouterr()
    assert captured.out == ""  # run_benchmark prints nothing on stdout: the command prints the results
    assert "benchmark: [1/4] FP32 batch 1 (1 steps)" in captured.err
    assert "benchmark: [4/4] FP32 batch 8" in captured.err


def test_max_seconds_budget_lists_what_was_not_run(monkeypatch):
    ticks = iter([0.0, 0.0, 100.0, 100.0, 100.0, 100.0])
    monkeypatch.setattr(bm.time, "monotonic", lambda: next(ticks, 100.0))
    config = bm.BenchmarkConfig(precision=["32-true"], batch_sizes=[1, 2], max_seconds=50, **TINY)
    doc = bm.run_benchmark(config, argv=[], progress=bm.Progress(2, "t", stream=io.StringIO(),
                                                                 clock=lambda: 0.0))
    assert [r["status"] for r in doc["results"]] == ["ok", "skipped"]
    assert "--max-seconds 50 budget was spent (100 s)" in doc["results"][1]["error"]


def test_tf32_fused_and_compile_mode_reach_the_rows(monkeypatch):
    seen = {}

    def recording_step(model, loss_fn, optimizer, scaler, batch, device_type, dtype):
        seen["fused"] = optimizer.defaults.get("fused")
        seen["tf32"] = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        seen["model"] = model
        return bm.train_step(model, loss_fn, optimizer, scaler, batch, device_type, dtype)

    monkeypatch.setattr(step_config, "compile_unavailable_reason", lambda device_type: None)
    monkeypatch.setattr(torch, "compile", lambda model, mode: seen.setdefault("mode", mode) and model)
    config = bm.BenchmarkConfig(precision=["32-true"], batch_sizes=[1], tf32=True, fused=True, compile=True,
                                compile_mode="max-autotune", **TINY)
    doc = bm.run_benchmark(config, argv=[], step_fn=recording_step)
    row = doc["results"][0]
    assert seen["fused"] is True and seen["tf32"] == (True, True) and seen["mode"] == "max-autotune"
    assert row["precision_label"] == "TF32" and row["tf32"] == {"matmul": True, "cudnn": True}
    assert row["fused"] is True and row["compile_mode"] == "max-autotune"
    assert "on for matmul" in doc["settings"]["tf32"]


def test_compile_without_a_compiler_is_one_line(monkeypatch):
    monkeypatch.setattr(step_config, "compile_unavailable_reason", lambda device_type: "no C++ compiler (test)")
    with pytest.raises(CropScaleError, match=r"^--compile: torch.compile is unavailable on cpu: no C\+\+ compiler"):
        bm.main(["--compile", "--device", "cpu", "--batch-sizes", "1"])


def test_bf16_on_a_cpu_without_bf16_units_is_said_up_front(monkeypatch):
    monkeypatch.setattr(bm, "cpu_bf16_units", lambda: False)
    config = bm.BenchmarkConfig(precision=["32-true", "bf16-mixed"], **TINY)
    notes = bm.slow_notes(config, torch.device("cpu"))
    assert any("bf16-mixed is known to be slow on this CPU" in n for n in notes)
    monkeypatch.setattr(bm, "cpu_bf16_units", lambda: True)
    assert not any("bf16-mixed" in n for n in bm.slow_notes(config, torch.device("cpu")))


def test_batch_order_and_the_output_written_after_every_configuration(tmp_path, monkeypatch):
    out = tmp_path / "b.json"
    seen_rows = []
    real = bm.run_configuration

    def spy(config, precision, batch_size, *args, **kwargs):
        if out.exists():  # the rows before this one are on disk already
            seen_rows.append(len(json.loads(out.read_text())["results"]))
        return real(config, precision, batch_size, *args, **kwargs)

    monkeypatch.setattr(bm, "run_configuration", spy)
    status = bm.main(["--precision", "32-true", "16-mixed", "--batch-sizes", "1", "2", "--order", "batch",
                      "--t2", "2", "--t1", "1", "--crop-size", "8", "--warmup", "0", "--iterations", "1",
                      "--device", "cpu", "--json", str(out)])
    assert status == 0
    doc = json.loads(out.read_text())
    assert [(r["precision"], r["batch_size"]) for r in doc["results"]] == [
        ("32-true", 1), ("16-mixed", 1), ("32-true", 2), ("16-mixed", 2)]
    assert seen_rows == [1, 2, 3]


def test_the_benchmark_ratios_are_named_by_the_figure_registry():
    """One name per figure: the benchmark JSON's AMP-vs-FP32 ratios and the device speed-up carry the keys the
    report and the study use (cropscale.runs.figures), not a bare ``speedup`` of unnamed base."""
    rows = [{"precision": "32-true", "batch_size": 2, "status": "ok", "samples_per_s": 10.0, "peak_memory_gib": 2.0},
            {"precision": "bf16-mixed", "batch_size": 2, "status": "ok", "samples_per_s": 15.0, "peak_memory_gib": 1.5}]
    (ratio,) = bm.amp_ratios(rows)
    figures = {k for k in ratio if k in FIGURES}
    assert figures == {"precision", "speedup_vs_fp32", "memory_ratio"}
    assert (ratio["speedup_vs_fp32"], ratio["memory_ratio"]) == (1.5, 0.75)  # 15 / 10, 1.5 / 2.0 by hand
    assert {k for k in speedup_and_karp_flatt(8.0, 5.0, 2) if k in FIGURES} == {
        "speedup_vs_1_device", "efficiency", "karp_flatt"}
