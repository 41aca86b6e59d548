"""The model's settings that depend on the data follow ``data.*`` through LightningCLI's linked arguments
(issue 35): ``data.t2``, ``data.t1``, ``data.crop_size`` -> ``model.*``, instead of the task reading them from the
data module with ``getattr``."""

import sys

import pytest
from jsonargparse import ArgumentError

from cropscale.cli.main import DEFAULT_CONFIG, CropScaleCLI
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.model.task import CropMappingTask

pytestmark = [pytest.mark.filterwarnings("ignore:(?s).*was deprecated in v4.49.0"),
              pytest.mark.filterwarnings("ignore:.*LeafSpec")]


@pytest.fixture(autouse=True)
def _plain_argv(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["cropscale"])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _cli(tmp_path, flanders_root, *extra):
    args = ["--config", str(DEFAULT_CONFIG), f"--data.root={flanders_root}",
            f"--trainer.logger.init_args.save_dir={tmp_path}", *extra]
    return CropScaleCLI(CropMappingTask, PastisHDDataModule, run=False, args=args,
                        parser_kwargs={"exit_on_error": False})


def test_model_follows_the_data_settings(tmp_path, flanders_root):
    cli = _cli(tmp_path, flanders_root, "--data.t2=6", "--data.t1=3", "--data.crop_size=16")
    assert (cli.model.hparams.t2, cli.model.hparams.t1, cli.model.hparams.crop_size) == (6, 3, 16)
    assert cli.config.model.t2 == 6 and cli.config.data.t2 == 6


def test_model_defaults_follow_the_data_defaults(tmp_path, flanders_root):
    cli = _cli(tmp_path, flanders_root)
    assert (cli.model.hparams.t2, cli.model.hparams.t1, cli.model.hparams.crop_size) == (16, 4, 32)


def test_the_linked_model_settings_cannot_be_given_apart(tmp_path, flanders_root):
    with pytest.raises(ArgumentError, match="model.t2"):
        _cli(tmp_path, flanders_root, "--model.t2=6")
