"""Crashed and incomplete runs in the report (issue 17, case 12): a ``run.json`` with status ``failed`` or
``running`` is a ``fit`` that did not finish; the report lists it marked as such (never skipped as "no
training run", never an ordinary row of n/a cells) and pairs no precision with it.

The folders are built as ``ProvenanceCallback`` leaves them: ``running`` with an empty summary at fit start
(a killed run stays so), ``failed`` with the callbacks' summaries and ``error`` from ``on_exception``.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from cropscale.report import command as rp
from cropscale.report.pairs import precision_pairs
from cropscale.runs.record import load_inputs, load_run
from tests.report.test_report import _config, _fake_run, _footnote, _md_row

ERROR = {"type": "CropScaleError", "message": "patch 1002: S2 file /d/S2_1002.npy: non-finite reflectance"}


def _crashed(folder: Path, precision: str, status: str, *, trained: bool) -> Path:
    """A fit that stopped: ``trained`` = it logged training steps before."""
    from torch.utils.tensorboard import SummaryWriter

    folder.mkdir(parents=True)
    writer = SummaryWriter(str(folder))
    if trained:
        writer.add_scalar("train/loss_step", 2.5, 1)
        writer.add_scalar("train/loss_step", 2.4, 2)
    writer.add_scalar("optim/global_batch", 4.0, 0)
    writer.close()
    (folder / "config.yaml").write_text(yaml.safe_dump(_config(precision)))
    run = {"schema": "cropscale.run/1", "evidence": "measured-run", "status": status, "precision": precision,
           "distributed": {"world_size": 1, "strategy": "SingleDeviceStrategy"}, "config": None, "summary": {}}
    if status == "failed":
        run["summary"] = {"throughput": {"evidence": "measured-run", "warmup_steps": 5, "epochs": []},
                          "nonfinite": {"per_rank": [{"nonfinite_batches": 0, "skipped_steps": 0}]}}
        run["error"] = ERROR
        run["global_step"] = 2 if trained else 0
        run["epochs_completed"] = 0
    (folder / "run.json").write_text(json.dumps(run))
    return folder


def _runs(tmp_path: Path) -> dict[str, Path]:
    runs = tmp_path / "runs"
    return {
        "ok": _fake_run(runs / "fp32" / "version_0", "32-true", [0.2, 0.3], samples=16, step_ms=100.0,
                        train_s=[10.0, 9.0], val_s=[2.0, 2.0], name="fp32"),
        "failed_mid": _crashed(runs / "bf16" / "version_0", "bf16-mixed", "failed", trained=True),
        "failed_start": _crashed(runs / "bf16" / "version_1", "bf16-mixed", "failed", trained=False),
        "killed_mid": _crashed(runs / "fp16" / "version_0", "16-mixed", "running", trained=True),
        "killed_start": _crashed(runs / "fp16" / "version_1", "16-mixed", "running", trained=False),
    }


def test_crashed_runs_load_as_failed_or_incomplete_runs(tmp_path):
    runs = _runs(tmp_path)
    skipped: list[str] = []
    records = {r.path: r for r in load_inputs([tmp_path / "runs"], on_skip=skipped.append)}
    assert skipped == []
    assert set(records) == {str(p) for p in runs.values()}
    for key in ("failed_mid", "failed_start"):
        r = records[str(runs[key])]
        assert r.training_run and r.status == "failed"
        assert r.descriptive["status"].value == "failed"
        assert r.descriptive["status"].note == "CropScaleError: " + ERROR["message"]
    for key in ("killed_mid", "killed_start"):
        r = records[str(runs[key])]
        assert r.training_run and r.status == "running"
        assert r.descriptive["status"].value == "incomplete"
        assert "status 'running'" in r.descriptive["status"].note
    assert records[str(runs["ok"])].descriptive["status"].value == "finished"
    # an n/a figure of a run that did not finish says so first
    why = load_run(runs["killed_mid"]).figures["samples_per_s"].why
    assert why.startswith("run incomplete (see Status): ")
    why = load_run(runs["failed_start"]).figures["best_miou"].why
    assert why == "run failed (see Status): no val/mIoU in the TensorBoard events (validation did not run)"
    assert load_run(runs["ok"]).figures["energy_j"].why.startswith("not measured")  # finished: as before


def test_report_marks_them_and_pairs_none(tmp_path, capsys):
    runs = _runs(tmp_path)
    records = load_inputs([tmp_path / "runs"], on_skip=None)
    assert precision_pairs(records) == []  # no FP32 pair with a run that did not finish
    out = tmp_path / "rep"
    assert rp.main([str(tmp_path / "runs"), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "skipped" not in printed
    md = (out / "report.md").read_text()
    lead = next(x for x in md.splitlines() if x.startswith("| Run |"))  # the comparison: the bare word
    lead_col = [c.strip() for c in lead.strip("|").split("|")].index("Status")
    assert [_md_row(md, "/".join(p.parts[-2:]))[lead_col] for p in runs.values()] == [
        "finished", "failed", "failed", "incomplete", "incomplete"]
    md = md.split("### Quality")[1]  # the quality detail: the word and its note
    header = next(x for x in md.splitlines() if x.startswith("| Run |"))
    status_col = [c.strip() for c in header.strip("|").split("|")].index("Status")
    ok = _md_row(md, "fp32/version_0")
    assert ok[status_col] == "finished"
    for folder in (runs["failed_mid"], runs["failed_start"]):
        cell = _md_row(md, "/".join(folder.parts[-2:]))[status_col]
        assert cell.startswith("failed [")
        assert _footnote(md, cell).endswith("CropScaleError: " + ERROR["message"])
    for folder in (runs["killed_mid"], runs["killed_start"]):
        cell = _md_row(md, "/".join(folder.parts[-2:]))[status_col]
        assert cell.startswith("incomplete [")
        assert "status 'running'" in _footnote(md, cell)
    assert "No two inputs differ only in precision." in md
