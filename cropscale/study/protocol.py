"""Pure arithmetic of the scaling study: batch protocols, LR rules, optimiser updates, speed-up.

No I/O, no torch: every function here is exact and unit-tested (efficiency and Karp-Flatt as well).

Notation (``docs/study.md``): ``N`` ranks (world size), ``L`` local batch (samples per rank per forward
pass), ``A`` gradient-accumulation factor (micro-batches per optimiser update), global batch
``G = L x N x A`` (samples per optimiser update), ``S`` training samples per epoch.

Two protocols are compared explicitly (``docs/study.md``, "Batch semantics"):

- ``equal-global`` (strong scaling at a fixed optimisation problem): ``G`` is fixed for every
  ``N``; the accumulation is matched, ``A = G / (L x N)``, which must be a whole number.
  Optimiser updates per epoch and the learning rate are then the same for every ``N``.
- ``equal-local`` (weak scaling of the batch): ``L`` is fixed and ``A = 1``, so ``G = L x N``
  grows with ``N``, there are fewer optimiser updates per epoch, and the learning rate follows a
  scaling rule (``linear``, Goyal et al. 2017; ``sqrt`` for Adam-type optimisers, Malladi et al.,
  NeurIPS 2022) relative to the reference batch (by default the 1-device global batch ``L``).
  Model quality must then be re-evaluated, not assumed.

Optimiser updates per epoch follow Lightning 2.x exactly. Each rank's training loader holds
``ceil(S / N)`` samples (``DistributedSampler`` pads the last shard with repeated samples;
with ``drop_last=True`` it holds ``ceil((S - N) / N)`` when ``N`` does not divide ``S``), hence
``B = ceil(samples per rank / L)`` batches (``floor`` with a loader's ``drop_last=True``). The
training loop steps the optimiser when ``A`` micro-batches are ready *or* at the last batch of
the epoch (``_TrainingEpochLoop._should_accumulate``), so updates per epoch
``U = ceil(B / A)``, the same formula as ``Trainer.estimated_stepping_batches`` per epoch.

A third protocol, ``batch-sweep``, varies the global batch itself (Sedona, Cavallaro et al., IGARSS 2020:
remote-sensing training held its accuracy up to global batches of about 8,000): for each ``G`` of a list,
:func:`realise_global_batch` finds ``G = L x N x A`` exactly within the spec's limits (largest local batch
that fits in memory, device counts available, largest accumulation allowed). Every ``G`` trains the same
number of epochs (same samples seen), so the optimiser updates per epoch fall as ``G`` grows
(:func:`update_windows` counts them, and the samples of a partial last update); the learning rate
follows ``none | linear | sqrt`` relative to the reference batch, per optimiser.

Speed-up ``S_N = T_1 / T_N`` and efficiency ``E_N = S_N / N`` (``docs/study.md``), with
``T`` the time of the same work (one training epoch of ``S`` samples) on 1 and on ``N`` ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from cropscale.errors import CropScaleError
from cropscale.model.optim import LRScaling, global_batch_size, scale_learning_rate
from cropscale.scaling.amdahl import amdahl_speedup
from cropscale.scaling.amdahl import efficiency as _efficiency

EQUAL_GLOBAL = "equal-global"
EQUAL_LOCAL = "equal-local"
BATCH_SWEEP = "batch-sweep"
PROTOCOLS: tuple[str, ...] = (EQUAL_GLOBAL, EQUAL_LOCAL)
"""The device-scaling protocols (:func:`batch_plan`)."""
ALL_PROTOCOLS: tuple[str, ...] = (*PROTOCOLS, BATCH_SWEEP)
"""Every protocol a study spec may name."""
LR_RULES: tuple[str, ...] = ("none", "linear", "sqrt")


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CropScaleError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def accumulation_factor(global_batch: int, local_batch: int, world_size: int) -> int:
    """Matched gradient accumulation of the ``equal-global`` protocol: ``A = G / (L x N)``.

    Args:
        global_batch: ``G``, samples per optimiser update.
        local_batch: ``L``, samples per rank per forward pass.
        world_size: ``N`` ranks.

    Returns:
        ``A >= 1``.

    Raises:
        CropScaleError: a factor < 1; ``G < N`` (e.g. global batch 1 cannot be split across 2 DDP
            ranks: every rank needs at least one sample per update); or ``G`` not a multiple of
            ``L x N`` (the accumulation would not be a whole number).
    """
    g = _positive_int(global_batch, "global batch")
    loc = _positive_int(local_batch, "local batch")
    n = _positive_int(world_size, "world size")
    if g < n:
        raise CropScaleError(
            f"global batch {g} cannot be split across {n} ranks: every DDP rank needs at least one sample"
            f" per optimiser update (use a global batch >= {n})"
        )
    if g % (loc * n):
        hint = (
            f"use a local batch that divides {g // n}" if g % n == 0 else f"use a global batch divisible by {n}"
        )
        raise CropScaleError(
            f"equal-global protocol: global batch {g} is not a multiple of local batch {loc} x world size {n}"
            f" = {loc * n}, so the accumulation {g}/{loc * n} = {g / (loc * n):g} is not a whole number ({hint})"
        )
    return g // (loc * n)


@dataclass(frozen=True)
class BatchPlan:
    """Batch sizes and learning rate of one study configuration.

    Attributes:
        protocol: ``equal-global``, ``equal-local`` or ``batch-sweep``.
        world_size: ``N`` ranks.
        local_batch: ``L`` samples per rank per forward pass (``--data.batch_size``).
        accumulation: ``A`` (``--trainer.accumulate_grad_batches``).
        global_batch: ``G = L x N x A`` samples per optimiser update.
        lr_scaling: rule applied by the task (``--model.lr_scaling``).
        reference_batch: global batch at which ``base_lr`` holds (``--model.reference_batch_size``).
        base_lr: learning rate at ``reference_batch`` (``--model.lr``).
        lr: the learning rate the task uses after the rule (before any warm-up factor).
        optimizer: ``--model.optimizer`` (``adamw | sgd | lars | lamb``).
    """

    protocol: str
    world_size: int
    local_batch: int
    accumulation: int
    global_batch: int
    lr_scaling: str
    reference_batch: int
    base_lr: float
    lr: float
    optimizer: str = "adamw"

    def as_dict(self) -> dict:
        """The plan as a JSON-ready dict (field name -> value)."""
        return asdict(self)


def batch_plan(
    protocol: str,
    world_size: int,
    local_batch: int,
    global_batch: int | None = None,
    base_lr: float = 1e-3,
    lr_scaling: LRScaling = "none",
    reference_batch: int | None = None,
) -> BatchPlan:
    """Batch sizes and learning rate of ``protocol`` on ``world_size`` ranks.

    Args:
        protocol: ``equal-global`` (``global_batch`` required; ``A = G / (L x N)``) or
            ``equal-local`` (``A = 1``, ``G = L x N``; ``global_batch`` must be None).
        world_size: ``N``.
        local_batch: ``L``.
        global_batch: ``G`` of the ``equal-global`` protocol.
        base_lr: learning rate at ``reference_batch``.
        lr_scaling: ``none | linear | sqrt`` (:func:`cropscale.model.optim.scale_learning_rate`).
        reference_batch: global batch of ``base_lr``; default: the protocol's 1-rank global batch
            (``G`` for ``equal-global``, so the LR is the same for every ``N``; ``L`` for
            ``equal-local``, so the LR grows as ``N`` (linear) or ``sqrt(N)`` (sqrt)).

    Raises:
        CropScaleError: unknown protocol or rule, missing or superfluous ``global_batch``, and the
            errors of :func:`accumulation_factor`.
    """
    if protocol not in PROTOCOLS:
        raise CropScaleError(f"protocol must be one of {', '.join(PROTOCOLS)}; got {protocol!r}")
    if lr_scaling not in LR_RULES:
        raise CropScaleError(f"lr_scaling must be one of {', '.join(LR_RULES)}; got {lr_scaling!r}")
    n = _positive_int(world_size, "world size")
    loc = _positive_int(local_batch, "local batch")
    if protocol == EQUAL_GLOBAL:
        if global_batch is None:
            raise CropScaleError("the equal-global protocol needs a global_batch (samples per optimiser update)")
        acc = accumulation_factor(global_batch, loc, n)
        ref_default = global_batch
    else:
        if global_batch is not None:
            raise CropScaleError(
                f"the equal-local protocol fixes the local batch; global_batch={global_batch} is not allowed"
                " (the global batch is local batch x world size)"
            )
        acc = 1
        ref_default = loc
    g = global_batch_size(loc, n, acc)
    ref = ref_default if reference_batch is None else _positive_int(reference_batch, "reference batch")
    if not (isinstance(base_lr, (int, float)) and math.isfinite(base_lr) and base_lr > 0):
        raise CropScaleError(f"base learning rate must be a positive number, got {base_lr!r}")
    lr = scale_learning_rate(float(base_lr), g, ref, lr_scaling)
    return BatchPlan(protocol, n, loc, acc, g, lr_scaling, ref, float(base_lr), lr)


def realise_global_batch(
    global_batch: int, max_local_batch: int, world_sizes: Sequence[int], max_accumulation: int | None = None
) -> tuple[int, int, int]:
    """Local batch ``L``, world size ``N`` and accumulation ``A`` with ``L x N x A = G`` exactly.

    The rule: the largest ``N`` of ``world_sizes`` that divides ``G`` (fewest sequential micro-batches),
    then the largest ``L <= max_local_batch`` that divides ``G / N``, then ``A = G / (L x N)``.

    Args:
        global_batch: ``G``, samples per optimiser update.
        max_local_batch: the largest local batch that fits in one device's memory (the spec's limit).
        world_sizes: device counts the sweep may use (the spec's, capped at the devices available).
        max_accumulation: the largest accumulation allowed (None = no limit).

    Returns:
        ``(L, N, A)``.

    Raises:
        CropScaleError: a factor < 1, no world size divides ``G`` (every rank needs the same share of
            the batch), or ``A`` above ``max_accumulation`` (the message gives the numbers).
    """
    g = _positive_int(global_batch, "global batch")
    max_local = _positive_int(max_local_batch, "max local batch")
    sizes = sorted({_positive_int(n, "world size") for n in world_sizes}, reverse=True)
    if not sizes:
        raise CropScaleError("no world size to realise the global batch on")
    n = next((n for n in sizes if g % n == 0), None)
    if n is None:
        raise CropScaleError(f"global batch {g} cannot be split evenly across any of {sorted(sizes)} ranks")
    local = next(loc for loc in range(min(max_local, g // n), 0, -1) if (g // n) % loc == 0)
    acc = g // (n * local)
    if max_accumulation is not None and acc > _positive_int(max_accumulation, "max accumulation"):
        raise CropScaleError(
            f"global batch {g} needs accumulation {acc} = {g} / (local batch {local} x {n} rank(s)), above the"
            f" limit of {max_accumulation}"
        )
    return local, n, acc


def sweep_plan(
    global_batch: int,
    max_local_batch: int,
    world_sizes: Sequence[int],
    base_lr: float,
    lr_scaling: LRScaling,
    reference_batch: int,
    max_accumulation: int | None = None,
    optimizer: str = "adamw",
) -> BatchPlan:
    """The batch plan of one point of the ``batch-sweep`` protocol.

    ``(L, N, A)`` from :func:`realise_global_batch`; the learning rate of ``optimizer`` from ``base_lr`` at
    ``reference_batch`` by ``lr_scaling`` (:func:`cropscale.model.optim.scale_learning_rate`).

    Raises:
        CropScaleError: an unknown rule, a bad learning rate, and the errors of :func:`realise_global_batch`.
    """
    if lr_scaling not in LR_RULES:
        raise CropScaleError(f"lr_scaling must be one of {', '.join(LR_RULES)}; got {lr_scaling!r}")
    if not (isinstance(base_lr, (int, float)) and math.isfinite(base_lr) and base_lr > 0):
        raise CropScaleError(f"base learning rate must be a positive number, got {base_lr!r}")
    local, n, acc = realise_global_batch(global_batch, max_local_batch, world_sizes, max_accumulation)
    ref = _positive_int(reference_batch, "reference batch")
    lr = scale_learning_rate(float(base_lr), global_batch, ref, lr_scaling)
    return BatchPlan(BATCH_SWEEP, n, local, acc, global_batch, lr_scaling, ref, float(base_lr), lr, optimizer)


@dataclass(frozen=True)
class UpdateWindows:
    """The optimiser updates of one epoch, as Lightning 2.x forms them.

    Attributes:
        updates: optimiser updates per epoch ``U = ceil(B / A)``.
        full_updates: updates that average ``A`` whole micro-batches on every rank (``floor(B / A)``, less
            one when the last micro-batch is short).
        last_update_samples: samples (over all ranks) in the last update of the epoch; ``G`` when it is full.
    """

    updates: int
    full_updates: int
    last_update_samples: int


def update_windows(samples: int, local_batch: int, world_size: int, accumulation: int = 1) -> UpdateWindows:
    """Optimiser updates per epoch and the samples of the last one (no ``drop_last``).

    Each rank holds ``r = ceil(S / N)`` samples (``DistributedSampler`` pads with repeats) in
    ``B = ceil(r / L)`` micro-batches; the loop steps every ``A`` micro-batches and at the end of the
    epoch, so ``U = ceil(B / A)``; the last update holds ``N x (r - L x A x (U - 1))`` samples. Lightning
    divides each micro-batch loss by ``A`` whatever the window's length, so a short last window is a
    proportionally smaller step.

    Raises:
        CropScaleError: a factor < 1.
    """
    n = _positive_int(world_size, "world size")
    loc = _positive_int(local_batch, "local batch")
    a = _positive_int(accumulation, "accumulation")
    per_rank = samples_per_rank(samples, n)
    b = math.ceil(per_rank / loc)
    u = math.ceil(b / a)
    last = n * (per_rank - loc * a * (u - 1))
    full = u if last == loc * n * a else u - 1
    return UpdateWindows(u, full, last)


def samples_per_rank(samples: int, world_size: int, drop_last: bool = False) -> int:
    """Training samples each rank sees per epoch under ``DistributedSampler``.

    ``ceil(S / N)`` (the last shard is padded with repeated samples), or with ``drop_last=True``
    and ``N`` not dividing ``S``: ``ceil((S - N) / N)`` (torch.utils.data.DistributedSampler).

    Raises:
        CropScaleError: ``samples < 1`` or ``world_size < 1``.
    """
    s = _positive_int(samples, "samples per epoch")
    n = _positive_int(world_size, "world size")
    if drop_last and s % n:
        return math.ceil((s - n) / n)
    return math.ceil(s / n)


def batches_per_rank(samples: int, local_batch: int, world_size: int, drop_last: bool = False) -> int:
    """Training batches per rank per epoch: ``ceil(samples_per_rank / L)``.

    ``drop_last`` applies to both the sampler and the loader (``floor`` instead of ``ceil``).
    """
    per_rank = samples_per_rank(samples, world_size, drop_last)
    loc = _positive_int(local_batch, "local batch")
    return per_rank // loc if drop_last else math.ceil(per_rank / loc)


def optimizer_updates_per_epoch(
    samples: int, local_batch: int, world_size: int, accumulation: int = 1, drop_last: bool = False
) -> int:
    """Optimiser updates per epoch as Lightning 2.x performs them: ``ceil(B / A)``.

    ``B`` comes from :func:`batches_per_rank`; a partial accumulation window at the end of the epoch still
    steps.

    Raises:
        CropScaleError: a factor < 1, or an epoch with no batch (``drop_last`` and too few samples).
    """
    b = batches_per_rank(samples, local_batch, world_size, drop_last)
    a = _positive_int(accumulation, "accumulation")
    if b < 1:
        raise CropScaleError(
            f"{samples} samples per epoch give no batch of {local_batch} on each of {world_size} ranks"
        )
    return math.ceil(b / a)


def speedup(t_1: float, t_n: float) -> float:
    """Speed-up ``S_N = T_1 / T_N`` (dimensionless) from the times (s) of the same work.

    Raises:
        CropScaleError: a time that is not a positive finite number.
    """
    for name, t in (("T_1", t_1), ("T_N", t_n)):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise CropScaleError(f"{name} must be a positive time in seconds, got {t!r}")
    return float(t_1) / float(t_n)


def efficiency(s_n: float, world_size: int) -> float:
    """Parallel efficiency ``E_N = S_N / N`` (:func:`cropscale.scaling.amdahl.efficiency`)."""
    return _efficiency(s_n, world_size)


def karp_flatt_time_ratio(world_size: int, serial_fraction: float) -> float:
    """``T_N / T_1 = e + (1 - e) / N``: the Karp-Flatt relation solved for the time on ``N`` ranks.

    For ``0 <= e <= 1`` this is ``1 / S`` of Amdahl's law
    (:func:`cropscale.scaling.amdahl.amdahl_speedup`); a measured ``e`` may also lie above 1 (the
    run slowed down) or below 0 (super-linear), and the relation is then extrapolated as it stands.

    Raises:
        CropScaleError: ``world_size < 1``, a non-finite ``e``, or an ``e < 0`` so negative that
            the predicted time is not positive.
    """
    n = _positive_int(world_size, "world size")
    e = serial_fraction
    if isinstance(e, bool) or not isinstance(e, (int, float)) or not math.isfinite(e):
        raise CropScaleError(f"serial fraction must be a finite number, got {e!r}")
    if 0.0 <= e <= 1.0:
        return 1.0 / amdahl_speedup(n, float(e))
    ratio = float(e) + (1.0 - float(e)) / n
    if ratio <= 0:
        raise CropScaleError(f"serial fraction {e:g} predicts a non-positive time on {n} ranks")
    return ratio


def predicted_epoch_time(
    t_1: float,
    world_size: int,
    serial_fraction: float,
    updates_per_epoch: int = 0,
    comm_per_update_s: float = 0.0,
    comm_per_update_ref_s: float = 0.0,
) -> float:
    """Analytical-scenario training-epoch time on ``N`` ranks (s).

    ``T_N = T_1 (e + (1 - e) / N) + U_N (t_c(N) - t_c(N_ref))``: the Karp-Flatt serial fraction
    ``e`` measured at ``N_ref`` ranks carries the overheads seen there; the second term adds, with
    no overlap, the growth of the modelled gradient synchronisation per optimiser update from
    ``t_c(N_ref)`` to ``t_c(N)`` (ring all-reduce model) over the ``U_N`` updates of one epoch.

    Raises:
        CropScaleError: a non-positive ``T_1``, a negative update count, and the errors of
            :func:`karp_flatt_time_ratio`.
    """
    speedup(t_1, t_1)  # validates T_1
    if isinstance(updates_per_epoch, bool) or not isinstance(updates_per_epoch, int) or updates_per_epoch < 0:
        raise CropScaleError(f"updates per epoch must be an integer >= 0, got {updates_per_epoch!r}")
    base = float(t_1) * karp_flatt_time_ratio(world_size, serial_fraction)
    return base + updates_per_epoch * (float(comm_per_update_s) - float(comm_per_update_ref_s))
