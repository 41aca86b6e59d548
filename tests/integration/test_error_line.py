"""An error that ends a run while Lightning's progress bar is drawn starts a line of its own (issue 37).

``python -m cropscale fit`` on the bundled sample with the progress bar on, stdout and stderr into one pipe as on a
terminal (the bar writes to stdout, the error to stderr): a full disk at the first checkpoint save (a typed error:
one line) and an unexpected error raised in a training batch (a traceback), under Lightning's ``TQDMProgressBar``
(the default where ``rich`` is not installed; it leaves its bar open on an exception) and its ``RichProgressBar``
(the default with ``rich``; it stops itself). What a terminal shows of a line is its text after the last carriage
return: there, the error's first line starts the line instead of following the bar's ``Epoch 0: 100%|...|``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SMALL_NET = ("{s2_dim: 16, s2_depth: 1, s2_heads: 2, s1_dim: 8, s1_heads: 2, width: 8, fpn_dim: 16, head_dim: 8,"
             " decoder_dim: 8, hr_dim: 4}")
ARGS = ["--trainer.max_epochs=2", "--data.samples_per_patch=3", "--data.batch_size=2", "--data.t2=4", "--data.t1=2",
        "--trainer.enable_progress_bar=true", "--trainer.enable_model_summary=false", f"--model.net_kwargs={SMALL_NET}"]


def _terminal_lines(text: str) -> list[str]:
    """Each line as a terminal leaves it: the text after its last carriage return."""
    return [line.rsplit("\r", 1)[-1] for line in text.split("\n")]


def _fit_merged(tmp_path: Path, root: Path, *args: str) -> tuple[int, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("CROPSCALE_TRACEBACK", None)
    res = subprocess.run([sys.executable, "-m", "cropscale", "fit", f"--data.root={root}", *ARGS, *args],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=600)
    return res.returncode, res.stdout


def _full_disk(tmp_path: Path) -> list[str]:
    path = tmp_path / "full_disk.yaml"
    path.write_text(json.dumps({"trainer": {"plugins": [
        {"class_path": "cropscale.testing.faults.FullDiskCheckpointIO", "init_args": {"on_save": 1}}]}}))
    return ["--config", str(path)]


def _raise_in_a_batch(_: Path) -> list[str]:
    return ["--trainer.callbacks+=cropscale.testing.faults.FailAt", "--trainer.callbacks.epoch=0",
            "--trainer.callbacks.batch=1", "--trainer.callbacks.how=raise"]


TQDM = ["--trainer.callbacks+=lightning.pytorch.callbacks.TQDMProgressBar"]


@pytest.mark.parametrize(("bar", "fault", "status", "first_line"), [
    (TQDM, _full_disk, 2, "cropscale: error: checkpoint not saved: cannot write "),
    (TQDM, _raise_in_a_batch, 1, "Traceback (most recent call last):"),
    ([], _full_disk, 2, "cropscale: error: checkpoint not saved: cannot write "),
], ids=["tqdm-full-disk", "tqdm-raise", "rich-full-disk"])
def test_an_error_under_the_progress_bar_starts_a_line(tmp_path, flanders_root, bar, fault, status, first_line):
    code, out = _fit_merged(tmp_path, flanders_root, *bar, *fault(tmp_path))
    assert code == status, out[-3000:]
    assert "Epoch 0" in out  # the bar was drawn
    lines = _terminal_lines(out)
    hits = [line for line in lines if first_line in line]
    assert hits and all(line.startswith(first_line) for line in hits), hits
