"""A tiny Lightning task with cropscale-style dict batches, for the callback tests and ``callback-bench``.

Not a model of anything: one ``nn.Linear`` over a flattened ``s2`` tensor, with switches to inject
numerical trouble at chosen optimizer steps or samples:

- ``overflow_steps``: multiply the (finite, FP32) loss by ``1e6``; under ``16-mixed`` the scaled
  FP16 gradients overflow, so the GradScaler skips the step and backs off.
- ``nan_grad_steps``: add ``sqrt(0 * sum(w))`` to the loss: its value is 0 (finite) but its gradient
  is NaN (``0.5 / sqrt(0) * 0``).
- ``loss_factors``: multiply the loss by a factor at chosen optimizer steps, e.g. ``{2: 1e39}``: a finite
  FP32 loss of about 1e37 that overflows only once a GradScaler multiplies it by its scale.
- :class:`ToyDataset` ``nan_patch_ids``: those samples' ``s2`` is NaN, so their batch loss is NaN.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from lightning.pytorch import LightningModule
from torch.utils.data import DataLoader, Dataset
from typing_extensions import override


class ToyDataset(Dataset):
    """``n`` samples ``{"s2": [T, C] f32, "patch_id": int64, "crop_yx": [2] int64}``.

    Sample ``i`` has ``patch_id = first_id + i`` and ``crop_yx = [8 * (i % 4), 8 * (i // 4)]``;
    ``s2`` is ``scale`` x standard normal (seeded), NaN for the ids in ``nan_patch_ids``.
    """

    def __init__(self, n: int = 16, t: int = 2, c: int = 3, scale: float = 0.1, seed: int = 0,
                 first_id: int = 1000, nan_patch_ids: Iterable[int] = ()) -> None:
        g = torch.Generator().manual_seed(seed)
        self.s2 = scale * torch.randn(n, t, c, generator=g)
        self.first_id = first_id
        self.nan_patch_ids = set(int(i) for i in nan_patch_ids)
        for pid in self.nan_patch_ids:
            if 0 <= pid - first_id < n:
                self.s2[pid - first_id] = float("nan")

    def __len__(self) -> int:
        return self.s2.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "s2": self.s2[i],
            "patch_id": torch.tensor(self.first_id + i, dtype=torch.int64),
            "crop_yx": torch.tensor([8 * (i % 4), 8 * (i // 4)], dtype=torch.int64),
        }


class ToyTask(LightningModule):
    """``loss = mean(Linear(flatten(s2))^2)``, plus the injections described in the module docstring.

    Its data is :class:`ToyDataset` with ``s2`` of shape ``[1, features]`` per sample.

    ``flops_per_sample = 6 * features`` (forward 2F, backward 4F for one output), all of it matmul
    (``flops_by_class``). With
    ``step_lr_scheduler`` a ``StepLR(gamma=0.9)`` steps every ``lr_scheduler_frequency`` optimizer steps
    (Lightning's ``interval: step``, ``frequency``).
    """

    def __init__(self, features: int = 6, lr: float = 0.05, optimizer: str = "sgd", weight_decay: float = 0.0,
                 overflow_steps: Iterable[int] = (), nan_grad_steps: Iterable[int] = (), n_train: int = 16,
                 batch_size: int = 4, nan_patch_ids: Iterable[int] = (),
                 step_lr_scheduler: bool = False, lr_scheduler_frequency: int = 1,
                 loss_factors: dict[int, float] | None = None) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(features, 1)
        self.lr = lr
        self.optimizer_name = optimizer
        self.weight_decay = weight_decay
        self.overflow_steps = set(overflow_steps)
        self.nan_grad_steps = set(nan_grad_steps)
        self.n_train = n_train
        self.batch_size = batch_size
        self.nan_patch_ids = tuple(nan_patch_ids)
        self.step_lr_scheduler = step_lr_scheduler
        self.lr_scheduler_frequency = lr_scheduler_frequency
        self.loss_factors = dict(loss_factors or {})
        self.flops_per_sample = 6.0 * features
        self.flops_by_class = {"convolution": 0.0, "matmul": 6.0 * features, "attention": 0.0}

    @override
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        y = self.lin(batch["s2"].flatten(1))
        loss = y.float().square().mean()
        if self.overflow_steps and self.global_step in self.overflow_steps:
            loss = loss * 1e6
        if self.nan_grad_steps and self.global_step in self.nan_grad_steps:
            loss = loss + torch.sqrt(0.0 * self.lin.weight.sum())
        if self.global_step in self.loss_factors:
            loss = loss * self.loss_factors[self.global_step]
        return loss

    @override
    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.log("val_loss", self.lin(batch["s2"].flatten(1)).square().mean())

    @override
    def configure_optimizers(self):  # noqa: ANN201
        if self.optimizer_name == "adamw":
            opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        else:
            opt = torch.optim.SGD(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        if not self.step_lr_scheduler:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step",
                                                   "frequency": self.lr_scheduler_frequency}}

    @override
    def train_dataloader(self) -> DataLoader:
        ds = ToyDataset(self.n_train, t=1, c=self.lin.in_features, nan_patch_ids=self.nan_patch_ids)
        return DataLoader(ds, batch_size=self.batch_size)

    @override
    def val_dataloader(self) -> DataLoader:
        return DataLoader(ToyDataset(8, t=1, c=self.lin.in_features, seed=1, first_id=5000), batch_size=4)


def toy_batches(n: int, batch: int = 1, features: int = 16, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` ready-made batches for :class:`ToyTask`; a ``DataLoader(..., batch_size=None)`` passes them through.

    Batch ``i`` is ``{"s2": [batch, features] f32 standard normal, "patch_id": [1] int64 = i,
    "crop_yx": [1, 2] int64 zeros}``.
    """
    g = torch.Generator().manual_seed(seed)
    return [{"s2": torch.randn(batch, features, generator=g), "patch_id": torch.tensor([i]),
             "crop_yx": torch.zeros(1, 2, dtype=torch.long)} for i in range(n)]
