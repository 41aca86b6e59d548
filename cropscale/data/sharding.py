"""Sharding of the data over DDP ranks: exact for evaluation, resumable for training.

:class:`TrainShardSampler` shuffles the training set as a function of ``(seed, epoch)`` and shards it
by rank, and can resume an epoch after its first ``k`` samples (see its docstring). The rest of this
docstring is about evaluation.

``torch.utils.data.DistributedSampler`` (which Lightning injects under DDP) pads the last shard with
repeated samples so that all ranks get ``ceil(N / world_size)`` of them: validation metrics then
count some patches twice, differently for each world size. :class:`EvalShardSampler` gives rank
``r`` of ``R`` the indices ``r, r + R, r + 2R, ... < N`` instead: uneven shards, no padding, no
shuffling, every index exactly once over the ranks.

It subclasses ``DistributedSampler`` so that Lightning keeps it: in Lightning 2.6,
``_DataConnector._requires_distributed_sampler`` is False when ``dataloader.sampler`` is already a
``DistributedSampler``, and ``_prepare_dataloader`` then leaves the DataLoader untouched (pinned by
``tests/test_sharding.py``).

Uneven shards have two failure modes under DDP: a rank with no sample at all (``N < world_size``, e.g.
3 ranks on 2 validation patches) makes Lightning stop ("``DataLoader`` within local rank has zero
length"), and ranks that run different numbers of steps hang on any per-step collective (a
``self.log(..., sync_dist=True)`` in ``validation_step``, FSDP's parameter all-gather in every forward,
a DDP-wrapped network with buffers). With ``pad=True`` every rank therefore yields the same number of
entries, ``ceil(N / R)`` (none when ``N = 0``): its own indices ``r, r + R, ... < N``, then
**placeholders**. A placeholder is the index ``N + j``, where ``j`` is the real sample it copies
(this rank's last real index, or ``r mod N`` for a rank without one, so that shapes match within a
batch). :class:`PaddedEvalDataset` turns it into a copy of sample ``j`` with ``patch_id =``
:data:`~cropscale.batch.PLACEHOLDER_PATCH_ID`; the task runs it through the network like any sample
and drops it before any metric, loss or prediction (:mod:`cropscale.batch`). A plain dataset raises
``IndexError`` for a placeholder index, so a placeholder is never counted by mistake.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler

from cropscale.batch import PLACEHOLDER_PATCH_ID
from cropscale.errors import CropScaleError


def _world() -> tuple[int, int]:
    """``(world_size, rank)`` of the default process group, ``(1, 0)`` when not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class EvalShardSampler(DistributedSampler):
    """Yield ``range(rank, num_samples, num_replicas)``: exact evaluation sharding, no repeated sample.

    Args:
        num_samples: samples ``N`` in the evaluation dataset (``len(dataset)``).
        num_replicas: world size ``R``; None = from ``torch.distributed`` (1 if not initialised).
        rank: this process's rank in ``[0, R)``; None = from ``torch.distributed`` (0 if not initialised).
        pad: complete every rank's shard to ``ceil(N / R)`` entries with placeholder indices ``>= N``
            (module docstring); use it with :class:`PaddedEvalDataset`.

    Attributes (as in ``DistributedSampler``): ``num_replicas``, ``rank``, ``num_samples`` (this rank's
    shard size, ``len(self)``, placeholders included), ``total_size`` (``N``), ``shuffle = False``,
    ``drop_last = False``.

    Arguments left None are resolved again at each ``__iter__`` / ``__len__``, so a sampler built
    before the process group exists (e.g. in a DataModule's ``__init__``) still shards correctly.

    Raises:
        CropScaleError: ``num_samples < 0``, ``num_replicas < 1`` or ``rank`` outside ``[0, R)``.
    """

    def __init__(self, num_samples: int, num_replicas: int | None = None, rank: int | None = None,
                 pad: bool = False) -> None:
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 0:
            raise CropScaleError(f"EvalShardSampler: num_samples must be an int >= 0, got {num_samples!r}")
        self._fixed_replicas, self._fixed_rank = num_replicas, rank
        self.pad = bool(pad)
        replicas, this_rank = self._resolve()
        # DistributedSampler's own checks and attributes (dataset, epoch, seed ...); the shard size is ours.
        super().__init__(range(num_samples), num_replicas=replicas, rank=this_rank, shuffle=False, drop_last=False)
        self.total_size = num_samples
        self.num_samples = len(self._indices())

    def _indices(self) -> list[int]:
        """This rank's real indices, then (with ``pad``) its placeholders ``N + j``."""
        n, replicas, rank = self.total_size, self.num_replicas, self.rank
        own = list(range(rank, n, replicas))
        if self.pad and n > 0:
            copy = own[-1] if own else rank % n
            own += [n + copy] * (-(-n // replicas) - len(own))
        return own

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
            self.num_samples = len(self._indices())

    def __iter__(self):
        self._refresh()
        return iter(self._indices())

    def __len__(self) -> int:
        self._refresh()
        return self.num_samples


class PaddedEvalDataset(Dataset):
    """An evaluation dataset that also answers the placeholder indices of :class:`EvalShardSampler` (``pad=True``).

    Index ``i < N`` is ``dataset[i]``; index ``N + j`` (``0 <= j < N``) is a copy of ``dataset[j]`` whose
    ``patch_id`` is :data:`~cropscale.batch.PLACEHOLDER_PATCH_ID` (-1), to be run through the network and
    dropped before any metric, loss or prediction counts it.

    Args:
        dataset: map-style dataset of sample dicts (:mod:`cropscale.batch` keys, ``patch_id`` among them).

    Raises:
        IndexError: an index outside ``[0, 2N)``.
    """

    def __init__(self, dataset: Sequence[dict[str, Any]]) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict[str, Any]:
        n = len(self.dataset)
        if not 0 <= index < 2 * n:
            raise IndexError(f"index {index} out of range for {n} samples and their placeholders")
        if index < n:
            return self.dataset[index]
        sample = dict(self.dataset[index - n])
        sample["patch_id"] = torch.tensor(PLACEHOLDER_PATCH_ID, dtype=torch.int64)
        return sample


def loader_seed(seed: int, epoch: int, rank: int) -> int:
    """Seed of the DataLoader's generator for one epoch of one rank: its workers' seeds derive from it.

    Worker ``w`` of that loader gets the torch seed ``base + w`` with ``base`` drawn from this generator, so
    worker seeds are a function of ``(seed, epoch, rank, w)`` (and not of how many epochs this process ran).
    """
    return int(np.random.SeedSequence([int(seed), int(epoch), int(rank), 0x5EED]).generate_state(1, np.uint64)[0]
               & 0x7FFF_FFFF_FFFF_FFFF)


class TrainShardSampler(DistributedSampler):
    """Training order as a function of ``(seed, epoch)``, sharded by rank, resumable in the middle of an epoch.

    The permutation and the shards are ``DistributedSampler``'s (``shuffle=True``, padded with repeated
    samples to equal shards, ``torch.Generator().manual_seed(seed + epoch)``), the same on every rank.
    Each entry is yielded as ``(epoch, index)``, so that the dataset draws the sample's random crop,
    dates and augmentation from ``(seed, epoch, index)`` (:class:`~cropscale.data.dataset.PastisHDDataset`),
    whatever process, worker or restart loads it. Lightning calls :meth:`set_epoch` at each epoch start
    (and keeps this sampler under DDP, as for any ``DistributedSampler``); ``generator``, the
    DataLoader's, is then re-seeded with :func:`loader_seed` so that worker seeds follow too.

    Resume: :meth:`resume_at` makes the next iteration run epoch ``e`` from its ``k``-th entry of this
    rank (the ``k`` entries before it were trained on before the checkpoint). Lightning creates the first
    training iterator of a resumed run before it calls :meth:`set_epoch`, so the epoch has to be set here.

    Args:
        dataset: the training dataset (``len`` used).
        num_replicas: world size ``R``.
        rank: this rank.
        seed: the data seed (``data.seed``).
        generator: the DataLoader's generator, re-seeded per epoch (None = none).
    """

    def __init__(self, dataset: Any, num_replicas: int, rank: int, seed: int,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=int(seed), drop_last=False)
        self.generator = generator
        self._resume: tuple[int, int] | None = None
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the next iteration (called by Lightning at each epoch start)."""
        super().set_epoch(int(epoch))
        if self.generator is not None:
            self.generator.manual_seed(loader_seed(self.seed, self.epoch, self.rank))

    def resume_at(self, epoch: int, start: int) -> None:
        """Make the next iteration epoch ``epoch`` from its ``start``-th entry (once)."""
        self.set_epoch(epoch)
        self._resume = (int(epoch), int(start))

    def __iter__(self):
        order = list(super().__iter__())
        start = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            start = self._resume[1]
        self._resume = None
        epoch = self.epoch
        return iter([(epoch, i) for i in order[start:]])
