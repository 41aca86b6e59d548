"""Evaluation sharding that covers every sample exactly once, for any world size.

``torch.utils.data.DistributedSampler`` (which Lightning injects under DDP) pads the last shard with
repeated samples so that all ranks get ``ceil(N / world_size)`` of them: validation metrics then
count some patches twice, differently for each world size. :class:`EvalShardSampler` gives rank
``r`` of ``R`` the indices ``r, r + R, r + 2R, ... < N`` instead: uneven shards, no padding, no
shuffling, every index exactly once over the ranks.

It subclasses ``DistributedSampler`` so that Lightning keeps it: in Lightning 2.6,
``_DataConnector._requires_distributed_sampler`` is False when ``dataloader.sampler`` is already a
``DistributedSampler``, and ``_prepare_dataloader`` then leaves the DataLoader untouched (pinned by
``tests/test_sharding.py``).

Uneven shards are safe for validation with summed metric states (:mod:`cropscale.metrics`), as long
as nothing issues a collective per batch: do not ``self.log(..., sync_dist=True)`` in
``validation_step`` (ranks run different numbers of steps), compute the torchmetrics metrics in
``on_validation_epoch_end`` on every rank. One more case: a DDP-wrapped network with buffers
broadcasts them in its first forward after a training step, so with ``N < world_size`` (a rank with
no sample) such a network would wait on the empty rank.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.utils.data import DistributedSampler

from cropscale.errors import CropScaleError


def _world() -> tuple[int, int]:
    """``(world_size, rank)`` of the default process group, ``(1, 0)`` when not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class EvalShardSampler(DistributedSampler):
    """Yield ``range(rank, num_samples, num_replicas)``: exact evaluation sharding, no padding.

    Args:
        num_samples: samples ``N`` in the evaluation dataset (``len(dataset)``).
        num_replicas: world size ``R``; None = from ``torch.distributed`` (1 if not initialised).
        rank: this process's rank in ``[0, R)``; None = from ``torch.distributed`` (0 if not initialised).

    Attributes (as in ``DistributedSampler``): ``num_replicas``, ``rank``, ``num_samples`` (this rank's
    shard size, ``len(self)``), ``total_size`` (``N``), ``shuffle = False``, ``drop_last = False``.

    Arguments left None are resolved again at each ``__iter__`` / ``__len__``, so a sampler built
    before the process group exists (e.g. in a DataModule's ``__init__``) still shards correctly.

    Raises:
        CropScaleError: ``num_samples < 0``, ``num_replicas < 1`` or ``rank`` outside ``[0, R)``.
    """

    def __init__(self, num_samples: int, num_replicas: int | None = None, rank: int | None = None) -> None:
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 0:
            raise CropScaleError(f"EvalShardSampler: num_samples must be an int >= 0, got {num_samples!r}")
        self._fixed_replicas, self._fixed_rank = num_replicas, rank
        replicas, this_rank = self._resolve()
        # DistributedSampler's own checks and attributes (dataset, epoch, seed ...); the shard size is ours.
        super().__init__(range(num_samples), num_replicas=replicas, rank=this_rank, shuffle=False, drop_last=False)
        self.total_size = num_samples
        self.num_samples = len(range(this_rank, num_samples, replicas))

    def _resolve(self) -> tuple[int, int]:
        world, world_rank = _world()
        replicas = world if self._fixed_replicas is None else self._fixed_replicas
        rank = world_rank if self._fixed_rank is None else self._fixed_rank
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise CropScaleError(f"EvalShardSampler: num_replicas must be an int >= 1, got {replicas!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < replicas:
            raise CropScaleError(f"EvalShardSampler: rank must be in [0, {replicas}), got {rank!r}")
        return replicas, rank

    def _refresh(self) -> None:
        if self._fixed_replicas is None or self._fixed_rank is None:
            self.num_replicas, self.rank = self._resolve()
            self.num_samples = len(range(self.rank, self.total_size, self.num_replicas))

    def __iter__(self):
        self._refresh()
        return iter(range(self.rank, self.total_size, self.num_replicas))

    def __len__(self) -> int:
        self._refresh()
        return self.num_samples
