"""Issue 37, must-show 3: a 2-process gloo fit where rank 1's weights alone go non-finite.

``cropscale.testing.faults.NonFiniteWeightsAt`` writes NaN into one parameter on rank 1 after the last optimizer
step (global step 4 of 2 epochs x 2 steps per rank): rank 0's weights stay finite, so the ranks' own facts
disagree. Both ranks must end with the same ``diverged`` verdict and exit status 1, and the epoch-1 validation,
run on rank 1's non-finite weights, must not make a best checkpoint: the best stays epoch 0's, finite.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.integration.test_cli import run_cli
from tests.integration.test_validity import _scalars

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*LeafSpec")]

REPO = Path(__file__).resolve().parents[2]
SMALL = ("{s2_dim: 16, s2_depth: 1, s2_heads: 2, s1_dim: 8, s1_heads: 2, width: 8, fpn_dim: 16, head_dim: 8,"
         " decoder_dim: 8, hr_dim: 4}")


def test_rank_1_non_finite_alone_makes_both_ranks_diverged_exit_1_and_keeps_no_nan_best(tmp_path, flanders_root):
    res = run_cli(["fit", f"--data.root={flanders_root}", "--data.samples_per_patch=2", "--data.batch_size=1",
                   "--data.t2=4", "--data.t1=2", "--trainer.log_every_n_steps=1", "--trainer.max_epochs=2",
                   f"--model.net_kwargs={SMALL}", "--trainer.enable_progress_bar=false",
                   "--trainer.enable_model_summary=false", "--trainer.accelerator=cpu", "--trainer.devices=2",
                   "--trainer.strategy=ddp", "--trainer.callbacks+=cropscale.testing.faults.NonFiniteWeightsAt",
                   "--trainer.callbacks.step=4", "--trainer.callbacks.rank=1"],
                  cwd=tmp_path, timeout=300, env_extra={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    assert res.returncode == 1, res.stderr[-3000:]
    assert "NonFiniteWeightsAt: nan written into net.s1a_missing on rank 1 after step 4" in res.stderr
    folder = tmp_path / "runs" / "default" / "version_0"
    rec = json.loads((folder / "run.json").read_text())
    verdict = ("training diverged: 1 of 118 parameter tensor(s) hold NaN or inf at the end of training (summed over"
               " ranks) (run folder runs/default/version_0)")
    errors = [line for line in res.stderr.splitlines() if line.startswith("cropscale: error:")]
    # rank 1 said it and exited; rank 0 said it last, with no "(but ... status ...)": rank 1's status was 1
    assert errors == [f"cropscale: error: rank 1: {verdict}", f"cropscale: error: {verdict}"], errors
    assert res.stderr.strip().splitlines()[-1] == errors[-1]
    assert (rec["status"], rec["validity"]["status"]) == ("diverged", "diverged")
    assert (rec["summary"]["trained"]["weights_finite"], rec["summary"]["trained"]["nonfinite_parameters"]) == (
        False, 1)
    epochs = rec["summary"]["quality"]["epochs"]
    assert [(e["epoch"], e["weights_finite"]) for e in epochs] == [(0, True), (1, False)]
    assert (rec["summary"]["quality"]["best_epoch"], rec["summary"]["quality"]["best"]) == (0, epochs[0]["value"])
    kept = sorted(p.name for p in (folder / "checkpoints").iterdir())
    assert kept == ["best-epoch00.ckpt", "last.ckpt"]  # no best of epoch 1
    best = torch.load(folder / "checkpoints" / "best-epoch00.ckpt", map_location="cpu", weights_only=False)
    assert all(bool(torch.isfinite(v).all()) for v in best["state_dict"].values() if v.is_floating_point())
    assert best["global_step"] == 2
    best_so_far = [v for _, v in sorted(_scalars(folder, "val/mIoU_best"))]
    assert best_so_far == pytest.approx([epochs[0]["value"]] * 2)  # epoch 1's score is never the best so far
