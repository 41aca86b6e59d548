"""Loader benchmark command (cropscale.bench.loader): runs, prints labelled samples/s, writes JSON."""

import json

import pytest

from cropscale import CropScaleError
from cropscale.bench.loader import main


def test_loader_bench_prints_labelled_figures(flanders_root, tmp_path, capsys):
    out = tmp_path / "loader.json"
    assert main(["--root", str(flanders_root), "--workers", "0", "--batches", "3", "--warmup", "1",
                 "--batch-size", "2", "--no-model", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "measured-microbenchmark" in text and "samples/s" in text
    result = json.loads(out.read_text())
    assert result["label"] == "measured-microbenchmark" and result["model"] is None
    (row,) = result["loader"]
    assert row["workers"] == 0 and row["samples"] == 6 and row["samples_per_s"] > 0
    assert row["samples_per_s"] == pytest.approx(row["samples"] / row["elapsed_s"])


def test_loader_bench_rejects_bad_arguments(flanders_root):
    with pytest.raises(CropScaleError, match="--batches"):
        main(["--root", str(flanders_root), "--batches", "0", "--no-model"])


@pytest.mark.slow
def test_loader_bench_with_model_step(flanders_root, capsys):
    assert main(["--root", str(flanders_root), "--workers", "0", "2", "--batches", "2", "--warmup", "0",
                 "--batch-size", "1", "--model-steps", "1"]) == 0
    text = capsys.readouterr().out
    assert "model training step" in text and text.count("measured-microbenchmark") == 2


def test_loader_bench_interleaves_the_checks_on_and_off(flanders_root, tmp_path, capsys):
    out = tmp_path / "loader.json"
    assert main(["--root", str(flanders_root), "--workers", "0", "--batches", "2", "--warmup", "0",
                 "--batch-size", "2", "--no-model", "--checks", "on", "off", "--rounds", "3", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["loader"]
    assert [(r["round"], r["checks"]) for r in rows] == [(0, "on"), (0, "off"), (1, "off"), (1, "on"), (2, "on"),
                                                         (2, "off")]
    on = sorted(r["samples_per_s"] for r in rows if r["checks"] == "on")
    off = sorted(r["samples_per_s"] for r in rows if r["checks"] == "off")
    arms = result["summary"]["arms"]
    assert (arms["0/on"]["median"], arms["0/on"]["min"], arms["0/on"]["max"]) == (on[1], on[0], on[2])
    assert result["summary"]["on_vs_off"]["0"] == pytest.approx(on[1] / off[1])
    text = capsys.readouterr().out
    assert "0 worker(s): checks on / off = " in text and text.count("measured-microbenchmark") >= 4


def test_loader_bench_refuses_an_unknown_checks_arm(flanders_root):
    with pytest.raises(CropScaleError, match="--checks"):
        main(["--root", str(flanders_root), "--checks", "maybe", "--no-model"])


def test_loader_bench_cpu_clock_is_for_the_main_process_only(flanders_root, tmp_path):
    with pytest.raises(CropScaleError, match=r"--clock cpu: measures this process only; use it with --workers 0"):
        main(["--root", str(flanders_root), "--clock", "cpu", "--workers", "0", "2", "--no-model"])
    out = tmp_path / "loader.json"
    assert main(["--root", str(flanders_root), "--workers", "0", "--batches", "2", "--warmup", "0", "--batch-size", "2",
                 "--no-model", "--clock", "cpu", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["loader"]
    assert row["samples_per_s"] == pytest.approx(row["samples"] / row["elapsed_s"])
