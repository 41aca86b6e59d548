"""One reading per fact (issue 35): ``metadata.geojson`` parsed once, the training arrays read once for both the
checks and the normalisation statistics, the data root checked once with one wording, the data module forwarding
its dataset's options instead of re-listing them.

Counted with monkeypatched ``numpy.load`` / ``Path.read_text`` / ``Path.is_dir`` on a copy of the bundled sample.
"""

import inspect
import pathlib
from collections import Counter

import numpy as np
import pytest

from cropscale import CropScaleError
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.data.dataset import PastisHDDataset


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def counted(monkeypatch):
    """Counters of ``numpy.load`` calls by file name, metadata reads, and ``is_dir`` calls by path."""
    loads, texts, dirs = Counter(), Counter(), Counter()
    real_load, real_text, real_dir = np.load, pathlib.Path.read_text, pathlib.Path.is_dir

    def load(file, *a, **k):
        loads[pathlib.Path(file).name] += 1
        return real_load(file, *a, **k)

    def read_text(self, *a, **k):
        texts[self.name] += 1
        return real_text(self, *a, **k)

    def is_dir(self):
        dirs[str(self)] += 1
        return real_dir(self)

    monkeypatch.setattr(np, "load", load)
    monkeypatch.setattr(pathlib.Path, "read_text", read_text)
    monkeypatch.setattr(pathlib.Path, "is_dir", is_dir)
    return loads, texts, dirs


def test_fit_setup_parses_the_metadata_once_and_reads_each_training_array_once(flanders4, counted):
    loads, texts, dirs = counted
    dm = PastisHDDataModule(str(flanders4), t2=8, t1=2)
    dm.setup("fit")
    assert texts["metadata.geojson"] == 1
    # each file: its header once (the index: shapes, dtypes, dates) and its values once (the checks, which also
    # accumulate the training statistics); before, a training file was opened 4 times (index, checks, the
    # statistics' own index, the statistics)
    for name in ("S2_1001.npy", "MASK_1001.npy", "S1A_2001.npy", "S2_1002.npy", "S1A_2002.npy"):
        assert loads[name] == 2, (name, loads)
    assert dirs[str(flanders4)] == 1  # the data root: checked once


def test_a_second_run_reads_no_value_of_a_file_it_has_checked(flanders4, tmp_path, counted):
    loads, _, _ = counted
    stats = tmp_path / "stats.json"
    PastisHDDataModule(str(flanders4), t2=8, t1=2, stats_path=str(stats)).setup("fit")
    loads.clear()
    dm = PastisHDDataModule(str(flanders4), t2=8, t1=2, stats_path=str(stats))
    dm.setup("fit")
    for name in ("S2_1001.npy", "MASK_1001.npy", "S1A_1001.npy", "S2_2002.npy", "TARGET_2002.npy"):
        assert loads[name] == 1, (name, loads)  # the index's header read only: the checks come from the cache


def test_a_missing_root_has_one_wording(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(CropScaleError) as from_module:
        PastisHDDataModule(str(missing))
    with pytest.raises(CropScaleError) as from_dataset:
        PastisHDDataset(missing, [1], train=True)
    assert str(from_module.value) == str(from_dataset.value) == f"data.root: dataset root not found: {missing}"


def test_an_unknown_orbit_has_one_wording(flanders_root):
    with pytest.raises(CropScaleError) as from_module:
        PastisHDDataModule(str(flanders_root), s1_orbits=["S1B"])
    with pytest.raises(CropScaleError) as from_dataset:
        PastisHDDataset(flanders_root, [1], train=True, s1_orbits=["S1B"])
    assert str(from_module.value) == str(from_dataset.value)
    assert str(from_module.value).startswith("data.s1_orbits: unknown orbit(s) ['S1B']")


def test_the_data_module_forwards_the_dataset_options():
    """As TorchGeo's data modules: the dataset's options are not re-listed in the data module's signature."""
    module = set(inspect.signature(PastisHDDataModule).parameters)
    dataset = set(inspect.signature(PastisHDDataset).parameters)
    # root: read at construction (classes.json, the layout); seed: the training sampler's too
    assert module & dataset == {"root", "seed"}
    assert "kwargs" in module


def test_the_forwarded_options_are_command_line_options(flanders_root):
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(PastisHDDataModule, "data")
    cfg = parser.parse_args(["--data.root", str(flanders_root), "--data.t2", "5", "--data.samples_per_patch", "3"])
    assert cfg.data.t2 == 5 and cfg.data.t1 == 4 and cfg.data.crop_size == 32  # the dataset's own defaults
    dm = parser.instantiate(cfg).data
    dm.setup("fit")
    assert dm.train_dataset.t2 == 5 and len(dm.train_dataset) == 2 * 3
    with pytest.raises(Exception, match="data.t3"):
        parser.parse_args(["--data.root", str(flanders_root), "--data.t3", "5"])
