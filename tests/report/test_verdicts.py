"""The report leads with verdicts (issues 30 and 38): configurations over seeds, each pair with its quality interval
and verdict at alpha = 0.05, the convergence note, the speed-up over runs, samples to target; runs that failed form
no pair.

t quantile: t_{0.95,2} = 2.919986 (the 90 % interval of 3 paired seeds).
"""

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

T_95_DF2 = 2.919986


def _run(folder: Path, precision: str, seed: int, miou: float, rates=(10.0, 10.0), status="finished",
         rise=(0.8, 0.9, 1.0)) -> Path:
    """A 3-epoch run: val/mIoU ``miou x rise[e]`` at epoch e; epoch 0 (warm-up) and 1, 2 at ``rates`` samples/s."""
    from torch.utils.tensorboard import SummaryWriter

    folder.mkdir(parents=True)
    writer = SummaryWriter(str(folder))
    for epoch, factor in enumerate(rise):
        writer.add_scalar("train/loss_step", 2.0 - epoch, epoch)
        writer.add_scalar("epoch", float(epoch), epoch + 1)
        writer.add_scalar("val/mIoU", miou * factor, epoch + 1)
    writer.close()
    config = {"seed_everything": seed, "trainer": {"accelerator": "cpu", "devices": 1, "precision": precision,
                                                   "max_epochs": 3, "accumulate_grad_batches": 1},
              "model": {"lr": 0.001}, "data": {"root": "data/x", "batch_size": 4}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    epochs = [ThroughputEpoch(epoch=i, samples=32, train_s=32 / q, val_s=1.0, wall_s=32 / q + 1.0)
              for i, q in enumerate((rates[0], *rates))]  # epoch 0 is the warm-up epoch
    doc = RunJson(status=status, precision=precision, config=config, trainer={"max_epochs": 3}, global_step=24,
                  summary=RunSummary(throughput=ThroughputSummary(epochs=epochs)))
    (folder / "run.json").write_text(json.dumps(doc.to_json()))
    return folder


def _records(tmp_path: Path, fp32: dict, other: dict, other_precision="bf16-mixed", rates=None, rise=(0.8, 0.9, 1.0)):
    for seed, miou in fp32.items():
        _run(tmp_path / "runs" / f"fp32_s{seed}" / "version_0", "32-true", seed, miou, rise=rise)
    for seed, miou in other.items():
        _run(tmp_path / "runs" / f"other_s{seed}" / "version_0", other_precision, seed, miou,
             rates=(rates or {}).get(seed, (15.0, 15.0)), rise=rise)
    return load_inputs([tmp_path / "runs"], on_skip=None, warmup_epochs=1)


def test_a_shift_beyond_the_margin_is_worse_in_the_report(tmp_path, capsys):
    records = _records(tmp_path, {0: 0.50, 1: 0.52, 2: 0.54}, {0: 0.44, 1: 0.47, 2: 0.47})
    (c,) = comparisons(records)
    half = T_95_DF2 * 0.01 / math.sqrt(3)  # paired differences -0.06, -0.05, -0.07: sd 0.01
    assert c.kind == "precision" and c.best.verdict == "worse"
    low, high = c.best.interval.low, c.best.interval.high  # TensorBoard keeps float32: 1e-6
    assert (low, high) == (pytest.approx(-0.06 - half, abs=1e-6), pytest.approx(-0.06 + half, abs=1e-6))
    assert c.speedup.estimate == pytest.approx(1.5)  # 15 / 10 samples/s in every measured epoch of every run
    assert (c.speedup.n_base, c.speedup.n_other) == (3, 3)  # runs, not runs x epochs
    # target 0.95 x mean FP32 best (0.52) = 0.494: FP32 reaches it at epoch 2 in every seed (0.9 x 0.54 = 0.486 <
    # 0.494 at epoch 1): 96 samples each; AMP BF16 never (best 0.47): every run counted as infinite
    assert c.target == pytest.approx(0.494)
    assert c.samples_to_target.verdict == "not reached" and c.samples_to_target.base.mean == 96
    out = tmp_path / "rep"
    assert rp.main([str(tmp_path / "runs"), "--output", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert md.index("## Verdicts") < md.index("## Comparison")
    assert ("- AMP BF16 vs FP32 (G 4, N 1): quality worse at this budget (3 epochs) (-0.0600, 90 % CI -0.0769..-0.0431"
            " below -0.02, one-sided t alpha = 0.05, paired t over 3 seeds (df 2))") in md
    assert "still improving = best-so-far val macro IoU rose >= 0.01 over the last 2 epochs" in md
    assert "| 90 % CI (alpha = 0.05 per side) |" in md and "| Convergence |" in md
    assert (out / "verdicts.png").stat().st_size > 0 and (out / "report_verdicts.csv").is_file()
    assert rp.main([str(tmp_path / "runs"), "--output", str(out), "--verdicts-only", "--margin", "0.05"]) == 0
    printed = capsys.readouterr().out
    assert "AMP BF16 vs FP32 (G 4, N 1): quality inconclusive (-0.0600, 90 % CI" in printed  # crosses -0.05


def test_one_seed_per_side_gives_no_verdict_in_the_report(tmp_path):
    (c,) = comparisons(_records(tmp_path, {0: 0.50}, {0: 0.30}))
    assert c.best.verdict == "inconclusive" and c.best.interval.low is None
    assert c.line().startswith("AMP BF16 vs FP32 (G 4, N 1): quality inconclusive (-0.2000, no CI: 1 seed on a side")
    assert "speed-up 1.50x training-loop samples/s (no interval: one run per side)" in c.line()


def test_identical_runs_are_no_verdict_but_no_spread(tmp_path):
    """Two seeds with identical differences give a zero-width interval: inconclusive, never equivalent."""
    records = _records(tmp_path, {0: 0.50, 1: 0.55}, {0: 0.50, 1: 0.55}, rates={0: (10.0, 10.0), 1: (10.0, 10.0)})
    (c,) = comparisons(records)
    assert c.best.verdict == "inconclusive" and c.final.verdict == "inconclusive"
    assert "no CI: no spread observed in 2 seeds" in c.line()
    assert c.speedup.estimate == pytest.approx(1.0) and c.speedup.low is None
    assert "1.00x training-loop samples/s (no interval: no spread observed in 2 / 2 runs)" in c.line()
    assert c.samples_to_target.ratio == 1.0 and "no spread observed in 2 / 2 runs" in c.line()


def test_equivalent_at_this_budget_only_while_a_run_still_improves(tmp_path):
    # paired differences 0.004, 0.006, 0.005 (sd 0.001): 90 % CI about +0.0033..+0.0067, inside +-0.02
    fp32, other = {0: 0.500, 1: 0.520, 2: 0.540}, {0: 0.504, 1: 0.526, 2: 0.545}
    (rising,) = comparisons(_records(tmp_path / "a", fp32, other))  # best-so-far rose 20 % over the last 2 epochs
    assert rising.best.verdict == "equivalent" and rising.convergence.at_budget
    assert "quality equivalent at this budget (3 epochs) (+0.0050, 90 % CI" in rising.line()
    assert "TOST alpha = 0.05" in rising.line()
    assert "convergence: FP32 (G 4, N 1) 3 of 3 run(s) still improving, AMP BF16 3 of 3" in rising.line()
    (flat,) = comparisons(_records(tmp_path / "b", fp32, other, rise=(0.996, 1.0, 1.0)))  # rose 0.4 % < 0.01
    assert flat.best.verdict == "equivalent" and not flat.convergence.at_budget
    assert "quality equivalent (+0.0050" in flat.line() and "at this budget" not in flat.line()
    assert "convergence: every run of both sides plateaued" in flat.line()


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
