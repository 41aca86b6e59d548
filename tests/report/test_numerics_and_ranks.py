"""The report shows what run.json records about non-finite batches (where, which part, the sample ids) and the
slowest rank of a multi-process run, figures worked by hand from the run.json written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cropscale.report import command as rp
from cropscale.report.summary import fit_summary
from cropscale.runs.record import load_run


def _two_rank_run(folder: Path) -> Path:
    """A finished 2-rank fit's run.json: epoch 0 warm-up; two non-finite batches recorded."""
    folder.mkdir(parents=True)
    per_rank = [[100.0, 150.0], [110.0, 105.0], [120.0, 130.0]]  # step medians (ms) by epoch, rank
    summary = {
        "step_timing": {"warmup_steps": 1, "steps_total": 30, "epochs": [
            {"epoch": e, "windows_ms": {"step": {"median": max(r), "p95": max(r), "n": 9}},
             "step_ms_per_rank": {"per_rank": r, "max": max(r), "median": sum(r) / 2, "slowest_rank": r.index(max(r))}}
            for e, r in enumerate(per_rank)]},
        "throughput": {"epochs": [{"epoch": e, "samples": 40, "train_s": 4.0} for e in range(3)]},
        "nonfinite": {"policy": "skip", "per_rank": [{"nonfinite_batches": 1, "skipped_steps": 1},
                                                     {"nonfinite_batches": 1, "skipped_steps": 1}],
                      "records": [
                          {"global_step": 17, "epoch": 1, "batch_idx": 7, "micro_batch": 0, "rank": 1,
                           "loss_finite": False, "grads_finite": False, "input_finite": False,
                           "nonfinite_inputs": ["s2"], "patch_id": [12, 40], "crop_yx": [[0, 32], [16, 0]],
                           "nonfinite_input_patch_id": [40], "nonfinite_input_crop_yx": [[16, 0]]},
                          {"global_step": 23, "epoch": 2, "batch_idx": 3, "micro_batch": None, "rank": 0,
                           "loss_finite": True, "grads_finite": False, "input_finite": True,
                           "patch_id": [5, 6], "crop_yx": [[0, 0], [32, 32]]}]},
    }
    run = {"schema": "cropscale.run/1", "status": "finished", "precision": "32-true",
           "distributed": {"world_size": 2, "strategy": "DDPStrategy"}, "summary": summary, "global_step": 30}
    (folder / "run.json").write_text(json.dumps(run))
    return folder


def _row(md: str, section: str, first_cell: str) -> list[str]:
    part = md.split(section, 1)[1]
    line = next(ln for ln in part.splitlines() if ln.startswith(f"| {first_cell} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_the_report_shows_the_slowest_rank_and_every_rank_in_its_note(tmp_path):
    run = load_run(_two_rank_run(tmp_path / "runs" / "ddp" / "version_0"))
    # measured epochs 1, 2: rank 0 median(110, 120) = 115, rank 1 median(105, 130) = 117.5
    assert run.figures["slowest_rank"].value == 1
    assert run.figures["slowest_rank_step_ms"].value == pytest.approx(117.5)
    md = rp.write_report([run], tmp_path / "out")["markdown"].read_text()
    cells = _row(md, "### Speed", run.name)
    assert cells[-3].startswith("1") and cells[-2].startswith("117.5 [")  # registry format ,.1f
    assert "rank 0 115.0 ms, rank 1 117.5 ms" in md


def test_the_report_lists_each_non_finite_batch_with_its_part_and_sample_ids(tmp_path):
    run = load_run(_two_rank_run(tmp_path / "runs" / "ddp" / "version_0"))
    md = rp.write_report([run], tmp_path / "out")["markdown"].read_text()
    section = md.split("### Non-finite batches", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in section.splitlines()
            if ln.startswith(f"| {run.name} |")]
    assert [r[1:5] for r in rows] == [["17", "1", "1", "0"], ["23", "2", "0", "all"]]
    assert rows[0][5] == "loss, gradients, inputs (s2)" and rows[1][5] == "gradients"  # batch 2: inputs checked, finite
    assert rows[0][6] == "12, 40" and rows[0][7] == "40" and rows[1][6] == "5, 6" and rows[1][7] == "none"


def test_no_non_finite_batch_says_so(tmp_path):
    folder = _two_rank_run(tmp_path / "runs" / "ddp" / "version_0")
    data = json.loads((folder / "run.json").read_text())
    data["summary"]["nonfinite"]["records"] = []
    (folder / "run.json").write_text(json.dumps(data))
    md = rp.write_report([load_run(folder)], tmp_path / "out")["markdown"].read_text()
    assert "### Non-finite batches\n\nNo run recorded a non-finite batch" in md


def test_the_fit_summary_names_the_first_non_finite_batch(tmp_path):
    text = fit_summary(load_run(_two_rank_run(tmp_path / "runs" / "ddp" / "version_0")), "report")
    line = next(ln for ln in text.splitlines() if ln.startswith("numerics"))
    first = " (first at step 17, rank 1: loss, gradients, inputs (s2), patch_id 40; the report lists all)"
    assert line.startswith(f"numerics    2 non-finite batch(es){first}, 2 skipped step(s); ")
