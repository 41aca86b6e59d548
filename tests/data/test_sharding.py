"""Tests of cropscale.data.sharding.EvalShardSampler and of how Lightning 2.6 treats it."""

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from cropscale import CropScaleError
from cropscale.data.sharding import EvalShardSampler


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5])
def test_every_index_exactly_once_over_the_ranks(world_size):
    for n in range(8):
        shards = [list(EvalShardSampler(n, num_replicas=world_size, rank=r)) for r in range(world_size)]
        assert sorted(i for shard in shards for i in shard) == list(range(n)), (n, shards)
        for r, shard in enumerate(shards):
            assert shard == list(range(r, n, world_size))
            assert len(EvalShardSampler(n, num_replicas=world_size, rank=r)) == len(shard)
        sizes = [len(s) for s in shards]
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n  # uneven shards, no padding


def test_three_patches_on_two_ranks_is_uneven_not_padded():
    assert list(EvalShardSampler(3, 2, 0)) == [0, 2]
    assert list(EvalShardSampler(3, 2, 1)) == [1]
    padded = DistributedSampler(range(3), num_replicas=2, rank=1, shuffle=False)
    assert list(padded) == [1, 0]  # what torch's sampler does instead: sample 0 twice


def test_reads_world_size_and_rank_from_torch_distributed(monkeypatch):
    assert list(EvalShardSampler(4)) == [0, 1, 2, 3]  # not initialised: one process
    sampler = EvalShardSampler(7)  # built before the process group exists, resolved again when iterated
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 2)
    assert list(sampler) == [2, 5] and len(sampler) == 2
    assert (sampler.num_replicas, sampler.rank) == (3, 2)
    fresh = EvalShardSampler(7)
    assert (fresh.num_replicas, fresh.rank, fresh.num_samples, fresh.total_size) == (3, 2, 2, 7)
    assert list(EvalShardSampler(7, num_replicas=2, rank=0)) == [0, 2, 4, 6]  # explicit arguments win


def test_bad_arguments():
    with pytest.raises(CropScaleError, match="rank must be in"):
        EvalShardSampler(5, num_replicas=2, rank=2)
    with pytest.raises(CropScaleError, match="num_replicas"):
        EvalShardSampler(5, num_replicas=0, rank=0)
    with pytest.raises(CropScaleError, match="num_samples"):
        EvalShardSampler(-1)


def test_lightning_keeps_the_sampler_under_ddp():
    """Pins Lightning 2.6's ``_DataConnector``: a DataLoader whose sampler is a DistributedSampler is not
    re-wrapped (``_requires_distributed_sampler`` is False), while a plain one gets a padding
    DistributedSampler."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.trainer.states import RunningStage

    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False)
    connector = trainer._data_connector
    ours = DataLoader(list(range(5)), batch_size=1, sampler=EvalShardSampler(5, num_replicas=2, rank=1))
    assert isinstance(ours.sampler, DistributedSampler)
    assert connector._requires_distributed_sampler(ours) is False
    kept = connector._prepare_dataloader(ours, shuffle=False, mode=RunningStage.VALIDATING)
    assert kept is ours and [int(b) for b in kept] == [1, 3]

    plain = DataLoader(list(range(5)), batch_size=1)
    assert connector._requires_distributed_sampler(plain) is True
    replaced = connector._prepare_dataloader(plain, shuffle=False, mode=RunningStage.VALIDATING)
    assert type(replaced.sampler) is DistributedSampler
    assert replaced.sampler.total_size == 6 > 5  # padded with a repeated sample


@pytest.mark.parametrize("world_size", range(1, 9))
def test_padded_shards_have_equal_length_and_count_every_index_once(world_size):
    """``pad=True``: every rank yields ceil(N / R) entries (at least one placeholder on a rank without a
    sample); the real indices (< N) over all ranks are range(N) exactly once, placeholders are >= N."""
    for n in range(0, 10):
        per_rank = -(-n // world_size)  # ceil, worked by hand: 3 patches on 4 ranks -> 1 each
        shards = [list(EvalShardSampler(n, num_replicas=world_size, rank=r, pad=True)) for r in range(world_size)]
        assert [len(s) for s in shards] == [per_rank] * world_size, (n, shards)
        assert all(len(EvalShardSampler(n, world_size, r, pad=True)) == per_rank for r in range(world_size))
        real = sorted(i for shard in shards for i in shard if i < n)
        assert real == list(range(n)), (n, shards)
        for r, shard in enumerate(shards):
            assert [i for i in shard if i < n] == list(range(r, n, world_size))
            # a placeholder names the real sample it copies: index - N, a valid index
            assert all(0 <= i - n < n for i in shard if i >= n)


def test_placeholders_of_three_patches_on_four_ranks():
    assert [list(EvalShardSampler(3, 4, r, pad=True)) for r in range(4)] == [[0], [1], [2], [3 + 0]]
    assert [list(EvalShardSampler(2, 3, r, pad=True)) for r in range(3)] == [[0], [1], [2 + 0]]
    assert [list(EvalShardSampler(5, 2, r, pad=True)) for r in range(2)] == [[0, 2, 4], [1, 3, 5 + 3]]


def test_padded_dataset_marks_placeholders_and_plain_datasets_refuse_them():
    from cropscale.batch import PLACEHOLDER_PATCH_ID
    from cropscale.data.sharding import PaddedEvalDataset

    base = [{"patch_id": torch.tensor(10 + i), "x": torch.full((2,), float(i))} for i in range(3)]
    padded = PaddedEvalDataset(base)
    assert len(padded) == 3
    assert int(padded[1]["patch_id"]) == 11 and torch.equal(padded[1]["x"], base[1]["x"])
    placeholder = padded[3 + 2]  # a copy of sample 2 that no metric may count
    assert int(placeholder["patch_id"]) == PLACEHOLDER_PATCH_ID == -1
    assert torch.equal(placeholder["x"], base[2]["x"]) and int(base[2]["patch_id"]) == 12  # source untouched
    with pytest.raises(IndexError):
        padded[6]
    with pytest.raises(IndexError):  # without the wrapper a placeholder index is refused, never counted
        base[3 + 2]


def test_training_order_is_a_function_of_seed_and_epoch_and_resumes_mid_epoch():
    from cropscale.data.sharding import TrainShardSampler, loader_seed

    data = list(range(10))
    for rank in (0, 1):
        sampler = TrainShardSampler(data, num_replicas=2, rank=rank, seed=7)
        reference = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=7)
        for epoch in (0, 3):
            sampler.set_epoch(epoch)
            reference.set_epoch(epoch)
            assert list(sampler) == [(epoch, i) for i in reference]  # DistributedSampler's order and shards
    full = TrainShardSampler(data, 2, 1, seed=7)
    full.set_epoch(3)
    order = list(full)
    resumed = TrainShardSampler(data, 2, 1, seed=7)
    resumed.resume_at(3, 2)
    assert list(resumed) == order[2:] and len(resumed) == 5  # len unchanged: Lightning counts the epoch's batches
    assert list(resumed) == order  # the skip applies once, to the epoch it was given for
    other = TrainShardSampler(data, 2, 1, seed=7)
    other.resume_at(3, 2)
    other.set_epoch(4)  # Lightning moved to another epoch: no skip there
    assert len(list(other)) == 5
    # the DataLoader's generator (its workers' seeds) follows (seed, epoch, rank)
    g = torch.Generator()
    s = TrainShardSampler(data, 2, 1, seed=7, generator=g)
    s.set_epoch(2)
    assert g.initial_seed() == loader_seed(7, 2, 1)
    seeds = {loader_seed(seed, epoch, rank) for seed in (0, 1) for epoch in range(4) for rank in range(4)}
    assert len(seeds) == 32
