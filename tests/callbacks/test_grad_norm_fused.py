"""The gradient norm under a GradScaler with an optimizer that unscales inside ``step()`` (issue 27).

Fused AdamW (``fused=True``, ``_step_supports_amp_scaling``) takes the loss scale into its own step, so
Lightning skips ``scaler.unscale_`` and the gradients the callback sees are still multiplied by the scale;
GradNormCallback must divide by the scale *of that step*. The reference is the test's own computation: before
each step, the same weights and batch in float64 without autocast or scaler, ``sqrt(sum g^2)`` by autograd.
FP16 autocast rounds the real step's gradients, hence the 2 % tolerance; the scale starts at 1024 and doubles
every 2 clean steps, so a missing division is off by 1024x or more and a stale scale by 2x. The foreach AdamW
(explicit ``unscale_``) is the control.
"""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins import MixedPrecision

from cropscale.callbacks import GradNormCallback
from cropscale.testing.toy import ToyTask

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),  # Lightning 2.6 on torch 2.13
    pytest.mark.filterwarnings("ignore:The number of training batches"),
]

STEPS = 6


class ListLogger(Logger):
    """Keeps every ``log_metrics`` call: ``[(step, metrics)]``."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict]] = []

    @property
    def name(self) -> str:
        return "list"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        return None

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append((step, dict(metrics)))


class AdamWTask(ToyTask):
    def __init__(self, fused: bool) -> None:
        super().__init__(n_train=4 * STEPS, batch_size=4)
        self.fused = fused

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.05, fused=self.fused, foreach=None if self.fused else True)


class Float64Norm(Callback):
    """The true gradient norm of each step: this batch and the weights before the step, in float64."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        w = pl_module.lin.weight.detach().double().clone().requires_grad_(True)
        b = pl_module.lin.bias.detach().double().clone().requires_grad_(True)
        y = batch["s2"].double().flatten(1) @ w.T + b
        y.square().mean().backward()
        self.norms.append(math.sqrt(float(w.grad.square().sum() + b.grad.square().sum())))


@pytest.mark.parametrize("fused", [True, False], ids=["fused-adamw", "foreach-adamw"])
def test_grad_norm_is_unscaled_for_an_optimizer_that_unscales_inside(fused):
    torch.manual_seed(0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_factor=2.0, growth_interval=2)
    gn, ref, logger = GradNormCallback(), Float64Norm(), ListLogger()
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, plugins=[MixedPrecision("16-mixed", "cpu", scaler)],
                      callbacks=[gn, ref], logger=logger, log_every_n_steps=1, limit_val_batches=0,
                      num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False)
    task = AdamWTask(fused)
    trainer.fit(task)
    assert getattr(task.optimizers().optimizer, "_step_supports_amp_scaling", False) is fused  # the path tested
    assert scaler.get_scale() == 1024.0 * 2 ** (STEPS // 2)  # it grew: each step has its own scale
    logged = [m["numerics/grad_norm"] for _, m in logger.rows if "numerics/grad_norm" in m]
    assert len(logged) == STEPS and gn.nonfinite_steps == 0
    assert logged == pytest.approx(ref.norms, rel=0.02)
