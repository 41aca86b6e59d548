"""``16-true`` and ``bf16-true`` on CPU are refused in one line, ``64-true`` runs with a warning (issue 27:
all three were accepted without a word). ``cli.main`` in this process, on the bundled Flanders sample."""

from __future__ import annotations

import sys

import pytest

from cropscale.cli import main as cli
from cropscale.precision import cpu_precision_line


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["cropscale"])


def _args(tmp_path, root, precision):
    return ["fit", f"--data.root={root}", "--trainer.accelerator=cpu", f"--trainer.precision={precision}",
            "--trainer.fast_dev_run=true", f"--trainer.default_root_dir={tmp_path}",
            "--data.batch_size=1"]


@pytest.mark.parametrize(("precision", "label"), [("16-true", "FP16"), ("bf16-true", "BF16")])
def test_true_half_precision_on_cpu_is_refused(capsys, tmp_path, flanders_root, precision, label):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(_args(tmp_path, flanders_root, precision))
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"cropscale: error: trainer.precision={precision} on CPU: {label} weights"), last
    assert "no FP32 master copy or loss scaling" in last and "use 32-true, 16-mixed or bf16-mixed" in last


def test_32_true_on_cpu_has_no_precision_line():
    assert cpu_precision_line("32-true") is None and cpu_precision_line("bf16-mixed") is None
    assert cpu_precision_line("16-mixed") is None and cpu_precision_line(16) is None  # legacy 16 = 16-mixed
    assert cpu_precision_line("64")[0] == "warning"  # legacy 64 = 64-true
