"""Quick CLI checks of checkpoint and output arguments: each fails with one line before any data is read."""

from tests.integration.test_cli import run_cli


def _line(res):
    return res.stderr.strip().splitlines()[-1]


def test_ckpt_path_last_without_a_run_names_where_it_looked(tmp_path, flanders_root):
    res = run_cli(["fit", f"--data.root={flanders_root}", "--ckpt_path", "last"], cwd=tmp_path)
    assert res.returncode == 2
    assert _line(res) == (
        "cropscale: error: --ckpt_path last: no last.ckpt under runs/default/version_*/checkpoints/ (looked in"
        f" {tmp_path}/runs/default); train first, or give a checkpoint file")


def test_run_folder_under_a_file_is_refused_before_training(tmp_path, flanders_root):
    (tmp_path / "runs").write_text("not a folder")
    res = run_cli(["fit", f"--data.root={flanders_root}", "--trainer.max_epochs=1"], cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert _line(res) == ("cropscale: error: run folder runs/default/version_0 cannot be created: runs is a file")
