"""Non-finite batches: detect a non-finite loss (and gradients) and record the offending batch's sample ids.

Then, by policy, ``log`` it, ``skip`` the optimizer step, or ``raise``.

What is checked per optimizer step: every micro-batch loss (``on_before_backward``) and, when no
GradScaler is in use, the total gradient norm (``on_before_optimizer_step``; one device reduction,
shared with :class:`~cropscale.callbacks.GradNormCallback`). Under FP16 with a GradScaler,
non-finite *gradients* with a finite loss are the scaler's business (an overflow: it skips the step
and backs off, counted by :class:`~cropscale.callbacks.LossScaleCallback`), so only the loss is
checked; the two counts stay distinct.

Policies:

- ``log`` (default): no host sync per step. The flags and references to the batch's
  ``patch_id`` / ``crop_yx`` tensors are kept and read at log steps. Under DDP a rank whose own loss
  was finite but whose averaged gradients were not also records its batch (``loss_finite: true``).
- ``skip``: one host read of the flags per step (the user asks for it). Under DDP the flags are first
  all-reduced (MAX) so that every rank skips together (a rank skipping alone would hang the others).
  Since DDP averages gradients, one rank's non-finite loss makes every rank's gradients non-finite;
  the record is written by the rank(s) whose loss was non-finite (by every rank with non-finite
  gradients when no loss was).
  The step is skipped by setting every gradient to ``None`` in ``on_before_optimizer_step``: PyTorch
  optimizers leave parameters without a gradient untouched (no update, no weight decay, no moment
  update). The LR scheduler still steps (Lightning steps it after every batch).
- ``raise``: as ``skip``, then :class:`NonFiniteError` on every rank.

Records name the batch by its dataset sample ids (``batch["patch_id"]``, ``batch["crop_yx"]``, see
:mod:`cropscale.batch`), not ``batch_idx``. Under ``skip``/``raise`` the record also lists which
samples of the batch hold non-finite input values (``nonfinite_input_patch_id``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from cropscale.callbacks._batches import id_tensors, ids_to_lists
from cropscale.callbacks._dist import dist_ready, gather_objects
from cropscale.callbacks._grads import (
    clear_grad_norm_cache,
    grad_norm_parts,
    grad_scaler,
    is_sharded_strategy,
    total_norms,
    trainable_params,
)
from cropscale.callbacks._logging import log_metrics
from cropscale.callbacks.base import ScalingCallback
from cropscale.errors import CropScaleError
from cropscale.runs.schema import NonFiniteRecord, NonFiniteSummary, RankCounts


class NonFiniteError(CropScaleError):
    """Training met a non-finite loss or gradient under ``NonFiniteCallback(policy="raise")``."""


class NonFiniteCallback(ScalingCallback):
    """Detects non-finite losses and gradients and records the sample ids of the offending batches.

    Args:
        policy: ``"log"``, ``"skip"`` (skip the optimizer step on every rank) or ``"raise"``.
        check_grads: also check the gradients (only when no GradScaler is in use).
        max_records: keep at most this many batch records (the counts go on).

    Logged (TensorBoard, at log steps): ``numerics/nonfinite_batches`` and
    ``numerics/nonfinite_skipped_steps`` (cumulative, this rank; all ranks' records are gathered
    into ``run.json`` at the end of training).

    Raises:
        CropScaleError: for an unknown ``policy``.
        NonFiniteError: under ``policy="raise"``, on every rank, when a step is non-finite.
    """

    summary_key = "nonfinite"

    def __init__(self, policy: Literal["log", "skip", "raise"] = "log", check_grads: bool = True,
                 max_records: int = 100) -> None:
        if policy not in ("log", "skip", "raise"):
            raise CropScaleError(f"NonFiniteCallback(policy={policy!r}): use 'log', 'skip' or 'raise'")
        if max_records < 0:
            raise CropScaleError(f"NonFiniteCallback(max_records={max_records}): must be >= 0")
        self.policy = policy
        self.check_grads = check_grads
        self.max_records = max_records
        self.nonfinite_batches = 0
        self.skipped_steps = 0
        self.records: list[NonFiniteRecord] = []
        self.all_records: list[NonFiniteRecord] | None = None
        self._params: list[torch.nn.Parameter] = []
        self._scaler: Any = None
        self._sharded = False
        self._batch: Any = None
        self._ids: tuple[Any, Any] = (None, None)
        self._losses: list[torch.Tensor] = []
        self._pending: list[tuple] = []
        self._rank = 0
        self._epoch = 0
        self._batch_idx = 0
        self._stepped = False
        self._logged = 0

    # ------------------------------------------------------------------ state
    @override
    def state_dict(self) -> dict[str, Any]:
        self._flush()
        return {"nonfinite_batches": self.nonfinite_batches, "skipped_steps": self.skipped_steps,
                "records": [r.to_json() for r in self.records]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.nonfinite_batches = int(state_dict.get("nonfinite_batches", 0))
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))
        self.records = [NonFiniteRecord.from_json(r) for r in state_dict.get("records", [])]

    # ------------------------------------------------------------------ hooks
    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._params = trainable_params(pl_module)
        self._scaler = grad_scaler(trainer)
        self._sharded = is_sharded_strategy(trainer)
        self._rank = trainer.global_rank
        self._pending = []
        self.all_records = None
        self._start_log_schedule(trainer)

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch = trainer.current_epoch

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        clear_grad_norm_cache()
        self._batch = batch if self.policy != "log" else None
        self._ids = id_tensors(batch)
        self._losses = []
        self._batch_idx = batch_idx
        self._stepped = False

    @override
    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        self._losses.append(loss.detach())

    @override
    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        losses = self._losses
        parts = None
        if self.check_grads and self._scaler is None:
            parts = grad_norm_parts(trainer, self._params, optimizer, sharded=self._sharded)
        self._stepped = True
        meta = (self._gstep + 1, self._epoch, self._batch_idx)  # global step after this optimizer step
        if self.policy == "log":
            self._pending.append((losses, parts, self._ids, meta))
            return
        # skip / raise: decide now, consistently on every rank
        loss_ok = torch.isfinite(torch.stack([v.reshape(()) for v in losses])).all() if losses else None
        grad_ok = torch.isfinite(torch.stack([t.reshape(()) for t in parts])).all() if parts else None
        dev = pl_module.device
        no = torch.zeros((), dtype=torch.int32, device=dev)
        local = torch.stack([no if loss_ok is None else (~loss_ok).to(torch.int32).to(dev),
                             no if grad_ok is None else (~grad_ok).to(torch.int32).to(dev)])
        glob = local.clone()
        if dist_ready(trainer):  # every rank takes part, bad or not: the same collective each step
            torch.distributed.all_reduce(glob, op=torch.distributed.ReduceOp.MAX)
        (loss_bad, grad_bad), (loss_bad_any, grad_bad_any) = torch.stack([local, glob]).bool().tolist()
        if not (loss_bad_any or grad_bad_any):
            return
        # DDP averages gradients, so one rank's NaN loss makes every rank's gradients NaN: the rank(s)
        # with a non-finite loss own the record; without one, every rank with bad gradients records
        if loss_bad or (grad_bad and not loss_bad_any):
            record = self._record(meta, loss_ok, grad_ok, self._ids, batch=self._batch)
            where = (f"non-finite {'loss' if record.loss_finite is False else 'gradients'} on rank "
                     f"{self._rank}: patch_id={record.patch_id}, crop_yx={record.crop_yx}")
        else:
            where = "non-finite loss on another rank (its record names the samples)"
        if self.policy == "raise":
            raise NonFiniteError(
                f"NonFiniteCallback(policy='raise'): global step {meta[0]} (epoch {meta[1]}): {where}"
            )
        for p in self._params:
            p.grad = None
        self.skipped_steps += 1

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._batch = None
        if self._stepped and self._count_step():
            self._flush()
            if self.nonfinite_batches != self._logged:  # a scalar only when the count moved
                self._logged = self.nonfinite_batches
                log_metrics(trainer, {"numerics/nonfinite_batches": self.nonfinite_batches,
                                      "numerics/nonfinite_skipped_steps": self.skipped_steps})

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._flush()
        log_metrics(trainer, {"numerics/nonfinite_batches": self.nonfinite_batches,
                              "numerics/nonfinite_skipped_steps": self.skipped_steps})

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._flush()
        gathered = gather_objects(trainer, (self.nonfinite_batches, self.skipped_steps, self.records))
        self.all_records = [r for _, _, recs in gathered for r in recs]
        self._per_rank_counts = [(n, s) for n, s, _ in gathered]
        if self.nonfinite_batches and trainer.is_global_zero:
            rank_zero_warn(f"NonFiniteCallback: {self.nonfinite_batches} non-finite batch(es) on rank 0 "
                           f"(policy={self.policy}); sample ids are in run.json")

    # ------------------------------------------------------------------ records
    def _record(self, meta: tuple, loss_ok: Any, grad_ok: Any, ids: tuple, batch: Any = None) -> NonFiniteRecord:
        step, epoch, batch_idx = meta
        rec = NonFiniteRecord(
            global_step=int(step), epoch=int(epoch), batch_idx=int(batch_idx), rank=self._rank,
            loss_finite=None if loss_ok is None else bool(loss_ok),
            grads_finite=None if grad_ok is None else bool(grad_ok),
            **ids_to_lists(*ids),
        )
        if isinstance(batch, Mapping):
            bad_samples = _nonfinite_samples(batch)
            if bad_samples is not None and rec.patch_id is not None:
                rec.nonfinite_input_patch_id = [rec.patch_id[i] for i in bad_samples if i < len(rec.patch_id)]
                if rec.crop_yx is not None:
                    rec.nonfinite_input_crop_yx = [rec.crop_yx[i] for i in bad_samples if i < len(rec.crop_yx)]
        self.nonfinite_batches += 1
        if len(self.records) < self.max_records:
            self.records.append(rec)
        return rec

    def _flush(self) -> None:
        """Read the pending ``log``-policy gradient norms and losses, and record the bad batches.

        Two device-to-host copies: the gradient norms (shared, read once) and the loss flags.
        """
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        grad_host = iter(total_norms([item[1] for item in pending if item[1] is not None]))  # shared, read once
        loss_host = iter(_finite_flags([v for item in pending for v in item[0]]))
        for losses, parts, ids, meta in pending:
            flags = [next(loss_host) for _ in losses]
            loss_ok = all(flags) if flags else None
            grad_ok = math.isfinite(next(grad_host)) if parts is not None else None
            if loss_ok is False or grad_ok is False:
                self._record(meta, loss_ok, grad_ok, ids)

    # ------------------------------------------------------------------ summary
    @override
    def summary(self) -> NonFiniteSummary:
        records = self.all_records if self.all_records is not None else self.records
        counts = getattr(self, "_per_rank_counts", [(self.nonfinite_batches, self.skipped_steps)])
        return NonFiniteSummary(
            policy=self.policy,
            check_grads=self.check_grads and self._scaler is None,
            nonfinite_batches_rank0=self.nonfinite_batches,
            skipped_steps_rank0=self.skipped_steps,
            per_rank=[RankCounts(nonfinite_batches=n, skipped_steps=s) for n, s in counts],
            records=list(records),
        )


def _finite_flags(values: list[torch.Tensor]) -> list[bool]:
    """Finiteness of each 0-d tensor in ``values`` (one stack, one device-to-host copy)."""
    if not values:
        return []
    try:
        stacked = torch.stack(values)
    except RuntimeError:  # not all 0-d, or on different devices
        stacked = torch.stack([v.detach().reshape(-1)[:1].reshape(()).to(values[0].device) for v in values])
    finite = torch.isfinite(stacked)
    if bool(finite.all()):  # the common case: one read
        return [True] * len(values)
    return finite.reshape(len(values), -1).all(dim=1).cpu().tolist()


def _nonfinite_samples(batch: Mapping) -> list[int] | None:
    """Indices of the samples whose floating-point tensors hold NaN/inf (rare path: reads the device)."""
    n = None
    bad: torch.Tensor | None = None
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() > 0:
            if n is None:
                n = value.shape[0]
            if value.shape[0] != n:
                continue
            per_sample = ~torch.isfinite(value.detach()).reshape(n, -1).all(dim=1)
            bad = per_sample if bad is None else (bad | per_sample.to(bad.device))
    if bad is None:
        return None
    return [int(i) for i in torch.nonzero(bad).reshape(-1).cpu().tolist()]
