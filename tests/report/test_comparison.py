"""The report's lead comparison, status marking, step decomposition in percent and device scaling, with
hand-worked numbers on fake run folders (the helpers of test_report)."""

from __future__ import annotations

import json

import pytest
import yaml

from cropscale.report import command as rp
from cropscale.report.comparison import comparison_rows, status, step_rows
from cropscale.report.pairs import precision_pairs
from cropscale.report.scaling import device_series
from cropscale.runs.record import load_inputs, load_run
from tests.report.test_report import _fake_bench, _fake_run, _md_row

NAN = float("nan")


def _losses(folder, values) -> None:
    """Add ``train/loss_step`` events (steps 0, 1, ...) to a run folder."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder), filename_suffix=".losses")
    for step, value in enumerate(values):
        writer.add_scalar("train/loss_step", value, step)
    writer.close()


def _on_devices(folder, devices: int, samples: int, train_s: list[float], global_batch: int = 8, seed: int = 0):
    """A fake FP32 run on ``devices`` ranks, equal-global: local batch = global batch / devices."""
    f = _fake_run(folder, "32-true", [0.2, 0.3, 0.31], samples=samples, step_ms=100.0, train_s=train_s,
                  val_s=[2.0] * len(train_s), batch_size=global_batch, name=folder.parent.name, gpu_peak=3.0)
    run = json.loads((f / "run.json").read_text())
    run["distributed"] = {"world_size": devices, "strategy": "DDPStrategy" if devices > 1 else "SingleDeviceStrategy"}
    (f / "run.json").write_text(json.dumps(run))
    cfg = yaml.safe_load((f / "config.yaml").read_text())
    cfg["trainer"].update(devices=devices, strategy="ddp" if devices > 1 else "auto", accumulate_grad_batches=1)
    cfg["data"]["batch_size"] = global_batch // devices
    cfg["seed_everything"] = seed
    (f / "config.yaml").write_text(yaml.safe_dump(cfg))
    return f


@pytest.fixture()
def mixed(tmp_path):
    runs = tmp_path / "runs"
    fp32 = _fake_run(runs / "fp32" / "version_0", "32-true", [0.20, 0.35, 0.30], samples=210, step_ms=100.0,
                     train_s=[30.0, 20.0, 22.0], val_s=[5.0, 4.0, 6.0], energy_j=3600.0, name="fp32", gpu_peak=3.0)
    amp = _fake_run(runs / "amp" / "version_0", "16-mixed", [0.25, 0.30, 0.33], samples=203, step_ms=70.0,
                    train_s=[25.0, 15.0, 14.0], val_s=[5.0, 4.0, 4.0], energy_j=2400.0, name="amp", gpu_peak=2.4)
    _losses(fp32, [2.0, 1.5, 1.2])
    _losses(amp, [2.0, NAN, NAN, NAN])  # the last 3 logged losses non-finite: diverged
    return tmp_path, fp32, amp, _fake_bench(tmp_path / "bench.json")


def test_comparison_rows_by_hand(mixed):
    tmp, fp32, amp, bench = mixed
    records = load_inputs([tmp / "runs", bench], on_skip=None)
    rows = {r.values["name"]: r for r in comparison_rows(records, precision_pairs(records), device_series(records))}
    base, mixed_run = rows["fp32/version_0"], rows["amp/version_0"]
    # FP32: 420 samples in 42 s over the measured epochs 1, 2; AMP: 406 in 29 s
    assert base.figures["samples_per_s"].value == pytest.approx(10.0)
    # the AMP run diverged: it forms no precision pair (docs/01_first_run.md), so no speed-up or mIoU change beside FP32
    assert mixed_run.figures["speedup_vs_fp32"].value is None and "diverged" in mixed_run.figures["speedup_vs_fp32"].why
    assert mixed_run.figures["iou_difference"].value is None
    assert [p.other for p in precision_pairs(records)] == ["bench.json: AMP FP16 b4"]
    assert "no run of the same configuration on another device count" in base.figures["efficiency"].why
    assert base.descriptive["status"].value == "finished" and mixed_run.descriptive["status"].value == "diverged"
    assert base.descriptive["precision"].value == "FP32"
    bench_base = rows["bench.json: FP32 b4"]  # an FP32 base without a quality figure: no invented 0 change
    assert bench_base.figures["speedup_vs_fp32"].value == 1.0 and bench_base.figures["iou_difference"].value is None
    assert rows["bench.json: AMP FP16 b64"].descriptive["status"].value == "oom"


def test_status_marks_diverged_failed_and_incomplete(mixed, tmp_path):
    _, fp32, amp, _ = mixed
    verdict = status(load_run(amp))
    assert verdict.value == "diverged"
    assert verdict.note == "train/loss_step non-finite at the last 3 logged step(s) (steps 1-3; last finite at step 0)"
    for run_status, error, shown, needle in (("failed", {"type": "RuntimeError", "message": "boom"}, "failed",
                                              "RuntimeError: boom"),
                                             ("running", None, "incomplete", "never completed")):
        run = json.loads((fp32 / "run.json").read_text())
        run["status"] = run_status
        run.pop("error", None)
        if error:
            run["error"] = error
        (fp32 / "run.json").write_text(json.dumps(run))
        cell = status(load_run(fp32))
        assert cell.value == shown and needle in cell.note


def test_report_marks_a_diverged_run_everywhere_it_is_listed(mixed):
    tmp, _, _, _ = mixed
    out = tmp / "report"
    assert rp.main([str(tmp / "runs"), "--output", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert _md_row(md, "amp/version_0")[1] == "diverged"  # the comparison
    quality = md.split("### Quality")[1]
    cell = _md_row(quality, "amp/version_0")[1]
    assert cell.startswith("diverged [")
    n = cell.rsplit("[", 1)[1].rstrip("]")
    assert f"[{n}] train/loss_step non-finite at the last 3 logged step(s)" in quality


def test_step_decomposition_is_percent_of_the_median_step_and_agrees_with_the_speed_table(mixed):
    tmp, fp32, _, _ = mixed
    (row,) = step_rows([load_run(fp32)])
    f = {k: v.value for k, v in row.figures.items()}
    # _fake_run's measured epoch: data wait 1, transfer 0.5, forward 30, backward 50, optimizer 18.5,
    # remainder 0 ms of a 100 ms median step
    assert f["share_data_wait"] == pytest.approx(1.0) and f["share_transfer"] == pytest.approx(0.5)
    assert f["share_forward"] == pytest.approx(30.0) and f["share_backward"] == pytest.approx(50.0)
    assert f["share_optimizer"] == pytest.approx(18.5) and f["share_remainder"] == 0.0
    assert f["share_sum"] == pytest.approx(100.0) and f["median_step_ms"] == 100.0
    out = tmp / "report"
    rp.main([str(tmp / "runs"), "--output", str(out)])
    md = (out / "report.md").read_text()
    speed = _md_row(md.split("### Speed")[1], "fp32/version_0")
    step = _md_row(md.split("### Step decomposition")[1], "fp32/version_0")
    assert speed[3].split()[0] == step[1].split()[0] == "100.0"  # the same median step in both tables


def test_device_series_speedup_efficiency_and_amdahl_fit_by_hand(tmp_path):
    runs = tmp_path / "runs"
    # measured epochs 1, 2: 800 samples in 80 / 50 / 32 s on 1 / 2 / 4 devices -> 10, 16, 25 samples/s
    _on_devices(runs / "n1" / "version_0", 1, 400, [50.0, 40.0, 40.0])
    _on_devices(runs / "n2" / "version_0", 2, 400, [30.0, 25.0, 25.0])
    _on_devices(runs / "n4" / "version_0", 4, 400, [20.0, 16.0, 16.0])
    # local batch 6, global 12: neither batch has a 1-device run (a local batch of 8 on 2 would: equal-local)
    _on_devices(runs / "other" / "version_0", 2, 400, [30.0, 25.0, 25.0], global_batch=12)
    records = load_inputs([runs], on_skip=None)
    (series,) = device_series(records)  # the equal-local series of the same runs (local 8, 4, 2) is no series
    assert series.protocol == "equal-global" and series.batch == 8
    assert [p.devices for p in series.points] == [1, 2, 4] and series.points[0].karp_flatt is None
    got = [(p.samples_per_s, p.speedup_vs_1_device, p.efficiency) for p in series.points]
    assert [v for row in got for v in row] == pytest.approx([10.0, 1.0, 1.0, 16.0, 1.6, 0.8, 25.0, 2.5, 0.625])
    assert [p.karp_flatt for p in series.points[1:]] == pytest.approx([0.25, 0.2])
    # least squares in 1/S: x = 1 - 1/N, y = 1/S - 1/N -> (0.5 x 0.125 + 0.75 x 0.15) / (0.25 + 0.5625)
    assert series.serial_fraction == pytest.approx(0.175 / 0.8125)
    out = tmp_path / "report"
    assert rp.main([str(runs), "--output", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert _md_row(md, "n4/version_0")[9] == "0.62"  # efficiency in the comparison: 2.5 / 4
    assert _md_row(md, "other/version_0")[9].startswith("n/a [")
    amdahl = md.split("Fitted serial fraction")[1]
    s = 0.175 / 0.8125
    assert f"| {s:.3f} [" in amdahl and f" {1 / (s + (1 - s) / 8):.2f} |" in amdahl  # Amdahl on 8 devices
    assert (out / "report_scaling.csv").is_file()
