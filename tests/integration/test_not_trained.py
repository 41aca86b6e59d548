"""A run that did not train says so (issue 23): ``16-mixed`` with a GradScaler that never finds a usable scale.

``init_scale=1e38`` makes every scaled FP16 gradient overflow; backing off by 0.5 per step, the scaler would need
about 110 steps to reach a usable scale, so all 4 steps of this fit are skipped and the weights never change.
Before, such a run ended with exit status 0, "0 non-finite batches" and a report that paired it with the FP32 run.
"""

import json

import pytest

from cropscale.report.pairs import precision_pairs
from cropscale.runs.record import load_run
from tests.integration.test_cli import run_cli

pytestmark = pytest.mark.slow

SMALL = ("{s2_dim: 16, s2_depth: 1, s2_heads: 2, s1_dim: 8, s1_heads: 2, width: 8, fpn_dim: 16, head_dim: 8,"
         " decoder_dim: 8, hr_dim: 4}")
ARGS = ["--trainer.max_epochs=1", "--data.samples_per_patch=2", "--data.batch_size=1", "--trainer.log_every_n_steps=1",
        "--trainer.limit_val_batches=0", "--trainer.enable_model_summary=false", f"--model.net_kwargs={SMALL}"]
NEVER_CALIBRATES = """
trainer:
  precision: null
  plugins:
    - class_path: lightning.pytorch.plugins.MixedPrecision
      init_args:
        precision: 16-mixed
        device: cpu
        scaler:
          class_path: torch.amp.GradScaler
          init_args: {device: cpu, init_scale: 1.0e+38}
"""


def test_a_run_whose_every_step_is_skipped_says_so_exits_1_and_forms_no_pair(tmp_path, flanders_root):
    cfg = tmp_path / "fp16_never.yaml"
    cfg.write_text(NEVER_CALIBRATES)
    res = run_cli(["fit", f"--data.root={flanders_root}", f"--config={cfg}", *ARGS,
                   "--trainer.logger.init_args.name=fp16"], cwd=tmp_path, env_extra={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("cropscale: error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "cropscale: error: the run did not train: no weight changed over 4 optimizer step(s) (4 of 4 optimizer"
        " steps skipped)"), errors
    text = res.stdout[res.stdout.index("NOT TRAINED"):]
    assert text.splitlines()[1].startswith("cropscale fit summary")   # the summary's first line says it
    (run_json,) = (tmp_path / "runs" / "fp16").rglob("run.json")
    rec = json.loads(run_json.read_text())
    assert rec["status"] == "not-trained" and rec["global_step"] == 4
    assert rec["summary"]["loss_scale"]["skipped_steps"] == 4
    assert rec["summary"]["trained"]["weights_changed"] is False
    assert rec["summary"]["trained"]["parameters_changed"] == 0

    res32 = run_cli(["fit", f"--data.root={flanders_root}", *ARGS, "--trainer.logger.init_args.name=fp32"],
                    cwd=tmp_path, env_extra={"OMP_NUM_THREADS": "1"})
    assert res32.returncode == 0, res32.stdout[-3000:] + res32.stderr[-3000:]
    assert "NOT TRAINED" not in res32.stdout
    (run32,) = (tmp_path / "runs" / "fp32").rglob("run.json")
    assert json.loads(run32.read_text())["summary"]["trained"]["weights_changed"] is True
    untrained, base = load_run(run_json.parent), load_run(run32.parent)
    assert untrained.pair_key == base.pair_key          # a pair but for its status
    assert precision_pairs([base, untrained]) == []
    untrained.status, untrained.validity = "finished", None  # the same record as a valid run: paired
    assert [p.other for p in precision_pairs([base, untrained])] == [untrained.name]
