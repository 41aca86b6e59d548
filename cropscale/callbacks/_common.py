"""Helpers shared by the scaling callbacks: batch inspection, log-step logic, rank gathers, statistics.

Nothing here synchronises the host with a device except the functions documented as collectives or
as reading device values (called at log steps and epoch ends only).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback

from cropscale.evidence import MEASURED_MICROBENCHMARK as EVIDENCE_MICROBENCHMARK
from cropscale.evidence import MEASURED_RUN as EVIDENCE_RUN
from cropscale.numbers import finite_or_none, median_p95, percentile

__all__ = ["EVIDENCE_MICROBENCHMARK", "EVIDENCE_RUN", "finite_or_none", "median_p95", "percentile"]

GIB = float(1 << 30)


# --------------------------------------------------------------------------------------------------
# batches
# --------------------------------------------------------------------------------------------------
def batch_size(batch: Any) -> int | None:
    """Number of samples in ``batch``.

    ``batch["s2"].shape[0]`` for a cropscale batch (see :mod:`cropscale.batch`); otherwise the first
    dimension of the first tensor found in a dict / list / tuple batch, so that the callbacks work in
    any Lightning project. ``None`` when no tensor with a dimension is found.
    """
    if isinstance(batch, Mapping):
        s2 = batch.get("s2")
        if isinstance(s2, torch.Tensor) and s2.dim() > 0:
            return int(s2.shape[0])
        values: Iterable[Any] = batch.values()
    elif isinstance(batch, (list, tuple)):
        values = batch
    elif isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    else:
        return None
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.dim() > 0:
                return int(value.shape[0])
        elif isinstance(value, (Mapping, list, tuple)):
            n = batch_size(value)
            if n is not None:
                return n
    return None


def id_tensors(batch: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """References to ``batch["patch_id"]`` (``[B]``) and ``batch["crop_yx"]`` (``[B, 2]``), or ``None``.

    No copy and no device read: cheap enough to call every step.
    """
    if isinstance(batch, Mapping):
        pid = batch.get("patch_id")
        yx = batch.get("crop_yx")
        return (pid if isinstance(pid, torch.Tensor) else None, yx if isinstance(yx, torch.Tensor) else None)
    return None, None


def ids_to_lists(patch_id: torch.Tensor | None, crop_yx: torch.Tensor | None) -> dict[str, Any]:
    """Sample ids as JSON-ready lists (reads device values: call on a rare path only)."""
    out: dict[str, Any] = {}
    if patch_id is not None:
        out["patch_id"] = [int(v) for v in patch_id.detach().reshape(-1).cpu().tolist()]
    if crop_yx is not None:
        out["crop_yx"] = [[int(a) for a in row] for row in crop_yx.detach().reshape(-1, 2).cpu().tolist()]
    return out


# --------------------------------------------------------------------------------------------------
# logging
# --------------------------------------------------------------------------------------------------
def is_log_step(trainer: Trainer) -> bool:
    """True at the steps where Lightning writes step metrics (``trainer.log_every_n_steps``).

    Evaluated in ``on_train_batch_end`` (after the optimizer step, so ``global_step`` already counts
    it). Also true on the last step before the trainer stops.
    """
    n = trainer.log_every_n_steps
    if n <= 0:
        return False
    return trainer.global_step % n == 0 or bool(trainer.should_stop)


_DEFERRED: list[dict[int, dict[str, float]]] = []  # open deferred_logging() blocks, innermost last


def log_metrics(trainer: Trainer, metrics: Mapping[str, float | int | None], step: int | None = None) -> None:
    """Write scalars through every logger of ``trainer`` (loggers write on global rank 0 only).

    ``None`` and non-finite values are dropped. ``step`` defaults to ``trainer.global_step``.
    Inside :func:`deferred_logging` the scalars are collected and written when the block ends.
    """
    if not trainer.loggers:
        return
    clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
    if not clean:
        return
    step = trainer.global_step if step is None else step
    if _DEFERRED:
        _DEFERRED[-1].setdefault(step, {}).update(clean)
        return
    for logger in trainer.loggers:
        logger.log_metrics(clean, step=step)


@contextmanager
def deferred_logging(trainer: Trainer) -> Iterator[None]:
    """Collect the :func:`log_metrics` calls made inside the block and write them at its end, one
    ``logger.log_metrics`` call per step.

    Why: TensorBoard's writer is a background thread that wakes on every event. Torch ops release the
    GIL, and each one that runs while the writer is busy waits to get it back, so a callback that
    reads device values after another one has logged pays for it: about 1.1 ms per log step for the
    non-finite check's reads in callback-bench's tiny-model run, against 0.35 ms when they come
    first. :class:`~cropscale.callbacks.CallbackGroup` wraps ``on_train_batch_end`` in this block,
    so its members do their reads first and the writes come last. Scalars are still written if the
    block raises.
    """
    _DEFERRED.append({})
    try:
        yield
    finally:
        collected = _DEFERRED.pop()
        for step, clean in collected.items():
            for logger in trainer.loggers:
                logger.log_metrics(clean, step=step)


# --------------------------------------------------------------------------------------------------
# statistics
# --------------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------------
# ranks
# --------------------------------------------------------------------------------------------------
def dist_ready(trainer: Trainer) -> bool:
    """True when ``torch.distributed`` is initialised and the run has more than one process."""
    return (
        trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
    )


def gather_vectors(trainer: Trainer, pl_module: LightningModule, values: Sequence[float | None]) -> list[list[float | None]]:
    """All ranks' ``values`` (same length on every rank), rank-ordered: ``[world_size][len(values)]``.

    A collective under DDP/FSDP (every rank must call it at the same point); a no-op copy on one
    process. ``None`` travels as NaN and comes back as ``None``. Uses ``trainer.strategy.all_gather``
    on the module's device, so it works with gloo (CPU) and NCCL (CUDA).
    """
    vec = [math.nan if v is None else float(v) for v in values]
    if not dist_ready(trainer):
        return [[finite_or_none(v) for v in vec]]
    t = torch.tensor(vec, dtype=torch.float64, device=pl_module.device)
    g = trainer.strategy.all_gather(t)
    rows = g.reshape(trainer.world_size, len(vec)).cpu().tolist()
    return [[finite_or_none(v) for v in row] for row in rows]


def gather_objects(trainer: Trainer, obj: Any) -> list[Any]:
    """All ranks' picklable ``obj`` (``torch.distributed.all_gather_object``); ``[obj]`` on one process.

    A collective: call it on every rank at the same point.
    """
    if not dist_ready(trainer):
        return [obj]
    out: list[Any] = [None] * trainer.world_size
    torch.distributed.all_gather_object(out, obj)
    return out


def rank_stats(per_rank: Sequence[float | None]) -> dict[str, Any]:
    """Max, median and the slowest (largest-value) rank of a per-rank figure."""
    vals = [(r, v) for r, v in enumerate(per_rank) if v is not None]
    if not vals:
        return {"per_rank": list(per_rank), "max": None, "median": None, "slowest_rank": None}
    slowest_rank, vmax = max(vals, key=lambda rv: rv[1])
    return {
        "per_rank": list(per_rank),
        "max": vmax,
        "median": percentile([v for _, v in vals], 50.0),
        "slowest_rank": slowest_rank,
    }


# --------------------------------------------------------------------------------------------------
# the callback base
# --------------------------------------------------------------------------------------------------
class ScalingCallback(Callback):
    """Base of the cropscale scaling callbacks.

    Subclasses set :attr:`summary_key` and implement :meth:`summary`, a JSON-ready dict that the
    :class:`~cropscale.callbacks.ProvenanceCallback` writes under ``run.json["summary"][summary_key]``
    at the end of ``fit``. Summaries are final after ``on_train_end`` (the per-rank gathers run at
    epoch ends and in ``on_train_end``, on every rank).
    """

    summary_key: str = "scaling"
    evidence: str = EVIDENCE_RUN
    _log_every: int = 0
    _gstep: int = 0

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary figures of this callback for ``run.json``."""
        return {"evidence": self.evidence}

    def wants_hook(self, hook: str) -> bool:
        """Whether this callback needs the per-step ``hook`` for the current run (asked by
        :class:`~cropscale.callbacks.CallbackGroup` after ``on_train_start``)."""
        return True

    def _start_log_schedule(self, trainer: Trainer) -> None:
        """Start counting optimizer steps from ``trainer.global_step`` (call in ``on_train_start``)."""
        self._log_every = int(trainer.log_every_n_steps or 0)
        self._gstep = int(trainer.global_step)

    def _count_step(self) -> bool:
        """Count one optimizer step; True when it is a log step (``global_step % log_every_n_steps == 0``).

        Same rule as :func:`is_log_step` but on the callback's own counter, so that no trainer
        property is read per step. Call once per optimizer step, in ``on_train_batch_end``.
        """
        self._gstep += 1
        every = self._log_every
        return every > 0 and self._gstep % every == 0


def iter_callbacks(trainer: Trainer) -> Iterator[Callback]:
    """Every callback of ``trainer``, with the members of :class:`~cropscale.callbacks.CallbackGroup` s
    expanded in place."""
    for cb in trainer.callbacks:
        members = getattr(cb, "callbacks", None)
        if getattr(cb, "_is_callback_group", False) and isinstance(members, list):
            yield from members
        else:
            yield cb


def scaling_callbacks(trainer: Trainer) -> list[ScalingCallback]:
    """The :class:`ScalingCallback` instances of ``trainer`` (group members included), in order."""
    return [cb for cb in iter_callbacks(trainer) if isinstance(cb, ScalingCallback)]


# --------------------------------------------------------------------------------------------------
# gradients
# --------------------------------------------------------------------------------------------------
_GRAD_NORM_CACHE: dict[str, Any] = {"key": None, "value": None}


class GradNormParts(list):
    """Device tensors whose norm is one step's total gradient norm (see :func:`grad_norm_parts`);
    ``total`` caches the host value once :func:`total_norms` has read it (shared by callbacks)."""

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
