"""A finished run is a valid run (issue 37), from the command line on the bundled real sample and the tiny network.

Each case of the issue: a fit that trained nothing, one that diverged in 4 steps, one that never validated; a
report that reads ``run.json`` first (a damaged events file, a malformed ``run.json``); and refused commands
that must leave their run folder byte for byte as it was.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from cropscale.report import command as rp
from cropscale.runs.record import load_inputs, load_run
from tests.data.test_errors import make_copy
from tests.integration.test_cli import run_cli
from tests.report.test_report import _md_row

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*LeafSpec")]

REPO = Path(__file__).resolve().parents[2]
ENV = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}  # this checkout's package, whatever is installed
SMALL = ("{s2_dim: 16, s2_depth: 1, s2_heads: 2, s1_dim: 8, s1_heads: 2, width: 8, fpn_dim: 16, head_dim: 8,"
         " decoder_dim: 8, hr_dim: 4}")
#: 2 training patches x 2 crops, batch 1: 4 optimizer steps per epoch
ARGS = ["--data.samples_per_patch=2", "--data.batch_size=1", "--trainer.log_every_n_steps=1", "--data.t2=4",
        "--data.t1=2", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        f"--model.net_kwargs={SMALL}"]


def _fit(cwd: Path, root: Path, *args: str):
    cwd.mkdir(parents=True, exist_ok=True)
    return run_cli(["fit", f"--data.root={root}", *ARGS, *args], cwd=cwd, env_extra=ENV)


def _error(res) -> str:
    errors = [line for line in res.stderr.splitlines() if line.startswith("cropscale: error:")]
    assert len(errors) == 1 and res.stderr.strip().splitlines()[-1] == errors[0], res.stderr[-3000:]
    return errors[0]


def _record(cwd: Path) -> tuple[Path, dict]:
    (path,) = (cwd / "runs").rglob("run.json")
    return path.parent, json.loads(path.read_text())


def _first_line(res) -> str:
    """The summary's first line: the one before ``cropscale fit summary``, or that line itself."""
    lines = res.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("cropscale fit summary"))
    return lines[at - 1] if at and lines[at - 1].strip() else lines[at]


def _scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of ``tag`` from every events file, read independently of the report."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = []
    for f in sorted(folder.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            out += [(e.step, e.value) for e in acc.Scalars(tag)]
    return out


# ------------------------------------------------------------------------------------------- nothing trained
@pytest.mark.parametrize("limit", [["--trainer.max_epochs=0"], ["--trainer.limit_train_batches=0",
                                                                   "--trainer.max_epochs=1"]])
def test_a_fit_that_takes_no_optimizer_step_is_not_trained_and_exits_1(tmp_path, flanders_root, limit):
    """Before: status finished, exit 0, an all-n/a summary (weights_changed was null, so no rule applied)."""
    res = _fit(tmp_path, flanders_root, *limit)
    assert res.returncode == 1, res.stderr[-3000:]
    assert _error(res).startswith("cropscale: error: the run did not train: took no optimizer step (global step 0;")
    folder, rec = _record(tmp_path)
    assert (rec["status"], rec["global_step"]) == ("not-trained", 0)
    assert rec["validity"] == {"valid": False, "status": "not-trained", "reason": rec["validity"]["reason"]}
    assert _first_line(res).startswith(f"NOT TRAINED  {rec['validity']['reason']}: ")
    assert load_run(folder).excluded.startswith("not-trained: took no optimizer step")


# ------------------------------------------------------------------------------------- diverged in 4 steps
def test_a_run_that_diverges_in_4_steps_is_diverged_keeps_no_nan_best_and_says_what_was_logged(tmp_path,
                                                                                               flanders_root):
    """``--model.lr=1e6`` over 4 steps. Before: status finished, exit 0, best-epoch00.ckpt = the NaN model, its
    constant prediction's val/mIoU (0.0198) reported as the best, "the last logged training loss is finite"."""
    res = _fit(tmp_path, flanders_root, "--model.lr=1e6", "--trainer.max_epochs=1")
    assert res.returncode == 1, res.stderr[-3000:]
    folder, rec = _record(tmp_path)
    last = torch.load(folder / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    floats = [v for v in last["state_dict"].values() if v.is_floating_point()]
    nonfinite = sum(not bool(torch.isfinite(v).all()) for v in floats)
    assert nonfinite == len(floats)  # the case of the issue: every tensor of last.ckpt non-finite
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["last.ckpt"]  # no best of NaN weights
    assert rec["status"] == "diverged" and rec["summary"]["trained"]["weights_finite"] is False
    assert rec["summary"]["trained"]["nonfinite_parameters"] == nonfinite
    assert _error(res) == (f"cropscale: error: training diverged: {nonfinite} of {nonfinite} parameter tensor(s)"
                           " hold NaN or inf at the end of training (summed over ranks) (run folder"
                           " runs/default/version_0)")
    assert _first_line(res).startswith("DIVERGED  ")
    quality = rec["summary"]["quality"]
    assert quality["validations"] == 1 and quality["epochs"][0]["weights_finite"] is False
    assert quality["best"] is None and quality["best_epoch"] is None  # never named as best
    assert [v for _, v in _scalars(folder, "val/mIoU_best")] != [] and not any(
        math.isfinite(v) for _, v in _scalars(folder, "val/mIoU_best"))  # nor as TensorBoard's best so far
    record = load_run(folder)
    assert record.figures["best_miou"].value is None and "non-finite weights" in record.figures["best_miou"].why
    # the numerics line says what TensorBoard shows: count the trailing non-finite logged losses by hand
    logged = [v for _, v in sorted(_scalars(folder, "train/loss_step"))]
    trailing = next(i for i, v in enumerate(reversed(logged)) if math.isfinite(v))
    assert trailing >= 1
    numerics = next(x for x in res.stdout.splitlines() if x.startswith("numerics"))
    assert numerics.endswith(f"the last {trailing} logged training losses are non-finite (from step"
                             f" {len(logged) - trailing})") if trailing > 1 else "is non-finite" in numerics
    report = tmp_path / "rep"
    assert rp.main([str(tmp_path / "runs"), "--output", str(report)]) == 0
    md = (report / "report.md").read_text()
    assert _md_row(md.split("## Comparison")[1], "default/version_0")[1].startswith("diverged")
    assert "- default/version_0: diverged: " in md.split("## Comparison")[0]  # left out of the verdicts, with why


# ------------------------------------------------------------------------------------------ never validated
def test_a_fit_whose_validation_never_runs_is_not_validated(tmp_path, flanders_root):
    res = _fit(tmp_path, flanders_root, "--trainer.max_epochs=1", "--trainer.check_val_every_n_epoch=2")
    assert res.returncode == 1, res.stderr[-3000:]
    assert _error(res).startswith("cropscale: error: the run never validated: validation was configured but never"
                                  " ran in 4 optimizer step(s)")
    _, rec = _record(tmp_path)
    assert rec["status"] == "not-validated" and rec["summary"]["quality"]["validation_configured"] is True


def test_no_validation_configured_is_a_valid_run(tmp_path, flanders_root):
    res = _fit(tmp_path, flanders_root, "--trainer.max_epochs=1", "--trainer.limit_val_batches=0")
    assert res.returncode == 0, res.stderr[-3000:]
    _, rec = _record(tmp_path)
    assert rec["status"] == "finished" and rec["validity"]["valid"] is True
    assert rec["summary"]["quality"] == {**rec["summary"]["quality"], "validation_configured": False,
                                         "validations": 0}


# ------------------------------------------------------------------------ a trained run, and what it meets
@pytest.fixture(scope="module")
def trained(tmp_path_factory, flanders_root) -> Path:
    """A valid 2-epoch run of the tiny network (8 optimizer steps, 2 validations); its working directory."""
    cwd = tmp_path_factory.mktemp("trained")
    res = _fit(cwd, flanders_root, "--trainer.max_epochs=2")
    assert res.returncode == 0, res.stderr[-3000:]
    return cwd


def _copy(trained: Path, tmp_path: Path) -> Path:
    shutil.copytree(trained, tmp_path / "w")
    return tmp_path / "w"


def test_the_report_reads_quality_from_run_json_and_names_a_damaged_events_file(trained, tmp_path):
    cwd = _copy(trained, tmp_path)
    folder, rec = _record(cwd)
    by_step = dict(_scalars(folder, "val/mIoU"))  # the values TensorBoard holds, read independently
    assert [e["value"] for e in rec["summary"]["quality"]["epochs"]] == pytest.approx(
        [by_step[s] for s in sorted(by_step)], abs=1e-6)
    before = load_run(folder)
    (events,) = folder.glob("events.out.tfevents.*")
    data = bytearray(events.read_bytes())
    for i in range(200, 260):  # a damaged record near the start: tensorboard silently stops there
        data[i] ^= 0xFF
    events.write_bytes(bytes(data))
    after = load_run(folder)
    assert "val/mIoU" not in after.scalar_tags  # what the events file lost ...
    for key in ("best_miou", "best_epoch", "final_miou"):  # ... costs no figure that run.json holds
        assert after.figures[key].value == before.figures[key].value is not None
    assert after.iou_by_epoch == before.iou_by_epoch and len(after.iou_by_epoch) == 2
    (problem,) = after.events_problems
    assert problem.startswith(f"events file unreadable: {events}, ") and "crc" in problem.lower()
    # a run.json without the quality record (written before it existed): the figure says the file, not a guess
    rec["summary"].pop("quality")
    (folder / "run.json").write_text(json.dumps(rec))
    older = load_run(folder)
    assert older.figures["best_miou"].value is None and older.figures["best_miou"].why == problem
    assert rp.main([str(cwd / "runs"), "--output", str(tmp_path / "rep")]) == 0
    assert f"- default/version_0: {problem}" in (tmp_path / "rep" / "report.md").read_text()


def test_after_a_kill_and_a_resume_every_epoch_stays_in_run_json(tmp_path, flanders_root):
    """SIGKILL in epoch 2, then ``--ckpt_path auto``: the earlier epochs' quality travels in the checkpoint.

    A killed process loses the events it had not flushed (TensorBoard's writer flushes every 120 s); here the
    killed attempt's whole events file is removed, the worst case. The report's quality figures and its
    best-so-far curve still hold every epoch (before, read from the events alone, epochs 0 and 1 dropped out).
    """
    args = ["--trainer.max_epochs=3"]
    kill = ["--trainer.callbacks+=cropscale.testing.faults.FailAt", "--trainer.callbacks.epoch=2",
            "--trainer.callbacks.batch=1", "--trainer.callbacks.how=sigkill"]
    killed = _fit(tmp_path, flanders_root, *args, *kill)
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    folder = tmp_path / "runs" / "default" / "version_0"
    first = sorted(folder.glob("events.out.tfevents.*"))
    resumed = _fit(tmp_path, flanders_root, *args, "--ckpt_path=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _, rec = _record(tmp_path)
    by_step = dict(_scalars(folder, "val/mIoU"))  # the last write of each step, over both attempts' files
    epochs = rec["summary"]["quality"]["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1, 2] and rec["summary"]["quality"]["validations"] == 3
    assert [e["value"] for e in epochs] == pytest.approx([by_step[e["global_step"] - 1] for e in epochs], abs=1e-6)
    for f in first:
        f.unlink()  # what the killed attempt wrote is gone
    record = load_run(folder)
    assert [epoch for epoch, _ in record.iou_by_epoch] == [0, 1, 2]
    values = [e["value"] for e in epochs]
    assert record.figures["best_miou"].value == pytest.approx(max(values))
    assert record.figures["best_epoch"].value == values.index(max(values))
    assert record.figures["final_miou"].value == pytest.approx(values[-1])


@pytest.mark.parametrize(("text", "needle"), [
    ("{not json", "is not valid JSON"),
    (json.dumps({"schema": "cropscale.run/1", "status": "finished", "summary": {"trained": "x"}}),
     "does not follow cropscale.run/1: summary: trained: TrainedSummary: expected a JSON object, got str"),
])
def test_one_malformed_run_json_is_listed_and_the_rest_reported(trained, tmp_path, capsys, text, needle):
    cwd = _copy(trained, tmp_path)
    good = cwd / "runs" / "default" / "version_0"
    shutil.copytree(good, cwd / "runs" / "broken" / "version_0")
    (cwd / "runs" / "broken" / "version_0" / "run.json").write_text(text)
    records = load_inputs([cwd / "runs"], on_skip=None)
    assert sorted((r.name, r.status) for r in records) == [("broken/version_0", "unreadable"),
                                                            ("default/version_0", "finished")]
    assert rp.main([str(cwd / "runs"), "--output", str(tmp_path / "rep")]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert _md_row(md.split("## Comparison")[1], "broken/version_0")[1].startswith("unreadable")
    assert needle in md and _md_row(md.split("## Comparison")[1], "default/version_0")[1] == "finished"


# ---------------------------------------------------------------------------------------- refused commands
def _tree(root: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under ``root``."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}


def _refused(cwd: Path, args: list[str], needle: str) -> None:
    before = _tree(cwd / "runs")
    res = run_cli(args, cwd=cwd, env_extra=ENV)
    assert res.returncode == 2 and needle in _error(res), res.stderr[-3000:]
    after = _tree(cwd / "runs")
    assert sorted(after) == sorted(before)  # no file or folder more, none less
    assert [k for k in before if before[k] != after[k]] == []  # and each byte for byte


def test_a_resume_with_another_network_is_refused_and_writes_nothing(trained, tmp_path, flanders_root):
    """Before: refused with a clear line after config.yaml was rewritten and an events file dropped in."""
    cwd = _copy(trained, tmp_path)
    ckpt = "runs/default/version_0/checkpoints/last.ckpt"
    _refused(cwd, ["fit", f"--data.root={flanders_root}", *ARGS[:-1], "--model.net_kwargs={width: 16}",
                   "--trainer.max_epochs=3", f"--ckpt_path={ckpt}"], "holds a network with")


def test_a_validate_with_another_network_is_refused_and_leaves_no_folder(trained, tmp_path, flanders_root):
    """Before: a validate_0/ folder with a failed run.json, which the report listed as a run."""
    cwd = _copy(trained, tmp_path)
    ckpt = "runs/default/version_0/checkpoints/last.ckpt"
    _refused(cwd, ["validate", f"--data.root={flanders_root}", *ARGS[:-1], "--model.net_kwargs={width: 16}",
                   f"--ckpt_path={ckpt}"], "holds a network with")


@pytest.fixture
def bad_mask(flanders_root, tmp_path) -> Path:
    """A copy of the sample whose cloud mask is coded 4/9 (Sen2Cor-like): refused by the data checks at set-up."""
    root = make_copy(flanders_root, tmp_path / "data", [1001, 1002, 2001, 2002])
    path = root / "DATA_S2_MASK" / "MASK_1002.npy"
    m = np.load(path)
    np.save(path, np.where(m > 0, 4, 9).astype(m.dtype))
    return root


def test_a_resume_refused_by_the_data_checks_at_set_up_writes_nothing(trained, tmp_path, bad_mask):
    """The refusal comes after Lightning created its events file: what was written is removed."""
    cwd = _copy(trained, tmp_path)
    _refused(cwd, ["fit", f"--data.root={bad_mask}", *ARGS, "--trainer.max_epochs=3",
                   "--ckpt_path=runs/default/version_0/checkpoints/last.ckpt"], "MASK_1002.npy")


def test_a_fresh_fit_refused_at_set_up_leaves_no_run_folder(trained, tmp_path, bad_mask):
    cwd = _copy(trained, tmp_path)
    _refused(cwd, ["fit", f"--data.root={bad_mask}", *ARGS, "--trainer.max_epochs=1"], "MASK_1002.npy")
