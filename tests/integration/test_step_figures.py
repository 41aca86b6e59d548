"""The median step from its callback to the report (issue 35): one "median step" line at the end of a fit, and
the same number in ``run.json``, the end-of-fit summary and the report's speed table.

A real ``python -m cropscale fit`` (subprocess, so that Lightning's own log lines are seen as a user sees them)
on the bundled Flanders sample with the network at small widths, two epochs (epoch 0 is the warm-up epoch)."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from tests.integration.test_cli import run_cli

REPO_ROOT = Path(__file__).resolve().parents[2]
HERE = {"PYTHONPATH": str(REPO_ROOT)}  # this checkout's package, also where another one is installed

SMALL_NET = {"s2_dim": 16, "s2_heads": 2, "s1_dim": 8, "width": 8, "fpn_dim": 16, "head_dim": 8,
             "decoder_dim": 8, "hr_dim": 4}


def _md_row(markdown: str, first_cell: str) -> list[str]:
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no row {first_cell!r} in\n{markdown}")


def test_one_median_step_line_and_one_number_end_to_end(tmp_path, flanders_root):
    res = run_cli(["fit", f"--data.root={flanders_root}", f"--model.net_kwargs={json.dumps(SMALL_NET)}",
                   "--trainer.max_epochs=2", "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=1",
                   "--data.batch_size=1"], cwd=tmp_path,
                  env_extra=HERE)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    said = [line for line in (res.stdout + res.stderr).splitlines() if re.search(r"median step [\d,.]+ ms", line)]
    assert len(said) == 1, said  # the summary's speed line only (its step line names no number)
    (folder,) = sorted((tmp_path / "runs" / "default").glob("version_*"))
    epochs = json.loads((folder / "run.json").read_text())["summary"]["step_timing"]["epochs"]
    # the rule by hand: the median over the measured epochs (epoch 1; epoch 0 is the warm-up) of the epoch medians
    step = statistics.median(e["windows_ms"]["step"]["median"] for e in epochs if e["epoch"] >= 1)
    assert said[0].endswith(f"median step {step:,.1f} ms"), said
    report = run_cli(["report", "runs", "--output", "reports"], cwd=tmp_path, env_extra=HERE)
    assert report.returncode == 0, report.stderr[-3000:]
    speed = (tmp_path / "reports" / "report.md").read_text().split("### Speed")[1]
    header = next([c.strip() for c in line.strip().strip("|").split("|")] for line in speed.splitlines()
                  if line.startswith("| Run |"))
    row = _md_row(speed, "default/version_0")
    assert row[header.index("Median step (ms)")].split()[0] == f"{step:,.1f}"
