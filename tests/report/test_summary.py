"""The end-of-fit summary: the record's figures (the report's rules), worked by hand on a fake run folder."""

from __future__ import annotations

import json

from cropscale.report.summary import fit_summary
from cropscale.runs.record import load_run
from tests.report.test_comparison import NAN, _losses
from tests.report.test_report import _fake_run


def _run(tmp_path, losses):
    folder = _fake_run(tmp_path / "runs" / "fp32" / "version_0", "32-true", [0.20, 0.35, 0.30], samples=210,
                       step_ms=100.0, train_s=[30.0, 20.0, 22.0], val_s=[5.0, 4.0, 6.0], energy_j=3600.0,
                       name="fp32", gpu_peak=3.0)
    _losses(folder, losses)
    return load_run(folder)


def test_summary_lines_by_hand(tmp_path):
    text = fit_summary(_run(tmp_path, [2.0, 1.5, 1.2]), "make report")
    lines = text.splitlines()
    assert lines[0] == ("cropscale fit summary [measured-run: every figure recorded by this run;"
                        " epoch 0 left out as warm-up]")
    assert set(lines[1]) == {"-"}
    body = {line[:12].strip(): line[12:] for line in lines[2:]}
    assert body["ran"] == "FP32 on 1 device(s) (SingleDeviceStrategy), global batch 4"
    assert body["quality"] == "best val/mIoU 0.3500 at epoch 1 (final 0.3000)"
    # epochs 1, 2: 420 samples in 42 s of the training loop and 24 + 28 = 52 s end to end (420 / 52 = 8.077); the
    # step window's median in epoch 1 is 100 ms (format ,.1f)
    assert body["speed"] == ("10.00 training-loop samples/s, 8.08 epoch-clock samples/s (end-to-end epoch); median"
                             " step 100.0 ms (median over the measured epochs)")
    # medians of the measured epochs: train [20, 22], validation [4, 6], end to end [24, 28]
    assert body["epoch"] == ("training-only 21.00 s, validation-only 5.00 s, end-to-end 26.00 s (median over the"
                             " measured epochs)")
    # windows 1, 0.5, 30, 50, 18.5, 0 ms of 100 (0.5 and 18.5 round half to even)
    assert body["step"].startswith("data wait 1 %, transfer 0 %, forward 30 %, backward 50 %, optimizer 18 %,"
                                   " remainder 0 % of the median step (window medians; sum 100 %)")
    assert body["memory"] == "peak 3.00 GiB (peak allocated GPU memory (torch.cuda))"
    assert body["energy"] == (f"{2400 / 420:.3f} J per training sample (GPU board energy (NVML): no CPU, memory,"
                              " network or cooling)")  # 2 x 1200 J for 2 x 210 samples
    assert body["numerics"] == ("1 non-finite batch(es), 0 skipped step(s); the last logged training loss is"
                                " finite")
    assert body["run folder"] == str(tmp_path / "runs" / "fp32" / "version_0")
    assert body["report"] == "make report"
    assert "DIVERGED" not in text


def test_summary_of_a_diverged_run_says_so_first(tmp_path):
    """A run.json written before the validity record, whose logged loss ended non-finite: judged when read."""
    text = fit_summary(_run(tmp_path, [2.0, NAN, NAN, NAN]), "make report")
    first = text.splitlines()[0]
    assert first == ("DIVERGED  train/loss_step non-finite at the last 3 logged step(s) (steps 1-3; last finite at"
                     " step 0): the figures below describe a diverged model: lower --model.lr or check the data"
                     " (run.json status 'diverged'; it forms no pair or verdict in the report)")
    assert text.splitlines()[1].startswith("cropscale fit summary")
    numerics = next(x for x in text.splitlines() if x.startswith("numerics"))
    assert numerics.endswith("the last 3 logged training losses are non-finite (from step 1)")


def test_the_numerics_line_reads_the_last_logged_loss(tmp_path):
    """The claim about the last loss is what was logged: one trailing NaN is said, not called finite."""
    text = fit_summary(_run(tmp_path, [2.0, 1.5, NAN]), "make report")
    assert "DIVERGED" not in text  # one logged NaN: fewer than the 3 of a divergence
    numerics = next(x for x in text.splitlines() if x.startswith("numerics"))
    assert numerics.endswith("the last logged training loss is non-finite (step 2)")


def test_summary_lists_the_data_warnings(tmp_path):
    record = _run(tmp_path, [2.0, 1.5, 1.2])
    body = {line[:12].strip(): line[12:] for line in fit_summary(record, "make report").splitlines()[2:]}
    assert body["data"] == "no data warning"
    path = tmp_path / "runs" / "fp32" / "version_0" / "run.json"
    run = json.loads(path.read_text())
    run["data_warnings"] = ["patch 1002 (fold 2): S1A file /d/S1A_1002.npy: another unit or scale than dB?",
                            "/d: 1 patch id(s) have files but no entry in metadata.geojson (3001)"]
    path.write_text(json.dumps(run))
    body = {line[:12].strip(): line[12:] for line in fit_summary(load_run(path.parent), "x").splitlines()[2:]}
    assert body["data"] == ("2 data warning(s) (run.json data_warnings; the report lists them): patch 1002"
                            " (fold 2): S1A file /d/S1A_1002.npy: another unit or scale than dB?; ...")
