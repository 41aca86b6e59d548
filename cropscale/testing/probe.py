"""The study's model on pre-generated synthetic samples, for probes and microbenchmarks without the data pipeline.

Used where training steps are timed without data loading (``bench.ddp_probe``,
``callback-bench --model network``).

- :class:`SyntheticSamples`: ``length`` samples cycled from one synthetic batch
  (:func:`cropscale.model.synthetic.synthetic_batch`), generated once, before training;
- :class:`ProbeTask`: :class:`~cropscale.model.network.CropMappingNet` (default configuration) with
  :class:`~cropscale.model.losses.MultiTaskLoss` and AdamW (lr 1e-3);
- :class:`StepTimer`: host wall time of each ``on_train_batch_start`` -> ``on_train_batch_end`` (s).
"""

from __future__ import annotations

import time

import torch
from lightning.pytorch import Callback, LightningModule
from torch.utils.data import Dataset
from typing_extensions import override

from cropscale.batch import model_inputs
from cropscale.model.losses import MultiTaskLoss
from cropscale.model.network import CropMappingNet
from cropscale.model.synthetic import synthetic_batch


class SyntheticSamples(Dataset):
    """``length`` samples cycled from a pool of ``pool`` synthetic samples.

    One sample per item: the batch contract of :mod:`cropscale.batch` without the batch dimension.

    Args:
        length: items in the dataset.
        pool: distinct samples generated (``synthetic_batch(pool, ...)``).
        t2: Sentinel-2 dates.
        t1: dates per Sentinel-1 orbit.
        crop_size: 10 m crop side (pixels).
        seed: seed of the synthetic batch.
    """

    def __init__(self, length: int, pool: int, t2: int = 16, t1: int = 4, crop_size: int = 16,
                 seed: int = 0) -> None:
        batch = synthetic_batch(pool, t2, t1, crop_size, crop_size, seed=seed)
        self.samples = [{k: v[i] for k, v in batch.items()} for i in range(pool)]
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.samples[i % len(self.samples)]


class ProbeTask(LightningModule):
    """The study's default network and multi-task loss, trained with AdamW (lr 1e-3); no validation."""

    def __init__(self) -> None:
        super().__init__()
        self.net = CropMappingNet()
        self.loss = MultiTaskLoss()

    @override
    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        total, _ = self.loss(self.net(**model_inputs(batch)), batch)
        return total

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class StepTimer(Callback):
    """Host wall time (s, ``time.perf_counter``) of each training batch, in :attr:`times`.

    Measured from ``on_train_batch_start`` to ``on_train_batch_end``.
    """

    def __init__(self) -> None:
        self.times: list[float] = []
        self._t0 = 0.0

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._t0 = time.perf_counter()

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.times.append(time.perf_counter() - self._t0)
