"""The report leads with verdicts (issue 30): configurations over seeds, each pair with its quality interval and
verdict, speed-up with its interval, time to target; runs that failed form no pair."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml

from cropscale.report import command as rp
from cropscale.report.verdicts import comparisons
from cropscale.runs.record import load_inputs
from cropscale.runs.schema import RunJson, RunSummary, ThroughputEpoch, ThroughputSummary

T_975_DF2 = 4.302653


def _run(folder: Path, precision: str, seed: int, miou: float, rates=(10.0, 10.0), status="finished") -> Path:
    from torch.utils.tensorboard import SummaryWriter

    folder.mkdir(parents=True)
    writer = SummaryWriter(str(folder))
    for epoch in range(2):
        writer.add_scalar("train/loss_step", 2.0 - epoch, epoch)
        writer.add_scalar("epoch", float(epoch), epoch + 1)
        writer.add_scalar("val/mIoU", miou * (0.9 if epoch == 0 else 1.0), epoch + 1)
    writer.close()
    config = {"seed_everything": seed, "trainer": {"accelerator": "cpu", "devices": 1, "precision": precision,
                                                   "max_epochs": 2, "accumulate_grad_batches": 1},
              "model": {"lr": 0.001}, "data": {"root": "data/x", "batch_size": 4}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    epochs = [ThroughputEpoch(epoch=i, samples=32, train_s=32 / q, val_s=1.0, wall_s=32 / q + 1.0)
              for i, q in enumerate((rates[0], *rates))]  # epoch 0 is the warm-up epoch
    doc = RunJson(status=status, precision=precision, config=config, trainer={"max_epochs": 2}, global_step=16,
                  summary=RunSummary(throughput=ThroughputSummary(epochs=epochs)))
    (folder / "run.json").write_text(json.dumps(doc.to_json()))
    return folder


def _records(tmp_path: Path, fp32: dict, other: dict, other_precision="bf16-mixed", rates=None):
    for seed, miou in fp32.items():
        _run(tmp_path / "runs" / f"fp32_s{seed}" / "version_0", "32-true", seed, miou)
    for seed, miou in other.items():
        _run(tmp_path / "runs" / f"other_s{seed}" / "version_0", other_precision, seed, miou,
             rates=(rates or {}).get(seed, (15.0, 15.0)))
    return load_inputs([tmp_path / "runs"], on_skip=None, warmup_epochs=1)


def test_a_shift_beyond_the_margin_is_worse_in_the_report(tmp_path, capsys):
    records = _records(tmp_path, {0: 0.50, 1: 0.52, 2: 0.54}, {0: 0.44, 1: 0.47, 2: 0.47})
    (c,) = comparisons(records)
    half = T_975_DF2 * 0.01 / math.sqrt(3)  # paired differences -0.06, -0.05, -0.07: sd 0.01
    assert c.kind == "precision" and c.best.verdict == "worse"
    low, high = c.best.interval.low, c.best.interval.high  # TensorBoard keeps float32: 1e-6
    assert (low, high) == (pytest.approx(-0.06 - half, abs=1e-6), pytest.approx(-0.06 + half, abs=1e-6))
    assert c.speedup.estimate == pytest.approx(1.5)  # 15 / 10 samples/s in every measured epoch
    # target 0.95 x mean FP32 best (0.52) = 0.494: FP32 reaches it in epoch 1 (0.9 x 0.54 = 0.486 < 0.494 in
    # epoch 0), AMP BF16 never (best 0.47)
    assert c.target == pytest.approx(0.494)
    assert "not reached by other" in c.time_text()
    out = tmp_path / "rep"
    assert rp.main([str(tmp_path / "runs"), "--output", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert md.index("## Verdicts") < md.index("## Comparison")
    assert "- AMP BF16 vs FP32 (G 4, N 1): worse quality (-0.0600, 95 % CI -0.0848..-0.0352, margin 0.02" in md
    assert (out / "verdicts.png").stat().st_size > 0 and (out / "report_verdicts.csv").is_file()
    assert rp.main([str(tmp_path / "runs"), "--output", str(out), "--verdicts-only", "--margin", "0.05"]) == 0
    printed = capsys.readouterr().out
    assert "AMP BF16 vs FP32 (G 4, N 1): quality inconclusive (need more seeds" in printed  # crosses -0.05


def test_one_seed_per_side_gives_no_verdict_in_the_report(tmp_path):
    (c,) = comparisons(_records(tmp_path, {0: 0.50}, {0: 0.30}))
    assert c.best.verdict == "inconclusive" and c.best.interval.low is None
    assert c.line().startswith("AMP BF16 vs FP32 (G 4, N 1): quality inconclusive (need more seeds: at least 2")


def test_identical_runs_are_equivalent_in_the_report(tmp_path):
    records = _records(tmp_path, {0: 0.50, 1: 0.55}, {0: 0.50, 1: 0.55}, rates={0: (10.0, 10.0), 1: (10.0, 10.0)})
    (c,) = comparisons(records)
    assert c.best.verdict == "equivalent" and c.final.verdict == "equivalent"
    assert c.speedup.estimate == pytest.approx(1.0) and "1.00x samples/s" in c.line()
    assert "1.00x time to 0.95" in c.line()


def test_a_failed_run_forms_no_comparison(tmp_path):
    _records(tmp_path, {0: 0.50, 1: 0.52}, {})
    _run(tmp_path / "runs" / "bad" / "version_0", "bf16-mixed", 0, 0.5, status="failed")
    assert comparisons(load_inputs([tmp_path / "runs"], on_skip=None, warmup_epochs=1)) == []


def test_the_verdicts_compared_setting_and_the_runs_kind_are_two_columns(tmp_path):
    """One name, one meaning: the runs table's "Kind" is run or microbenchmark; the verdict table names the setting
    that differs between the two sides (here the precision) under its own key, read back from the two CSVs."""
    _records(tmp_path, {0: 0.50, 1: 0.52}, {0: 0.44, 1: 0.47})
    out = tmp_path / "rep"
    assert rp.main([str(tmp_path / "runs"), "--output", str(out)]) == 0
    with open(out / "report.csv", newline="") as f:
        runs = list(csv.DictReader(f))
    with open(out / "report_verdicts.csv", newline="") as f:
        verdicts = list(csv.DictReader(f))
    assert {row["kind"] for row in runs} == {"run"} and len(runs) == 4
    assert "kind" not in verdicts[0]
    assert [row["compared"] for row in verdicts] == ["precision"]
