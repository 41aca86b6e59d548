"""PastisHDDataModule: classes, batches of the contract, training-fold statistics, collate of absent
parts, deterministic worker seeding, evaluation sharding, jsonargparse construction."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cropscale import CropScaleError
from cropscale.batch import HR_SCALE, MODEL_INPUT_KEYS, TARGET_KEYS
from cropscale.data.collate import BATCH_KEYS, collate
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.data.stats import NormStats


def test_classes_available_after_init(flanders_root, pastis_mini_root):
    dm = PastisHDDataModule(str(flanders_root))
    assert dm.num_classes == 10 and dm.class_names[2] == "maize"
    dm = PastisHDDataModule(str(pastis_mini_root), ignore_index=19)
    assert dm.num_classes == 20 and dm.class_names[19] == "Void label" and dm.ignore_index == 19
    assert dm.train_dataset is None  # nothing read beyond metadata and classes


@pytest.mark.parametrize("which", ["flanders", "pastis"])
def test_batches_follow_the_contract(flanders_root, pastis_mini_root, which):
    root = flanders_root if which == "flanders" else pastis_mini_root
    dm = PastisHDDataModule(str(root), batch_size=3, val_batch_size=2, samples_per_patch=2,
                            ignore_index=19 if which == "pastis" else None)
    dm.setup("fit")
    val_hw = (64, 32) if which == "flanders" else (32, 32)
    for loader, (h, w) in [(dm.train_dataloader(), (32, 32)), (dm.val_dataloader(), val_hw)]:
        b = next(iter(loader))
        n = b["s2"].shape[0]
        assert list(b) == list(BATCH_KEYS) and set(MODEL_INPUT_KEYS + TARGET_KEYS) <= set(b)
        assert b["s2"].shape == (n, 16, 10, h, w) and b["s2"].dtype == torch.float32
        assert b["s2_mask"].shape == (n, 16, h, w) and b["s2_mask"].dtype == torch.bool
        for orbit in ("s1a", "s1d"):
            assert b[orbit].shape == (n, 4, 2, h, w) and b[f"{orbit}_mask"].shape == (n, 4)
            assert b[f"{orbit}_doy"].dtype == torch.int64
        assert b["semantic"].shape == (n, h, w) and b["semantic"].dtype == torch.int64
        assert b["parcel"].shape == (n, 3, h, w) and b["parcel_present"].shape == (n,)
        assert b["hr"].shape == (n, 3, HR_SCALE * h, HR_SCALE * w) and b["hr_present"].dtype == torch.bool
        assert b["patch_id"].shape == (n,) and b["crop_yx"].shape == (n, 2)
        assert bool(b["hr_present"].all()) == (which == "flanders")
    # 2 patches x 2 crops / batch 3, last batch kept (flanders), 3 x 2 / 3 (pastis)
    assert len(dm.train_dataloader()) == 2


def test_statistics_are_training_folds_only_and_exact(flanders_root, tmp_path):
    path = tmp_path / "stats.json"
    dm = PastisHDDataModule(str(flanders_root), stats_path=str(path))
    stats = dm.compute_stats()
    saved = json.loads(path.read_text())
    assert saved["folds"] == [1] and saved["patch_ids"] == [1001, 2001]
    assert saved["s2"]["bands"][0] == "B02" and "S1A" in saved and "S1D" not in saved
    # direct formula: mean and population std over the clear pixels of every date of patches 1001, 2001
    values, s1 = [], []
    for pid in (1001, 2001):
        s2 = np.load(flanders_root / "DATA_S2" / f"S2_{pid}.npy").astype(np.float64)
        mask = np.load(flanders_root / "DATA_S2_MASK" / f"MASK_{pid}.npy") > 0
        values.append(s2.transpose(1, 0, 2, 3)[:, mask])
        s1.append(np.load(flanders_root / "DATA_S1A" / f"S1A_{pid}.npy")[:, :2].transpose(1, 0, 2, 3).reshape(2, -1))
    values, s1 = np.concatenate(values, axis=1), np.concatenate(s1, axis=1).astype(np.float64)
    np.testing.assert_allclose(stats.s2_mean, values.mean(axis=1), rtol=1e-10)
    np.testing.assert_allclose(stats.s2_std, values.std(axis=1), rtol=1e-9)
    np.testing.assert_allclose(stats.s1["S1A"][0], s1.mean(axis=1), rtol=1e-9)
    np.testing.assert_allclose(stats.s1["S1A"][1], s1.std(axis=1), rtol=1e-9)
    assert stats.counts["S2"] == values.shape[1]
    # round trip
    loaded = NormStats.load(path)
    np.testing.assert_array_equal(loaded.s2_mean, stats.s2_mean)
    np.testing.assert_array_equal(loaded.s1["S1A"][1], stats.s1["S1A"][1])


def test_existing_statistics_are_loaded_not_recomputed(flanders_root, tmp_path, monkeypatch):
    path = tmp_path / "stats.json"
    PastisHDDataModule(str(flanders_root), stats_path=str(path)).compute_stats()
    import cropscale.data.datamodule as dmod

    monkeypatch.setattr(dmod, "stats_from_moments", lambda *a, **k: pytest.fail("recomputed"))
    dm = PastisHDDataModule(str(flanders_root), stats_path=str(path))
    dm.setup("fit")
    assert dm.train_dataset.stats is dm.stats and dm.val_dataset.stats is dm.stats
    assert dm.stats.folds == [1]


def test_statistics_of_other_folds_are_refused(flanders_root, tmp_path):
    path = tmp_path / "stats.json"
    PastisHDDataModule(str(flanders_root), train_folds=[2], val_folds=[1], stats_path=str(path)).compute_stats()
    dm = PastisHDDataModule(str(flanders_root), stats_path=str(path))
    with pytest.raises(CropScaleError, match=r"folds \[2\].*train_folds are \[1\]"):
        dm.setup("fit")
    path.write_text("{not json")
    with pytest.raises(CropScaleError, match="cannot read normalisation statistics"):
        dm.load_stats()


def sample(pid, h=4, w=4, t1=None, hr=True, parcel=True):
    s = {"s2": torch.zeros(3, 10, h, w), "s2_doy": torch.ones(3, dtype=torch.int64),
         "s2_mask": torch.ones(3, h, w, dtype=torch.bool), "semantic": torch.zeros(h, w, dtype=torch.int64),
         "patch_id": torch.tensor(pid), "crop_yx": torch.tensor([0, 0])}
    if t1:
        s.update(s1a=torch.ones(t1, 2, h, w), s1a_doy=torch.ones(t1, dtype=torch.int64),
                 s1a_mask=torch.ones(t1, dtype=torch.bool))
    if hr:
        s.update(hr=torch.ones(3, 10 * h, 10 * w), hr_present=torch.tensor(True))
    if parcel:
        s.update(parcel=torch.ones(3, h, w), parcel_present=torch.tensor(True))
    return s


def test_collate_fills_absent_parts():
    b = collate([sample(1, t1=2), sample(2, hr=False, parcel=False)], t1=5)
    assert list(b) == list(BATCH_KEYS)
    assert b["s1a"].shape == (2, 2, 2, 4, 4)  # T1 from the sample that has the orbit
    assert b["s1a_mask"].tolist() == [[True, True], [False, False]] and (b["s1a"][1] == 0).all()
    assert b["s1d"].shape == (2, 5, 2, 4, 4) and not b["s1d_mask"].any() and (b["s1d_doy"] == 0).all()
    assert b["hr_present"].tolist() == [True, False] and (b["hr"][1] == 0).all() and b["hr"].shape == (2, 3, 40, 40)
    assert b["parcel_present"].tolist() == [True, False] and (b["parcel"][1] == 0).all()
    with pytest.raises(CropScaleError, match="no t1"):
        collate([sample(1)])
    with pytest.raises(CropScaleError, match=r"s2 shapes differ.*patches \[1, 2\]"):
        collate([sample(1, t1=2), sample(2, h=5, t1=2)])


def first_batches(root, seed, n=2):
    dm = PastisHDDataModule(str(root), batch_size=2, samples_per_patch=4, num_workers=2, seed=seed)
    dm.setup("fit")
    it = iter(dm.train_dataloader())
    return [next(it) for _ in range(n)]


def test_worker_seeding_is_deterministic(flanders_root):
    a, b, c = first_batches(flanders_root, 0), first_batches(flanders_root, 0), first_batches(flanders_root, 1)
    for x, y in zip(a, b, strict=True):
        for key in x:
            assert torch.equal(x[key], y[key]), key
    assert any(not torch.equal(x[k], z[k]) for x, z in zip(a, c, strict=True) for k in ("crop_yx", "s2", "patch_id"))
    # the two workers drew different crops/dates (not the same stream)
    assert not torch.equal(a[0]["s2"], a[1]["s2"])


def test_loader_settings_and_eval_sharding(pastis_mini_root):
    dm = PastisHDDataModule(str(pastis_mini_root), num_workers=2, persistent_workers=True, prefetch_factor=3,
                            pin_memory=True, ignore_index=19, test_folds=[3])
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.num_workers == 2 and loader.persistent_workers and loader.prefetch_factor == 3 and loader.pin_memory
    assert dm.val_dataloader().sampler.__class__.__name__ == "SequentialSampler"
    dm.trainer = SimpleNamespace(world_size=2, global_rank=1)
    from cropscale.data.sharding import EvalShardSampler

    sampler = dm.val_dataloader().sampler
    assert isinstance(sampler, EvalShardSampler) and list(sampler) == [1]  # val: 2 patches, rank 1 of 2
    dm.setup("test")
    assert [p.patch_id for p in dm.test_dataset.patches] == [20213, 30336]
    dm0 = PastisHDDataModule(str(pastis_mini_root), ignore_index=19)
    assert "persistent_workers" not in dm0._loader_kwargs() and "prefetch_factor" not in dm0._loader_kwargs()
    with pytest.raises(CropScaleError, match="test_folds"):
        dm0.setup("test")


def test_built_by_jsonargparse(flanders_root):
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(PastisHDDataModule, "data")
    cfg = parser.parse_args(["--data.root", str(flanders_root), "--data.samples_per_patch", "3",
                             "--data.train_folds", "[1]", "--data.prefetch_factor", "2"])
    dm = parser.instantiate(cfg).data
    assert isinstance(dm, PastisHDDataModule) and dm.kwargs["samples_per_patch"] == 3 and dm.prefetch_factor == 2
    assert dm.num_classes == 10


def _fitting_trainer(epoch, batches, world=1, rank=0):
    """A stand-in for the Trainer as the data module sees it while fitting."""
    progress = SimpleNamespace(current=SimpleNamespace(processed=batches))
    return SimpleNamespace(world_size=world, global_rank=rank, current_epoch=epoch,
                           state=SimpleNamespace(fn=SimpleNamespace(value="fit")),
                           fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)))


def _epoch_batches(dm, epoch):
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(epoch)  # what Lightning does at each epoch start
    return list(loader)


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for key in x:
            assert torch.equal(x[key], y[key]), key


def test_training_samples_do_not_depend_on_workers_or_on_earlier_epochs(flanders_root):
    kwargs = {"batch_size": 3, "samples_per_patch": 4, "t2": 4, "t1": 2}
    plain = PastisHDDataModule(str(flanders_root), **kwargs)
    plain.setup("fit")
    workers = PastisHDDataModule(str(flanders_root), num_workers=2, **kwargs)
    workers.setup("fit")
    epoch2 = _epoch_batches(plain, 2)
    _same(_epoch_batches(workers, 2), epoch2)  # no worker-dependent stream
    _epoch_batches(plain, 0)
    _same(_epoch_batches(plain, 2), epoch2)  # not a stream continued from the epochs before
    assert not torch.equal(_epoch_batches(plain, 1)[0]["s2"], epoch2[0]["s2"])  # but another epoch draws others


def test_state_dict_resumes_the_epoch_where_the_checkpoint_stopped(flanders_root):
    kwargs = {"batch_size": 2, "samples_per_patch": 5, "t2": 4, "t1": 2, "seed": 3}
    uninterrupted = PastisHDDataModule(str(flanders_root), **kwargs)
    uninterrupted.setup("fit")
    epoch1 = _epoch_batches(uninterrupted, 1)  # 10 samples: 5 batches
    assert len(epoch1) == 5
    saver = PastisHDDataModule(str(flanders_root), **kwargs)
    saver.trainer = _fitting_trainer(epoch=1, batches=2)
    state = saver.state_dict()
    assert state == {"format": "cropscale-data-position/1", "seed": 3, "world_size": 1, "batch_size": 2, "epoch": 1,
                     "batches": 2}
    resumed = PastisHDDataModule(str(flanders_root), **kwargs)
    resumed.load_state_dict(state)
    resumed.setup("fit")
    loader = resumed.train_dataloader()
    loader.sampler.set_epoch(1)
    _same(list(loader), epoch1[2:])  # the 3 batches the checkpoint had not trained on
    _same(_epoch_batches(resumed, 2), _epoch_batches(uninterrupted, 2))  # then whole epochs again
    # an end-of-epoch checkpoint: the next epoch from its start
    end = PastisHDDataModule(str(flanders_root), **kwargs)
    end.load_state_dict({**state, "batches": 5})
    end.setup("fit")
    assert end.train_dataloader().sampler.epoch == 2
    # a mid-epoch checkpoint of another world size cannot be continued exactly: one line says so
    other = PastisHDDataModule(str(flanders_root), **kwargs)
    other.load_state_dict({**state, "world_size": 2})
    other.setup("fit")
    with pytest.raises(CropScaleError, match="stopped after 2 batches of epoch 1 with world size 2"):
        other.train_dataloader()
    assert PastisHDDataModule(str(flanders_root)).state_dict() == {}  # outside fit: nothing to save


@pytest.mark.parametrize("world,padded", [(3, 18), (5, 20)])
def test_uneven_shards_are_noted_and_a_global_batch_beyond_the_epoch_is_refused(flanders_root, world, padded):
    """2 training patches x 8 crops = 16 samples: 3 or 5 ranks pad the epoch to equal shards (18, 20 entries)."""
    dm = PastisHDDataModule(str(flanders_root), samples_per_patch=8, batch_size=2, t2=4, t1=2)
    dm.setup("fit")
    assert len(dm.train_dataset) == 16
    dm.trainer = SimpleNamespace(world_size=world, global_rank=0)
    loader = dm.train_dataloader()
    assert len(loader.sampler) * world == padded  # DistributedSampler's padding, counted independently
    assert dm.data_warnings[-1] == (f"the 16 training samples do not split evenly over {world} ranks: each epoch"
                                    f" trains {padded} entries, {padded - 16} of them repeated samples (equal shards"
                                    " per rank)")
    dm.batch_size = 4 if world == 5 else 6  # global batch 20 or 18 for a 16-sample epoch
    with pytest.raises(CropScaleError) as err:
        dm.train_dataloader()
    assert str(err.value) == (f"global batch {dm.batch_size * world} (data.batch_size {dm.batch_size} x world size"
                              f" {world}) is larger than the 16 training samples of one epoch: lower"
                              " data.batch_size or the world size")
