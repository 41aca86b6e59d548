"""Tests of cropscale.data.sharding.EvalShardSampler and of how Lightning 2.6 treats it."""

import pytest
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
