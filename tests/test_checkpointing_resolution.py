"""Which checkpoint a resume takes, at the boundaries: numbered folders and files past 9, equal times, equal progress,
limits hit exactly, files that are not states (issue 36). The fits that write them: test_checkpointing.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from cropscale.checkpointing import (
    TrainingState,
    check_fit_start,
    completed_run,
    find_last_checkpoint,
    find_resume_state,
    hpc_checkpoints_in,
    next_eval_folder,
    resume_command,
    run_version,
    training_state,
)
from cropscale.errors import CheckpointError
from tests.test_checkpointing import _state_file


def _last(runs: Path, version: str, when: float) -> Path:
    p = runs / "default" / version / "checkpoints" / "last.ckpt"
    p.parent.mkdir(parents=True)
    p.write_bytes(b"x")
    os.utime(p, (when, when))
    return p


def test_equal_times_go_to_the_higher_numbered_run_past_9(tmp_path):
    """Copied or restored folders share a modification time: version_10 is newer than version_9, not older."""
    runs, now = tmp_path / "runs", time.time()
    _last(runs, "version_2", now)
    _last(runs, "version_9", now)
    ten = _last(runs, "version_10", now)
    assert find_last_checkpoint(runs, "default") == ten


def test_the_highest_numbered_run_with_a_state_past_9(tmp_path):
    runs = tmp_path / "runs"
    for version, step in ((2, 50), (9, 40), (10, 30)):  # the newest run is 10, whatever its progress
        _state_file(runs / "default" / f"version_{version}" / "checkpoints" / "last.ckpt", step, 1)
    (runs / "default" / "version_11" / "checkpoints").mkdir(parents=True)  # failed before its first save
    (runs / "default" / "version_x" / "checkpoints").mkdir(parents=True)  # not a numbered run
    assert find_resume_state(runs, "default").global_step == 30
    assert find_resume_state(runs, "default", version=9).global_step == 40
    assert find_resume_state(runs, "default", version="version_2").global_step == 50


def test_equal_progress_goes_to_the_newest_file_and_more_epochs_win_at_equal_steps(tmp_path):
    ck = tmp_path / "runs" / "default" / "version_0" / "checkpoints"
    old = _state_file(ck / "hpc_ckpt_3.ckpt", 8, 1)
    new = _state_file(ck / "last.ckpt", 8, 1)
    now = time.time()
    os.utime(old, (now - 10, now - 10))
    os.utime(new, (now, now))
    assert find_resume_state(tmp_path / "runs", "default").path == new
    after_end = _state_file(ck / "last-v1.ckpt", 8, 2)  # saved after the epoch's end: further on
    os.utime(after_end, (now - 20, now - 20))
    assert find_resume_state(tmp_path / "runs", "default").path == after_end


def test_the_training_state_of_a_file(tmp_path):
    s = training_state(_state_file(tmp_path / "a.ckpt", 12, 3))
    assert (s.global_step, s.epoch, s.epochs_done, s.progress()) == (12, 3, 3, (12, 3))
    torch.save({"state_dict": {}, "global_step": 5, "epoch": 2}, tmp_path / "b.ckpt")  # no loops: epochs from epoch
    assert training_state(tmp_path / "b.ckpt") == TrainingState(tmp_path / "b.ckpt", 5, 2, 2)
    torch.save({"state_dict": {}, "global_step": 5}, tmp_path / "c.ckpt")  # no epoch at all: 0
    assert (training_state(tmp_path / "c.ckpt").epoch, training_state(tmp_path / "c.ckpt").epochs_done) == (0, 0)
    torch.save({"state_dict": {}}, tmp_path / "d.ckpt")  # not a training state
    torch.save({"global_step": 1}, tmp_path / "e.ckpt")
    torch.save([1, 2], tmp_path / "f.ckpt")
    (tmp_path / "g.ckpt").write_bytes(b"garbage")
    assert [training_state(tmp_path / f"{n}.ckpt") for n in "defg"] == [None, None, None, None]


@pytest.mark.parametrize(("steps", "epochs_done", "max_epochs", "max_steps", "expected"), [
    (12, 2, 3, 12, "global step 12 of trainer.max_steps=12"),  # exactly the step limit
    (11, 2, 3, 12, None),
    (12, 2, -1, -1, None),  # no limit
    (12, 2, None, None, None),
    (12, 3, 3, 0, "3 of trainer.max_epochs=3 epochs done (global step 12)"),  # max_steps 0: no limit
    (0, 0, 0, -1, "0 of trainer.max_epochs=0 epochs done (global step 0)"),  # max_epochs 0 is a limit
])
def test_a_run_is_complete_exactly_at_its_limits(steps, epochs_done, max_epochs, max_steps, expected):
    assert completed_run(TrainingState(Path("x"), steps, epochs_done, epochs_done), max_epochs, max_steps) == expected


def test_a_slurm_start_names_the_requeue_checkpoint_lightning_would_restore(tmp_path, monkeypatch):
    """Lightning restores the highest-numbered hpc_ckpt_N.ckpt: past 9 that is not the last by name."""
    for n in (2, 9, 10):
        (tmp_path / f"hpc_ckpt_{n}.ckpt").write_bytes(b"x")
    (tmp_path / "hpc_ckpt_x.ckpt").write_bytes(b"x")  # not one of Lightning's
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "hpc_ckpt_99.ckpt").write_bytes(b"x")  # not directly in the folder
    assert [p.name for p in hpc_checkpoints_in(tmp_path)] == ["hpc_ckpt_2.ckpt", "hpc_ckpt_9.ckpt",
                                                              "hpc_ckpt_10.ckpt"]
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    with pytest.raises(CheckpointError, match=r"^\S*hpc_ckpt_10\.ckpt is a SLURM requeue checkpoint that Lightning"):
        check_fit_start(None, 3, -1, tmp_path)
    assert check_fit_start(str(tmp_path / "hpc_ckpt_2.ckpt"), 3, -1, tmp_path) is None  # named: not refused


def test_check_fit_start_ends_a_complete_run_and_lets_an_unfinished_one_go(tmp_path):
    done = _state_file(tmp_path / "done.ckpt", 20, 4)
    assert check_fit_start(str(done), 4, -1, tmp_path) == (
        f"cropscale: {done} is a complete run (4 of trainer.max_epochs=4 epochs done (global step 20)): nothing to "
        "train; to train further, raise --trainer.max_epochs (or max_steps)")
    assert check_fit_start(str(done), 5, -1, tmp_path) is None
    assert check_fit_start(str(tmp_path / "missing.ckpt"), 4, -1, tmp_path) is None  # Lightning reports it
    assert check_fit_start(None, 4, -1, tmp_path) is None


def test_run_version_and_the_next_evaluation_folder(tmp_path):
    runs = tmp_path / "runs"
    ck = runs / "default" / "version_12" / "checkpoints" / "epoch=3.ckpt"
    assert run_version(ck, runs, "default") == 12
    assert run_version(ck, runs, "other") is None
    assert run_version(runs / "default" / "version_12" / "epoch=3.ckpt", runs, "default") is None
    assert run_version(runs / "default" / "version_x" / "checkpoints" / "a.ckpt", runs, "default") is None
    run = tmp_path / "run"
    assert next_eval_folder(run, "validate") == "validate_0"
    for k in (0, 1, 2):
        (run / f"validate_{k}").mkdir(parents=True)
    (run / "test_0").mkdir()
    assert next_eval_folder(run, "validate") == "validate_3" and next_eval_folder(run, "test") == "test_1"


def test_the_resume_command_keeps_every_other_argument_in_order():
    assert resume_command(["fit", "--ckpt_path", "a.ckpt", "--trainer.max_epochs", "4", "--ckpt_path=b"],
                          program="srun python -m cropscale") == (
        "srun python -m cropscale fit --trainer.max_epochs 4 --ckpt_path auto")
    assert resume_command([]) == "python -m cropscale --ckpt_path auto"
    assert resume_command(["fit", "--ckpt_pathological=1"]) == "python -m cropscale fit --ckpt_pathological=1 " \
                                                               "--ckpt_path auto"
