"""Total gradient norm before clipping, after AMP unscaling, global across ranks; fraction of steps clipped.

Measured in ``on_before_optimizer_step``: Lightning calls it after ``scaler.unscale_`` (16-mixed) and
before gradient clipping (``plugins/precision/amp.py``), so the gradients are unscaled and unclipped.
Optimizers that unscale inside ``step()`` (fused, ``_step_supports_amp_scaling``) skip the explicit
``unscale_``; the norm is then divided by the scale on the device.

Global across ranks: under DDP every rank holds the all-reduced gradients, so the local norm is the
global one. Under sharded strategies the local ``sum |g|^p`` of the *sharded* gradients is all-reduced
over their *shard* group only (a device-side collective, no host sync): FSDP flat parameters over the
FSDP process group (under ``HYBRID_SHARD`` the intra-node shard group, not the replicas), FSDP2 / tensor
parallel DTensors over the mesh dimensions they are ``Shard``-ed on; replicated parameters and DeepSpeed
ZeRO-1 gradients are whole on every rank and are not added up again
(:class:`~cropscale.callbacks._grads.ShardLayout`). The per-step norms stay on the device and are read
at log steps, in one device-to-host copy with the other callbacks' values
(:mod:`~cropscale.callbacks._readout`).

When Lightning clips by norm (``gradient_clip_val`` with ``gradient_clip_algorithm="norm"``, the default
configuration) the 2-norm is the one the clipping computes anyway (``torch.nn.utils.clip_grad_norm_``
returns the total norm before clipping, after unscaling; :class:`~cropscale.callbacks._grads.ClipNormTap`
keeps it): no device work of the callback's own per step. Not under FSDP, DeepSpeed or a precision plugin
that clips its own way, nor for another ``norm_type``: the callback then reduces the gradients itself (one
``torch._foreach_norm`` per step, or the sharded reduction above); the attribute ``norm_source`` says
which.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from typing_extensions import override

from cropscale.callbacks._grads import (
    REPLICATED,
    WORLD,
    ClipNormTap,
    GradNormParts,
    ShardLayout,
    clear_grad_norm_cache,
    clip_norm_tap,
    grad_norm_parts,
    grad_scaler,
    norms_tensor,
    release_clip_tap,
    scale_tensor,
    shard_layout,
    trainable_params,
)
from cropscale.callbacks._logging import log_metrics
from cropscale.callbacks._readout import read_later
from cropscale.callbacks.base import ScalingCallback, resumed_epoch
from cropscale.errors import CropScaleError
from cropscale.numbers import median_p95
from cropscale.runs.schema import GradNormEpoch, GradNormSummary


class GradNormCallback(ScalingCallback):
    """Records the total gradient norm of every optimizer step and how often clipping bites.

    Args:
        norm_type: the norm (2.0 = L2, ``float("inf")`` = max-abs).
        clip_val: threshold for "clipped"; ``None`` takes ``trainer.gradient_clip_val`` when the
            trainer clips by norm (``gradient_clip_algorithm="norm"``).
        sharded: ``None`` (default) reads the gradient layout from the strategy; ``True`` forces every
            plain gradient to count as a disjoint shard over all ranks; ``False`` forces the local norm.

    Logged (TensorBoard): at log steps ``numerics/grad_norm`` (mean over the interval),
    ``numerics/grad_norm_max``, ``numerics/grad_clip_fraction``; at epoch end
    ``numerics/epoch/grad_norm_median``, ``numerics/epoch/grad_norm_p95``,
    ``numerics/epoch/grad_clip_fraction``. Non-finite norms (AMP overflow, bad batches) are counted
    apart (``nonfinite_steps``) and left out of the statistics.

    ``state_dict`` keeps the counts and per-epoch summaries, and inside an epoch its steps so far (norms, clipped
    and non-finite counts), so that an epoch resumed from a mid-epoch checkpoint counts each step once. From a
    checkpoint at an epoch's last batch end Lightning goes on with the next epoch without that epoch's
    ``on_train_epoch_end``: ``on_train_start`` closes the resumed epoch's record with its saved steps.

    Example::

        from lightning.pytorch import Trainer
        from cropscale.callbacks import GradNormCallback

        # clipping by norm: the callback keeps the norm the clipping computes (no device work of its own)
        trainer = Trainer(gradient_clip_val=1.0, callbacks=[GradNormCallback()])

        # command line: the preset's settings replace the member of configs/default.yaml's CallbackGroup
        #   python -m cropscale fit --config callbacks/grad_norm.yaml
    """

    summary_key = "grad_norm"

    def __init__(self, norm_type: float = 2.0, clip_val: float | None = None, sharded: bool | None = None) -> None:
        if not (norm_type > 0):
            raise CropScaleError(f"GradNormCallback(norm_type={norm_type}): must be > 0")
        if clip_val is not None and clip_val <= 0:
            raise CropScaleError(f"GradNormCallback(clip_val={clip_val}): must be > 0 or None")
        self.norm_type = float(norm_type)
        self.clip_val = clip_val
        self.sharded = sharded
        self.steps = 0
        self.clipped_steps = 0
        self.nonfinite_steps = 0
        self.epochs: list[GradNormEpoch] = []
        self._params: list[torch.nn.Parameter] = []
        self._layout: ShardLayout = REPLICATED
        self._threshold: float | None = None
        self._threshold_reason: str | None = None
        self._scaler: Any = None
        self._tap: ClipNormTap | None = None
        self._tap_seen = 0
        self.norm_source = "not measured yet"  # where the norms come from (the clipping's, or computed)
        self._norms: list[tuple[list[torch.Tensor], torch.Tensor | None]] = []
        self._epoch_norms: list[float] = []
        self._epoch_now: int | None = None
        self._resumed_in_epoch: dict[str, Any] | None = None
        self._epoch_clipped = 0
        self._epoch_nonfinite = 0
        self._unlogged: list[float] = []  # norms read by a checkpoint between two log steps: the next interval's
        self._stepped = False

    @override
    def state_dict(self) -> dict[str, Any]:
        self._flush()
        state = {"steps": self.steps, "clipped_steps": self.clipped_steps, "nonfinite_steps": self.nonfinite_steps,
                 "epochs": [e.to_json() for e in self.epochs]}
        if self._epoch_norms or self._epoch_nonfinite:  # a checkpoint inside an epoch: its steps so far
            state["in_epoch"] = {"epoch": self._epoch_now, "norms": list(self._epoch_norms),
                                 "clipped": self._epoch_clipped, "nonfinite": self._epoch_nonfinite}
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps = int(state_dict.get("steps", 0))
        self.clipped_steps = int(state_dict.get("clipped_steps", 0))
        self.nonfinite_steps = int(state_dict.get("nonfinite_steps", 0))
        self.epochs = [GradNormEpoch.from_json(e) for e in state_dict.get("epochs", [])]
        self._resumed_in_epoch = state_dict.get("in_epoch")

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._params = trainable_params(pl_module)
        clear_grad_norm_cache()
        if self.sharded is None:
            self._layout = shard_layout(trainer)
        else:
            self._layout = WORLD if self.sharded else REPLICATED
        self._scaler = grad_scaler(trainer)
        self._norms = []
        self._tap, reason = None, "norm_type is not 2"
        if self.norm_type == 2.0 and not self._layout.sharded and self._layout.kind != "unsupported":
            self._tap, reason = clip_norm_tap(trainer, pl_module)
        self._tap_seen = self._tap.calls if self._tap is not None else 0
        self.norm_source = ("the gradient clipping's total norm (torch.nn.utils.clip_grad_norm_)" if self._tap
                             else f"computed by the callback ({reason})")
        if self.clip_val is not None:
            self._threshold, self._threshold_reason = float(self.clip_val), None
        elif trainer.gradient_clip_val and _algorithm(trainer.gradient_clip_algorithm) == "norm":
            self._threshold, self._threshold_reason = float(trainer.gradient_clip_val), None
        else:
            self._threshold = None
            self._threshold_reason = ("no gradient clipping by norm configured (trainer.gradient_clip_val unset "
                                      "or gradient_clip_algorithm='value')")
        self._epoch_norms, self._epoch_clipped, self._epoch_nonfinite = [], 0, 0
        resumed, over = resumed_epoch(self._resumed_in_epoch, trainer)
        self._resumed_in_epoch = None
        if resumed is not None:
            # the steps before the checkpoint count once in the record of their epoch
            self._epoch_norms = [float(v) for v in resumed.get("norms", [])]
            self._epoch_clipped, self._epoch_nonfinite = int(resumed["clipped"]), int(resumed["nonfinite"])
            if over:  # its record closes here with its saved steps
                self._close_epoch(trainer, int(resumed["epoch"]))
        self._start_log_schedule(trainer)

    @override
    def wants_hook(self, hook: str) -> bool:
        if hook == "on_before_optimizer_step" and self._tap is not None:
            return False  # the clipping's norm, taken in on_train_batch_end
        return self._layout.kind != "unsupported"  # gradients outside p.grad: nothing to measure per step

    @override
    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        if self._tap is not None:  # the clipping's norm comes after this hook: taken in on_train_batch_end
            return
        self._stepped = True
        self._epoch_now = trainer.current_epoch
        parts = grad_norm_parts(trainer, self._params, optimizer, self._gstep, norm_type=self.norm_type,
                                sharded=self._layout)
        if parts is None:
            return
        scale = None
        if self._scaler is not None and getattr(optimizer, "_step_supports_amp_scaling", False):
            scale = scale_tensor(self._scaler)  # gradients still scaled: divide at read time
            scale = None if scale is None else scale.detach().clone()
        self._norms.append((parts, scale))

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        tap = self._tap
        if tap is not None:  # clipping runs once per optimizer step: a new norm is a new step
            if tap.calls == self._tap_seen:
                return
            self._tap_seen = tap.calls
            self._norms.append((GradNormParts([tap.last]), None))
            self._epoch_now = trainer.current_epoch  # a checkpoint inside this epoch carries its steps so far
        elif not self._stepped:
            return
        self._stepped = False
        if self._count_step():
            self._flush(then=lambda interval: self._log_interval(trainer, interval))

    def _log_interval(self, trainer: Trainer, interval: list[float]) -> None:
        finite = list(filter(math.isfinite, interval))
        metrics: dict[str, float | None] = {}
        if finite:
            metrics["numerics/grad_norm"] = sum(finite) / len(finite)
            metrics["numerics/grad_norm_max"] = max(finite)
            if self._threshold is not None:
                metrics["numerics/grad_clip_fraction"] = sum(map(self._threshold.__lt__, finite)) / len(finite)
        log_metrics(trainer, metrics)

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close_epoch(trainer, trainer.current_epoch)

    def _close_epoch(self, trainer: Trainer, epoch: int) -> None:
        """Append ``epoch``'s record from its steps so far, log its figures and start the next epoch's counts."""
        self._flush()
        self._unlogged = []  # the epoch's last steps are in its epoch figures
        norms = self._epoch_norms
        stats = median_p95(norms)
        frac = (self._epoch_clipped / len(norms)) if (norms and self._threshold is not None) else None
        self.epochs.append(GradNormEpoch(
            epoch=epoch, steps=len(norms) + self._epoch_nonfinite,
            grad_norm_median=stats["median"], grad_norm_p95=stats["p95"],
            grad_norm_max=max(norms) if norms else None,
            clipped_steps=self._epoch_clipped if self._threshold is not None else None,
            clip_fraction=frac, nonfinite_steps=self._epoch_nonfinite,
        ))
        log_metrics(trainer, {"numerics/epoch/grad_norm_median": stats["median"],
                              "numerics/epoch/grad_norm_p95": stats["p95"],
                              "numerics/epoch/grad_clip_fraction": frac})
        self._epoch_norms, self._epoch_clipped, self._epoch_nonfinite = [], 0, 0

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._flush()
        release_clip_tap(trainer)

    @override
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        release_clip_tap(trainer)

    def _flush(self, then: Any = None) -> None:
        """Read the pending norms and update the counts, then ``then(values)`` (one device-to-host copy).

        ``values`` are the norms read since the last ``then``: those read without one (a checkpoint between two
        log steps) come first. Nothing pending: nothing is read and ``then`` is not called.

        Through :func:`~cropscale.callbacks._readout.read_later`: inside a group's ``on_train_batch_end`` the
        copy is shared with the other members and happens at the end of the hook, else now.
        """
        if not self._norms:  # nothing new since the last read (the hooks flush with ``then`` after a new norm)
            return
        pending, self._norms = self._norms, []
        scales = [s for _, s in pending if s is not None]
        norms = norms_tensor([parts for parts, _ in pending], self.norm_type)

        def resolve(host: list[float]) -> None:
            values = self._count(host[len(scales):], host[:len(scales)], pending)
            if then is None:  # read for a checkpoint between log steps: logged with the next interval
                self._unlogged += values
            else:
                carried, self._unlogged = self._unlogged, []
                then(carried + values)

        read_later(scales, resolve, [norms])

    def _count(self, values: list[float], scales: list[float], pending: list[tuple[Any, Any]]) -> list[float]:
        if scales:  # fused optimizers: gradients were still scaled, divide by the scale
            host_scales = iter(scales)
            values = [v / next(host_scales) if s is not None else v for v, (_, s) in zip(values, pending, strict=True)]
        finite = list(filter(math.isfinite, values))  # host work in C calls: a log step reads 50 steps or more
        bad = len(values) - len(finite)
        self.steps += len(values)
        self.nonfinite_steps += bad
        self._epoch_nonfinite += bad
        self._epoch_norms += finite
        if self._threshold is not None:
            clipped = sum(map(self._threshold.__lt__, finite))
            self.clipped_steps += clipped
            self._epoch_clipped += clipped
        return values

    @override
    def summary(self) -> GradNormSummary:
        finite_steps = self.steps - self.nonfinite_steps
        return GradNormSummary(
            norm_type=self.norm_type,
            sharded_reduction=self._layout.sharded,
            sharding=self._layout.kind,
            sharding_reason=self._layout.reason,
            clip_threshold=self._threshold,
            clip_threshold_reason=self._threshold_reason,
            steps=self.steps,
            nonfinite_steps=self.nonfinite_steps,
            clipped_steps=self.clipped_steps if self._threshold is not None else None,
            clip_fraction=(
                (self.clipped_steps / finite_steps) if (finite_steps and self._threshold is not None) else None
            ),
            epochs=list(self.epochs),
        )


def _algorithm(value: Any) -> str:
    """``"norm"`` or ``"value"`` from Lightning's ``GradClipAlgorithmType`` enum, a string or ``None``."""
    if value is None:
        return "norm"
    return str(getattr(value, "value", value)).lower()
