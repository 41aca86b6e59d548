"""Cost model of gradient synchronisation: ring all-reduce (DDP buckets) and FSDP's collectives.

FSDP's pair is reduce-scatter / all-gather of fully sharded data parallelism.

Notation (the study's): ``P`` trainable parameters, ``b`` bytes per gradient element, payload
``M = P b`` (bytes), ``N`` ranks (world size), ``alpha`` per-phase latency (s), ``B_eff``
effective bandwidth per rank (bytes/s).

- Ring all-reduce = reduce-scatter + all-gather, ``2 (N - 1)`` steps each moving ``M / N``
  (Patarasuk and Yuan, J. Parallel Distrib. Comput. 69(2), 2009; Thakur, Rabenseifner and Gropp,
  IJHPCA 19(1), 2005):
  per-rank send volume ``V = 2 (N - 1) M / N`` bytes (the same volume is received);
  time ``T = 2 (N - 1) alpha + (2 (N - 1) / N) M / B_eff``.
- Reduce-scatter or all-gather alone: ``V = (N - 1) M / N``, ``T = (N - 1) alpha + ((N - 1) / N) M / B_eff``.
- PyTorch DDP all-reduces gradients in *buckets* (``bucket_cap_mb`` = 25 MiB by default; the first
  bucket, which holds the gradients that become ready last, is capped at 1 MiB,
  ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``). A bucket closes once it reaches its cap, so
  it may overshoot by one tensor; tensors of different dtypes never share a bucket. Each bucket is
  one all-reduce, so the latency term is paid once per bucket.
- FSDP with full sharding all-gathers the parameters before forward and again before backward and
  reduce-scatters the gradients: ``3 (N - 1) M / N`` per rank and step; without resharding after
  forward (``SHARD_GRAD_OP``) the backward all-gather is skipped: ``2 (N - 1) M / N``.

The model ignores overlap with backward, topology (NVLink vs PCIe vs network), protocol choice
(NCCL may use trees) and contention: every number from it is an ``analytical-scenario``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cropscale.errors import CropScaleError
from cropscale.evidence import ANALYTICAL_SCENARIO

MIB = 1024 * 1024
"""Bytes per MiB."""
DDP_BUCKET_CAP_MB = 25
"""PyTorch DDP's default ``bucket_cap_mb`` (MiB)."""
DDP_FIRST_BUCKET_MB = 1
"""PyTorch DDP's default first-bucket cap (MiB), ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``."""


def _check_world_size(world_size: int) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise CropScaleError(f"world_size must be an integer >= 1, got {world_size!r}")
    return world_size


def _check_positive(value: float, name: str, allow_zero: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise CropScaleError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def payload_bytes(num_params: int, bytes_per_element: float = 4) -> float:
    """Gradient payload ``M = P b`` in bytes (``b = 4`` for FP32, 2 for FP16/BF16 gradients)."""
    if isinstance(num_params, bool) or not isinstance(num_params, int) or num_params < 0:
        raise CropScaleError(f"num_params must be a non-negative integer, got {num_params!r}")
    return float(num_params) * _check_positive(bytes_per_element, "bytes_per_element")


def ring_allreduce_volume(payload: float, world_size: int) -> float:
    """Bytes each rank sends (and receives) in one ring all-reduce of ``payload`` bytes: ``V = 2 (N - 1) M / N``.

    The one definition of the ring volume (the table, the benchmark series and the send-bytes helpers call it).

    Raises:
        CropScaleError: ``world_size < 1`` or a negative payload.
    """
    n = _check_world_size(world_size)
    return 2.0 * (n - 1) * _check_positive(payload, "payload", allow_zero=True) / n


def ring_allreduce_send_bytes(num_params: int, world_size: int, bytes_per_element: float = 4) -> float:
    """Bytes each rank sends (and receives) in one ring all-reduce: ``V = 2 (N - 1) P b / N``.

    Raises:
        CropScaleError: a negative parameter count, ``world_size < 1`` or ``b <= 0``.
    """
    return ring_allreduce_volume(payload_bytes(num_params, bytes_per_element), world_size)


def ring_allreduce_time(payload: float, world_size: int, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """Ring all-reduce time ``T = 2 (N - 1) alpha + (2 (N - 1) / N) M / B_eff`` in seconds.

    Args:
        payload: ``M`` in bytes.
        world_size: ``N`` ranks.
        alpha_s: per-phase latency in s.
        bandwidth_bytes_per_s: effective per-rank bandwidth ``B_eff`` in bytes/s.
    """
    n = _check_world_size(world_size)
    m = _check_positive(payload, "payload", allow_zero=True)
    a = _check_positive(alpha_s, "alpha_s", allow_zero=True)
    bw = _check_positive(bandwidth_bytes_per_s, "bandwidth_bytes_per_s")
    return 2.0 * (n - 1) * a + (2.0 * (n - 1) / n) * m / bw


def reduce_scatter_send_bytes(num_params: int, world_size: int, bytes_per_element: float = 4) -> float:
    """Bytes each rank sends in a ring reduce-scatter (or all-gather): ``(N - 1) P b / N``."""
    n = _check_world_size(world_size)
    return (n - 1) * payload_bytes(num_params, bytes_per_element) / n


all_gather_send_bytes = reduce_scatter_send_bytes
"""All-gather moves the same per-rank volume as reduce-scatter: ``(N - 1) P b / N``."""


def reduce_scatter_time(payload: float, world_size: int, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """Ring reduce-scatter (or all-gather) time ``(N - 1) alpha + ((N - 1) / N) M / B_eff`` in s."""
    n = _check_world_size(world_size)
    m = _check_positive(payload, "payload", allow_zero=True)
    a = _check_positive(alpha_s, "alpha_s", allow_zero=True)
    bw = _check_positive(bandwidth_bytes_per_s, "bandwidth_bytes_per_s")
    return (n - 1) * a + ((n - 1) / n) * m / bw


all_gather_time = reduce_scatter_time


def fsdp_send_bytes(
    num_params: int, world_size: int, bytes_per_element: float = 4, reshard_after_forward: bool = True
) -> dict[str, float]:
    """Per-rank bytes sent per training step under FSDP.

    Returns:
        ``{"all_gather": ..., "reduce_scatter": ..., "total": ...}`` in bytes. ``all_gather``
        counts the forward gather plus, with ``reshard_after_forward`` (FULL_SHARD), the backward
        re-gather: total ``3 (N - 1) M / N`` (FULL_SHARD) or ``2 (N - 1) M / N`` (SHARD_GRAD_OP).
    """
    one = reduce_scatter_send_bytes(num_params, world_size, bytes_per_element)
    gathers = 2 if reshard_after_forward else 1
    return {"all_gather": gathers * one, "reduce_scatter": one, "total": (gathers + 1) * one}


# --------------------------------------------------------------------------- DDP buckets


@dataclass(frozen=True)
class Bucket:
    """One DDP gradient bucket: indices into the tensor list, its size in bytes and dtype."""

    indices: tuple[int, ...]
    nbytes: int
    dtype: str


def ddp_buckets(
    tensor_bytes: Sequence[int],
    dtypes: Sequence[str] | None = None,
    bucket_cap_mb: float = DDP_BUCKET_CAP_MB,
    first_bucket_mb: float | None = DDP_FIRST_BUCKET_MB,
) -> list[Bucket]:
    """Assign gradient tensors to DDP buckets by size.

    Greedy, in the given order (pass the order in which gradients become ready, i.e. roughly the
    reverse of ``module.parameters()``): a tensor joins the open bucket of its dtype; the bucket
    closes as soon as its size reaches its cap (``first_bucket_mb`` for a dtype's first bucket,
    ``bucket_cap_mb`` afterwards), so it may exceed the cap by one tensor. Buckets are returned
    ordered by their first tensor index.

    Args:
        tensor_bytes: size in bytes of each gradient tensor.
        dtypes: dtype name per tensor (default: all the same).
        bucket_cap_mb: cap in MiB (DDP's ``bucket_cap_mb``, 25 by default).
        first_bucket_mb: cap of the first bucket in MiB (1 by default in DDP; ``None`` = same as
            ``bucket_cap_mb``, which is what DDP does when ``bucket_cap_mb`` is set explicitly).

    Raises:
        CropScaleError: negative sizes, non-positive caps, or ``dtypes`` of the wrong length.
    """
    sizes = [int(b) for b in tensor_bytes]
    if any(b < 0 for b in sizes):
        raise CropScaleError("tensor_bytes must be non-negative sizes in bytes")
    if dtypes is None:
        dtypes = ["float32"] * len(sizes)
    dtypes = [str(d) for d in dtypes]
    if len(dtypes) != len(sizes):
        raise CropScaleError(f"dtypes has {len(dtypes)} entries for {len(sizes)} tensors")
    cap = int(_check_positive(bucket_cap_mb, "bucket_cap_mb") * MIB)
    first = cap if first_bucket_mb is None else int(_check_positive(first_bucket_mb, "first_bucket_mb") * MIB)
    open_buckets: dict[str, tuple[list[int], int]] = {}
    closed_count: dict[str, int] = {}
    done: list[Bucket] = []
    for i, (size, dt) in enumerate(zip(sizes, dtypes, strict=True)):
        idx, total = open_buckets.get(dt, ([], 0))
        idx.append(i)
        total += size
        limit = first if closed_count.get(dt, 0) == 0 else cap
        if total >= limit:
            done.append(Bucket(tuple(idx), total, dt))
            closed_count[dt] = closed_count.get(dt, 0) + 1
            open_buckets.pop(dt, None)
        else:
            open_buckets[dt] = (idx, total)
    for dt, (idx, total) in open_buckets.items():
        done.append(Bucket(tuple(idx), total, dt))
    return sorted(done, key=lambda b: b.indices[0])


def estimated_bucket_count(
    payload: float, bucket_cap_mb: float = DDP_BUCKET_CAP_MB, first_bucket_mb: float | None = DDP_FIRST_BUCKET_MB
) -> int:
    """Number of DDP buckets for a payload of ``payload`` bytes when tensor sizes are unknown.

    Assumes the payload splits exactly at the caps (no one-tensor overshoot): one first bucket of
    ``first_bucket_mb`` and then ``ceil(rest / bucket_cap_mb)`` buckets. Use :func:`ddp_buckets`
    with a real module's tensors for the exact figure.
    """
    m = _check_positive(payload, "payload", allow_zero=True)
    if m == 0:
        return 0
    cap = _check_positive(bucket_cap_mb, "bucket_cap_mb") * MIB
    first = cap if first_bucket_mb is None else _check_positive(first_bucket_mb, "first_bucket_mb") * MIB
    if m <= first:
        return 1
    return 1 + math.ceil((m - first) / cap)


def ddp_allreduce_time(
    bucket_bytes: Iterable[float], world_size: int, alpha_s: float, bandwidth_bytes_per_s: float
) -> float:
    """Time of all of DDP's bucket all-reduces, one after another, without overlap (s).

    ``sum_k [2 (N - 1) alpha + (2 (N - 1) / N) m_k / B_eff]`` = ``K 2 (N - 1) alpha +
    (2 (N - 1) / N) M / B_eff`` for ``K`` buckets of sizes ``m_k`` summing to ``M``: the latency
    term is paid once per bucket.
    """
    return sum(ring_allreduce_time(float(m), world_size, alpha_s, bandwidth_bytes_per_s) for m in bucket_bytes)


@dataclass(frozen=True)
class GradientPayload:
    """What DDP has to synchronise for a real ``nn.Module``.

    Attributes:
        num_params: trainable (``requires_grad``) parameter count ``P``.
        payload_bytes: ``M`` in bytes (sum over trainable tensors of numel x gradient element size).
        bytes_per_element: ``M / P`` (4.0 for an all-FP32 model).
        grad_dtypes: distinct gradient dtype names, e.g. ``("float32",)``.
        tensor_bytes: bytes per gradient tensor, in DDP's ready order (reverse of ``parameters()``).
        tensor_dtypes: dtype name per entry of ``tensor_bytes``.
        source: description of where the figures come from (the module's class name).
    """

    num_params: int
    payload_bytes: float
    bytes_per_element: float
    grad_dtypes: tuple[str, ...]
    tensor_bytes: tuple[int, ...] = field(repr=False)
    tensor_dtypes: tuple[str, ...] = field(repr=False)
    source: str = ""

    def buckets(
        self, bucket_cap_mb: float = DDP_BUCKET_CAP_MB, first_bucket_mb: float | None = DDP_FIRST_BUCKET_MB
    ) -> list[Bucket]:
        """DDP buckets of this model's gradients (see :func:`ddp_buckets`)."""
        return ddp_buckets(self.tensor_bytes, self.tensor_dtypes, bucket_cap_mb, first_bucket_mb)


def gradient_payload(module, grad_dtype=None) -> GradientPayload:
    """Parameter count and gradient bytes of a real ``torch.nn.Module``.

    Args:
        module: the network (only parameters with ``requires_grad`` count; shared parameters once).
        grad_dtype: dtype the gradients are communicated in, if not the parameters' own
            (e.g. ``torch.float16`` with DDP's FP16-compression communication hook). Under AMP the
            parameters and hence the gradients DDP reduces stay FP32.

    Duck-typed (``module.parameters()``, ``p.numel()``, ``p.element_size()``, ``dtype.itemsize``), so
    this package needs no torch import.

    Raises:
        CropScaleError: ``module`` is not an ``nn.Module`` or has no trainable parameter.
    """
    if not callable(getattr(module, "parameters", None)):
        raise CropScaleError(f"gradient_payload needs a torch.nn.Module, got {type(module).__name__}")
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise CropScaleError(f"{type(module).__name__} has no trainable parameter (requires_grad=True)")
    sizes, dts = [], []
    for p in reversed(params):
        dt = grad_dtype if grad_dtype is not None else p.dtype
        elem = grad_dtype.itemsize if grad_dtype is not None else p.element_size()
        sizes.append(p.numel() * elem)
        dts.append(str(dt).removeprefix("torch."))
    num = sum(p.numel() for p in params)
    total = float(sum(sizes))
    return GradientPayload(
        num_params=num,
        payload_bytes=total,
        bytes_per_element=total / num,
        grad_dtypes=tuple(sorted(set(dts))),
        tensor_bytes=tuple(sizes),
        tensor_dtypes=tuple(dts),
        source=type(module).__name__,
    )


# --------------------------------------------------------------------------- table


@dataclass(frozen=True)
class AllReduceRow:
    """Gradient synchronisation cost of one step on ``world_size`` ranks (one table row).

    Volumes in MiB per rank per step (``fsdp_send_mib``: FULL_SHARD, ``3 (N - 1) M / N``); times
    in ms (no overlap with backward).
    """

    world_size: int
    payload_mib: float
    ring_send_mib: float
    fsdp_send_mib: float
    buckets: int
    alpha_us: float
    bandwidth_gb_s: float
    ring_time_ms: float
    ddp_time_ms: float
    evidence: str = ANALYTICAL_SCENARIO


def allreduce_table(
    num_params: int | None = None,
    bytes_per_element: float = 4,
    world_sizes: Iterable[int] = (2, 4, 8),
    alpha_us: float = 10.0,
    bandwidth_gb_s: float = 10.0,
    bucket_cap_mb: float = DDP_BUCKET_CAP_MB,
    first_bucket_mb: float | None = DDP_FIRST_BUCKET_MB,
    payload: GradientPayload | None = None,
) -> list[AllReduceRow]:
    """One :class:`AllReduceRow` per world size.

    Give either ``num_params`` (+ ``bytes_per_element``; buckets then estimated from the payload
    by :func:`estimated_bucket_count`) or ``payload`` from :func:`gradient_payload` (exact buckets
    from the module's tensors). ``alpha_us`` (per-phase latency, µs) and ``bandwidth_gb_s``
    (effective per-rank bandwidth, GB/s = 1e9 bytes/s) are assumptions of the scenario.

    Raises:
        CropScaleError: neither or both of ``num_params`` and ``payload``; bad numbers.
    """
    if (num_params is None) == (payload is None):
        raise CropScaleError("allreduce_table needs exactly one of num_params or payload")
    alpha_s = _check_positive(alpha_us, "alpha_us", allow_zero=True) * 1e-6
    bw = _check_positive(bandwidth_gb_s, "bandwidth_gb_s") * 1e9
    if payload is not None:
        m = payload.payload_bytes
        bucket_sizes = [b.nbytes for b in payload.buckets(bucket_cap_mb, first_bucket_mb)]
    else:
        m = payload_bytes(num_params, bytes_per_element)
        k = estimated_bucket_count(m, bucket_cap_mb, first_bucket_mb)
        cap = bucket_cap_mb * MIB
        first = cap if first_bucket_mb is None else first_bucket_mb * MIB
        bucket_sizes = [min(m, first)] + [min(cap, m - first - i * cap) for i in range(k - 1)]
    rows = []
    for n in world_sizes:
        n = _check_world_size(n)
        rows.append(
            AllReduceRow(
                world_size=n,
                payload_mib=m / MIB,
                ring_send_mib=ring_allreduce_volume(m, n) / MIB,
                fsdp_send_mib=3.0 * (n - 1) * m / n / MIB,  # FULL_SHARD: 2 all-gathers + 1 reduce-scatter
                buckets=len(bucket_sizes),
                alpha_us=float(alpha_us),
                bandwidth_gb_s=float(bandwidth_gb_s),
                ring_time_ms=1e3 * ring_allreduce_time(m, n, alpha_s, bw),
                ddp_time_ms=1e3 * ddp_allreduce_time(bucket_sizes, n, alpha_s, bw),
            )
        )
    return rows


def format_allreduce_table(rows: Sequence[AllReduceRow]) -> str:
    """Markdown table of :func:`allreduce_table` rows, one per world size, with the evidence label."""
    if not rows:
        raise CropScaleError("format_allreduce_table needs at least one row")
    header = [
        "Ranks", "Payload", "Ring send/rank", "FSDP send/rank", "DDP buckets", "alpha", "B_eff",
        "Ring time", "DDP time", "Evidence",
    ]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for r in rows:
        cells = [
            str(r.world_size), f"{r.payload_mib:.2f} MiB", f"{r.ring_send_mib:.2f} MiB",
            f"{r.fsdp_send_mib:.2f} MiB", str(r.buckets), f"{r.alpha_us:g} us", f"{r.bandwidth_gb_s:g} GB/s",
            f"{r.ring_time_ms:.3f} ms", f"{r.ddp_time_ms:.3f} ms", r.evidence,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
