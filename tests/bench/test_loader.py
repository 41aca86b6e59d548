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
