"""AMP loss scale: the ``torch.amp.GradScaler`` scale, its growth and back-off events, skipped steps.

Detection without a host sync per step: after every optimizer step the scaler's scale tensor is
copied on its device (``scale.clone()``, one device op); the copies and each step's loss-finiteness
flag are read at log steps, once. ``GradScaler.update()`` multiplies the scale by
``backoff_factor`` (< 1) exactly when ``scaler.step`` skipped the optimizer step because the
unscaled gradients held inf/NaN, and by ``growth_factor`` after ``growth_interval`` clean steps
(PyTorch ``torch/amp/grad_scaler.py``, ``_amp_update_scale_``). So a decrease of the scale between
two steps is one back-off event and one skipped step, an increase is one growth event.

Skipped steps split into *overflow* skips (every micro-batch loss was finite: the FP16 gradients, or the
loss once multiplied by the scale, overflowed) and skips with a non-finite loss (a bad batch, which
:class:`~cropscale.callbacks.NonFiniteCallback` counts as such). The losses are judged *before* scaling
(:func:`~cropscale.callbacks._grads.watch_unscaled_loss`): ``on_before_backward`` receives the scaled
loss under fp16, and a finite loss of 1e37 becomes inf there.

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

from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from cropscale.callbacks._grads import grad_scaler, scale_tensor, unwatch_unscaled_loss, watch_unscaled_loss
from cropscale.callbacks._logging import log_metrics
from cropscale.callbacks.base import ScalingCallback
from cropscale.runs.schema import LossScaleEpoch, LossScaleSummary

_COUNTS = ("steps", "backoff_events", "growth_events", "skipped_steps", "overflow_skips", "nonfinite_loss_skips",
           "lr_scheduler_steps_on_skipped")


class LossScaleCallback(ScalingCallback):
    """Counts GradScaler growth and back-off events and skipped optimizer steps, without a per-step sync.

    Logged (TensorBoard, at log steps): ``amp/loss_scale``, ``amp/backoff_events``,
    ``amp/growth_events``, ``amp/skipped_steps``, ``amp/overflow_skips``,
    ``amp/lr_scheduler_steps_on_skipped`` (cumulative counts over the run); ``amp/scaler_in_use``
    (0 or 1) once at the start of training.

    Counts are global: DDP ranks share one scale (the scaler's inf check sees all-reduced gradients),
    so rank 0's counts stand for the run. ``state_dict`` keeps the counts (read from the device when
    a checkpoint is saved), so a resumed run continues them.
    """

    summary_key = "loss_scale"

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(_COUNTS, 0)
        self.epochs: list[LossScaleEpoch] = []
        self._scaler: Any = None
        self._reason: str | None = None
        self._precision: str | None = None
        self._config: dict[str, Any] = {}
        self._scales: list[torch.Tensor] = []  # scale before the first pending step, then after each step
        self._loss_ok: list[torch.Tensor] = []  # per pending step: all micro-batch losses finite
        self._micro_ok: list[torch.Tensor] = []
        self._sched_steps: list[int] = []  # per pending step: scheduler steps taken after it (host ints)
        self._schedulers: list[Any] = []
        self._sched_before = 0
        self._stepped = False
        self._last_scale: float | None = None
        self._initial_scale: float | None = None
        self._epoch_start_counts: dict[str, int] = dict(self.counts)

    # ------------------------------------------------------------------ state
    @override
    def state_dict(self) -> dict[str, Any]:
        self._flush()
        return {"counts": dict(self.counts), "epochs": [e.to_json() for e in self.epochs],
                "last_scale": self._last_scale, "initial_scale": self._initial_scale}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.counts.update({k: int(v) for k, v in state_dict.get("counts", {}).items()})
        self.epochs = [LossScaleEpoch.from_json(e) for e in state_dict.get("epochs", [])]
        self._last_scale = state_dict.get("last_scale")
        self._initial_scale = state_dict.get("initial_scale")

    @override
    def wants_hook(self, hook: str) -> bool:
        return self._scaler is not None  # nothing to do per step without a GradScaler

    # ------------------------------------------------------------------ hooks
    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._precision = str(trainer.precision)
        self._scaler = grad_scaler(trainer)
        self._scales, self._loss_ok, self._micro_ok, self._sched_steps = [], [], [], []
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
            watch_unscaled_loss(s, self._on_unscaled_loss)
        log_metrics(trainer, {"amp/scaler_in_use": 0.0 if self._scaler is None else 1.0})
        self._start_log_schedule(trainer)
        self._epoch_start_counts = dict(self.counts)

    def _on_unscaled_loss(self, loss: torch.Tensor) -> None:
        """The micro-batch loss before scaling: its finiteness flag (a device op, no read)."""
        self._micro_ok.append(torch.isfinite(loss.detach()).all())

    @override
    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        if self._scaler is None:
            return
        if not self._scales:  # the scale the pending steps start from (initialised by scaler.scale())
            scale = scale_tensor(self._scaler)
            if scale is not None:
                self._scales.append(scale.detach().clone())

    @override
    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        self._stepped = True
        self._sched_before = _scheduler_steps(self._schedulers)

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._stepped = False

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._scaler is None or not self._stepped or not self._scales:
            return
        log_now = self._count_step()
        scale = scale_tensor(self._scaler)
        self._scales.append(scale.detach().clone())
        micro = self._micro_ok
        self._loss_ok.append(micro[0] if len(micro) == 1 else torch.stack(micro).all())
        self._micro_ok = []
        self._sched_steps.append(_scheduler_steps(self._schedulers) - self._sched_before)
        if log_now:
            self._flush()
            log_metrics(trainer, self._metrics())

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._scaler is None:
            return
        self._flush()
        self.epochs.append(LossScaleEpoch(
            epoch=trainer.current_epoch,
            **{k: self.counts[k] - self._epoch_start_counts.get(k, 0) for k in _COUNTS},
            loss_scale_end=self._last_scale,
        ))
        self._epoch_start_counts = dict(self.counts)
        log_metrics(trainer, self._metrics())

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._flush()
        unwatch_unscaled_loss(self._scaler, self._on_unscaled_loss)

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        unwatch_unscaled_loss(self._scaler, self._on_unscaled_loss)

    # ------------------------------------------------------------------ resolution
    def _flush(self) -> None:
        """Read the pending scale copies (one device-to-host copy) and update the counts."""
        if len(self._scales) < 2:
            return
        scales = torch.stack(self._scales).double().cpu().tolist()
        loss_ok = torch.stack(self._loss_ok).cpu().tolist() if self._loss_ok else []
        if self._initial_scale is None:
            self._initial_scale = scales[0]
        for i, (before, after) in enumerate(zip(scales[:-1], scales[1:], strict=False)):
            ok = bool(loss_ok[i]) if i < len(loss_ok) else True
            self.counts["steps"] += 1
            if after < before:
                self.counts["backoff_events"] += 1
                self.counts["skipped_steps"] += 1
                self.counts["overflow_skips" if ok else "nonfinite_loss_skips"] += 1
                drift = self._sched_steps[i] if i < len(self._sched_steps) else 0
                self.counts["lr_scheduler_steps_on_skipped"] += drift
            elif after > before:
                self.counts["growth_events"] += 1
        self._last_scale = scales[-1]
        self._scales = [self._scales[-1]]
        self._loss_ok = []
        self._sched_steps = []

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


def _scheduler_steps(schedulers: list[Any]) -> int:
    """Steps taken so far by ``schedulers``: the sum of their ``last_epoch`` (host integers)."""
    return sum(int(getattr(s, "last_epoch", 0)) for s in schedulers)
