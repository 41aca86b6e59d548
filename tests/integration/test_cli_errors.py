"""Typed errors (issue 28): each user error is raised, typed, where it is found; the CLI maps the type to its
exit status and reads no message text."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from cropscale.cli import main as cli
from cropscale.errors import CheckpointError, ConfigError, CropScaleError, TrainerArgumentError
from cropscale.model.task import CropMappingTask

SMALL_NET = {"s2_dim": 16, "s2_heads": 2, "s1_dim": 8, "width": 8, "fpn_dim": 16, "head_dim": 8,
             "decoder_dim": 8, "hr_dim": 4}


def _command(monkeypatch, raise_it):
    """An analysis subcommand ``fake`` whose ``main`` calls ``raise_it``."""
    module = types.ModuleType("cropscale_fake_command")
    module.main = lambda argv: raise_it()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(cli.EXTRA_COMMANDS, "fake", (module.__name__, "test command"))


def test_the_exit_status_is_the_error_class_s(monkeypatch, capsys):
    class Custom(ConfigError):
        exit_status = 5

    def boom():
        raise Custom("--fake: bad value 3")

    _command(monkeypatch, boom)
    with pytest.raises(SystemExit) as ended:
        cli.main(["fake"])
    assert ended.value.code == 5
    assert capsys.readouterr().err.splitlines() == ["cropscale: error: --fake: bad value 3"]
    assert issubclass(TrainerArgumentError, ConfigError) and issubclass(CheckpointError, CropScaleError)
    assert CropScaleError.exit_status == ConfigError.exit_status == CheckpointError.exit_status == 2


@pytest.mark.parametrize("error", [
    ValueError("Weights only load failed because of a bad pickle"),
    RuntimeError("Error(s) in loading state_dict for CropMappingTask: size mismatch"),
])
def test_an_untyped_error_is_not_read_as_a_user_error_by_its_text(monkeypatch, error):
    """A bug's exception keeps its traceback whatever its message says (the old CLI matched these fragments)."""
    def boom():
        raise error

    _command(monkeypatch, boom)
    with pytest.raises(type(error)):
        cli.main(["fake"])


def test_checkpoint_errors_are_typed(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    plain = tmp_path / "weights.pt"
    torch.save(torch.nn.Linear(2, 2).state_dict(), plain)
    for path in (tmp_path / "missing.ckpt", text, plain):
        with pytest.raises(CheckpointError, match=str(path.name)):
            cli.check_checkpoint(str(path))
    # bytes on which torch's weights-only unpickler raises a KeyError, not an UnpicklingError
    short = tmp_path / "hi.txt"
    short.write_text("hi\n")
    with pytest.raises(CheckpointError, match=r"hi.txt is not a readable Lightning checkpoint \(not a torch"):
        cli.check_checkpoint(str(short))


def test_ckpt_path_best_in_a_new_process_is_a_checkpoint_error():
    """Lightning's ``best`` is the best checkpoint this process's ModelCheckpoint saved: a new CLI process has none
    (Lightning raised a ValueError from inside ``trainer.validate``)."""
    with pytest.raises(CheckpointError, match=r"^--ckpt_path best: .*give a checkpoint file"):
        cli.check_checkpoint("best")


def test_weights_that_do_not_fit_the_network_are_a_checkpoint_error():
    """The real task refuses another network's weights (here: a head for 10 classes into one for 7)."""
    theirs = CropMappingTask(num_classes=10, net_kwargs=SMALL_NET).state_dict()
    ours = CropMappingTask(num_classes=7, net_kwargs=SMALL_NET)
    with pytest.raises(CheckpointError, match=r"--ckpt_path .*another network .*size mismatch"):
        ours.load_state_dict(theirs)
    ours.load_state_dict(CropMappingTask(num_classes=7, net_kwargs=SMALL_NET).state_dict())  # same shapes: loads


@pytest.mark.parametrize("arg,needle", [("--trainer.strategy=bogus", "bogus"),
                                        ("--trainer.devices=-5", "--trainer.devices")])
def test_trainer_argument_errors_are_typed_where_the_trainer_is_built(flanders_root, tmp_path, monkeypatch, arg,
                                                                      needle):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TrainerArgumentError, match=needle):
        cli._lightning_cli(["fit", f"--data.root={flanders_root}", arg])


def test_a_misspelt_net_kwargs_key_is_one_line_naming_it_and_the_valid_keys(tmp_path, flanders_root):
    """Issue 37: ``--model.net_kwargs='{"widht": 8}'`` ended in a 52-line traceback (CropMappingNet's TypeError).
    Now: exit status 2 and one line naming the key, the closest valid key and every valid key, the latter read
    here from CropMappingNet's signature (num_classes comes from the data, so it is not one of them)."""
    import inspect
    import os
    import subprocess
    from pathlib import Path

    from cropscale.model.network import CropMappingNet

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(repo))
    res = subprocess.run([sys.executable, "-m", "cropscale", "fit", f"--data.root={flanders_root}",
                          '--model.net_kwargs={"widht": 8, "s2_dim": 16}'], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    (line,) = [x for x in res.stderr.splitlines() if "error" in x.lower()]
    assert line == res.stderr.strip().splitlines()[-1] and line.startswith("cropscale: error: model.net_kwargs")
    valid = [p for p in inspect.signature(CropMappingNet.__init__).parameters if p not in ("self", "num_classes")]
    assert len(valid) == 17 and "'widht'" in line and "'width'" in line, line
    assert line.endswith(", ".join(valid)), line
    assert "s2_dim" not in line.split("valid keys")[0]  # the key that exists is not named as the wrong one
    assert not (tmp_path / "runs").exists()  # refused before the run folder was made
