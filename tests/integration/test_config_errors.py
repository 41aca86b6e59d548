"""Config-file errors name the YAML file and the key, in one line (issue 27). Before: an empty file gave
"Unexpected config:" and nothing more, a wrong type a 600-character dump of the Union members, a misspelt
callback class named neither the file nor the class it meant. ``cli.main`` runs in this process (the real
parser of ``python -m cropscale fit``); the parse fails before anything is built.
"""

from __future__ import annotations

import sys

import pytest

from cropscale.cli import main as cli


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["cropscale"])  # LightningCLI warns when sys.argv holds pytest's arguments


def _error_line(capsys, tmp_path, text: str | None, *extra: str) -> str:
    path = tmp_path / "run.yaml"
    args = ["fit"]
    if text is not None:
        path.write_text(text)
        args += ["--config", str(path)]
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*args, *extra, "--print_config"])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cropscale: error: "), lines
    assert lines[0].endswith(" (see: python -m cropscale fit --help)"), lines
    return lines[0]


@pytest.mark.parametrize(("text", "expected"), [
    ("", "config file {path} is empty: a config is a YAML mapping"),
    ("# only a comment\n", "config file {path} is empty"),
    ("- a\n- b\n", "config file {path} holds a list, not a mapping of keys"),
    ("trainer: [\n", "config file {path} is not valid YAML: "),
    ("trainer:\n  max_epochs: abc\n", "config file {path}: key trainer.max_epochs: 'abc' is not an int or null"),
    ("trainer:\n  callbacks:\n    - class_path: cropscale.callbacks.EnergyCallbak\n",
     "config file {path}: key trainer.callbacks: class_path 'cropscale.callbacks.EnergyCallbak': module "
     "'cropscale.callbacks' has no attribute 'EnergyCallbak' (did you mean cropscale.callbacks.EnergyCallback?)"),
    ("trainer:\n  callbacks:\n    - class_path: cropscale.callbacks.EnergyCallback\n      init_args:\n"
     "        price_per_gpu_hour: abc\n",
     "config file {path}: key trainer.callbacks: class_path 'cropscale.callbacks.EnergyCallback': "
     "init_args.price_per_gpu_hour: 'abc' is not a float or null"),
])
def test_config_file_error_names_the_file_and_the_key(capsys, tmp_path, text, expected):
    line = _error_line(capsys, tmp_path, text)
    assert expected.format(path=tmp_path / "run.yaml") in line, line
    assert "Subtypes" not in line and "Given value type" not in line  # no parser dump
    assert len(line) - len(str(tmp_path / "run.yaml")) < 300, line  # was 600+ characters of parser dump


def test_the_last_config_that_sets_the_key_is_named(capsys, tmp_path):
    first = tmp_path / "first.yaml"
    first.write_text("trainer:\n  max_epochs: 3\n  accumulate_grad_batches: x\n")
    line = _error_line(capsys, tmp_path, "trainer:\n  max_epochs: 2\n", "--config", str(first))
    assert f"config file {first}: key trainer.accumulate_grad_batches: 'x' is not an int" in line, line


def test_command_line_value_is_named_as_such(capsys, tmp_path):
    line = _error_line(capsys, tmp_path, "trainer:\n  max_epochs: 2\n", "--trainer.max_epochs=abc")
    assert "command line --trainer.max_epochs: key trainer.max_epochs: 'abc' is not an int or null" in line, line
