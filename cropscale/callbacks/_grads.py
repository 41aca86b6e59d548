"""Gradient helpers shared by the gradient-norm and non-finite callbacks.

One total-norm computation per optimizer step (device tensors, cached), or the one gradient clipping made
(:class:`ClipNormTap`), combined on the device at log steps (:func:`norms_tensor`); the AMP scaler and its
scale without a host sync; the trainable parameters; how the strategy lays out gradients across ranks
(:class:`ShardLayout`); the unscaled loss under a GradScaler.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.plugins.precision import MixedPrecision, Precision

from cropscale.callbacks._dist import dist_ready

_GRAD_NORM_CACHE: dict[str, Any] = {"key": None, "value": None}


class GradNormParts(list):
    """Device tensors whose norm is one step's total gradient norm (:func:`grad_norm_parts`, :func:`norms_tensor`)."""


def clear_grad_norm_cache() -> None:
    """Forget the cached gradient norm (called at ``on_train_start``, so that no fit reads another fit's norms)."""
    _GRAD_NORM_CACHE["key"] = None
    _GRAD_NORM_CACHE["value"] = None


@dataclass(frozen=True)
class ShardLayout:
    """How a run's gradients are laid out across ranks, for the global gradient norm.

    ``kind``:

    - ``replicated``: every rank holds whole gradients (single device, DDP, FSDP ``NO_SHARD``, DeepSpeed
      ZeRO-0/1, which shards optimizer states only): the local norm is the global one, nothing is reduced;
    - ``flat``: FSDP (1) flat-parameter shards: a parameter FSDP flattened (``_fsdp_flattened``) holds this
      rank's shard, and its ``sum |g|^p`` is summed over ``group``, the *shard* group only (under
      ``HYBRID_SHARD`` the intra-node group: the replicas hold the same shards and are not added again);
      parameters FSDP ignores are replicated;
    - ``dtensor``: FSDP2 / tensor parallel (``ModelParallelStrategy``): each DTensor gradient is summed over
      the mesh dimensions on which it is ``Shard``-ed and nowhere else (``Replicate`` dimensions hold copies);
      plain-tensor gradients are replicated;
    - ``world``: forced (``GradNormCallback(sharded=True)``): every plain gradient is a disjoint shard over
      all ranks;
    - ``unsupported``: the gradients are not in ``p.grad`` (DeepSpeed ZeRO-2/3); ``reason`` says why.
    """

    kind: str = "replicated"
    group: Any = None
    reason: str | None = None

    @property
    def sharded(self) -> bool:
        """Whether some gradient is reduced across ranks."""
        return self.kind in ("flat", "dtensor", "world")


REPLICATED = ShardLayout("replicated")
WORLD = ShardLayout("world")


def shard_layout(trainer: Trainer) -> ShardLayout:
    """The :class:`ShardLayout` of ``trainer``'s strategy (read once, at ``on_train_start``)."""
    strategy = trainer.strategy
    name = type(strategy).__name__
    if name == "FSDPStrategy":
        sharding = getattr(getattr(strategy, "sharding_strategy", None), "name", "")
        if sharding == "NO_SHARD":
            return REPLICATED
        root = getattr(strategy, "model", None)
        return ShardLayout("flat", getattr(root, "process_group", None))  # the shard group (HYBRID: intra-node)
    if name == "ModelParallelStrategy":
        return ShardLayout("dtensor")
    if name == "DeepSpeedStrategy":
        config = getattr(strategy, "config", None) or {}
        stage = int((config.get("zero_optimization") or {}).get("stage", 0)) if isinstance(config, dict) else 0
        if stage <= 1:  # ZeRO-1 shards the optimizer states; gradients are whole and all-reduced on every rank
            return REPLICATED
        return ShardLayout("unsupported", reason=f"DeepSpeed ZeRO stage {stage} keeps partitioned gradients in its "
                           "own buffers, not in p.grad: the gradient norm is not measured")
    return REPLICATED


def is_sharded_strategy(trainer: Trainer) -> bool:
    """True when some gradients are reduced across ranks for the norm (see :func:`shard_layout`)."""
    return shard_layout(trainer).sharded


def grad_norm_parts(
    trainer: Trainer,
    params: Sequence[torch.nn.Parameter],
    optimizer: Any,
    step: int,
    norm_type: float = 2.0,
    sharded: bool | ShardLayout = False,
) -> GradNormParts | None:
    """Device tensors whose ``norm_type`` norm is the total gradient norm of ``params`` (no host sync).

    Without sharding: the per-parameter norms (one ``torch._foreach_norm`` launch, about 20 µs on a
    CPU); :func:`norms_tensor` combines them on the device at log steps. With a sharded layout
    (:class:`ShardLayout`; ``True`` means :data:`WORLD`) the local ``sum |g|^p`` (local max for ``inf``) of
    the sharded gradients is all-reduced over their shard group only, a device-side collective, and
    returned as one part per group beside the replicated gradients' norms. Computed once per optimizer
    step and shared by the callbacks that need it (gradient norm and non-finite checks): the cache is keyed
    by ``step``, the caller's count of optimizer steps (:meth:`~cropscale.callbacks.base.ScalingCallback.
    _count_step`, the same in every scaling callback of a fit), so that no per-step hook has to clear it.
    ``None`` when no parameter has a gradient.

    Raises:
        RuntimeError: from the collectives, when ranks call this at different points.
    """
    layout = WORLD if sharded is True else (REPLICATED if sharded is False else sharded)
    # no trainer property in the key (``global_step`` costs about 2 µs a read): the callers' own step counts
    key = (id(optimizer), float(norm_type), layout.kind, id(layout.group), step)
    if _GRAD_NORM_CACHE["key"] == key:
        return _GRAD_NORM_CACHE["value"]
    value: GradNormParts | None
    if not (layout.sharded and dist_ready(trainer)):
        grads = [g for p in params if (g := p.grad) is not None]
        if not grads:
            value = None
        else:
            if type(grads[0]) is not torch.Tensor:  # DTensor without a sharded layout: the local shards
                grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
            value = GradNormParts(_local_norms(grads, norm_type))
    else:
        with_grad = [p for p in params if p.grad is not None]
        value = _sharded_parts(with_grad, layout, norm_type) if with_grad else None
    _GRAD_NORM_CACHE["key"] = key
    _GRAD_NORM_CACHE["value"] = value
    return value


def _local_norms(grads: list[torch.Tensor], norm_type: float) -> Sequence[torch.Tensor]:
    """The ``norm_type`` norm of each gradient (one ``_foreach_norm`` launch where it applies)."""
    if grads[0].requires_grad:  # backward(create_graph=True): keep the norms out of the graph
        grads = [g.detach() for g in grads]
    # no torch.no_grad() block: gradients are leaves that need no graph, and entering one costs about
    # 6 µs per step on a CPU (measured in a Lightning step of callback-bench's tiny model)
    try:
        return torch._foreach_norm(grads, norm_type)
    except (RuntimeError, TypeError, AttributeError):  # mixed devices/dtypes, no foreach kernel
        return [torch.linalg.vector_norm(g, norm_type) for g in grads]


def _shard_groups(p: torch.nn.Parameter, layout: ShardLayout) -> tuple[Any, ...] | None:
    """The process groups ``p``'s gradient is sharded over (``None``: replicated, nothing to reduce)."""
    grad = p.grad
    placements = getattr(grad, "placements", None)
    if placements is not None:  # DTensor: the mesh dimensions it is Shard-ed on, whatever the layout
        mesh = grad.device_mesh
        dims = [i for i, pl in enumerate(placements) if pl.is_shard()]
        return tuple(mesh.get_group(i) for i in dims) or None
    if layout.kind == "world":
        return (torch.distributed.group.WORLD,)
    if layout.kind == "flat" and getattr(p, "_fsdp_flattened", False):
        return (layout.group if layout.group is not None else torch.distributed.group.WORLD,)
    return None


def _sharded_parts(params: list[torch.nn.Parameter], layout: ShardLayout, norm_type: float) -> GradNormParts:
    """Per shard group, the group's norm; per replicated gradient, its local norm.

    A group's norm is the local ``sum |g|^p`` all-reduced over the group. The ``norm_type`` combination of
    the parts is the global norm.
    """
    by_groups: dict[tuple[int, ...], tuple[tuple[Any, ...], list[torch.Tensor]]] = {}
    replicated: list[torch.Tensor] = []
    for p in params:
        groups = _shard_groups(p, layout)
        local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
        if groups is None:
            replicated.append(local)
        else:
            by_groups.setdefault(tuple(id(g) for g in groups), (groups, []))[1].append(local)
    parts = GradNormParts(_local_norms(replicated, norm_type) if replicated else [])
    inf = math.isinf(norm_type)
    for groups, grads in by_groups.values():
        norms = torch.stack([n.double() for n in _local_norms(grads, norm_type)])
        local = norms.max() if inf else (norms ** norm_type).sum()
        for group in groups:  # Shard-ed on several mesh dimensions: summed over each in turn
            op = torch.distributed.ReduceOp.MAX if inf else torch.distributed.ReduceOp.SUM
            torch.distributed.all_reduce(local, op=op, group=group)
        parts.append(local if inf else local ** (1.0 / norm_type))
    return parts


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


def norms_tensor(steps: Sequence[Sequence[torch.Tensor]], norm_type: float = 2.0) -> torch.Tensor:
    """Total norm of each step from its :func:`grad_norm_parts` (or one total each), as a device tensor ``[steps]``.

    No host read: give the result to :func:`~cropscale.callbacks._readout.read_later`. A step of one part (the
    total norm clipping computed, :class:`ClipNormTap`) is that part; otherwise
    ``(sum_i part_i^p)^(1/p)`` (``max_i part_i`` for ``p = inf``) on the device; NaN / inf propagate.
    """
    widths = set(map(len, steps))  # C calls only: a log step hands 50 steps or more
    if widths == {1}:
        return torch.stack([parts[0] for parts in steps])  # 0-d each
    width = len(steps[0])
    if width and widths == {width}:
        try:  # [steps, parts] -> one norm per row
            mat = torch.stack([t for parts in steps for t in parts]).reshape(len(steps), width).double()
            return torch.linalg.vector_norm(mat, norm_type, dim=1)
        except RuntimeError:  # mixed dtypes or devices: one step at a time below
            pass
    device = steps[0][0].device
    return torch.stack([
        torch.linalg.vector_norm(torch.stack([t.reshape(()).double().to(device) for t in parts]), norm_type)
        if len(parts) else torch.zeros((), dtype=torch.float64, device=device)
        for parts in steps])


class ClipNormTap:
    """Keeps the total gradient norm that Lightning's clipping by norm computes (and otherwise throws away).

    Installed on the trainer's precision plugin (``clip_grad_by_norm``, an instance attribute shadowing the
    method) by :func:`clip_norm_tap`; does what ``Precision.clip_grad_by_norm`` does in Lightning 2.6,
    ``torch.nn.utils.clip_grad_norm_(plugin.main_params(optimizer), clip_val)``, and keeps its return value:
    the 2-norm of all gradients *before* clipping (after AMP unscaling: Lightning clips after
    ``scaler.unscale_``), a 0-d device tensor, with no extra device work. ``calls`` counts the clippings (one
    per optimizer step), ``last`` is the latest norm.
    """

    def __init__(self, plugin: Any) -> None:
        self.plugin = plugin
        self.calls = 0
        self.last: torch.Tensor | None = None
        plugin.clip_grad_by_norm = self.clip_grad_by_norm

    def clip_grad_by_norm(self, optimizer: Any, clip_val: float) -> None:
        """Clip the gradients of ``optimizer``'s parameters to total 2-norm ``clip_val``; keep the norm before."""
        self.last = torch.nn.utils.clip_grad_norm_(self.plugin.main_params(optimizer), clip_val)
        self.calls += 1


_CLIP_TAP_ATTR = "_cropscale_clip_tap"


def clip_norm_tap(trainer: Trainer, pl_module: LightningModule) -> tuple[ClipNormTap | None, str | None]:
    """The shared :class:`ClipNormTap` of ``trainer`` when the clipping's norm can stand for the callbacks' own.

    That is when Lightning clips by norm on every optimizer step through the precision plugin's
    ``clip_grad_by_norm`` as written in ``Precision`` (32-true, 16-mixed, bf16-mixed, 64-true, half precision),
    on whole gradients (single device, DDP): ``gradient_clip_val > 0`` with ``gradient_clip_algorithm="norm"``,
    automatic optimisation and the default ``configure_gradient_clipping``. Not under FSDP (its precision
    plugin refuses ``clip_grad_by_norm``: FSDP clips through the root module, on sharded gradients, and the
    callbacks compute the norm themselves, :func:`grad_norm_parts`), DeepSpeed (it clips inside its own
    engine) or a plugin that clips its own way.

    Returns:
        ``(tap, None)``, or ``(None, reason)`` saying why the callbacks compute the norm themselves.
    """
    plugin = trainer.precision_plugin
    clip = trainer.gradient_clip_val
    algorithm = str(getattr(trainer.gradient_clip_algorithm, "value", trainer.gradient_clip_algorithm) or "norm")
    if not clip or float(clip) <= 0 or algorithm.lower() != "norm":
        return None, "no gradient clipping by norm configured"
    if not pl_module.automatic_optimization:
        return None, "manual optimisation: Lightning does not clip"
    if type(pl_module).configure_gradient_clipping is not LightningModule.configure_gradient_clipping:
        return None, f"{type(pl_module).__name__} overrides configure_gradient_clipping"
    if shard_layout(trainer).kind != "replicated":
        return None, f"{type(trainer.strategy).__name__}: gradients are sharded, the clipping's norm is not global"
    cls = type(plugin)
    if cls.clip_grad_by_norm is not Precision.clip_grad_by_norm or cls.clip_gradients not in (
            Precision.clip_gradients, MixedPrecision.clip_gradients):
        return None, f"precision plugin {cls.__name__} clips its own way"
    tap = plugin.__dict__.get(_CLIP_TAP_ATTR)
    if tap is None:
        tap = ClipNormTap(plugin)
        setattr(plugin, _CLIP_TAP_ATTR, tap)
    return tap, None


def release_clip_tap(trainer: Trainer) -> None:
    """Give the precision plugin its own ``clip_grad_by_norm`` back (idempotent; at the end of training)."""
    plugin = trainer.precision_plugin
    if plugin.__dict__.pop(_CLIP_TAP_ATTR, None) is not None:
        plugin.__dict__.pop("clip_grad_by_norm", None)
