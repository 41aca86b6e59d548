"""The quality-and-speed report: parsing of run folders (run.json + TensorBoard events +
config.yaml) and benchmark JSONs, exact figures, precision pairs, evidence labels, n/a reasons, PNG
figures; end to end on two tiny fits of the bundled sample (slow)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib.image as mpimg
import pytest
import yaml

from cropscale import CropScaleError
from cropscale.precision import BY_CPU_FALLBACK, BY_PLUGIN, PrecisionDecision
from cropscale.report import command as rp
from cropscale.report.pairs import precision_pairs
from cropscale.report.tables import TableRow, write_table
from cropscale.runs.figures import PAIRS, RUNS, Column, table_columns
from cropscale.runs.record import load_benchmark, load_inputs, load_run
from cropscale.runs.rules import Figure

REPO = Path(__file__).resolve().parents[2]
FIGURES = ("iou_by_epoch.png", "throughput.png", "peak_memory.png", "step_decomposition.png", "device_scaling.png")


def _config(precision: str, batch_size: int = 4, name: str = "default") -> dict:
    return {
        "seed_everything": 0,
        "trainer": {"precision": precision, "devices": 1, "num_nodes": 1, "strategy": "auto",
                    "max_epochs": 3, "logger": {"init_args": {"name": name, "save_dir": "runs"}}},
        "model": {"lr": 0.001},
        "data": {"batch_size": batch_size, "root": "data/x"},
    }


def _fake_run(folder: Path, precision: str, mious: list[float], *, samples: int, step_ms: float,
              train_s: list[float], val_s: list[float], energy_j: float | None = None, batch_size: int = 4,
              name: str = "default", gpu_peak: float | None = None) -> Path:
    """A run folder as ``fit --config callbacks/scaling.yaml`` writes it (run.json, events, config.yaml)."""
    from torch.utils.tensorboard import SummaryWriter

    folder.mkdir(parents=True)
    writer = SummaryWriter(str(folder))
    writer.add_scalar("optim/global_batch", float(batch_size), 0)
    for epoch, miou in enumerate(mious):
        step = 10 * (epoch + 1)
        writer.add_scalar("epoch", float(epoch), step)
        writer.add_scalar("train/loss_epoch", 2.0 - 0.5 * epoch, step)
        writer.add_scalar("val/mIoU", miou, step)
        writer.add_scalar("epoch", float(epoch), step)
        for w, v in (("forward", 1.0), ("backward", 2.0)):
            writer.add_scalar(f"perf/step/{w}_ms", v * (epoch + 1), step)
    writer.close()
    (folder / "config.yaml").write_text(yaml.safe_dump(_config(precision, batch_size, name)))
    epochs = [{"epoch": i, "samples": samples, "train_s": t, "val_s": v, "wall_s": t + v,
               "step_latency_ms": {"median": None}} for i, (t, v) in enumerate(zip(train_s, val_s, strict=True))]
    windows = {w: {"median": m, "p95": m * 1.1, "n": 20} for w, m in
               (("data_wait", 1.0), ("transfer", 0.5), ("forward", 0.3 * step_ms), ("backward", 0.5 * step_ms),
                ("optimizer", 0.2 * step_ms - 1.5), ("remainder", 0.0), ("step", step_ms))}
    summary = {
        "step_timing": {"evidence": "measured-run", "warmup_steps": 5, "steps_total": 30,
                        "epochs": [{"epoch": 0,
                                    "windows_ms": {w: {"median": None, "p95": None, "n": 0} for w in windows}},
                                   {"epoch": 1, "windows_ms": windows}]},
        "throughput": {"evidence": "measured-run", "warmup_steps": 5, "epochs": epochs},
        "loss_scale": ({"scaler_in_use": True, "skipped_steps": 2} if precision == "16-mixed"
                       else {"scaler_in_use": False, "reason": "no GradScaler"}),
        "nonfinite": {"per_rank": [{"nonfinite_batches": 1, "skipped_steps": 0}]},
        "energy": ({"available": True, "method": "counter", "total_energy_j": energy_j,
                    "epochs": [{"epoch": i, "energy_j": energy_j / len(train_s), "samples": samples}
                               for i in range(len(train_s))]} if energy_j is not None
                   else {"available": False, "reason": "the model runs on 'cpu'"}),
        "memory": {"gpu_available": gpu_peak is not None, "peak_allocated_gib": gpu_peak, "host_peak_rss_gib": 1.5},
    }
    run = {"schema": "cropscale.run/1", "evidence": "measured-run", "status": "finished", "precision": precision,
           "distributed": {"world_size": 1, "strategy": "SingleDeviceStrategy"}, "config": None, "summary": summary}
    (folder / "run.json").write_text(json.dumps(run))
    return folder


def _fake_bench(path: Path) -> Path:
    rows = []
    for precision, batch, median, status in (("32-true", 4, 100.0, "ok"), ("16-mixed", 4, 80.0, "ok"),
                                             ("16-mixed", 64, None, "oom")):
        ok = status == "ok"
        rows.append({"precision": precision, "batch_size": batch, "status": status,
                     "error": None if ok else "out of memory at batch 64",
                     "median_step_ms": median, "p95_step_ms": median * 1.05 if ok else None,
                     "samples_per_s": batch / (median / 1000) if ok else None, "peak_memory_gib": 2.0 if ok else None,
                     "peak_memory_kind": "cuda-max-allocated", "nonfinite_steps": 0 if ok else None,
                     "grad_scaler": precision == "16-mixed", "warmup": 10, "iterations": 30})
    path.write_text(json.dumps({"schema": "cropscale.benchmark/1", "evidence": "measured-microbenchmark",
                                "environment": {"device": {"name": "NVIDIA H200"}}, "results": rows}))
    return path


@pytest.fixture()
def fake_inputs(tmp_path):
    a = _fake_run(tmp_path / "runs" / "fp32" / "version_0", "32-true", [0.20, 0.35, 0.30], samples=210,
                  step_ms=100.0, train_s=[30.0, 20.0, 22.0], val_s=[5.0, 4.0, 6.0], energy_j=3600.0,
                  name="fp32", gpu_peak=3.0)
    b = _fake_run(tmp_path / "runs" / "amp" / "version_0", "16-mixed", [0.25, 0.30, 0.33], samples=203,
                  step_ms=70.0, train_s=[25.0, 15.0, 14.0], val_s=[5.0, 4.0, 4.0], energy_j=2400.0,
                  name="amp", gpu_peak=2.4)
    c = _fake_run(tmp_path / "runs" / "fp32_b8" / "version_0", "32-true", [0.1], samples=480,
                  step_ms=180.0, train_s=[40.0], val_s=[5.0], batch_size=8, name="fp32_b8")
    bench = _fake_bench(tmp_path / "bench.json")
    return tmp_path, a, b, c, bench


def test_load_run_exact_figures(fake_inputs):
    _, a, b, c, _ = fake_inputs
    ra = load_run(a)
    f = {k: v.value for k, v in ra.figures.items()}
    assert (ra.precision, ra.strategy, ra.devices, ra.global_batch) == ("32-true", "SingleDeviceStrategy", 1, 4)
    assert f["best_miou"] == pytest.approx(0.35, abs=1e-7) and f["best_epoch"] == 1  # float32 in TensorBoard
    assert f["final_train_loss"] == 1.0
    assert f["median_step_ms"] == 100.0 and f["p95_step_ms"] == pytest.approx(110.0)  # epoch 1: measured steps
    assert f["samples_per_s"] == pytest.approx(420 / 42)  # measured epochs 1, 2: 2 x 210 samples in 20 + 22 s
    assert f["train_epoch_s"] == 21.0 and f["val_epoch_s"] == 5.0 and f["epoch_s"] == 26.0  # median after epoch 0
    # energy over the measured epochs 1 and 2: 2 x 1200 J for 2 x 210 samples
    assert f["energy_j"] == 2400.0 and f["energy_j_per_sample"] == pytest.approx(2400.0 / 420)
    assert f["peak_memory_gib"] == 3.0 and "GPU" in ra.figures["peak_memory_gib"].note
    assert f["nonfinite"] == 1 and f["skipped_steps"] == 0
    assert all(v.evidence == "measured-run" for v in ra.figures.values())
    assert [e for e, _ in ra.iou_by_epoch] == [0, 1, 2]
    assert [round(v, 6) for _, v in ra.iou_by_epoch] == [0.2, 0.35, 0.35]  # best available so far
    assert ra.step_windows_ms["backward"] == 50.0 and "StepTiming" in ra.step_windows_source

    rb = load_run(b)
    assert rb.figures["skipped_steps"].value == 2  # GradScaler skips under 16-mixed
    rc = load_run(c)
    assert rc.figures["energy_j"].value is None and "cpu" in rc.figures["energy_j"].why
    assert rc.figures["peak_memory_gib"].value == 1.5 and "RSS" in rc.figures["peak_memory_gib"].note
    assert rc.figures["train_epoch_s"].value == 40.0  # a single epoch is its own median


def test_load_benchmark_rows_and_oom(fake_inputs):
    *_, bench = fake_inputs
    rows = load_benchmark(bench)
    assert [(r.precision, r.global_batch, r.status) for r in rows] == [
        ("32-true", 4, "ok"), ("16-mixed", 4, "ok"), ("16-mixed", 64, "oom")]
    assert rows[0].figures["samples_per_s"].value == 40.0
    assert rows[0].figures["samples_per_s"].evidence == "measured-microbenchmark"
    assert rows[0].figures["best_miou"].value is None and "compute-only" in rows[0].figures["best_miou"].why
    assert rows[2].figures["median_step_ms"].value is None and "oom" in rows[2].figures["median_step_ms"].why


def test_pairs_only_differ_in_precision(fake_inputs):
    _, a, b, c, bench = fake_inputs
    records = load_inputs([a.parents[2], bench])
    pairs = precision_pairs(records)
    by_other = {p.other: p for p in pairs}
    assert set(by_other) == {"amp/version_0", "bench.json: AMP FP16 b4"}  # fp32_b8 differs in batch: no pair
    run_pair = by_other["amp/version_0"]
    assert run_pair.base == "fp32/version_0"
    assert run_pair.figures["speedup_vs_fp32"].value == pytest.approx((406 / 29) / (420 / 42))  # 14 / 10
    assert run_pair.figures["step_ratio"].value == 70.0 / 100.0
    assert run_pair.figures["iou_difference"].value == pytest.approx(0.33 - 0.35, abs=1e-7)
    assert run_pair.figures["memory_ratio"].value == 2.4 / 3.0
    assert run_pair.evidence == "measured-run"
    bench_pair = by_other["bench.json: AMP FP16 b4"]
    assert bench_pair.figures["speedup_vs_fp32"].value == (4 / 0.08) / (4 / 0.1)
    iou_difference = bench_pair.figures["iou_difference"]
    assert iou_difference.value is None and "compute-only" in iou_difference.why


def test_main_writes_tables_and_figures(fake_inputs, capsys):
    tmp, a, b, c, bench = fake_inputs
    out = tmp / "report"
    assert rp.main([str(tmp / "runs"), str(bench), "--output", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert md.index("## Comparison") < md.index("## Detail") < md.index("## Precision pairs")
    lead = _md_row(md, "fp32/version_0")  # the comparison table comes first
    assert lead[:6] == ["fp32/version_0", "finished", "FP32", "1", "4", "0.3500"] and lead[-1] == "measured-run"
    assert lead[7] == "10.00"  # samples/s
    quality = _md_row(md.split("### Quality")[1], "fp32/version_0")
    assert quality[2:4] == ["0.3500", "1"]  # best val/mIoU and its epoch
    oom = next(line for line in md.splitlines() if line.startswith("| bench.json: AMP FP16 b64 |"))
    assert "n/a [" in oom
    assert "configuration oom: out of memory at batch 64" in md  # the reason is in the notes
    with open(out / "report.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6
    first = next(r for r in rows if r["name"] == "fp32/version_0")
    assert float(first["samples_per_s"]) == pytest.approx(10.0) and first["samples_per_s_evidence"] == "measured-run"
    assert first["energy_j"] == "2400.0" and first["evidence"] == "measured-run"
    b64 = next(r for r in rows if r["name"] == "bench.json: AMP FP16 b64")
    assert b64["samples_per_s"] == "" and "oom" in b64["samples_per_s_note"]
    with open(out / "report_pairs.csv", newline="") as f:
        pairs = list(csv.DictReader(f))
    assert {p["other"] for p in pairs} == {"amp/version_0", "bench.json: AMP FP16 b4"}
    for name in FIGURES:
        image = mpimg.imread(out / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert "wrote" in capsys.readouterr().out


def test_write_table_plain_values_and_notes(tmp_path):
    rows = [TableRow(values={"name": "x", "gpus": 2}, figures={"speedup": 1.82}, evidence="analytical-scenario"),
            TableRow(values={"name": "y", "gpus": 4},
                     figures={"speedup": Figure(None, "analytical-scenario", "no fit")},
                     evidence="analytical-scenario")]
    cols = (Column("name", "Name", figure=False), Column("gpus", "GPUs", "d", figure=False),
            Column("speedup", "Speed-up", ".2f"))
    md, csv_path = write_table(rows, tmp_path, "t", cols)
    lines = md.read_text().splitlines()
    assert lines[0] == "| Name | GPUs | Speed-up | Evidence |"
    assert lines[2] == "| x | 2 | 1.82 | analytical-scenario |"
    assert lines[3] == "| y | 4 | n/a [1] | analytical-scenario |"
    assert lines[-1] == "[1] no fit"
    with open(csv_path, newline="") as f:
        got = list(csv.DictReader(f))
    assert got[0] == {"name": "x", "gpus": "2", "speedup": "1.82", "speedup_evidence": "analytical-scenario",
                      "speedup_note": "", "evidence": "analytical-scenario"}


def test_bad_inputs_name_the_path(tmp_path):
    with pytest.raises(CropScaleError, match="does not exist"):
        load_inputs([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(CropScaleError, match="holds no run folder"):
        load_inputs([tmp_path / "empty"])
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something/1"}))
    with pytest.raises(CropScaleError, match="other.json is not a cropscale benchmark JSON"):
        load_inputs([other])
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(CropScaleError, match="broken.json is not valid JSON"):
        load_inputs([broken])


def test_run_without_run_json_reports_reasons(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    folder = tmp_path / "plain" / "version_0"
    writer = SummaryWriter(str(folder))
    writer.add_scalar("train/loss_epoch", 1.0, 5)
    writer.add_scalar("val/mIoU", 0.4, 5)
    writer.close()
    (folder / "config.yaml").write_text(yaml.safe_dump(_config("bf16-mixed", 2)))
    r = load_run(folder)
    assert r.precision == "bf16-mixed" and r.global_batch == 2 and r.devices == 1
    assert r.precision_decision.verified is False and r.training_run
    assert r.figures["best_miou"].value == pytest.approx(0.4) and r.figures["best_epoch"].value == 0
    for key in ("samples_per_s", "median_step_ms", "energy_j", "peak_memory_gib"):
        assert r.figures[key].value is None and "no run.json" in r.figures[key].why


# ------------------------------------------------- plain fits: config.yaml + TensorBoard, no run.json
def _plain_config(precision="32-true", *, accelerator="cpu", strategy="auto", devices=1, num_nodes=1,
                  batch_size=2) -> dict:
    """``config.yaml`` as LightningCLI's SaveConfigCallback writes it for a plain ``fit``."""
    return {
        "seed_everything": 0,
        "trainer": {"accelerator": accelerator, "strategy": strategy, "devices": devices, "num_nodes": num_nodes,
                    "precision": precision, "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                                                       "init_args": {"save_dir": "runs", "name": "default"}},
                    "max_epochs": 1, "accumulate_grad_batches": 1},
        "model": {"lr": 0.001},
        "data": {"root": "data/x", "batch_size": batch_size, "samples_per_patch": 2},
        "ckpt_path": None,
    }


def _plain_run(folder: Path, config: dict | None = None, *, train: bool = True, miou: float = 0.3) -> Path:
    """A run folder of ``python -m cropscale fit`` without the scaling callbacks (``train=False``: one of
    ``validate``, which logs validation scalars only): events, config.yaml, hparams.yaml."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    if train:
        writer.add_scalar("train/loss_step", 2.5, 0)
        writer.add_scalar("epoch", 0.0, 1)
        writer.add_scalar("train/loss_epoch", 2.0, 1)
    writer.add_scalar("epoch", 0.0, 1 if train else 0)
    writer.add_scalar("val/mIoU", miou, 1 if train else 0)
    writer.close()
    (folder / "config.yaml").write_text(yaml.safe_dump(config or _plain_config()))
    (folder / "hparams.yaml").write_text(yaml.safe_dump({"lr": 0.001}))
    return folder


def _md_row(md: str, name: str) -> list[str]:
    line = next(x for x in md.splitlines() if x.startswith(f"| {name} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def _footnote(md: str, cell: str) -> str:
    """The footnote text a ``... [n]`` cell points to (the first footnote block after the cell's row)."""
    n = cell.rsplit("[", 1)[1].rstrip("]")
    lines = md.splitlines()
    row = next(i for i, x in enumerate(lines) if cell in x and x.startswith("| "))
    return next(x for x in lines[row:] if x.startswith(f"[{n}] "))


@pytest.mark.parametrize(("strategy", "shown"), [
    ({"class_path": "lightning.pytorch.strategies.DDPStrategy",
      "init_args": {"find_unused_parameters": False, "process_group_backend": None, "timeout": "0:30:00"}}, "ddp"),
    ({"class_path": "lightning.pytorch.strategies.FSDPStrategy", "init_args": {"sharding_strategy": "FULL_SHARD"}},
     "fsdp"),
    ({"class_path": "my_pkg.strategies.ShardedThing", "init_args": {"x": 1}}, "ShardedThing"),
    ("lightning.pytorch.strategies.DDPStrategy", "ddp"),
    ("ddp_find_unused_parameters_true", "ddp_find_unused_parameters_true"),
    ("ddp", "ddp"),
])
def test_strategy_short_name(tmp_path, strategy, shown):
    folder = _plain_run(tmp_path / "v0", _plain_config(strategy=strategy, devices=2))
    r = load_run(folder)
    assert r.strategy == shown
    md, _ = write_table([TableRow.of(r, table_columns(RUNS))], tmp_path / "out", "t", table_columns(RUNS))
    cells = _md_row(md.read_text(), r.name)
    assert cells[4] == shown and "class_path" not in md.read_text()


def test_strategy_from_run_json_short_name_and_auto_footnote(tmp_path):
    folder = _plain_run(tmp_path / "v0", _plain_config(strategy="ddp", devices=2))
    (folder / "run.json").write_text(json.dumps({"schema": "cropscale.run/1", "status": "finished",
                                                 "precision": "32-true", "summary": {"throughput": {}},
                                                 "distributed": {"world_size": 2, "strategy": "DDPStrategy"}}))
    r = load_run(folder)
    assert (r.strategy, r.devices) == ("ddp", 2)
    auto = load_run(_plain_run(tmp_path / "v1"))  # strategy 'auto', no run.json
    assert auto.strategy == "auto" and "not recorded" in auto.descriptive["strategy"].note


@pytest.mark.parametrize(("devices", "num_nodes", "count", "shown", "why"), [
    ("2", 1, 2, 2, None),  # LightningCLI stores --trainer.devices=2 as the string '2'
    (2, 1, 2, 2, None),
    ("2", "2", 4, 4, "2 per node x 2 nodes"),
    ([0, 1], 1, 2, 2, "2 device id(s) [0, 1]"),
    ("0,1", 1, 2, 2, "2 device id(s) ['0', '1']"),
    ("auto", 1, None, "auto", "requests devices='auto'"),
    (-1, 1, None, "all (-1)", "requests devices=-1"),
    (None, 1, None, None, "no trainer.devices"),
])
def test_devices_from_config(tmp_path, devices, num_nodes, count, shown, why):
    folder = _plain_run(tmp_path / "v0", _plain_config(devices=devices, num_nodes=num_nodes, batch_size=3))
    r = load_run(folder)
    assert r.devices == count
    assert r.global_batch == (3 * count if count else None)  # local batch x world size (no optim/global_batch)
    if count is None:
        assert "world size is unknown" in r.descriptive["global_batch"].why
    desc = r.descriptive["devices"]
    assert desc.value == shown
    text = desc.why if shown is None else desc.note
    assert (text is None) if why is None else (why in text)
    md, csv_path = write_table([TableRow.of(r, table_columns(RUNS))], tmp_path / "out", "t", table_columns(RUNS))
    cell = _md_row(md.read_text(), r.name)[5]
    if why is None:
        assert cell == str(shown)
    else:  # never a bare n/a: the cell points to its reason
        assert cell.startswith(f"{'n/a' if shown is None else shown} [") and why in _footnote(md.read_text(), cell)
    with open(csv_path, newline="") as f:
        row = next(csv.DictReader(f))
    assert row["devices"] == ("" if shown is None else str(shown)) and (why or "") in row["devices_note"]


def test_requested_precision_is_labelled_and_footnoted(tmp_path):
    runs = tmp_path / "runs"
    base = _plain_run(_mk(runs / "fp32" / "version_0"), _plain_config("32-true"), miou=0.30)
    amp = _plain_run(_mk(runs / "amp" / "version_0"), _plain_config("16-mixed"), miou=0.32)  # on CPU: ran bf16
    auto = _plain_run(_mk(runs / "auto" / "version_0"), _plain_config("bf16-mixed", accelerator="auto", batch_size=4))
    ra, rb, rc = load_run(base), load_run(amp), load_run(auto)
    assert rb.precision_decision == PrecisionDecision("16-mixed", None, BY_CPU_FALLBACK) and rb.precision == "16-mixed"
    assert "as bf16-mixed" in rb.descriptive["precision"].note
    assert "cannot be verified" in rc.descriptive["precision"].note
    assert ra.descriptive["precision"].value == "32-true (requested)"
    assert rb.precision_label == "AMP FP16 (requested)"

    out = tmp_path / "rep"
    assert rp.main([str(runs), "--output", str(out)]) == 0
    md = (out / "report.md").read_text()
    cell = _md_row(md, "amp/version_0")[2]
    assert cell.startswith("AMP FP16 (requested) [")
    note = _footnote(md, cell)
    assert "no run.json" in note and "accelerator 'cpu'" in note and "bf16-mixed" in note
    assert _md_row(md, "auto/version_0")[2].startswith("AMP BF16 (requested) [")
    with open(out / "report.csv", newline="") as f:
        full = {row["name"]: row for row in csv.DictReader(f)}
    assert full["amp/version_0"]["precision"] == "16-mixed (requested)"
    # the pair is by requested precision and says so: never a bare "AMP FP16" as if recorded
    pairs = md.split("## Precision pairs")[1]
    pair = _md_row(pairs, "fp32/version_0")
    assert pair[1] == "amp/version_0" and pair[2].startswith("AMP FP16 (requested) [")
    pnote = _footnote(pairs, pair[2])
    assert "not verified" in pnote and "amp/version_0" in pnote and "bf16-mixed" in pnote
    iou = [c.key for c in table_columns(PAIRS)].index("iou_difference")
    assert pair[iou].startswith("+0.0200")  # the IoU difference is measured all the same
    assert "| AMP FP16 |" not in md
    with open(out / "report_pairs.csv", newline="") as f:
        prow = next(csv.DictReader(f))
    assert prow["precision"] == "AMP FP16 (requested)" and "not verified" in prow["precision_note"]


def test_run_json_precision_is_authoritative(tmp_path):
    runs = tmp_path / "runs"
    base = _plain_run(_mk(runs / "fp32" / "version_0"), _plain_config("32-true"))
    amp = _plain_run(_mk(runs / "amp" / "version_0"), _plain_config("16-mixed"))
    for folder, precision in ((base, "32-true"), (amp, "bf16-mixed")):  # what Lightning ran on CPU
        (folder / "run.json").write_text(json.dumps({
            "schema": "cropscale.run/1", "status": "finished", "precision": precision, "config": None,
            "distributed": {"world_size": 1, "strategy": "SingleDeviceStrategy"},
            "summary": {"throughput": {"samples_per_s": 5.0, "epochs": []}}}))
    rb = load_run(amp)
    assert rb.precision_decision == PrecisionDecision("16-mixed", "bf16-mixed", BY_CPU_FALLBACK)
    assert rb.precision == "bf16-mixed"
    assert "requested 16-mixed" in rb.descriptive["precision"].note
    assert load_run(base).descriptive["precision"].note is None
    pairs = precision_pairs(load_inputs([runs]))
    assert [p.precision for p in pairs] == ["AMP BF16"] and pairs[0].descriptive == {}


def test_an_older_run_json_of_a_plugin_run_gets_no_false_footnote(tmp_path):
    """An older ``run.json`` holds only the ``precision`` string: a ``configs/precision/amp_fp16_cpu.yaml`` run
    (``trainer.precision: null``, a MixedPrecision plugin) requested 16-mixed by its plugin and ran 16-mixed. The
    old reader took the unset ``trainer.precision`` for Lightning's 32-true and said "the configuration requested
    32-true (Lightning changed it)"."""
    config = _plain_config(None)
    config["trainer"]["plugins"] = [{"class_path": "lightning.pytorch.plugins.MixedPrecision", "init_args": {
        "precision": "16-mixed", "device": "cpu", "scaler": {"class_path": "torch.amp.GradScaler"}}}]
    folder = _plain_run(_mk(tmp_path / "amp" / "version_0"), config)
    (folder / "run.json").write_text(json.dumps({
        "schema": "cropscale.run/1", "status": "finished", "precision": "16-mixed", "config": None,
        "distributed": {"world_size": 1, "strategy": "SingleDeviceStrategy", "accelerator": "CPUAccelerator"}}))
    r = load_run(folder)
    assert r.precision_decision == PrecisionDecision("16-mixed", "16-mixed", BY_PLUGIN)
    assert r.descriptive["precision"] == Figure("16-mixed", None, None, None) and r.precision_label == "AMP FP16"
    (folder / "run.json").unlink()  # without run.json: requested by the plugin, not Lightning's default 32-true
    r = load_run(folder)
    assert r.precision_decision == PrecisionDecision("16-mixed", None, BY_PLUGIN)
    assert r.precision_label == "AMP FP16 (requested)" and "a precision plugin" in r.descriptive["precision"].note


def _mk(folder: Path) -> Path:
    folder.mkdir(parents=True)
    return folder


def test_validate_folders_are_skipped(tmp_path, capsys):
    runs = tmp_path / "runs"
    fit = _plain_run(_mk(runs / "default" / "version_0"))
    val = _plain_run(_mk(runs / "default" / "version_1"), train=False)
    assert load_run(val).training_run is False
    lines: list[str] = []
    records = load_inputs([runs], on_skip=lines.append)
    assert [r.name for r in records] == ["default/version_0"]
    assert lines == [f"skipped {val}: no training run (validate/test only)"]

    out = tmp_path / "rep"
    assert rp.main([str(runs), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"skipped {val}: no training run (validate/test only)\n" in printed
    md = (out / "report.md").read_text()
    assert "default/version_0" in md and "default/version_1" not in md

    # named explicitly: still skipped, with the reason
    assert rp.main([str(fit), str(val), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith(f"skipped {val}:"))
    assert "named explicitly" in line and "train/loss_epoch" in line and "no run.json" in line
    assert "default/version_1" not in (out / "report.md").read_text()
    with pytest.raises(CropScaleError, match="no training run or benchmark among the inputs"):
        rp.main([str(val), "--output", str(out)])

    # run.json with a training summary keeps a folder without train/* scalars (and one without: skipped)
    (val / "run.json").write_text(json.dumps({"schema": "cropscale.run/1", "status": "finished",
                                              "summary": {"throughput": {"samples_per_s": 1.0}}}))
    assert load_run(val).training_run is True
    (val / "run.json").write_text(json.dumps({"schema": "cropscale.run/1", "status": "finished", "summary": {}}))
    r = load_run(val)
    assert r.training_run is False and "status 'finished'" in r.skip_reason
    # run.json exists only for a fit: status failed is a fit that failed, kept and marked (tests/report/
    # test_failed_runs.py), not skipped as "no training run"
    (val / "run.json").write_text(json.dumps({"schema": "cropscale.run/1", "status": "failed", "summary": {}}))
    r = load_run(val)
    assert r.training_run is True and r.descriptive["status"].value == "failed"


# ------------------------------------------------------------------------------ end to end (slow)
def _fit(cwd: Path, name: str, precision: str, data_root: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "cropscale", "fit", f"--data.root={data_root}", "--trainer.max_epochs=1",
           "--data.samples_per_patch=2", "--data.batch_size=2", f"--trainer.precision={precision}",
           "--trainer.enable_progress_bar=false", f"--trainer.logger.init_args.name={name}"]
    if (REPO / "callbacks" / "scaling.yaml").is_file():
        cmd[4:4] = ["--config", str(REPO / "callbacks" / "scaling.yaml")]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_report_on_two_tiny_fits(tmp_path, flanders_root):
    """FP32 and bf16-mixed, one epoch each on the bundled sample (run side by side, one thread each),
    then ``python -m cropscale report`` on both."""
    procs = [_fit(tmp_path, "fp32", "32-true", flanders_root), _fit(tmp_path, "bf16", "bf16-mixed", flanders_root)]
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:]
    from cropscale.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(tmp_path / "runs"), "--output", str(tmp_path / "report")])
    assert exit_info.value.code == 0
    md = (tmp_path / "report" / "report.md").read_text()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in md.split("## Detail")[0].splitlines() if line.startswith("| ") and "/version_" in line}
    assert set(rows) == {"fp32/version_0", "bf16/version_0"}
    for cells in rows.values():
        assert cells[1] == "finished"
        assert 0.0 <= float(cells[5]) <= 1.0  # best val/mIoU
        assert float(cells[7].split()[0]) > 0  # samples/s
        assert cells[-1] == "measured-run"
    assert rows["fp32/version_0"][2] == "FP32" and rows["bf16/version_0"][2] == "AMP BF16"
    assert rows["fp32/version_0"][8] == "1.00" and float(rows["bf16/version_0"][8]) > 0  # speed-up vs FP32
    pairs = md.split("## Precision pairs")[1]
    pair = next(line for line in pairs.splitlines() if line.startswith("| fp32/version_0 | bf16/version_0 |"))
    cells = [c.strip() for c in pair.strip("|").split("|")]
    keys = [c.key for c in table_columns(PAIRS)]
    assert float(cells[keys.index("speedup_vs_fp32")]) > 0
    assert cells[keys.index("iou_difference")].startswith(("+", "-"))
    for name in FIGURES:
        assert mpimg.imread(tmp_path / "report" / name).ndim == 3
