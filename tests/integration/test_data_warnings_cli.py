"""A modality absent from the whole data set, end to end (issue 37): the fit's summary, ``run.json`` and the report
say what the model was trained without; a modality the configuration asks for is a one-line error before anything
is written."""

import json
import shutil

import pytest

from tests.data.test_errors import make_copy
from tests.integration.test_cli import run_cli
from tests.integration.test_not_trained import SMALL

pytestmark = pytest.mark.slow

ARGS = ["--trainer.max_epochs=1", "--data.samples_per_patch=2", "--data.batch_size=2", "--trainer.log_every_n_steps=1",
        "--trainer.enable_model_summary=false", f"--model.net_kwargs={SMALL}", "--data.t2=8", "--data.t1=2"]


@pytest.fixture
def no_mask(flanders_root, tmp_path):
    root = make_copy(flanders_root, tmp_path / "flanders", [1001, 1002, 2001, 2002])
    shutil.rmtree(root / "DATA_S2_MASK")
    return root


def test_a_fit_without_the_cloud_mask_says_so_in_the_summary_run_json_and_report(no_mask, tmp_path):
    env = {"OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    res = run_cli(["fit", f"--data.root={no_mask}", *ARGS], cwd=tmp_path, env_extra=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    line = (f"{no_mask}: the model is trained without the Sentinel-2 cloud mask (no DATA_S2_MASK folder: only pixels"
            " whose ten bands are all 0 count as no data, so every cloudy observation is fed as clear), Sentinel-1"
            " descending (no DATA_S1D folder: its inputs are zeros with masks False)")
    summary = res.stdout[res.stdout.index("cropscale fit summary"):]
    (data,) = [x for x in summary.splitlines() if x.startswith("data ")]
    assert data.endswith(f"1 data warning(s) (run.json data_warnings; the report lists them): {line}"), data
    (run_json,) = (tmp_path / "runs").rglob("run.json")
    assert json.loads(run_json.read_text())["data_warnings"] == [line]
    rep = run_cli(["report", "runs", "--output", "rep"], cwd=tmp_path, env_extra=env)
    assert rep.returncode == 0, rep.stderr[-3000:]
    assert line in (tmp_path / "rep" / "report.md").read_text()


def test_a_modality_asked_for_and_absent_is_one_line_and_writes_no_run(no_mask, tmp_path):
    env = {"OMP_NUM_THREADS": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    res = run_cli(["fit", f"--data.root={no_mask}", *ARGS, "--data.s2_mask=true"], cwd=tmp_path, env_extra=env)
    assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
    errors = [x for x in res.stderr.splitlines() if x.startswith("cropscale: error:")]
    assert errors == [f"cropscale: error: data.s2_mask asks for DATA_S2_MASK but {no_mask} has no DATA_S2_MASK folder:"
                      " no patch has it (set data.s2_mask=false to detect no data from all-zero pixels only)"], errors
    assert not (tmp_path / "runs").exists()
