"""Command-line parsing that used to run with a silently different meaning (issue 17): integer
``--trainer.limit_*`` values, option prefixes, and a data error raised inside a DataLoader worker."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from torch.utils.data import DataLoader

from cropscale import CropScaleError
from cropscale.data.collate import collate
from cropscale.data.dataset import PastisHDDataset
from cropscale.errors import user_error_text
from tests.data.test_errors import make_copy
from tests.integration.test_cli import run_cli


def _config(stdout: str) -> dict:
    return yaml.safe_load(stdout)


# ------------------------------------------------------------------ case 8: int | float limits
def test_integer_limits_stay_integers(tmp_path, flanders_root):
    extra = tmp_path / "extra.yaml"
    extra.write_text("trainer:\n  limit_predict_batches: 3\n")
    res = run_cli(["fit", "--print_config", f"--data.root={flanders_root}", "--config", str(extra),
                   "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=0.5",
                   "--trainer.limit_test_batches=1.0"], cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    trainer = _config(res.stdout)["trainer"]
    # Lightning: an int is a number of batches, a float a fraction of them
    assert trainer["limit_train_batches"] == 1 and isinstance(trainer["limit_train_batches"], int)
    assert trainer["limit_val_batches"] == 0.5
    assert trainer["limit_test_batches"] == 1.0 and isinstance(trainer["limit_test_batches"], float)
    assert trainer["limit_predict_batches"] == 3 and isinstance(trainer["limit_predict_batches"], int)


# ------------------------------------------------------------------ case 9: no abbreviations
@pytest.mark.parametrize("arg,needle", [("--trainer.max_epoch=7", "trainer.max_epoch"),
                                        ("--data.batch=8", "data.batch")])
def test_option_prefixes_are_errors(tmp_path, flanders_root, arg, needle):
    res = run_cli(["fit", "--print_config", f"--data.root={flanders_root}", arg], cwd=tmp_path, timeout=300)
    assert res.returncode == 2, (res.returncode, res.stdout[-2000:], res.stderr[-2000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cropscale: error: ") and needle in lines[0], lines


# ------------------------------------------------------------------ case 11: worker errors
@pytest.fixture
def nan_validation_copy(flanders_root, tmp_path):
    """Flanders with patch 1002 (validation) NaN on every date but the first, middle and last.

    The setup scan refuses it; with ``--data.check_values=false`` (no scan) the NaN guard of each read, which is
    always on, meets it in the loader (in the worker process with ``num_workers=1``).
    """
    root = make_copy(flanders_root, tmp_path / "flanders", [1001, 1002, 2001, 2002])
    path = root / "DATA_S2" / "S2_1002.npy"
    a = np.load(path).astype(np.float32)
    sampled = np.round(np.linspace(0, a.shape[0] - 1, 3)).astype(int)
    a[np.setdiff1d(np.arange(a.shape[0]), sampled), 0, 0, 0] = np.nan
    np.save(path, a)
    return root, path


def test_worker_error_reads_as_the_main_process_error(nan_validation_copy):
    root, path = nan_validation_copy
    ds = PastisHDDataset(root, [2], train=False, t2=8, t1=2)
    texts = []
    for workers in (0, 1):
        loader = DataLoader(ds, batch_size=1, num_workers=workers, collate_fn=collate)
        with pytest.raises(CropScaleError) as err:
            next(iter(loader))
        texts.append(user_error_text(err.value))
    assert texts[0] == texts[1], texts
    assert texts[0].startswith(f"patch 1002: S2 file {path}: non-finite reflectance") and "\n" not in texts[0]
    assert "Traceback" not in texts[1] and "DataLoader worker process" not in texts[1]


@pytest.mark.slow
def test_worker_error_is_one_line_end_to_end(nan_validation_copy, tmp_path):
    root, path = nan_validation_copy
    lines = []
    for workers in (0, 1):
        res = run_cli(["fit", f"--data.root={root}", "--trainer.max_epochs=1", "--trainer.limit_train_batches=1",
                       "--data.batch_size=2", f"--data.num_workers={workers}", "--trainer.logger=false",
                       "--data.check_values=false",
                       "--trainer.enable_checkpointing=false", "--trainer.callbacks=[]",
                       "--trainer.enable_progress_bar=false"], cwd=tmp_path, timeout=600)
        assert res.returncode == 2, res.stderr[-3000:]
        errors = [x for x in res.stderr.splitlines() if x.startswith("cropscale: error:")]
        assert len(errors) == 1, res.stderr[-3000:]
        lines.append(errors[0])
    assert lines[0] == lines[1] and f"patch 1002: S2 file {path}: non-finite reflectance" in lines[0]
    assert len(lines[0]) < 300, lines[0]
