"""AMP loss scale: the ``torch.amp.GradScaler`` scale, its growth and back-off events, skipped steps.

No device work and no host read on an ordinary step. ``GradScaler.step`` runs ``optimizer.step()`` only when
the unscaled gradients were finite, and ``GradScaler.update()`` then multiplies the scale by
``backoff_factor`` (< 1) exactly when the step was skipped, and by ``growth_factor`` after
``growth_interval`` clean steps in a row (PyTorch ``torch/amp/grad_scaler.py``, ``_amp_update_scale_``). So:

- a skipped step is seen on the host from the optimizer's own step hook
  (``Optimizer.register_step_post_hook``): it did not fire between ``on_before_optimizer_step`` and
  ``on_train_batch_end``. An optimizer that unscales inside its ``step()`` (fused,
  ``_step_supports_amp_scaling``) always runs it: then the scaler's own ``found_inf`` tensor for that step
  (``optimizer.found_inf``, set by ``GradScaler.step``) is kept and read at the next log step;
- back-off and growth events follow from the skipped steps by the rule above, replayed on the host from
  the scale and growth tracker at the start of training; at each log step the scaler's scale and growth
  tracker are read (in the one copy of the log step, :mod:`~cropscale.callbacks._readout`) and the replay
  is set back to them if they differ (a scale set by hand, ``update(new_scale)``).

Skipped steps split into *overflow* skips (every micro-batch loss was finite: the FP16 gradients, or the
loss once multiplied by the scale, overflowed) and skips with a non-finite loss (a bad batch, which
:class:`~cropscale.callbacks.NonFiniteCallback` counts as such). The losses are the ones Lightning hands to
``on_train_batch_end`` (detached, *before* scaling: ``on_before_backward`` receives the scaled loss under
fp16, and a finite loss of 1e37 becomes inf there); references are kept, and only those of skipped steps
are read, at the log step.

Lightning steps LR schedulers with ``interval: step`` even when the scaler skipped the optimizer step
(Lightning issues #5558, #16228), so the schedule drifts. What the schedulers really did is counted:
the sum of their ``last_epoch`` is read (host integers, no device work) before the optimizer step
(``on_before_optimizer_step``) and after Lightning's scheduler step (``on_train_batch_end``); the
difference on a skipped step is its drift (``lr_scheduler_steps_on_skipped``). With ``frequency: 2``
a scheduler steps on every other optimizer step only, and a skipped step between two of its steps
adds no drift.

Under ``bf16-mixed``, FP32 or any precision without a scaler the callback records once that no
scaler is in use and does nothing per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from cropscale.callbacks._grads import grad_scaler
from cropscale.callbacks._logging import log_metrics
from cropscale.callbacks._readout import read_later, read_values
from cropscale.callbacks.base import ScalingCallback, resumed_epoch
from cropscale.runs.schema import LossScaleEpoch, LossScaleSummary

_COUNTS = ("steps", "backoff_events", "growth_events", "skipped_steps", "overflow_skips", "nonfinite_loss_skips",
           "lr_scheduler_steps_on_skipped")


class LossScaleCallback(ScalingCallback):
    """Counts GradScaler growth and back-off events and skipped optimizer steps, without a per-step sync.

    Logged (TensorBoard, at log steps): ``amp/loss_scale``, ``amp/backoff_events``,
    ``amp/growth_events``, ``amp/skipped_steps``, ``amp/overflow_skips``,
    ``amp/lr_scheduler_steps_on_skipped`` (cumulative counts over the run). Whether a scaler is in use is
    ``run.json`` ``summary.loss_scale.scaler_in_use`` and a setting of the HPARAMS tab, not a scalar (a constant
    scalar would be one dot on TensorBoard's first screen).

    Counts are global: DDP ranks share one scale (the scaler's inf check sees all-reduced gradients),
    so rank 0's counts stand for the run. ``state_dict`` keeps the counts (read from the device when
    a checkpoint is saved), so a resumed run continues them, and inside an epoch the counts at its start, so that
    an epoch resumed from a mid-epoch checkpoint counts each step once. From a checkpoint at an epoch's last batch
    end Lightning goes on with the next epoch without that epoch's ``on_train_epoch_end``: ``on_train_start``
    closes the resumed epoch's record with its counts up to the checkpoint.

    No arguments: the scaler is the precision plugin's (``trainer.precision_plugin.scaler``); under ``32-true`` and
    ``bf16-mixed`` the callback records that none is in use and does nothing per step.

    Example::

        from lightning.pytorch import Trainer
        from cropscale.callbacks import LossScaleCallback

        trainer = Trainer(precision="16-mixed", callbacks=[LossScaleCallback()])

        # command line: the preset's settings replace the member of configs/default.yaml's CallbackGroup
        #   python -m cropscale fit --config configs/precision/amp_fp16.yaml --config callbacks/loss_scale.yaml
    """

    summary_key = "loss_scale"

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(_COUNTS, 0)
        self.epochs: list[LossScaleEpoch] = []
        self._scaler: Any = None
        self._reason: str | None = None
        self._precision: str | None = None
        self._config: dict[str, Any] = {}
        self._pending: list[_Step] = []
        self._losses: list[torch.Tensor] = []  # the current optimizer step's micro-batch losses (references)
        self._hooks: list[Any] = []  # the optimizers' step post-hook handles
        self._ran = False  # an optimizer's step() ran since on_before_optimizer_step
        self._found_inf: torch.Tensor | None = None  # fused optimizers: the scaler's found_inf of the step
        self._fused = False
        self._replay: tuple[float, int] | None = None  # (scale, growth tracker) after the last resolved step
        self._schedulers: list[Any] = []
        self._sched_before = 0
        self._stepped = False
        self._last_scale: float | None = None
        self._initial_scale: float | None = None
        self._epoch_start_counts: dict[str, int] = dict(self.counts)
        self._epoch_now: int | None = None  # the epoch of the last counted step
        self._resumed_in_epoch: dict[str, Any] | None = None

    # ------------------------------------------------------------------ state
    @override
    def state_dict(self) -> dict[str, Any]:
        self._flush()
        state = {"counts": dict(self.counts), "epochs": [e.to_json() for e in self.epochs],
                 "last_scale": self._last_scale, "initial_scale": self._initial_scale}
        if self._epoch_now is not None and self.counts["steps"] != self._epoch_start_counts.get("steps", 0):
            # a checkpoint inside an epoch: the counts at its start, so that its record counts each step once
            state["in_epoch"] = {"epoch": self._epoch_now, "start_counts": dict(self._epoch_start_counts)}
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.counts.update({k: int(v) for k, v in state_dict.get("counts", {}).items()})
        self.epochs = [LossScaleEpoch.from_json(e) for e in state_dict.get("epochs", [])]
        self._last_scale = state_dict.get("last_scale")
        self._initial_scale = state_dict.get("initial_scale")
        self._resumed_in_epoch = state_dict.get("in_epoch")

    @override
    def wants_hook(self, hook: str) -> bool:
        if hook in ("on_before_backward", "on_after_backward", "on_before_zero_grad"):
            return False
        return self._scaler is not None  # nothing to do per step without a GradScaler

    # ------------------------------------------------------------------ hooks
    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._precision = str(trainer.precision)
        self._scaler = grad_scaler(trainer)
        self._pending, self._losses = [], []
        self._schedulers = [cfg.scheduler for cfg in trainer.lr_scheduler_configs
                            if getattr(cfg, "interval", "epoch") == "step"]
        if self._scaler is None or not getattr(self._scaler, "is_enabled", lambda: True)():
            self._scaler = None
            self._reason = (
                f"precision={self._precision}: no GradScaler in use (FP16 loss scaling only applies to 16-mixed)"
            )
            rank_zero_info(f"LossScaleCallback: {self._reason}")
        else:
            self._reason = None
            s = self._scaler
            self._config = {
                "growth_factor": float(s.get_growth_factor()),
                "backoff_factor": float(s.get_backoff_factor()),
                "growth_interval": int(s.get_growth_interval()),
            }
            self._replay = _scaler_state(s)  # one read at the start of training, none if the scale is not made yet
            if self._initial_scale is None:
                self._initial_scale = self._replay[0]
            self._fused = any(getattr(o, "_step_supports_amp_scaling", False) for o in trainer.optimizers)
            self._hooks = [o.register_step_post_hook(self._on_optimizer_step) for o in trainer.optimizers]
        self._start_log_schedule(trainer)
        self._epoch_start_counts = dict(self.counts)
        resumed, over = resumed_epoch(self._resumed_in_epoch, trainer)
        self._resumed_in_epoch = None
        if self._scaler is not None and resumed is not None:
            # the record of the resumed epoch counts from its start, before the checkpoint
            self._epoch_start_counts = {k: int(v) for k, v in resumed["start_counts"].items()}
            if over:  # its record closes here with its counts up to the checkpoint
                self._close_epoch(trainer, int(resumed["epoch"]))

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The optimizer's step post hook: its ``step()`` ran (the scaler did not skip it, unless fused)."""
        self._ran = True
        if self._fused:
            self._found_inf = getattr(optimizer, "found_inf", None)

    @override
    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        self._stepped = True
        self._ran = False
        self._found_inf = None
        self._sched_before = _scheduler_steps(self._schedulers)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._scaler is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else None
        if isinstance(loss, torch.Tensor):
            self._losses.append(loss)
        if not self._step_done():
            return
        log_now = self._count_step()
        self._epoch_now = trainer.current_epoch
        losses, self._losses = self._losses, []
        if losses:  # no loss: training_step returned None, Lightning neither steps nor updates the scaler
            skipped = None if self._fused else not self._ran
            self._pending.append(_Step(skipped, self._found_inf, losses,
                                       _scheduler_steps(self._schedulers) - self._sched_before))
        if log_now:
            self._flush(then=lambda: log_metrics(trainer, self._metrics()))

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._scaler is None:
            return
        self._close_epoch(trainer, trainer.current_epoch)

    def _close_epoch(self, trainer: Trainer, epoch: int) -> None:
        """Append ``epoch``'s record (the counts since its start), log the counts and start the next epoch's."""
        self._flush()
        self.epochs.append(LossScaleEpoch(
            epoch=epoch,
            **{k: self.counts[k] - self._epoch_start_counts.get(k, 0) for k in _COUNTS},
            loss_scale_end=self._last_scale,
        ))
        self._epoch_start_counts = dict(self.counts)
        log_metrics(trainer, self._metrics())

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._flush()
        self._remove_hooks()

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._remove_hooks()

    def _remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    # ------------------------------------------------------------------ resolution
    def _flush(self, then: Any = None) -> None:
        """Resolve the pending steps, then call ``then()``: one device-to-host copy (shared in a group).

        Read: the scaler's scale and growth tracker, the ``found_inf`` of fused steps, and the losses of the
        steps that were skipped (or, fused, may have been).
        """
        scaler = self._scaler
        if not self._pending or scaler is None or getattr(scaler, "_scale", None) is None:
            if then is not None:
                then()
            return
        pending, self._pending = self._pending, []
        tensors = [scaler._scale, scaler._growth_tracker]  # 0-d
        tensors += [st.found_inf for st in pending if st.skipped is None and st.found_inf is not None]
        tensors += [loss for st in pending if st.skipped is not False for loss in st.losses]

        def resolve(host: list[float]) -> None:
            self._count(pending, host)
            if then is not None:
                then()

        read_later(tensors, resolve)

    def _count(self, pending: list[_Step], host: list[float]) -> None:
        scale_now, tracker_now = host[0], int(host[1])
        values = iter(host[2:])
        found = [next(values) > 0 if st.skipped is None and st.found_inf is not None else st.skipped
                 for st in pending]
        scale, tracker = self._replay if self._replay is not None else (scale_now, tracker_now)
        growth, backoff = self._config["growth_factor"], self._config["backoff_factor"]
        interval = self._config["growth_interval"]
        for st, skipped in zip(pending, found, strict=True):
            losses_ok = all(math.isfinite(next(values)) for _ in st.losses) if st.skipped is not False else True
            self.counts["steps"] += 1
            if skipped:  # found_inf: the step was skipped and update() backed off
                self.counts["backoff_events"] += 1
                self.counts["skipped_steps"] += 1
                self.counts["overflow_skips" if losses_ok else "nonfinite_loss_skips"] += 1
                self.counts["lr_scheduler_steps_on_skipped"] += st.scheduler_steps
                scale, tracker = _f32(scale * backoff), 0
            elif tracker + 1 == interval:
                grown = _f32(scale * growth)
                if math.isfinite(grown):
                    scale = grown
                    self.counts["growth_events"] += 1
                tracker = 0
            else:
                tracker += 1
        if (scale, tracker) != (scale_now, tracker_now):  # the scale was set from outside: follow the scaler
            scale, tracker = scale_now, tracker_now
        self._replay = (scale, tracker)
        self._last_scale = scale_now

    def _metrics(self) -> dict[str, float | None]:
        return {
            "amp/loss_scale": self._last_scale,
            "amp/backoff_events": self.counts["backoff_events"],
            "amp/growth_events": self.counts["growth_events"],
            "amp/skipped_steps": self.counts["skipped_steps"],
            "amp/overflow_skips": self.counts["overflow_skips"],
            "amp/lr_scheduler_steps_on_skipped": self.counts["lr_scheduler_steps_on_skipped"],
        }

    # ------------------------------------------------------------------ summary
    @override
    def summary(self) -> LossScaleSummary:
        if self._scaler is None:
            return LossScaleSummary(precision=self._precision, scaler_in_use=False, reason=self._reason)
        return LossScaleSummary(
            precision=self._precision, scaler_in_use=True, **self._config, initial_scale=self._initial_scale,
            final_scale=self._last_scale, **self.counts, epochs=list(self.epochs),
        )


@dataclass(slots=True)
class _Step:
    """One pending optimizer step: skipped (host, ``None`` when only ``found_inf`` knows), its losses, drift."""

    skipped: bool | None
    found_inf: torch.Tensor | None
    losses: list[torch.Tensor]
    scheduler_steps: int


def _scaler_state(scaler: Any) -> tuple[float, int]:
    """The scaler's (scale, growth tracker): host values before its first ``scale()``, else one read."""
    if getattr(scaler, "_scale", None) is None:
        return float(scaler._init_scale), int(scaler._init_growth_tracker)
    scale, tracker = read_values([scaler._scale, scaler._growth_tracker])
    return scale, int(tracker)


def _f32(x: float) -> float:
    """``x`` rounded to float32, as the scaler's scale tensor holds it."""
    return float(np.float32(x))


def _scheduler_steps(schedulers: list[Any]) -> int:
    """Steps taken so far by ``schedulers``: the sum of their ``last_epoch`` (host integers)."""
    return sum(int(getattr(s, "last_epoch", 0)) for s in schedulers)
