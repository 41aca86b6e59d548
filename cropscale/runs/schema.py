"""The typed records of ``run.json`` (schema ``cropscale.run/1``, documented in ``docs/run_json.md``).

The scaling callbacks build these records and :class:`~cropscale.callbacks.ProvenanceCallback`
writes them with :meth:`Record.to_json`; the run reader (:mod:`cropscale.runs.record`) reads them
back with :meth:`Record.from_json`. One class per ``summary`` section and per epoch entry, field
names equal to the JSON keys, units in the names (``_s``, ``_ms``, ``_j``, ``_w``, ``_gib``).

Reading is lenient in the way a reader of older files must be: a key that is absent takes the
field's default (``None`` or empty), a key that is not a field is kept in :attr:`Record.other` and
written back unchanged. Writing omits the fields marked :func:`optional` while they are ``None``
(``loss_scale.reason`` exists only without a GradScaler, for instance), so a written file has the
keys the documentation lists for its case and no others.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

from cropscale.errors import CropScaleError
from cropscale.evidence import MEASURED_RUN
from cropscale.numbers import median_p95
from cropscale.precision import PrecisionDecision

RUN_SCHEMA = "cropscale.run/1"
"""Schema id of ``run.json``."""
BENCHMARK_SCHEMA = "cropscale.benchmark/1"
"""Schema id of the benchmark JSON (``python -m cropscale benchmark --json``)."""

STEP_WINDOWS: tuple[str, ...] = ("data_wait", "transfer", "forward", "backward", "optimizer", "remainder")
"""The disjoint windows of one optimizer step that :class:`cropscale.callbacks.StepTimingCallback` records and
that add up to the step (``summary.step_timing.windows`` lists them, then ``step``, ``comm``, ``comm_exposed``)."""
COMM_FIGURES: tuple[str, ...] = ("comm", "comm_exposed")
"""The communication figures of a step: the union of the all-reduce bucket intervals and the part left
after the last bucket was launched (not windows: they overlap ``backward``)."""

T = TypeVar("T", bound="Record")


def optional(default: Any = None) -> Any:
    """A field that :meth:`Record.to_json` leaves out while its value is ``None``."""
    return field(default=default, metadata={"omit_none": True})


def jsonable(value: Any) -> Any:
    """A JSON-ready copy: the one cleaning pass of ``run.json`` (:meth:`Record.to_json`).

    Records to dicts, tuples to lists, keys to ``str``, NaN / inf to ``None``, any other object (a path, a
    numpy integer) to its ``str``.
    """
    if isinstance(value, Record | PrecisionDecision):
        return value.to_json()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


def _convert(hint: Any, value: Any) -> Any:
    """``value`` (parsed JSON) as the type ``hint``: records, ``list[...]``, ``dict[str, ...]``, unions.

    Raises:
        CropScaleError: a record expected and something else found (a malformed file).
    """
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(hint):
            if arg is not type(None):
                return _convert(arg, value)
        return value
    if isinstance(hint, type) and issubclass(hint, Record | PrecisionDecision):
        return hint.from_json(value)  # each raises for anything but an object
    if origin is list and isinstance(value, list):
        (arg,) = typing.get_args(hint) or (Any,)
        return [_convert(arg, v) for v in value]
    if origin is dict and isinstance(value, Mapping):
        args = typing.get_args(hint)
        arg = args[1] if len(args) == 2 else Any
        return {k: _convert(arg, v) for k, v in value.items()}
    return value


@dataclass
class Record:
    """Base of the typed records: JSON in and out, unknown keys kept in :attr:`other`."""

    other: dict[str, Any] = field(default_factory=dict, repr=False, compare=False, kw_only=True)

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (field order, then :attr:`other`; see :func:`jsonable`)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "other":
                continue
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit_none"):
                continue
            out[f.name] = jsonable(value)
        out.update({k: jsonable(v) for k, v in self.other.items() if k not in out})
        return out

    @classmethod
    def from_json(cls: type[T], data: Mapping[str, Any] | None) -> T:
        """Build the record from parsed JSON (``None`` or ``{}`` gives the defaults).

        Raises:
            CropScaleError: ``data`` is not a JSON object.
        """
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise CropScaleError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls) if f.name != "other"}
        kwargs = {}
        for k, v in data.items():
            if k in names:
                try:
                    kwargs[k] = _convert(hints[k], v)
                except CropScaleError as err:
                    raise CropScaleError(f"{k}: {err}") from None
        record = cls(**kwargs)
        record.other = {k: v for k, v in data.items() if k not in names}
        return record


# ------------------------------------------------------------------------------------- shared parts
@dataclass
class WindowStats(Record):
    """Median and 95th percentile of a step figure over ``n`` steps (ms)."""

    median: float | None = None
    p95: float | None = None
    n: int = 0

    @classmethod
    def of(cls, values: Sequence[float], scale: float = 1.0) -> WindowStats:
        """The statistics of ``values`` multiplied by ``scale`` (1e3 for seconds -> ms); ``None`` for no value."""
        return cls(**median_p95(values, scale=scale))


@dataclass
class RankStats(Record):
    """A per-rank figure gathered at epoch end: values by global rank, maximum, median, slowest rank.

    ``slowest_rank`` is the rank with the largest value (the slowest, for times).
    """

    per_rank: list[float | None] = field(default_factory=list)
    max: float | None = None
    median: float | None = None
    slowest_rank: int | None = None


# ------------------------------------------------------------------------------------- step timing
@dataclass
class StepTimingEpoch(Record):
    """One training epoch of :class:`~cropscale.callbacks.StepTimingCallback` (ms)."""

    epoch: int = 0
    steps_measured: int = 0
    windows_ms: dict[str, WindowStats] = field(default_factory=dict)
    host_windows_ms: dict[str, WindowStats] | None = optional()
    """``data_wait_host`` and ``transfer_host``: the same two windows on the host clock (``perf_counter``)."""
    step_ms_per_rank: RankStats = field(default_factory=RankStats)
    window_median_ms_per_rank: dict[str, list[float | None]] = field(default_factory=dict)
    first_batch_wait_ms_per_rank: list[float | None] = field(default_factory=list)


@dataclass
class StepTimingSummary(Record):
    """``summary.step_timing``: the step-time decomposition of a run."""

    evidence: str = MEASURED_RUN
    clock: str | None = None
    warmup_steps: int | None = None
    sync_cuda: bool | None = None
    steps_total: int = 0
    steps_measured: int = 0
    comm_timing: dict[str, Any] = field(default_factory=dict)
    trace_path: str | None = None
    windows: list[str] = field(default_factory=list)
    epochs: list[StepTimingEpoch] = field(default_factory=list)


# -------------------------------------------------------------------------------------- throughput
@dataclass
class ThroughputEpoch(Record):
    """One training epoch of :class:`~cropscale.callbacks.ThroughputCallback`.

    Samples (global), samples/s, step latency (ms), train / validation / end-to-end seconds, TFLOP/s
    and MFU. Two throughputs, named apart: ``samples_per_s`` (the training loop: samples / ``train_s``) and
    ``samples_per_s_epoch_clock`` (samples / ``wall_s``, the end-to-end epoch).
    """

    epoch: int = 0
    samples: int = 0
    samples_per_rank: list[int] = field(default_factory=list)
    samples_per_s: float | None = None
    samples_per_s_per_rank: list[float | None] = field(default_factory=list)
    samples_per_s_steady: float | None = None
    step_latency_ms: WindowStats = field(default_factory=WindowStats)
    train_s: float | None = None
    train_s_per_rank: list[float | None] = field(default_factory=list)
    val_s: float | None = None
    wall_s: float | None = None
    flops_per_sample: float | None = None
    tflops_per_s_per_gpu: float | None = None
    peak_tflops: float | None = None
    mfu: float | None = None
    samples_per_s_epoch_clock: float | None = None


@dataclass
class ThroughputSummary(Record):
    """``summary.throughput``: samples/s over the whole run and per epoch.

    ``dtype`` is the matmuls' dtype; ``dtypes_by_class`` the dtype of each operator class (convolution,
    matmul, attention) as the run's switches (``tf32``) selected it; ``flops_by_class`` the FLOPs of one
    sample per class and ``peak_tflops`` the attainable peak MFU was divided by (``peak_source``:
    ``attainable``, ``table`` or the ``peak_tflops`` override).
    """

    evidence: str = MEASURED_RUN
    device: str | None = None
    dtype: str | None = None
    dtypes_by_class: dict[str, str] = field(default_factory=dict)
    tf32: dict[str, bool] = field(default_factory=dict)
    flops_by_class: dict[str, float] | None = None
    peak_tflops: float | None = None
    peak_source: str | None = None
    warmup_steps: int | None = None
    flops_source: str | None = None
    mfu_reason: str | None = None
    total_samples: int = 0
    total_train_s: float = 0.0
    samples_per_s: float | None = None
    epochs: list[ThroughputEpoch] = field(default_factory=list)
    total_wall_s: float | None = None
    samples_per_s_epoch_clock: float | None = None


# -------------------------------------------------------------------------------------- loss scale
@dataclass
class LossScaleEpoch(Record):
    """One training epoch of :class:`~cropscale.callbacks.LossScaleCallback` (event counts)."""

    epoch: int = 0
    steps: int = 0
    backoff_events: int = 0
    growth_events: int = 0
    skipped_steps: int = 0
    overflow_skips: int = 0
    nonfinite_loss_skips: int = 0
    lr_scheduler_steps_on_skipped: int = 0
    loss_scale_end: float | None = None


@dataclass
class LossScaleSummary(Record):
    """``summary.loss_scale``: the AMP GradScaler's events (``reason`` only without a scaler)."""

    evidence: str = MEASURED_RUN
    precision: str | None = None
    scaler_in_use: bool = False
    reason: str | None = optional()
    growth_factor: float | None = optional()
    backoff_factor: float | None = optional()
    growth_interval: int | None = optional()
    initial_scale: float | None = optional()
    final_scale: float | None = optional()
    steps: int | None = optional()
    backoff_events: int | None = optional()
    growth_events: int | None = optional()
    skipped_steps: int | None = optional()
    overflow_skips: int | None = optional()
    nonfinite_loss_skips: int | None = optional()
    lr_scheduler_steps_on_skipped: int | None = optional()
    epochs: list[LossScaleEpoch] | None = optional()


# -------------------------------------------------------------------------------------- non-finite
@dataclass
class RankCounts(Record):
    """Non-finite batches and steps skipped on one rank."""

    nonfinite_batches: int = 0
    skipped_steps: int = 0


@dataclass
class NonFiniteRecord(Record):
    """One non-finite batch: where (step, epoch, micro-batch, rank), what was not finite and the sample ids.

    ``global_step`` is the 0-based index of the optimizer step the micro-batch belongs to (``trainer.global_step``
    while it ran, skipped steps counted; the step of the trace line and of Lightning's ``train/loss_step`` point for
    that step), ``micro_batch`` the 0-based index of the micro-batch in its optimizer step (``None`` when the
    gradients alone were non-finite: the record then names every micro-batch of the step);
    ``input_finite`` whether its floating-point batch tensors were finite (``None``: not checked) and
    ``nonfinite_inputs`` the keys of those that were not.
    """

    global_step: int = 0
    epoch: int = 0
    batch_idx: int = 0
    micro_batch: int | None = None
    rank: int = 0
    loss_finite: bool | None = None
    grads_finite: bool | None = None
    input_finite: bool | None = None
    nonfinite_inputs: list[str] | None = optional()
    patch_id: list[int] | None = optional()
    crop_yx: list[list[int]] | None = optional()
    nonfinite_input_patch_id: list[int] | None = optional()
    nonfinite_input_crop_yx: list[list[int]] | None = optional()

    @property
    def part(self) -> str:
        """Which part was not finite: ``loss``, ``gradients``, ``inputs (<keys>)``, comma-separated."""
        parts = [name for name, finite in (("loss", self.loss_finite), ("gradients", self.grads_finite))
                 if finite is False]
        if self.input_finite is False:
            parts.append(f"inputs ({', '.join(self.nonfinite_inputs or []) or '?'})")
        return ", ".join(parts) or "not recorded"


@dataclass
class NonFiniteSummary(Record):
    """``summary.nonfinite``: non-finite batches and the steps the policy skipped."""

    evidence: str = MEASURED_RUN
    policy: str = "log"
    check_grads: bool = True
    input_check: str | None = None
    nonfinite_batches_rank0: int = 0
    skipped_steps_rank0: int = 0
    per_rank: list[RankCounts] = field(default_factory=list)
    records: list[NonFiniteRecord] = field(default_factory=list)

    @property
    def nonfinite_batches(self) -> int:
        """Non-finite batches summed over ranks (rank 0's count when no rank list was gathered)."""
        return sum(r.nonfinite_batches for r in self.per_rank) if self.per_rank else self.nonfinite_batches_rank0

    @property
    def skipped_steps(self) -> int:
        """Steps the policy skipped, summed over ranks (rank 0's count when no rank list was gathered)."""
        return sum(r.skipped_steps for r in self.per_rank) if self.per_rank else self.skipped_steps_rank0


# ------------------------------------------------------------------------------------ gradient norm
@dataclass
class GradNormEpoch(Record):
    """One training epoch of :class:`~cropscale.callbacks.GradNormCallback`."""

    epoch: int = 0
    steps: int = 0
    grad_norm_median: float | None = None
    grad_norm_p95: float | None = None
    grad_norm_max: float | None = None
    clipped_steps: int | None = None
    clip_fraction: float | None = None
    nonfinite_steps: int = 0


@dataclass
class GradNormSummary(Record):
    """``summary.grad_norm``: the global gradient norm before clipping and how often it was clipped.

    ``sharding`` is the gradient layout the norm was reduced for (``replicated``, ``flat``, ``dtensor``,
    ``world`` or ``unsupported``, see :class:`cropscale.callbacks._grads.ShardLayout`).
    """

    evidence: str = MEASURED_RUN
    norm_type: float = 2.0
    sharded_reduction: bool = False
    sharding: str | None = None
    sharding_reason: str | None = optional()
    clip_threshold: float | None = None
    clip_threshold_reason: str | None = None
    steps: int = 0
    nonfinite_steps: int = 0
    clipped_steps: int | None = None
    clip_fraction: float | None = None
    epochs: list[GradNormEpoch] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ energy
@dataclass
class EnergyWindow(Record):
    """Energy of all GPUs over the whole ``fit`` training window (J) and its per-rank parts."""

    energy_j: float | None = None
    energy_j_per_rank: list[float | None] = field(default_factory=list)
    seconds_per_rank: list[float | None] = field(default_factory=list)


@dataclass
class EnergyEpoch(Record):
    """One training epoch (its validation included) of :class:`~cropscale.callbacks.EnergyCallback`."""

    epoch: int = 0
    energy_j: float | None = None
    energy_j_per_rank: list[float | None] = field(default_factory=list)
    seconds_per_rank: list[float | None] = field(default_factory=list)
    avg_power_w: float | None = None
    avg_power_w_per_rank: list[float | None] = field(default_factory=list)
    samples: int = 0
    j_per_sample: float | None = None
    gpu_hours: float | None = None
    cost: float | None = None
    throttle_reasons_rank0_end: list[str] | None = None


@dataclass
class EnergySummary(Record):
    """``summary.energy``: GPU board energy from NVML (``reason`` and ``devices`` only when unavailable).

    ``power_samples`` / ``power_sample_period_s`` (``method`` ``sampled-power`` only): the fewest power readings any
    rank took over the training window and the longest mean period between them (s).
    """

    evidence: str = MEASURED_RUN
    available: bool = False
    reason: str | None = optional()
    method: str | None = optional()
    devices: list[Any] = field(default_factory=list)
    price_per_gpu_hour: float | None = optional()
    currency: str | None = optional()
    total_energy_j: float | None = optional()
    total_gpu_hours: float | None = optional()
    total_samples: int | None = optional()
    j_per_sample: float | None = optional()
    total_cost: float | None = optional()
    training: EnergyWindow | None = optional()
    epochs: list[EnergyEpoch] | None = optional()
    power_samples: int | None = optional()
    power_sample_period_s: float | None = optional()


# ------------------------------------------------------------------------------------------ memory
@dataclass
class MemoryEpoch(Record):
    """One training epoch of :class:`~cropscale.callbacks.MemoryCallback` (GiB = 2^30 bytes)."""

    epoch: int = 0
    peak_allocated_gib: float | None = None
    peak_reserved_gib: float | None = None
    host_rss_gib: float | None = None
    host_peak_rss_gib: float | None = None
    per_rank: dict[str, list[float | None]] = field(default_factory=dict)


@dataclass
class MemorySummary(Record):
    """``summary.memory``: GPU allocator peaks and host RSS, maxima over epochs and ranks (GiB)."""

    evidence: str = MEASURED_RUN
    gpu_available: bool = False
    gpu_reason: str | None = None
    peak_allocated_gib: float | None = None
    peak_reserved_gib: float | None = None
    host_peak_rss_gib: float | None = None
    epochs: list[MemoryEpoch] = field(default_factory=list)


# -------------------------------------------------------------------------------------- trained
@dataclass
class TrainedSummary(Record):
    """``summary.trained``: whether the optimizer steps changed the weights (``TrainedCallback``).

    ``parameters_changed`` of ``parameters`` tensors differ (``torch.equal``) between the start and the end of the
    training loop on some rank; ``weights_changed`` is ``parameters_changed > 0``; ``optimizer_steps`` the
    optimizer steps Lightning ran in between (``trainer.global_step``, skipped ones included).
    """

    evidence: str = MEASURED_RUN
    weights_changed: bool | None = None
    parameters_changed: int | None = None
    parameters: int | None = None
    optimizer_steps: int | None = None
    weights_finite: bool | None = optional()
    """Every parameter tensor finite at the end of the training loop on every rank (None: not checked)."""
    nonfinite_parameters: int | None = optional()
    """Parameter tensors holding a NaN or inf at the end of the training loop, summed over ranks."""


# ------------------------------------------------------------------------------------------ quality
@dataclass
class QualityEpoch(Record):
    """One validation inside ``fit`` (:class:`~cropscale.callbacks.QualityCallback`).

    ``value`` is the monitored metric (``None`` when not logged or non-finite); ``weights_finite`` whether every
    parameter was finite on every rank when it ran (a non-finite model's score is never a best).
    """

    epoch: int = 0
    global_step: int = 0
    value: float | None = None
    weights_finite: bool | None = None


@dataclass
class QualitySummary(Record):
    """``summary.quality``: every validation of the fit (resumed runs included) and the best and final value.

    ``validation_configured`` is Lightning's ``trainer.enable_validation`` (a validation loader, a
    ``validation_step`` and ``limit_val_batches > 0``); ``validations`` the validation runs of the whole fit
    (sanity checks not counted). ``best`` is the best (``mode``) ``value`` among the validations whose weights were
    finite, ``best_epoch`` the first epoch that reached it; ``final`` the value of the last validation.
    """

    evidence: str = MEASURED_RUN
    monitor: str = "val/mIoU"
    mode: str = "max"
    validation_configured: bool | None = None
    validations: int = 0
    best: float | None = None
    best_epoch: int | None = None
    final: float | None = None
    final_epoch: int | None = None
    epochs: list[QualityEpoch] = field(default_factory=list)


# --------------------------------------------------------------------------------------- divergence
@dataclass
class DivergenceSummary(Record):
    """``summary.divergence``: the training loss at every optimizer step (``DivergenceCallback``).

    ``trailing_nonfinite_steps`` optimizer steps at the end of the run had a non-finite loss on some rank (on any
    of their micro-batches), the first of them ``since_step`` (0-based step index); ``diverged`` when they are at
    least ``min(window, steps)``; ``stopped_at_step`` the global step at which the callback stopped the run.
    """

    evidence: str = MEASURED_RUN
    window: int = 0
    steps: int = 0
    trailing_nonfinite_steps: int = 0
    since_step: int | None = None
    last_finite_step: int | None = None
    diverged: bool | None = None
    why: str | None = None
    stopped_at_step: int | None = None


# ---------------------------------------------------------------------------------------- validity
@dataclass
class ValidityRecord(Record):
    """``run.json["validity"]``: the verdict of :func:`cropscale.runs.validity.validity` on a finished fit.

    ``status`` is ``finished`` (a valid run) or ``not-trained``, ``diverged``, ``not-validated``; ``reason`` one
    sentence with the counts the verdict rests on.
    """

    valid: bool = False
    status: str | None = None
    reason: str | None = None


# ------------------------------------------------------------------------------------- hang watch
@dataclass
class FlightRecorderRecord(Record):
    """``hang_watch.flight_recorder``: PyTorch's Flight Recorder (the collectives each rank entered) for this run.

    ``applies`` is false, with ``reason``, where it records nothing (gloo unless the user turned it on, one
    process); else ``trace_buffer_size`` (entries kept per rank), ``dump_on_timeout`` (PyTorch dumps when a
    collective times out), ``dump_prefix`` (each rank's dump is ``<dump_prefix><rank>``, written at a collective
    timeout and when the hang watch names a hang) and ``set_by`` (``cropscale``, ``user``, or both: which of the
    variables cropscale set because they were unset).
    """

    applies: bool = False
    reason: str | None = optional()
    backend: str | None = optional()
    trace_buffer_size: int | None = optional()
    dump_on_timeout: bool | None = optional()
    dump_prefix: str | None = optional()
    set_by: str | None = optional()


@dataclass
class RankProgress(Record):
    """One rank's last progress as the hang watch saw it (``hang_watch.hang.ranks[]``).

    ``epoch``, ``batch`` (index within the epoch of the batch it last fetched), ``stage`` (how far that batch
    got: ``before its step``, ``in its step``, ``after its step``, ``done``, ``no batch yet``), ``global_step``
    (optimizer steps done); ``phase`` (``training``, or a pause: ``warm-up``, ``epoch start``, ``validation``,
    ``epoch end``); ``where`` its main thread's Python stack said (``in a collective: ...``, ``in backward
    ...``, ``in its own code at <file>:<line> in <function>``); ``in_collective`` (true: waiting for other
    ranks; false: in its own code; null: unknown); ``still_s``: seconds since its progress last changed;
    ``heartbeat``: whether its reporting thread still ran (false: the process is stopped, or a C call holds
    the GIL); ``published``: false for a rank that never reported.
    """

    rank: int = 0
    published: bool = True
    epoch: int | None = None
    batch: int | None = None
    stage: str | None = None
    global_step: int | None = None
    phase: str | None = None
    where: str | None = None
    in_collective: bool | None = None
    still_s: float | None = None
    heartbeat: bool | None = None


@dataclass
class HangRecord(Record):
    """``hang_watch.hang``: the hang the watch named (only in a run it ended).

    ``hung_ranks`` (the ranks named), ``separated`` (false: every rank stopped at the same point and none was
    in its own code, so the evidence could not tell the hung rank from the waiting ones: all are named),
    ``still_s`` (how long no rank had reached its next step when named), ``bound_s`` with ``bound_kind``
    (``step`` or ``pause``) and ``bound_rule`` (how the bound was computed), ``detected_utc``, ``ranks`` (every
    rank's last progress), ``message`` (the line printed) and ``flight_recorder_dumps`` (the files written).
    """

    evidence: str = MEASURED_RUN
    hung_ranks: list[int] = field(default_factory=list)
    separated: bool = True
    still_s: float | None = None
    bound_s: float | None = None
    bound_kind: str | None = None
    bound_rule: str | None = None
    detected_utc: str | None = None
    ranks: list[RankProgress] = field(default_factory=list)
    message: str | None = None
    flight_recorder_dumps: list[str] = field(default_factory=list)


@dataclass
class HangWatchRecord(Record):
    """``run.json["hang_watch"]``: how :class:`cropscale.hangs.HangWatch` watched this fit, and the hang it named.

    ``enabled`` (false, with ``reason``, for one process or without a store); ``floor_s``, ``pause_floor_s``,
    ``factor``, ``poll_s`` (the bound's settings: a step bound ``max(floor_s, factor x the longest stillness
    of ordinary steps)``, a pause bound ``max(pause_floor_s, factor x the longest pause)``); ``channel`` (where
    ranks report their progress); ``flight_recorder``; ``hang`` (absent unless the watch ended the run).
    """

    evidence: str = MEASURED_RUN
    enabled: bool = False
    reason: str | None = optional()
    floor_s: float | None = None
    pause_floor_s: float | None = None
    factor: float | None = None
    poll_s: float | None = None
    channel: str | None = optional()
    flight_recorder: FlightRecorderRecord | None = None
    hang: HangRecord | None = optional()
# ------------------------------------------------------------------------------ checkpoint writes
@dataclass
class CheckpointEpoch(Record):
    """Checkpoint writes of one training epoch (:class:`~cropscale.callbacks.CheckpointTimingCallback`; s).

    ``write_s`` is the time global rank 0's ``CheckpointIO.save_checkpoint`` took (the other ranks wait for it in
    Lightning's barrier); ``outside_wall_s`` the part written after the epoch's end hook, i.e. outside the
    epoch's ``wall_s`` (ModelCheckpoint's save at the training epoch end), the rest fell inside it (a save after
    a validation in the middle of the epoch).
    """

    epoch: int = 0
    saves: int = 0
    write_s: float = 0.0
    outside_wall_s: float = 0.0


@dataclass
class CheckpointSummary(Record):
    """``summary.checkpoint``: the checkpoint writes of the run (global rank 0's ``CheckpointIO``; s)."""

    evidence: str = MEASURED_RUN
    checkpoint_io: str | None = None
    saves: int = 0
    write_s: float = 0.0
    epochs: list[CheckpointEpoch] = field(default_factory=list)


# -------------------------------------------------------------------------------------- the record
@dataclass
class RunSummary(Record):
    """``run.json["summary"]``: one section per scaling callback present (``None`` when absent)."""

    step_timing: StepTimingSummary | None = optional()
    throughput: ThroughputSummary | None = optional()
    loss_scale: LossScaleSummary | None = optional()
    nonfinite: NonFiniteSummary | None = optional()
    grad_norm: GradNormSummary | None = optional()
    energy: EnergySummary | None = optional()
    memory: MemorySummary | None = optional()
    trained: TrainedSummary | None = optional()
    checkpoint: CheckpointSummary | None = optional()
    quality: QualitySummary | None = optional()
    divergence: DivergenceSummary | None = optional()


SUMMARY_TYPES: dict[str, type[Record]] = {
    f.name: typing.get_args(typing.get_type_hints(RunSummary)[f.name])[0]
    for f in dataclasses.fields(RunSummary) if f.name != "other"
}
"""``summary`` key -> the record type of that section."""


# -------------------------------------------------------------------------------------- diagnosis
@dataclass
class DiagnosisFigure(Record):
    """One figure a finding rests on: its value, unit, evidence label and where it comes from."""

    name: str = ""
    value: float | None = None
    unit: str = ""
    evidence: str = MEASURED_RUN
    source: str | None = None


@dataclass
class Finding(Record):
    """One finding of the diagnosis (:mod:`cropscale.diagnosis`): what limits the run, the evidence, the bound.

    ``kind`` is one of :data:`cropscale.diagnosis.thresholds.KINDS`; ``share`` the fraction of its ``base``
    (``step``: the median optimizer step; ``epoch``: the end-to-end epoch) the term takes; ``bound`` how many
    times faster the run could at best go without it (``analytical-scenario``: ``T / (T - t)``);
    ``saving_s_per_epoch`` the seconds per epoch it costs (what orders the findings); ``rank`` and ``part``
    name the culprit rank and the window of its step; ``line`` says it all in one sentence; ``try_settings``
    the settings of this project to try.
    """

    kind: str = ""
    severity: str = ""
    line: str = ""
    share: float | None = None
    base: str | None = None
    bound: float | None = None
    saving_s_per_epoch: float | None = None
    rank: int | None = None
    part: str | None = None
    evidence: list[DiagnosisFigure] = field(default_factory=list)
    try_settings: list[str] = field(default_factory=list)


@dataclass
class RankScore(Record):
    """One rank's own work and waits (ms, medians over the measured epochs) and its score against its best epoch.

    ``own_ms`` = data wait + transfer + forward + (backward - exposed communication) + optimizer; ``wait_ms`` the
    exposed communication (waiting in the gradient all-reduce); ``own_ms_by_epoch`` every recorded epoch's own
    work (``None`` where not recorded); ``score`` = own work of its best epoch / of its last epoch (1: at its
    best; NVIDIA's individual performance score).
    """

    rank: int = 0
    own_ms: float | None = None
    wait_ms: float | None = None
    own_ms_by_epoch: list[float | None] = field(default_factory=list)
    best_epoch: int | None = None
    score: float | None = None


@dataclass
class Diagnosis(Record):
    """``run.json["diagnosis"]``: what limits the run (:func:`cropscale.diagnosis.diagnose`).

    ``limit`` is the kind of the first finding (the one that costs the most time per epoch); ``step_ms`` the median
    over the ranks of their median step (ms, measured epochs); ``shares`` the
    fraction of the step (or epoch) of every term the rules weigh, whether or not it makes a finding (the
    report's comparison of runs reads them); ``not_judged`` what this run's records cannot answer (host gaps
    on a CPU clock, NVML throttle reasons without a GPU); ``error`` a rule that failed (the rest stands).
    """

    evidence: str = MEASURED_RUN
    rules: str = "cropscale.diagnosis/1"
    warmup_epochs: int = 0
    world_size: int = 1
    limit: str | None = None
    step_ms: float | None = None
    findings: list[Finding] = field(default_factory=list)
    shares: dict[str, float] = field(default_factory=dict)
    ranks: list[RankScore] = field(default_factory=list)
    not_judged: list[str] = field(default_factory=list)
    error: str | None = optional()


@dataclass
class RunJson(Record):
    """The whole ``run.json``: provenance written at fit start, the summary at fit end."""

    schema: str = RUN_SCHEMA
    evidence: str = MEASURED_RUN
    status: str | None = None
    started_utc: str | None = None
    finished_utc: str | None = None
    run_dir: str | None = None
    command: list[str] = field(default_factory=list)
    git: dict[str, Any] = field(default_factory=dict)
    dataset: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] | None = None
    config_source: str | None = None
    host: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    devices: list[dict[str, Any]] = field(default_factory=list)
    topology: dict[str, Any] = field(default_factory=dict)
    distributed: dict[str, Any] = field(default_factory=dict)
    precision: str | None = None
    precision_decision: PrecisionDecision | None = optional()
    float32_matmul_precision: str | None = None
    seeds: dict[str, Any] = field(default_factory=dict)
    trainer: dict[str, Any] = field(default_factory=dict)
    callbacks: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    data_warnings: list[str] | None = optional()
    summary: RunSummary = field(default_factory=RunSummary)
    global_step: int | None = optional()
    epochs_completed: int | None = optional()
    error: dict[str, Any] | None = optional()
    hang_watch: HangWatchRecord | None = optional()
    diagnosis: Diagnosis | None = optional()
    validity: ValidityRecord | None = optional()
