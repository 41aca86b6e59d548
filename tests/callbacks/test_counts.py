"""Per-epoch counts and caps of the callbacks against numbers worked out by hand (issue 27).

- GPU peak memory per epoch, through a fake CUDA allocator whose allocations the test makes;
- the gradient norm's per-epoch step count (and its values, against a float64 norm of the same gradients);
- the ``max_records`` cap of the non-finite callback.
"""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch import Callback, Trainer

from cropscale.callbacks import GradNormCallback, MemoryCallback, NonFiniteCallback
from cropscale.testing.toy import ToyTask

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),  # Lightning 2.6 on torch 2.13
    pytest.mark.filterwarnings("ignore:NonFiniteCallback"),  # the warning the injected NaNs are meant to raise
    pytest.mark.filterwarnings("ignore:The number of training batches"),
]

GIB = 2**30


# ------------------------------------------------------------------------------------ GPU peak memory
class FakeAllocator:
    """The few ``torch.cuda`` memory counters MemoryCallback reads, driven by the test's allocations (bytes).

    Semantics of the caching allocator: ``max_memory_*`` is the highest value since the last
    ``reset_peak_memory_stats``, which sets the peaks to the current values.
    """

    def __init__(self) -> None:
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0

    def set(self, allocated: int, reserved: int) -> None:
        self.allocated, self.reserved = allocated, reserved
        self.peak_allocated = max(self.peak_allocated, allocated)
        self.peak_reserved = max(self.peak_reserved, reserved)

    def reset_peak_memory_stats(self, device=None) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def install(self, mp: pytest.MonkeyPatch) -> None:
        mp.setattr(torch.cuda, "is_available", lambda: True)
        mp.setattr(torch.cuda, "reset_peak_memory_stats", self.reset_peak_memory_stats)
        mp.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak_allocated)
        mp.setattr(torch.cuda, "max_memory_reserved", lambda device=None: self.peak_reserved)
        mp.setattr(torch.cuda, "memory_allocated", lambda device=None: self.allocated)
        mp.setattr(torch.cuda, "memory_reserved", lambda device=None: self.reserved)


# (allocated, reserved) in GiB during each epoch, in order; the epoch peaks worked out by hand below
EPOCH_USE = [
    [(1, 2), (3, 4), (1, 4), (1, 1)],  # epoch 0: a 3 GiB peak, then freed (and the cache emptied)
    [(2, 2), (1, 2)],  # epoch 1 starts at (1, 1): peaks 2 and 2, not epoch 0's 3 and 4
    [(1, 2)],  # epoch 2 starts at (1, 2): the peaks since the reset are the values at the reset, 1 and 2
]
EXPECTED_PEAKS = [(3.0, 4.0), (2.0, 2.0), (1.0, 2.0)]  # (allocated, reserved) GiB per epoch


def test_gpu_peak_memory_is_the_peak_of_each_epoch(monkeypatch):
    alloc = FakeAllocator()
    alloc.install(monkeypatch)
    trainer = SimpleNamespace(world_size=1, loggers=[], log_every_n_steps=0, global_step=0, current_epoch=0)
    module = SimpleNamespace(device=torch.device("cuda", 0))
    cb = MemoryCallback()
    cb.on_train_start(trainer, module)
    for epoch, uses in enumerate(EPOCH_USE):
        trainer.current_epoch = epoch
        cb.on_train_epoch_start(trainer, module)
        for a, r in uses:
            alloc.set(a * GIB, r * GIB)
        cb.on_train_epoch_end(trainer, module)
    got = [(e.peak_allocated_gib, e.peak_reserved_gib) for e in cb.epochs]
    assert got == EXPECTED_PEAKS
    assert (cb.summary().peak_allocated_gib, cb.summary().peak_reserved_gib) == (3.0, 4.0)


# ------------------------------------------------------------------------- gradient norm per epoch
class ReferenceNorms(Callback):
    """The test's own norm of each optimizer step's gradients: float64, before the step, per epoch."""

    def __init__(self) -> None:
        self.by_epoch: dict[int, list[float]] = {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        sq = sum(float(p.grad.double().square().sum()) for p in pl_module.parameters() if p.grad is not None)
        self.by_epoch.setdefault(trainer.current_epoch, []).append(math.sqrt(sq))


@pytest.mark.parametrize("clip", [None, 1e6], ids=["computed", "clipping-norm"])
def test_grad_norm_steps_per_epoch_under_accumulation(clip):
    """2 epochs of 24 samples, batch 4, 2 micro-batches per step: 3 optimizer steps per epoch (6 micro-batches).
    NaN gradients at global step 5, the last (NaN weights would follow it): epoch 0 has 3 finite steps, epoch 1
    two finite and one not."""
    torch.manual_seed(0)
    gn, ref = GradNormCallback(), ReferenceNorms()
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=2, accumulate_grad_batches=2, gradient_clip_val=clip,
                      limit_val_batches=0, num_sanity_val_steps=0, callbacks=[gn, ref], logger=False,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(ToyTask(n_train=24, batch_size=4, nan_grad_steps={5}, optimizer="adamw"))
    assert [(e.epoch, e.steps, e.nonfinite_steps) for e in gn.epochs] == [(0, 3, 0), (1, 3, 1)]
    assert (gn.steps, gn.nonfinite_steps) == (6, 1)
    for e in gn.epochs:
        finite = [v for v in ref.by_epoch[e.epoch] if math.isfinite(v)]
        assert e.grad_norm_max == pytest.approx(max(finite), rel=1e-5)
        assert e.grad_norm_median == pytest.approx(statistics.median(finite), rel=1e-5)


# ------------------------------------------------------------------------------------ max_records
@pytest.mark.parametrize(("max_records", "kept"), [(0, 0), (2, 2), (3, 3), (5, 3)])
def test_max_records_caps_the_records_and_not_the_count(max_records, kept):
    """NaN in samples 1001, 1005 and 1009: batches 0, 1 and 2 of 4 (batch 4); ``skip`` keeps the weights finite,
    so exactly these three batches are non-finite; the first ``min(max_records, 3)`` are kept, in order."""
    nf = NonFiniteCallback(policy="skip", max_records=max_records)
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_val_batches=0, num_sanity_val_steps=0,
                      callbacks=[nf], logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False)
    trainer.fit(ToyTask(n_train=16, batch_size=4, nan_patch_ids={1001, 1005, 1009}))
    assert (nf.nonfinite_batches, nf.skipped_steps) == (3, 3)
    summary = nf.summary()
    assert len(summary.records) == kept
    expected_ids = [[1000, 1001, 1002, 1003], [1004, 1005, 1006, 1007], [1008, 1009, 1010, 1011]][:kept]
    assert [r.patch_id for r in summary.records] == expected_ids
    assert [r.nonfinite_input_patch_id for r in summary.records] == [[1001], [1005], [1009]][:kept]
