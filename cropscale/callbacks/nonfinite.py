"""Non-finite batches: detect a non-finite loss (and gradients) and record the offending micro-batch's sample ids.

Then, by policy, ``log`` it, ``skip`` the optimizer step, or ``raise``.

What is checked, per optimizer step (``docs/measuring.md``, "Gradient accumulation"):

- **every micro-batch**: its loss (``on_before_backward``; under a GradScaler the loss *before* scaling,
  see :func:`~cropscale.callbacks._grads.watch_unscaled_loss`: a finite loss that overflows only once
  multiplied by the scale is an AMP overflow, never a non-finite batch);
- **the inputs** (the floating-point batch tensors, inputs and targets) of a micro-batch whose loss was
  non-finite: under ``skip``/``raise`` from the micro-batch itself, kept until the optimizer step (a rare
  path, no per-step cost); under ``log`` only with ``check_inputs=True``, which adds per micro-batch one
  ``torch._foreach_norm(tensors, inf)`` launch (``max |x|`` of each tensor, finite exactly when every
  element is) — off by default because it is per-step work in the mode that is meant to cost nothing;
- **the gradients**, once, when no GradScaler is in use (``on_before_optimizer_step``; one device reduction
  shared with :class:`~cropscale.callbacks.GradNormCallback`; under ``log`` with Lightning clipping by norm,
  the total norm the clipping computed, :class:`~cropscale.callbacks._grads.ClipNormTap`: no device work).
  Under FP16 with a GradScaler, non-finite gradients with finite losses are the scaler's business (an
  overflow: it skips the step and backs off, counted by
  :class:`~cropscale.callbacks.LossScaleCallback`), so only losses and inputs are checked.

A *non-finite batch* is a micro-batch whose loss is NaN/inf; its record names its optimizer step (``global_step``:
the step's 0-based index, ``trainer.global_step`` while the micro-batch ran, as in the step-timing trace; Lightning
counts a skipped step as a step), the micro-batch (index in the optimizer step, ``batch_idx``), its sample ids
(``patch_id``, ``crop_yx``) and which of input / loss / gradients was non-finite. When the gradients are non-finite
but every loss was finite, one record names the step (``micro_batch: null``, the sample ids of all its
micro-batches). Counts are per micro-batch.

Policies:

- ``log`` (default): no host read per step. The losses, norms and references to the micro-batches'
  ``patch_id`` / ``crop_yx`` tensors are kept and read at log steps (one device-to-host copy for the
  losses, inputs and gradient norms, shared with the other members of a group,
  :mod:`~cropscale.callbacks._readout`). Each rank judges alone: under DDP a rank whose losses
  were finite but whose averaged gradients were not records its step too (``loss_finite: true``).
- ``skip``: one host read of the flags per optimizer step (the user asks for it). Under DDP the flags
  are first all-reduced (MAX) so that every rank skips the same optimizer step (a rank skipping alone
  would hang the others). Since DDP averages gradients, one rank's non-finite loss makes every rank's
  gradients non-finite; the record is written by the rank(s) whose loss was non-finite (by every rank
  with non-finite gradients when no loss was). The step is skipped by setting every gradient to ``None``
  in ``on_before_optimizer_step``: PyTorch optimizers leave parameters without a gradient untouched (no
  update, no weight decay, no moment update). The LR scheduler still steps (Lightning steps it after
  every optimizer step). Under ``skip``/``raise`` the micro-batches of the current optimizer step are
  kept referenced until it (``accumulate_grad_batches`` batches of inputs in memory), so that the record
  also lists which samples hold non-finite values (``nonfinite_input_patch_id`` / ``_crop_yx``).
- ``raise``: as ``skip``, then :class:`NonFiniteError` on every rank.

Records name the batch by its dataset sample ids (``batch["patch_id"]``, ``batch["crop_yx"]``, see
:mod:`cropscale.batch`), not only ``batch_idx``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from cropscale.callbacks._batches import float_tensors, id_tensors, ids_to_lists
from cropscale.callbacks._dist import dist_ready, gather_objects
from cropscale.callbacks._grads import (
    ClipNormTap,
    GradNormParts,
    clear_grad_norm_cache,
    clip_norm_tap,
    grad_norm_parts,
    grad_scaler,
    norms_tensor,
    release_clip_tap,
    shard_layout,
    trainable_params,
    unwatch_unscaled_loss,
    watch_unscaled_loss,
)
from cropscale.callbacks._logging import log_metrics
from cropscale.callbacks._readout import read_later
from cropscale.callbacks.base import ScalingCallback
from cropscale.errors import CropScaleError
from cropscale.runs.schema import NonFiniteRecord, NonFiniteSummary, RankCounts


class NonFiniteError(CropScaleError):
    """Training met a non-finite loss or gradient under ``NonFiniteCallback(policy="raise")``."""


@dataclass(slots=True)
class _MicroBatch:
    """What one micro-batch left for the decision at the optimizer step (device tensors, no host values)."""

    index: int  # 0-based position in its optimizer step
    batch_idx: int
    ids: tuple[Any, Any]  # patch_id [B], crop_yx [B, 2] (references)
    input_keys: list[str]
    input_extremes: Sequence[torch.Tensor] | None = None  # max |x| of each floating-point batch tensor (0-d)
    loss: torch.Tensor | None = None  # 0-d, unscaled
    batch: Any = None  # skip / raise only


class NonFiniteCallback(ScalingCallback):
    """Detects non-finite losses and gradients and records the sample ids of the offending micro-batches.

    Args:
        policy: ``"log"``, ``"skip"`` (skip the optimizer step on every rank) or ``"raise"``.
        check_grads: also check the gradients (only when no GradScaler is in use).
        check_inputs: under ``log``, also reduce each micro-batch's floating-point tensors (inputs and targets)
            so that a record says whether its input was non-finite (``max |x|`` per tensor and micro-batch).
            ``None`` (default): no per-step work; under ``skip``/``raise`` the inputs of a non-finite micro-batch
            are examined anyway, on the rare path.
        max_records: keep at most this many records per rank (the counts go on).

    Logged (TensorBoard, at log steps): ``numerics/nonfinite_batches`` and
    ``numerics/nonfinite_skipped_steps`` (cumulative, this rank; all ranks' records are gathered
    into ``run.json`` at the end of training).

    Raises:
        CropScaleError: for an unknown ``policy`` or a negative ``max_records``.
        NonFiniteError: under ``policy="raise"``, on every rank, when a step is non-finite.

    Example::

        from lightning.pytorch import Trainer
        from cropscale.callbacks import NonFiniteCallback

        trainer = Trainer(callbacks=[NonFiniteCallback(policy="skip", max_records=100)])

        # command line: the preset's settings replace the member of configs/default.yaml's CallbackGroup
        #   python -m cropscale fit --config callbacks/nonfinite.yaml
    """

    summary_key = "nonfinite"

    def __init__(self, policy: Literal["log", "skip", "raise"] = "log", check_grads: bool = True,
                 check_inputs: bool | None = None, max_records: int = 100) -> None:
        if policy not in ("log", "skip", "raise"):
            raise CropScaleError(f"NonFiniteCallback(policy={policy!r}): use 'log', 'skip' or 'raise'")
        if max_records < 0:
            raise CropScaleError(f"NonFiniteCallback(max_records={max_records}): must be >= 0")
        self.policy = policy
        self.check_grads = check_grads
        self.check_inputs = check_inputs
        self.max_records = max_records
        self.nonfinite_batches = 0
        self.skipped_steps = 0
        self.records: list[NonFiniteRecord] = []
        self.all_records: list[NonFiniteRecord] | None = None
        self._per_rank_counts: list[tuple[int, int]] | None = None
        self._params: list[torch.nn.Parameter] = []
        self._scaler: Any = None
        self._layout: Any = False
        self._micros: list[_MicroBatch] = []
        self._input_keys: dict[tuple[Any, ...], list[str]] = {}
        self._pending: list[tuple[list[_MicroBatch], Any, tuple[int, int]]] = []
        self._rank = 0
        self._epoch = 0
        self._stepped = False
        self._logged = 0
        self._early = True  # micro-batches recorded from on_train_batch_start (see on_train_start)
        self._step: tuple[Any, tuple[int, int]] = (None, (0, 0))  # (gradient norm parts, meta) of the step
        self._tap: ClipNormTap | None = None  # log, FP32, Lightning clipping by norm: the clipping's norm
        self._tap_seen = 0

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
        clear_grad_norm_cache()
        self._scaler = grad_scaler(trainer)
        # skip / raise decide at the optimizer step, before the step's last on_train_batch_end, and the input check
        # runs before training_step: both record a micro-batch from its start. Otherwise (log, the default, under
        # automatic optimisation) the micro-batch is recorded in on_train_batch_end from the loss Lightning hands
        # it: two hooks per step instead of four, and no detach.
        self._early = self.policy != "log" or bool(self.check_inputs) or not pl_module.automatic_optimization
        if self._scaler is not None and self._early:
            watch_unscaled_loss(self._scaler, self._on_unscaled_loss)
        self._layout = shard_layout(trainer)
        self._tap = None
        if self.check_grads and self._scaler is None and not self._early:
            self._tap, _ = clip_norm_tap(trainer, pl_module)
        self._tap_seen = self._tap.calls if self._tap is not None else 0
        self._rank = trainer.global_rank
        self._epoch = trainer.current_epoch  # a resume at an epoch's last batch runs the next with no epoch start
        self._micros, self._pending = [], []
        self.all_records = None
        self._start_log_schedule(trainer)

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch = trainer.current_epoch

    @override
    def wants_hook(self, hook: str) -> bool:
        if hook in ("on_train_batch_start", "on_before_backward"):
            return self._early  # under log without the input check, the loss comes with on_train_batch_end
        if hook == "on_before_optimizer_step":
            return self._tap is None  # the clipping's norm is taken in on_train_batch_end
        return True

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if not self._early:
            return
        micro = _MicroBatch(len(self._micros), batch_idx, id_tensors(batch), [])
        if self.check_inputs:
            keys, tensors = self._inputs(batch)
            if tensors:
                micro.input_keys, micro.input_extremes = _extremes(keys, tensors)
        if self.policy != "log":
            micro.batch = batch
        self._micros.append(micro)

    def _inputs(self, batch: Any) -> tuple[list[str], list[torch.Tensor]]:
        """The floating-point tensors of ``batch`` and their keys; the keys of a flat dict batch are cached."""
        if isinstance(batch, dict):
            names = tuple(batch)
            cached = self._input_keys.get(names)
            if cached is None:
                keys, tensors = float_tensors(batch)
                if all(k in batch for k in keys):  # flat: remember which keys hold floating-point tensors
                    self._input_keys[names] = keys
                return keys, tensors
            tensors = [batch[k] for k in cached]
            if all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in tensors):
                return cached, tensors
        return float_tensors(batch)

    def _on_unscaled_loss(self, loss: torch.Tensor) -> None:
        """The loss before GradScaler scaling (16-mixed), called just before ``on_before_backward``."""
        if self._micros:
            self._micros[-1].loss = loss.detach()

    @override
    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        # under a scaler this loss is scaled: the tap has the real one
        if self._early and self._scaler is None and self._micros:
            self._micros[-1].loss = loss.detach()

    @override
    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        if self._tap is not None:  # log with the clipping's norm: the step is taken in on_train_batch_end
            return
        parts = None
        if self.check_grads and self._scaler is None:
            parts = grad_norm_parts(trainer, self._params, optimizer, self._gstep, sharded=self._layout)
        self._stepped = True
        meta = (self._gstep, self._epoch)  # this optimizer step's index: trainer.global_step before it
        if not self._early:  # log: the step's last micro-batch is recorded in on_train_batch_end
            self._step = (parts, meta)
            return
        micros, self._micros = self._micros, []
        if self.policy == "log":
            self._pending.append((micros, parts, meta))
            return
        self._decide(trainer, pl_module, micros, parts, meta)

    def _decide(self, trainer: Trainer, pl_module: LightningModule, micros: list[_MicroBatch], parts: Any,
                meta: tuple[int, int]) -> None:
        """Under skip / raise: read this step's flags (all-reduced under DDP) and act on every rank alike."""
        dev = pl_module.device
        flags = _step_flags(micros, parts, dev)  # [loss_bad..., input_bad..., grads_bad] as 0/1 int32
        n = len(micros)
        glob = torch.stack([flags[:n].amax() if n else flags.new_zeros(()), flags[-1]])
        if dist_ready(trainer):  # every rank takes part, bad or not: the same collective each step
            torch.distributed.all_reduce(glob, op=torch.distributed.ReduceOp.MAX)
        host = torch.cat([flags, glob]).tolist()
        loss_bad, input_bad, grads_bad = host[:n], host[n:2 * n], host[2 * n]
        loss_bad_any, grads_bad_any = host[-2:]
        if not (loss_bad_any or grads_bad_any):
            return
        grad_ok = None if parts is None else not grads_bad
        # DDP averages gradients, so one rank's NaN loss makes every rank's gradients NaN: the rank(s)
        # with a non-finite loss own the record; without one, every rank with bad gradients records
        records: list[NonFiniteRecord] = []
        for micro, lb, ib in zip(micros, loss_bad, input_bad, strict=True):
            if lb:
                records.append(self._record(meta, [micro], False, grad_ok, _input_ok(micro, ib), micro.index))
        if grads_bad and not loss_bad_any:
            records.append(self._record(meta, micros, True, False, _inputs_ok(micros, input_bad), None))
        if records:
            rec = records[0]
            where = (f"non-finite {'loss' if rec.loss_finite is False else 'gradients'} on rank {self._rank}"
                     f"{'' if rec.micro_batch is None else f', micro-batch {rec.micro_batch}'}: "
                     f"patch_id={rec.patch_id}, crop_yx={rec.crop_yx}")
        else:
            where = "non-finite loss on another rank (its record names the samples)"
        if self.policy == "raise":
            raise NonFiniteError(f"NonFiniteCallback(policy='raise'): global step {meta[0]} (epoch {meta[1]}): {where}")
        for p in self._params:
            p.grad = None
        self.skipped_steps += 1

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._early:  # log without the input check: the loss Lightning returns, already detached
            self._micros.append(_MicroBatch(len(self._micros), batch_idx, id_tensors(batch), [], loss=_loss(outputs)))
            tap = self._tap
            if tap is not None and tap.calls != self._tap_seen:  # clipped: an optimizer step ran, with its norm
                self._tap_seen = tap.calls
                self._stepped = True
                self._step = (GradNormParts([tap.last]), (self._gstep, self._epoch))  # counted just below
            if self._stepped:
                micros, self._micros = self._micros, []
                self._pending.append((micros, *self._step))
        if not self._stepped:
            return
        self._stepped = False
        if self._count_step():
            self._flush(then=lambda: self._log_counts(trainer))

    def _log_counts(self, trainer: Trainer) -> None:
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
        self._micros = []
        unwatch_unscaled_loss(self._scaler, self._on_unscaled_loss)
        release_clip_tap(trainer)
        gathered = gather_objects(trainer, (self.nonfinite_batches, self.skipped_steps,
                                            [r.to_json() for r in self.records]))
        self.all_records = [NonFiniteRecord.from_json(r) for _, _, recs in gathered for r in recs]
        self._per_rank_counts = [(n, s) for n, s, _ in gathered]
        if self.nonfinite_batches and trainer.is_global_zero:
            rank_zero_warn(f"NonFiniteCallback: {self.nonfinite_batches} non-finite batch(es) on rank 0 "
                           f"(policy={self.policy}); sample ids are in run.json")

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        unwatch_unscaled_loss(self._scaler, self._on_unscaled_loss)
        release_clip_tap(trainer)

    # ------------------------------------------------------------------ records
    def _record(self, meta: tuple[int, int], micros: list[_MicroBatch], loss_ok: bool, grad_ok: bool | None,
                input_ok: bool | None, micro_index: int | None) -> NonFiniteRecord:
        """One record: a micro-batch with a non-finite loss, or (``micro_index`` None) a step with non-finite gradients.

        Reads the sample ids from the device (a rare path).
        """
        step, epoch = meta
        ids = [ids_to_lists(*m.ids) for m in micros]
        rec = NonFiniteRecord(
            global_step=int(step), epoch=int(epoch), batch_idx=int(micros[-1].batch_idx if micros else -1),
            micro_batch=micro_index, rank=self._rank, loss_finite=loss_ok, grads_finite=grad_ok, input_finite=input_ok,
            patch_id=[v for d in ids for v in d.get("patch_id", [])] if any("patch_id" in d for d in ids) else None,
            crop_yx=[v for d in ids for v in d.get("crop_yx", [])] if any("crop_yx" in d for d in ids) else None,
        )
        if all(m.batch is not None for m in micros):  # skip / raise: examine the inputs themselves (rare path)
            bad_keys = [k for m in micros for k in _nonfinite_keys(m.batch)]
            rec.input_finite = not bad_keys
            if micro_index is not None and bad_keys:
                rec.nonfinite_inputs = bad_keys
        elif micro_index is not None and input_ok is False:
            micro = micros[0]
            flags = _finite_flags(micro.input_extremes or [])
            rec.nonfinite_inputs = [k for k, ok in zip(micro.input_keys, flags, strict=True) if not ok]
        if self.policy != "log" and all(isinstance(m.batch, Mapping) for m in micros):
            bad = [i for m in micros for i in _sample_flags(m.batch)]  # per sample of the step's micro-batches
            if rec.patch_id is not None and len(bad) == len(rec.patch_id):
                rec.nonfinite_input_patch_id = [p for p, b in zip(rec.patch_id, bad, strict=True) if b]
            if rec.crop_yx is not None and len(bad) == len(rec.crop_yx):
                rec.nonfinite_input_crop_yx = [c for c, b in zip(rec.crop_yx, bad, strict=True) if b]
        self.nonfinite_batches += 1  # a micro-batch with a non-finite loss, or a step with non-finite gradients
        if len(self.records) < self.max_records:
            self.records.append(rec)
        return rec

    def _flush(self, then: Any = None) -> None:
        """Read the pending ``log``-policy values, record the bad micro-batches, then call ``then()``.

        One device-to-host copy for the losses, the inputs' ``max |x|`` and the gradient norms, through
        :func:`~cropscale.callbacks._readout.read_later` (shared with a group's other members, at the end of its
        ``on_train_batch_end``); finiteness is judged on the host.
        """
        if not self._pending:
            if then is not None:
                then()
            return
        pending, self._pending = self._pending, []
        if self._early:  # the input check may have left max |x| values
            values = [v for micros, _, _ in pending for m in micros for v in _micro_values(m)]
        else:  # losses only (no per-micro-batch call): the order _judge reads them in
            values = [m.loss for micros, _, _ in pending for m in micros if m.loss is not None]
        parts = [p for _, p, _ in pending if p is not None]

        def resolve(host: list[float]) -> None:
            n = len(values)
            if not all(map(math.isfinite, host)):  # the common case, all finite, judged in one C call
                self._judge(pending, host[:n], host[n:])
            if then is not None:
                then()

        read_later(values, resolve, [norms_tensor(parts)] if parts else [])

    def _judge(self, pending: list[tuple[list[_MicroBatch], Any, tuple[int, int]]], values: list[float],
               grads: list[float]) -> None:
        """Record the non-finite micro-batches (and steps) of ``pending`` from their host values."""
        grad_host = iter(grads)
        flags = iter([math.isfinite(v) for v in values])
        for micros, parts, meta in pending:
            grad_ok = math.isfinite(next(grad_host)) if parts is not None else None
            loss_oks, input_oks = [], []
            for m in micros:
                loss_oks.append(next(flags) if m.loss is not None else None)
                inputs = [next(flags) for _ in (m.input_extremes or [])]
                input_oks.append(all(inputs) if inputs else None)
            for m, lo, io in zip(micros, loss_oks, input_oks, strict=True):
                if lo is False:
                    self._record(meta, [m], False, grad_ok, io, m.index)
            if grad_ok is False and not any(lo is False for lo in loss_oks):
                checked = [io for io in input_oks if io is not None]
                self._record(meta, micros, True, False, all(checked) if checked else None, None)

    # ------------------------------------------------------------------ summary
    @override
    def summary(self) -> NonFiniteSummary:
        records = self.all_records if self.all_records is not None else self.records
        counts = self._per_rank_counts or [(self.nonfinite_batches, self.skipped_steps)]
        return NonFiniteSummary(
            policy=self.policy,
            check_grads=self.check_grads and self._scaler is None,
            input_check=("every micro-batch" if self.check_inputs else
                         ("non-finite micro-batches" if self.policy != "log" else "off")),
            nonfinite_batches_rank0=self.nonfinite_batches,
            skipped_steps_rank0=self.skipped_steps,
            per_rank=[RankCounts(nonfinite_batches=n, skipped_steps=s) for n, s in counts],
            records=list(records),
        )


def _extremes(keys: list[str], tensors: list[torch.Tensor]) -> tuple[list[str], list[torch.Tensor]]:
    """The keys of the non-empty tensors and the largest magnitude ``max |x|`` of each; no host read.

    One ``torch._foreach_norm(..., inf)`` launch for all of them (a ``vector_norm`` per tensor where the
    foreach kernel does not apply); each value is a 0-d tensor, NaN / inf when its tensor holds one (the
    infinity norm propagates both), so one finiteness read per tensor tells which input was bad.
    """
    kept = [k for k, t in zip(keys, tensors, strict=True) if t.numel()]
    values = [(t.detach() if t.requires_grad else t) for t in tensors if t.numel()]
    if not values:
        return [], []
    try:
        return kept, list(torch._foreach_norm(values, math.inf))
    except (RuntimeError, TypeError, AttributeError, NotImplementedError):  # integer-like or mixed devices
        return kept, [torch.linalg.vector_norm(v.float() if not v.is_floating_point() else v, math.inf)
                      for v in values]


def _loss(outputs: Any) -> torch.Tensor | None:
    """The loss in the ``outputs`` of ``on_train_batch_end`` under automatic optimisation, or ``None``.

    Lightning's detached copy of the ``training_step`` loss (``ClosureResult.loss``): divided by
    ``accumulate_grad_batches`` and never multiplied by a GradScaler's scale, so it is finite exactly when the
    micro-batch's loss was. ``None`` when ``training_step`` returned none (the batch was skipped).
    """
    loss = outputs.get("loss") if isinstance(outputs, dict) else None
    return loss if isinstance(loss, torch.Tensor) else None


def _micro_values(micro: _MicroBatch) -> list[torch.Tensor]:
    """The 0-d device values of a micro-batch whose finiteness is read: its loss, then its inputs' ``max |x|``."""
    if micro.input_extremes is None:
        return [] if micro.loss is None else [micro.loss]
    return ([micro.loss] if micro.loss is not None else []) + list(micro.input_extremes)


def _input_ok(micro: _MicroBatch, input_bad: int) -> bool | None:
    return None if micro.input_extremes is None else not input_bad


def _inputs_ok(micros: list[_MicroBatch], input_bad: list[int]) -> bool | None:
    """Whether the inputs of all ``micros`` were finite (``None`` when none was checked)."""
    checked = [not bad for m, bad in zip(micros, input_bad, strict=True) if m.input_extremes is not None]
    return all(checked) if checked else None


def _step_flags(micros: list[_MicroBatch], parts: Any, device: torch.device) -> torch.Tensor:
    """``[loss_bad per micro-batch, input_bad per micro-batch, grads_bad]`` as 0/1 int32 on ``device`` (no read)."""
    zero = torch.zeros((), dtype=torch.int32, device=device)

    def bad(values: Sequence[torch.Tensor]) -> torch.Tensor:
        if not values:
            return zero
        return (~torch.isfinite(torch.stack([v.reshape(()).float().to(device) for v in values]))).any().to(torch.int32)

    loss = [zero if m.loss is None else bad([m.loss]) for m in micros]
    inputs = [bad(m.input_extremes or []) for m in micros]
    return torch.stack([*loss, *inputs, bad(list(parts)) if parts else zero])


def _finite_flags(values: Sequence[torch.Tensor]) -> list[bool]:
    """Finiteness of each 0-d tensor in ``values`` (one stack, one device-to-host copy)."""
    if not values:
        return []
    try:  # 0-d values on one device (the common case): one op, whatever their floating dtypes
        stacked = torch.stack(list(values))
    except RuntimeError:  # other shapes, or on different devices
        stacked = torch.stack([v.reshape(()).float().to(values[0].device) for v in values])
    finite = torch.isfinite(stacked)
    if bool(finite.all()):  # the common case: one read
        return [True] * len(values)
    return finite.cpu().tolist()


def _nonfinite_keys(batch: Any) -> list[str]:
    """Keys of the floating-point tensors of ``batch`` that hold NaN/inf (rare path: reads the device)."""
    keys, tensors = float_tensors(batch)
    if not tensors:
        return []
    finite = torch.stack([torch.isfinite(t).all().to(tensors[0].device) for t in tensors]).cpu().tolist()
    return [k for k, ok in zip(keys, finite, strict=True) if not ok]


def _sample_flags(batch: Mapping) -> list[bool]:
    """Per sample of ``batch``: does any of its floating-point tensors hold NaN/inf (rare path: reads the device)."""
    _, tensors = float_tensors(batch)
    n = None
    bad: torch.Tensor | None = None
    for value in tensors:
        if value.dim() == 0:
            continue
        if n is None:
            n = value.shape[0]
        if value.shape[0] != n:
            continue
        per_sample = ~torch.isfinite(value.detach()).reshape(n, -1).all(dim=1)
        bad = per_sample if bad is None else (bad | per_sample.to(bad.device))
    return [] if bad is None else [bool(b) for b in bad.cpu().tolist()]
