"""Gradient helpers shared by the gradient-norm and non-finite callbacks.

One total-norm computation per optimizer step (device tensors, cached), combined on the host at log
steps; the AMP scaler and its scale without a host sync; the trainable parameters; whether the strategy
shards gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer

from cropscale.callbacks._dist import dist_ready

_GRAD_NORM_CACHE: dict[str, Any] = {"key": None, "value": None}


class GradNormParts(list):
    """Device tensors whose norm is one step's total gradient norm (see :func:`grad_norm_parts`).

    ``total`` caches the host value once :func:`total_norms` has read it (shared by callbacks).
    """

    total: float | None = None


def clear_grad_norm_cache() -> None:
    """Forget the cached gradient norm (called at every ``on_train_batch_start``)."""
    _GRAD_NORM_CACHE["key"] = None
    _GRAD_NORM_CACHE["value"] = None


def is_sharded_strategy(trainer: Trainer) -> bool:
    """True when parameters (and gradients) are sharded across ranks (FSDP / model-parallel strategies)."""
    name = type(trainer.strategy).__name__
    if name in ("FSDPStrategy",):
        sharding = getattr(trainer.strategy, "sharding_strategy", None)
        return getattr(sharding, "name", "") != "NO_SHARD"
    return name in ("ModelParallelStrategy", "DeepSpeedStrategy")


def grad_norm_parts(
    trainer: Trainer,
    params: Sequence[torch.nn.Parameter],
    optimizer: Any,
    norm_type: float = 2.0,
    sharded: bool = False,
) -> GradNormParts | None:
    """Device tensors whose ``norm_type`` norm is the total gradient norm of ``params`` (no host sync).

    Without sharding: the per-parameter norms (one ``torch._foreach_norm`` launch, about 20 µs on a
    CPU); :func:`total_norms` combines them on the host at log steps. With ``sharded`` (FSDP: each
    rank holds a shard of every gradient) the local ``sum |g|^p`` (local max for ``inf``) is
    all-reduced over ranks, a device-side collective, and the single global norm is returned. DTensor
    gradients are reduced on their local shards. Computed once per optimizer step and shared by the
    callbacks that need it (gradient norm and non-finite checks). ``None`` when no parameter has a
    gradient.
    """
    key = (id(optimizer), trainer.global_step, float(norm_type), bool(sharded))
    if _GRAD_NORM_CACHE["key"] == key:
        return _GRAD_NORM_CACHE["value"]
    grads = [p.grad for p in params if p.grad is not None]
    value: GradNormParts | None
    if not grads:
        value = None
    else:
        if type(grads[0]) is not torch.Tensor:  # DTensor (FSDP2 / tensor parallel): local shards
            grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        if grads[0].requires_grad:  # backward(create_graph=True): keep the norms out of the graph
            grads = [g.detach() for g in grads]
        # no torch.no_grad() block: gradients are leaves that need no graph, and entering one costs about
        # 6 µs per step on a CPU (measured in a Lightning step of callback-bench's tiny model)
        try:
            parts = torch._foreach_norm(grads, norm_type)
        except (RuntimeError, TypeError, AttributeError):  # mixed devices/dtypes, no foreach kernel
            parts = [torch.linalg.vector_norm(g, norm_type) for g in grads]
        if sharded and dist_ready(trainer):
            local = torch.linalg.vector_norm(torch.stack([t.double() for t in parts]), norm_type)
            if math.isinf(norm_type):
                torch.distributed.all_reduce(local, op=torch.distributed.ReduceOp.MAX)
                value = GradNormParts([local])
            else:
                powered = local ** norm_type
                torch.distributed.all_reduce(powered, op=torch.distributed.ReduceOp.SUM)
                value = GradNormParts([powered ** (1.0 / norm_type)])
        else:
            value = GradNormParts(parts)
    _GRAD_NORM_CACHE["key"] = key
    _GRAD_NORM_CACHE["value"] = value
    return value


def total_norms(steps: Sequence[Sequence[torch.Tensor]], norm_type: float = 2.0) -> list[float]:
    """Total norm of each step from its :func:`grad_norm_parts` (one device-to-host copy for all steps).

    ``total = (sum_i part_i^p)^(1/p)``, or ``max_i part_i`` for ``p = inf``; NaN / inf propagate.
    """
    if not steps:
        return []
    cached = [getattr(parts, "total", None) for parts in steps]
    if all(c is not None for c in cached):  # another callback read these steps already
        return cached  # type: ignore[return-value]
    values = _total_norms(steps, norm_type)
    for parts, v in zip(steps, values, strict=True):
        if isinstance(parts, GradNormParts):
            parts.total = v
    return values


def _total_norms(steps: Sequence[Sequence[torch.Tensor]], norm_type: float) -> list[float]:
    tensors = [t for parts in steps for t in parts]
    width = len(steps[0])
    if width and all(len(parts) == width for parts in steps):
        try:  # the common case, vectorised: [steps, parts] -> one norm per row
            mat = torch.stack(tensors).reshape(len(steps), width).double()
            return torch.linalg.vector_norm(mat, norm_type, dim=1).cpu().tolist()
        except RuntimeError:  # mixed dtypes or devices: the host path below
            pass
    try:
        flat = torch.stack(tensors).double().cpu().tolist()
    except RuntimeError:
        flat = [float(t) for t in tensors]
    out: list[float] = []
    i = 0
    inf = math.isinf(norm_type)
    for parts in steps:
        vals = flat[i:i + len(parts)]
        i += len(parts)
        if any(math.isnan(v) for v in vals):
            out.append(math.nan)
        elif inf:
            out.append(max(vals) if vals else 0.0)
        else:
            try:
                out.append(math.fsum(v ** norm_type for v in vals) ** (1.0 / norm_type))
            except OverflowError:
                out.append(math.inf)
    return out


def trainable_params(pl_module: LightningModule) -> list[torch.nn.Parameter]:
    """The parameters of ``pl_module`` that require gradients (fixed for a ``fit``)."""
    return [p for p in pl_module.parameters() if p.requires_grad]


def grad_scaler(trainer: Trainer) -> Any:
    """The ``torch.amp.GradScaler`` of the precision plugin (``16-mixed``), or ``None``."""
    return getattr(trainer.precision_plugin, "scaler", None)


def scale_tensor(scaler: Any) -> torch.Tensor | None:
    """The scaler's scale as a device tensor without a host sync (``None`` before its first use)."""
    get_async = getattr(scaler, "_get_scale_async", None)
    if callable(get_async):
        return get_async()
    return getattr(scaler, "_scale", None)


class _LossTap:
    """Calls listeners with the tensor handed to ``GradScaler.scale``, then scales it as before."""

    def __init__(self, scaler: Any) -> None:
        self.scaler = scaler
        self.listeners: list[Callable[[torch.Tensor], None]] = []
        self.original = scaler.scale  # the bound method of the scaler's class
        scaler.scale = self.scale  # an instance attribute shadows the method; removed in unwatch

    def scale(self, outputs: Any) -> Any:
        for fn in self.listeners:
            fn(outputs)
        return self.original(outputs)


_TAP_ATTR = "_cropscale_loss_tap"


def watch_unscaled_loss(scaler: Any, fn: Callable[[torch.Tensor], None]) -> None:
    """Call ``fn(loss)`` with every loss the precision plugin hands to ``scaler.scale``: the *unscaled* loss.

    Under ``16-mixed`` Lightning scales the loss in ``MixedPrecision.pre_backward`` and calls
    ``on_before_backward`` with the **scaled** loss (``docs/measuring.md``): a finite loss that overflows
    only once multiplied by the scale (an AMP overflow, the scaler's business) would look non-finite there.
    ``fn`` sees the loss before that multiplication, once per micro-batch, just before ``on_before_backward``.
    Adds one Python call per micro-batch; several callbacks share one wrapper.
    """
    tap = scaler.__dict__.get(_TAP_ATTR)
    if tap is None:
        tap = _LossTap(scaler)
        setattr(scaler, _TAP_ATTR, tap)
    if fn not in tap.listeners:
        tap.listeners.append(fn)


def unwatch_unscaled_loss(scaler: Any, fn: Callable[[torch.Tensor], None]) -> None:
    """Undo :func:`watch_unscaled_loss` for ``fn``; the scaler's own ``scale`` is back when no listener is left."""
    tap = scaler.__dict__.get(_TAP_ATTR) if scaler is not None else None
    if tap is None:
        return
    if fn in tap.listeners:
        tap.listeners.remove(fn)
    if not tap.listeners:
        scaler.__dict__.pop("scale", None)
        scaler.__dict__.pop(_TAP_ATTR, None)
