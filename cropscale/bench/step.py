"""Compute-only training-step microbenchmark: FP32 against AMP FP16 and AMP BF16.

``python -m cropscale benchmark --precision 32-true 16-mixed bf16-mixed --batch-sizes 1 2 4
--warmup 10 --iterations 30 --device cuda --output bench.json``

What one step is (the study's compute-only step): synthetic tensors already on
the device (:func:`cropscale.model.synthetic.synthetic_batch`, ``s2 [B, T2, 10, H, W]``, ``s1a`` /
``s1d [B, T1, 2, H, W]``, targets incl. ``hr [B, 3, 10H, 10W]``); the full
:class:`~cropscale.model.network.CropMappingNet` forward under ``torch.autocast`` for the mixed
precisions; :class:`~cropscale.model.losses.MultiTaskLoss`; backward (through a real
``torch.amp.GradScaler`` for ``16-mixed``); gradient-norm clipping to 1.0 (after ``unscale_``);
``torch.optim.AdamW``. No data loading, no Lightning.

Timing: host ``time.perf_counter`` around each step, with ``torch.cuda.synchronize`` inside the timed
window after every step on CUDA (on CPU every op is synchronous already). ``--warmup`` steps are run
and recorded apart; ``--iterations`` steps are measured. Median and p95
(:func:`cropscale.numbers.percentile`: numpy's linear interpolation) of the measured steps in ms;
samples/s = batch / median step (s). The non-finite check of each step (loss and gradient norm,
accumulated on the device, read twice per configuration) is launched after the timed window; on CUDA
its two tiny kernels run at the start of the next step's window (microseconds against a step of
milliseconds).

Each configuration (precision x batch size) starts from a fresh state: same seed, new model,
optimizer, scaler and batch, ``torch._dynamo.reset()`` under ``--compile``, and on CUDA the peak
memory counters reset and the cache emptied. TF32 is switched off for matmul and cuDNN for every
row (``torch.backends.cuda.matmul.allow_tf32 = False``, ``torch.backends.cudnn.allow_tf32 = False``)
so that the FP32 row is true FP32 on Ampere and later GPUs and the FP32 parts of the AMP rows
match it, unless ``--tf32`` switches it on for every row (the ``32-true`` rows are then labelled
``TF32``); the previous settings are restored at the end.

Speed levers: ``--compile`` (``--compile-mode``), ``--fused`` (fused AdamW), ``--channels-last``
(:mod:`cropscale.model.speed`). ``--stop-at-oom`` skips the batch sizes above one that ran out of
memory, ``--max-seconds`` the configurations not started within a time budget (``status =
"skipped"``, printed as "not run"). Progress (configuration i of n, step, time left) and the
configurations known to be slow on this device go to stderr; stdout keeps the results.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` (GiB = 2**30 bytes) over the configuration
(model, optimizer state, batch, activations); on CPU the largest resident set size (RSS) of the
whole process read from ``/proc/self/statm`` after each step — the process total (Python, libraries,
allocator caches kept from earlier configurations), so only an upper bound of the step's needs.
``peak_memory_kind`` says which.

FLOPs: :func:`cropscale.model.flops.flops_per_sample` (forward + backward of one sample, optimizer
excluded; evidence ``count``) x batch / median step = achieved TFLOP/s; MFU = achieved / the attainable
dense peak of the math that ran (:func:`cropscale.env.peaks.attainable_peak_tflops`): the FLOPs per
operator class (:func:`cropscale.model.flops.flops_per_sample_by_class`, ``flops_by_class`` in the JSON)
weight the peaks of the dtypes each class ran in, read from torch's switches when the row runs
(``dtypes_by_class``: the autocast dtype under AMP, FP32 under ``32-true`` since TF32 is off here;
the usual convention although some ops stay in FP32); ``None`` with ``mfu_reason`` where the device is
not in the scaling callbacks' peak table (always on CPU) unless ``--peak-tflops`` is given.

16-mixed on CPU: torch (>= 2.3) has float16 autocast and ``torch.amp.GradScaler("cpu")`` on CPU, so the
row runs with a real scaler there too; it is numerically meaningful but its speed is not (most CPUs
have no fast FP16 matrix units). Where the installed torch lacks either, the row has
``status = "unsupported"`` and the reason.

Out of memory (``torch.OutOfMemoryError``) in a configuration gives ``status = "oom"`` for that row;
the remaining configurations still run. Any other error gives ``status = "error"`` with its message,
the rest still run, and the command exits with status 1.

Energy (CUDA): the NVML total-energy counter of the GPU (matched by UUID, :mod:`cropscale.env.nvml`) read
just before the first measured step and just after the last one (both synchronised): ``energy_j`` over
``energy_window_s``, ``energy_per_sample_j`` = J / (iterations x batch), ``avg_power_w``. The counter
moves in steps of its own update interval, so a window under a second is coarse (``energy_reason`` says
so). On CPU, or without the counter, the energy fields are ``None`` with ``energy_reason``.

Every figure here is evidence ``measured-microbenchmark``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from cropscale.batch import model_inputs
from cropscale.commands import CropSize, Device, OptionError, SampleShape, Seed, Threads, Warmup, parse_options
from cropscale.env import nvml, peaks
from cropscale.env.host import cpu_bf16_units, current_rss_bytes, environment_record, load_average
from cropscale.errors import CropScaleError
from cropscale.evidence import COUNT, MEASURED_MICROBENCHMARK
from cropscale.files import atomic_write_text
from cropscale.model.flops import flops_per_sample, flops_per_sample_by_class
from cropscale.model.losses import MultiTaskLoss
from cropscale.model.network import CropMappingNet
from cropscale.model.speed import COMPILE_MODES, compile_unavailable_reason, fused_devices
from cropscale.model.synthetic import synthetic_batch
from cropscale.numbers import percentile
from cropscale.precision import LABELS as PRECISION_LABELS
from cropscale.progress import Progress

__all__ = [
    "AUTOCAST_DTYPE",
    "PRECISIONS",
    "SCHEMA",
    "BenchmarkConfig",
    "amp_ratios",
    "format_table",
    "main",
    "peak_tflops",
    "run_benchmark",
    "run_configuration",
    "train_step",
]

SCHEMA = "cropscale.benchmark/1"
PRECISIONS: tuple[str, ...] = ("32-true", "16-mixed", "bf16-mixed")
AUTOCAST_DTYPE: dict[str, torch.dtype | None] = {"32-true": None, "16-mixed": torch.float16,
                                                 "bf16-mixed": torch.bfloat16}
"""``torch.autocast`` dtype of each benchmarked precision (``None``: no autocast)."""
CLIP_NORM = 1.0
GIB = 2**30


@dataclass
class BenchmarkConfig:
    """What to measure (one instance = one ``benchmark`` invocation).

    Args:
        precisions: Lightning precision names, any of :data:`PRECISIONS`.
        batch_sizes: samples per step (local batch), each >= 1.
        warmup: unmeasured steps per configuration (>= 0).
        iterations: measured steps per configuration (>= 1).
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:i"``.
        num_classes, t2, t1, crop_size: model and sample shape (``C``; Sentinel-2 dates ``T2``;
            dates per Sentinel-1 orbit ``T1``; ``H = W = crop_size`` pixels at 10 m, a multiple of 4).
        net_kwargs: further :class:`~cropscale.model.network.CropMappingNet` arguments.
        channels_last: convert the model to ``torch.channels_last`` (4-D conv weights; the 5-D
            inputs keep their layout).
        compile: wrap the model in ``torch.compile`` (compilation falls in the warm-up steps).
        compile_mode: ``torch.compile`` mode (:data:`cropscale.model.speed.COMPILE_MODES`).
        fused: fused AdamW (``torch.optim.AdamW(fused=True)``).
        tf32: TF32 on for matmul and cuDNN in every row (the ``32-true`` rows are then labelled ``TF32``);
            off by default, so that ``32-true`` is true FP32.
        stop_at_oom: after an out-of-memory batch size, the larger ones of the same precision are not run
            (``status = "skipped"``).
        max_seconds: configurations not started within this many seconds of the first are not run
            (``status = "skipped"``); ``None``: no limit.
        order: ``precision`` (precision outer, batch size inner) or ``batch`` (batch size outer: under a
            time budget every precision gets its small batches first).
        lr, weight_decay: AdamW settings.
        seed: seed of model initialisation and synthetic batch (the same for every configuration).
        peak_tflops: override of the dense peak TFLOP/s used for MFU (all precisions).
    """

    precisions: list[str] = field(default_factory=lambda: ["32-true", "16-mixed"])
    batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4])
    warmup: int = 10
    iterations: int = 30
    device: str = "cpu"
    num_classes: int = 10
    t2: int = 16
    t1: int = 4
    crop_size: int = 32
    net_kwargs: dict[str, Any] = field(default_factory=dict)
    channels_last: bool = False
    compile: bool = False
    compile_mode: str = "default"
    fused: bool = False
    tf32: bool = False
    stop_at_oom: bool = False
    max_seconds: float | None = None
    order: str = "precision"
    lr: float = 1e-3
    weight_decay: float = 0.01
    seed: int = 0
    peak_tflops: float | None = None

    def validate(self) -> None:
        """Raise :class:`CropScaleError` naming the bad argument."""
        bad = [p for p in self.precisions if p not in PRECISIONS]
        if bad or not self.precisions:
            raise CropScaleError(f"--precision must be among {', '.join(PRECISIONS)}; got {self.precisions}")
        if not self.batch_sizes or any(int(b) < 1 for b in self.batch_sizes):
            raise CropScaleError(f"--batch-sizes must be integers >= 1; got {self.batch_sizes}")
        if self.warmup < 0:
            raise CropScaleError(f"--warmup must be >= 0; got {self.warmup}")
        if self.iterations < 1:
            raise CropScaleError(f"--iterations must be >= 1; got {self.iterations}")
        if self.crop_size < 4 or self.crop_size % 4:
            raise CropScaleError(
                f"--crop-size must be a positive multiple of 4 (two stride-2 stages); got {self.crop_size}"
            )
        for name in ("num_classes", "t2", "t1"):
            if getattr(self, name) < 1:
                raise CropScaleError(f"--{name.replace('_', '-')} must be >= 1; got {getattr(self, name)}")
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise CropScaleError(f"--peak-tflops must be > 0; got {self.peak_tflops}")
        if self.order not in ("precision", "batch"):
            raise CropScaleError(f"--order must be precision or batch; got {self.order!r}")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise CropScaleError(f"--max-seconds must be > 0; got {self.max_seconds}")
        if self.compile_mode not in COMPILE_MODES:
            raise CropScaleError(f"--compile-mode must be one of {', '.join(COMPILE_MODES)}; got {self.compile_mode!r}")
        device = resolve_device(self.device)
        if self.compile:
            reason = compile_unavailable_reason(device.type)
            if reason is not None:
                raise CropScaleError(f"--compile: torch.compile is unavailable on {device.type}: {reason}")
        if self.fused and device.type not in fused_devices():
            raise CropScaleError(f"--fused: torch {torch.__version__} has no fused AdamW kernel for {device.type}")


def resolve_device(name: str) -> torch.device:
    """``torch.device`` for ``name``; raises :class:`CropScaleError` if it does not exist here."""
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise CropScaleError(f"--device {name!r} is not a device name (cpu, cuda, cuda:i): {err}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CropScaleError(f"--device {name!r}: CUDA is not available on this machine (use --device cpu)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise CropScaleError(
                f"--device {name!r}: only {torch.cuda.device_count()} CUDA device(s) visible"
            )
    elif device.type != "cpu":
        raise CropScaleError(f"--device {name!r}: only cpu and cuda[:i] are supported")
    return device


# ----------------------------------------------------------------------------------------- peaks
def peak_tflops(device_name: str, dtype: str, override: float | None = None) -> tuple[float | None, str | None]:
    """Dense peak TFLOP/s of ``device_name`` for ``dtype`` (``fp32 | fp16 | bf16``).

    Looked up in the scaling callbacks' peak table (one table in the project). Returns
    ``(peak, None)`` or ``(None, reason)``; ``override`` (``--peak-tflops``) wins.
    """
    if override is not None:
        return float(override), None
    try:
        value = peaks.peak_tflops(device_name, dtype)
    except (KeyError, ValueError, CropScaleError) as err:
        return None, f"device {device_name!r} / {dtype} is not in the dense peak table: {err}"
    if value is None:
        return None, f"device {device_name!r} / {dtype} is not in the dense peak table (pass --peak-tflops)"
    return float(value), None


# ------------------------------------------------------------------------------------------ step
def train_step(
    model: torch.nn.Module,
    loss_fn: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    batch: dict[str, torch.Tensor],
    device_type: str,
    autocast_dtype: torch.dtype | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimisation step; returns ``(loss, grad_norm)`` as 0-d device tensors (no host sync).

    Forward and loss under ``torch.autocast(device_type, autocast_dtype)`` when ``autocast_dtype`` is
    set; ``scaler.scale(loss).backward()``; ``scaler.unscale_``; ``clip_grad_norm_(.., 1.0)``;
    ``scaler.step``; ``scaler.update`` (a disabled scaler makes these plain backward / step).
    """
    optimizer.zero_grad(set_to_none=True)
    ctx = (torch.autocast(device_type=device_type, dtype=autocast_dtype) if autocast_dtype is not None
           else contextlib.nullcontext())
    with ctx:
        outputs = model(**model_inputs(batch))
        loss, _terms = loss_fn(outputs, batch)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach(), grad_norm.detach()


def _unsupported_reason(precision: str, device: torch.device) -> str | None:
    if precision == "bf16-mixed" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bfloat16 support (torch.cuda.is_bf16_supported() is False)"
    if precision == "16-mixed":
        if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
            return "torch.amp.GradScaler is missing from this torch"
        if device.type == "cpu":
            try:
                torch.amp.GradScaler("cpu")
                with torch.autocast("cpu", dtype=torch.float16):
                    pass
            except (RuntimeError, ValueError, TypeError, AssertionError) as err:
                return f"float16 autocast or GradScaler('cpu') unsupported by torch {torch.__version__}: {err}"
    return None


def set_tf32(on: bool = False) -> dict[str, bool]:
    """Switch TF32 for matmul and cuDNN on or off; returns the switches as set ``{"matmul", "cudnn"}``."""
    torch.backends.cuda.matmul.allow_tf32 = bool(on)
    torch.backends.cudnn.allow_tf32 = bool(on)
    return {"matmul": bool(torch.backends.cuda.matmul.allow_tf32), "cudnn": bool(torch.backends.cudnn.allow_tf32)}


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _empty_row(config: BenchmarkConfig, precision: str, batch_size: int, device: torch.device) -> dict[str, Any]:
    return {
        "precision": precision,
        "precision_label": row_label(precision, config.tf32),
        "batch_size": int(batch_size),
        "status": "ok",
        "error": None,
        "evidence": MEASURED_MICROBENCHMARK,
        "device": str(device),
        "autocast_dtype": str(AUTOCAST_DTYPE[precision]).removeprefix("torch.") if AUTOCAST_DTYPE[precision] else None,
        "grad_scaler": precision == "16-mixed",
        "tf32": None,
        "channels_last": config.channels_last,
        "compile": config.compile,
        "compile_mode": config.compile_mode if config.compile else None,
        "fused": config.fused,
        "warmup": config.warmup,
        "iterations": config.iterations,
        "warmup_step_times_ms": [],
        "step_times_ms": [],
        "median_step_ms": None,
        "p95_step_ms": None,
        "mean_step_ms": None,
        "min_step_ms": None,
        "max_step_ms": None,
        "samples_per_s": None,
        "peak_memory_gib": None,
        "peak_memory_kind": None,
        "peak_reserved_gib": None,
        "flops_per_sample": None,
        "achieved_tflops": None,
        "peak_tflops": None,
        "dtypes_by_class": None,
        "mfu": None,
        "mfu_reason": None,
        "loss_scale_initial": None,
        "loss_scale_final": None,
        "nonfinite_steps": None,
        "nonfinite_warmup_steps": None,
        "final_loss": None,
        "energy_j": None,
        "energy_per_sample_j": None,
        "energy_window_s": None,
        "avg_power_w": None,
        "energy_method": None,
        "energy_reason": None,
    }


@dataclass
class _Setup:
    """What one configuration measures: a fresh model, loss, optimizer, scaler and synthetic batch."""

    model: torch.nn.Module
    step_model: Callable[..., Any]
    loss_fn: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    batch: dict[str, torch.Tensor]


def _fresh_state(config: BenchmarkConfig, device: torch.device, row: dict[str, Any]) -> int | None:
    """Reset state between configurations and return the process RSS (bytes) as the starting host peak.

    Frees the previous configuration, switches TF32 off, resets the compile caches and the CUDA peak counters.
    """
    _free(device)
    row["tf32"] = set_tf32(config.tf32)
    if config.compile:
        torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return current_rss_bytes()


def build_setup(config: BenchmarkConfig, precision: str, batch_size: int, device: torch.device) -> _Setup:
    """Model (seeded), loss, AdamW, scaler (enabled for ``16-mixed``) and the synthetic batch on ``device``."""
    torch.manual_seed(config.seed)
    model = CropMappingNet(num_classes=config.num_classes, **config.net_kwargs).to(device)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    batch = synthetic_batch(
        batch_size, t2=config.t2, t1=config.t1, height=config.crop_size, width=config.crop_size,
        num_classes=config.num_classes, device=device, seed=config.seed,
    )
    return _Setup(
        model=model,
        step_model=torch.compile(model, mode=config.compile_mode) if config.compile else model,
        loss_fn=MultiTaskLoss().to(device),
        optimizer=torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                    **({"fused": True} if config.fused else {})),
        scaler=torch.amp.GradScaler(device.type, enabled=precision == "16-mixed"),
        batch=batch,
    )


def _run_steps(setup: _Setup, config: BenchmarkConfig, precision: str, device: torch.device,
               step_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]], row: dict[str, Any],
               peak_rss: int | None, progress: Progress | None = None,
               ) -> tuple[list[float], torch.Tensor | None, int | None]:
    """Warm-up and measured steps; returns ``(step times in ms, last loss, host peak RSS in bytes)``.

    Fills ``loss_scale_initial``, ``nonfinite_warmup_steps`` and ``nonfinite_steps`` (a device
    counter, read once after the warm-up and once at the end).
    """
    scaler = setup.scaler
    if scaler.is_enabled():
        row["loss_scale_initial"] = float(scaler.get_scale())
    nonfinite = torch.zeros((), dtype=torch.int64, device=device)
    times: list[float] = []
    loss = None
    energy = None
    for i in range(config.warmup + config.iterations):
        if i == config.warmup:
            row["nonfinite_warmup_steps"] = int(nonfinite.item())
            nonfinite.zero_()
            energy = _energy_start(device, row)
        start = time.perf_counter()
        loss, grad_norm = step_fn(setup.step_model, setup.loss_fn, setup.optimizer, scaler, setup.batch,
                                  device.type, AUTOCAST_DTYPE[precision])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
        nonfinite += (~torch.isfinite(loss) | ~torch.isfinite(grad_norm)).to(torch.int64)
        if device.type == "cpu":
            rss = current_rss_bytes()
            if rss is not None and (peak_rss is None or rss > peak_rss):
                peak_rss = rss
        if progress is not None:
            progress.step(i + 1)
    _energy_end(energy, row, config.iterations * row["batch_size"])
    if config.warmup == 0:
        row["nonfinite_warmup_steps"] = 0
    row["nonfinite_steps"] = int(nonfinite.item())
    return times, loss, peak_rss


def _energy_start(device: torch.device, row: dict[str, Any]) -> tuple[nvml.NvmlDevice, float, float] | None:
    """``(NVML device, counter J, perf_counter s)`` now, or ``None`` with ``energy_reason`` set in ``row``."""
    dev, why = nvml.open_device_for(device)
    ok, why = dev.has_energy_counter() if dev is not None else (False, why)
    if not ok:
        row["energy_reason"] = why
        return None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return dev, dev.energy_j(), time.perf_counter()


def _energy_end(start: tuple[nvml.NvmlDevice, float, float] | None, row: dict[str, Any], samples: int) -> None:
    """Energy of the measured steps from the counter readings around them: J, J/sample, W, window (s)."""
    if start is None:
        return
    dev, e0, t0 = start
    joules = nvml.counter_delta_j(e0, dev.energy_j())
    seconds = time.perf_counter() - t0
    if joules is None:
        row["energy_reason"] = "the NVML energy counter went backwards (driver reload)"
        return
    row.update(energy_j=joules, energy_window_s=seconds, energy_method="nvml-counter",
               energy_per_sample_j=joules / samples if samples else None,
               avg_power_w=joules / seconds if seconds > 0 else None)
    if seconds < 1.0:
        row["energy_reason"] = (f"window {seconds:.3f} s: under a second the counter's update interval makes "
                                "the energy coarse")


def _record_end_state(row: dict[str, Any], loss: torch.Tensor | None, scaler: torch.amp.GradScaler,
                      device: torch.device, peak_rss: int | None) -> None:
    """Final loss, final loss scale and peak memory (GiB) of the configuration."""
    final = float(loss) if loss is not None else None
    row["final_loss"] = final if final is not None and math.isfinite(final) else None
    if scaler.is_enabled():
        row["loss_scale_final"] = float(scaler.get_scale())
    if device.type == "cuda":
        row["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / GIB
        row["peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / GIB
        row["peak_memory_kind"] = "cuda-max-allocated"
    else:
        row["peak_memory_gib"] = peak_rss / GIB if peak_rss is not None else None
        row["peak_memory_kind"] = "host-rss-process"


def _timing_figures(row: dict[str, Any], times: list[float], warmup: int, batch_size: int) -> None:
    """Raw step times and their median, p95, mean, min, max (ms) and samples/s = batch / median (s)."""
    measured = times[warmup:]
    row["warmup_step_times_ms"] = times[:warmup]
    row["step_times_ms"] = measured
    median = statistics.median(measured)
    row.update(
        median_step_ms=median,
        p95_step_ms=percentile(measured, 95),
        mean_step_ms=statistics.fmean(measured),
        min_step_ms=min(measured),
        max_step_ms=max(measured),
        samples_per_s=batch_size / (median / 1e3),
    )


def _mfu_figures(row: dict[str, Any], config: BenchmarkConfig, precision: str, batch_size: int,
                 device: torch.device, flops_per_sample: float | None,
                 flops_by_class: dict[str, float] | None = None) -> None:
    """Achieved TFLOP/s = FLOPs per sample x batch / median step (s) / 1e12, and MFU = achieved / attainable peak.

    ``dtypes_by_class`` is read from torch's TF32 switches now (:func:`cropscale.env.peaks.tf32_settings`);
    the peak is the ``--peak-tflops`` override, else the attainable peak of ``flops_by_class`` (or, without
    it, the table's peak when every class runs in one dtype).
    """
    tf32 = peaks.tf32_settings()
    dtypes = peaks.class_dtypes(precision, tf32["matmul"], tf32["cudnn_conv"])
    row["dtypes_by_class"] = dtypes
    if flops_per_sample is None:
        row["mfu_reason"] = "FLOPs per sample unavailable"
        return
    row["flops_per_sample"] = flops_per_sample
    row["achieved_tflops"] = flops_per_sample * batch_size / (row["median_step_ms"] / 1e3) / 1e12
    if config.peak_tflops is not None:
        peak, why = float(config.peak_tflops), None
    elif device.type == "cpu":
        peak, why = None, "device is a CPU: no dense peak table for CPUs"
    elif flops_by_class:
        peak = peaks.attainable_peak_tflops(_device_name(device), flops_by_class, dtypes)
        why = None if peak is not None else (f"device {_device_name(device)!r} / {sorted(set(dtypes.values()))} is "
                                             "not in the dense peak table (pass --peak-tflops)")
    else:
        peak, why = peak_tflops(_device_name(device), dtypes["matmul"])
    row["peak_tflops"] = peak
    row["mfu"] = row["achieved_tflops"] / peak if peak else None
    row["mfu_reason"] = why


def run_configuration(
    config: BenchmarkConfig,
    precision: str,
    batch_size: int,
    device: torch.device,
    flops_per_sample: float | None = None,
    step_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
    flops_by_class: dict[str, float] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Measure one (precision, batch size) configuration in a fresh state; returns its result row.

    ``step_fn`` replaces :func:`train_step` (same signature; tests use it to fake an OOM). Out of
    memory gives a row with ``status = "oom"``; other exceptions propagate to the caller.

    Row fields: see :func:`run_benchmark`. Times in ms, memory in GiB (2**30 bytes), throughput in
    samples/s, FLOPs in FLOP, TFLOP/s = 1e12 FLOP/s.
    """
    row = _empty_row(config, precision, batch_size, device)
    reason = _unsupported_reason(precision, device)
    if reason is not None:
        row.update(status="unsupported", error=reason)
        return row
    peak_rss = _fresh_state(config, device, row)
    setup = None
    try:
        setup = build_setup(config, precision, batch_size, device)
        times, loss, peak_rss = _run_steps(setup, config, precision, device, step_fn or train_step, row, peak_rss,
                                           progress)
        _record_end_state(row, loss, setup.scaler, device, peak_rss)
    except torch.OutOfMemoryError as err:
        row.update(status="oom", error=f"out of memory at batch {batch_size}: {' '.join(str(err).split())[:400]}")
        return row
    finally:
        del setup
        _free(device)
    _timing_figures(row, times, config.warmup, batch_size)
    _mfu_figures(row, config, precision, batch_size, device, flops_per_sample, flops_by_class)
    return row


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def _flops(config: BenchmarkConfig) -> tuple[dict[str, float] | None, str | None]:
    torch.manual_seed(config.seed)
    net = CropMappingNet(num_classes=config.num_classes, **config.net_kwargs)
    counts = flops_per_sample(net, t2=config.t2, t1=config.t1, height=config.crop_size, width=config.crop_size)
    return {k: float(v) for k, v in counts.items()}, None


def _flops_by_class(config: BenchmarkConfig) -> dict[str, float]:
    torch.manual_seed(config.seed)
    net = CropMappingNet(num_classes=config.num_classes, **config.net_kwargs)
    split = flops_per_sample_by_class(net, t2=config.t2, t1=config.t1, height=config.crop_size,
                                      width=config.crop_size)
    return {k: float(v) for k, v in split.items()}


def row_label(precision: str, tf32: bool = False) -> str:
    """Display label of a benchmark row: the precision's (``FP32``, ``AMP FP16``, ...); ``TF32`` for 32-true + TF32."""
    return "TF32" if tf32 and precision == "32-true" else PRECISION_LABELS[precision]


def slow_notes(config: BenchmarkConfig, device: torch.device) -> list[str]:
    """Configurations known to be slow on this device, said before they run (printed on stderr).

    ``bf16-mixed`` on a CPU without bfloat16 units (:func:`cropscale.env.host.cpu_bf16_units`): autocast
    converts around FP32 arithmetic there, and a step takes several times an FP32 one.
    """
    notes = []
    if device.type == "cpu" and "bf16-mixed" in config.precisions and cpu_bf16_units() is False:
        notes.append("bf16-mixed is known to be slow on this CPU: it has no bfloat16 units (no avx512_bf16 / "
                     "amx_bf16 flag), so autocast converts around FP32 math; expect each bf16 step to take "
                     "several times an FP32 step")
    if device.type == "cpu" and "16-mixed" in config.precisions:
        notes.append("16-mixed on a CPU: numerically meaningful, but its speed is not (no fast FP16 units)")
    if config.compile:
        notes.append(f"--compile: each configuration compiles during its {config.warmup} warm-up step(s) "
                     "(the first one takes the longest)")
    return notes


def _skip_reason(config: BenchmarkConfig, oom_at: int | None, batch_size: int, elapsed_s: float) -> str | None:
    """Why a configuration is not run (``--stop-at-oom``, ``--max-seconds``), or ``None``."""
    if config.stop_at_oom and oom_at is not None and batch_size > oom_at:
        return f"not run: batch {oom_at} already ran out of memory (--stop-at-oom)"
    if config.max_seconds is not None and elapsed_s > config.max_seconds:
        return f"not run: the --max-seconds {config.max_seconds:g} budget was spent ({elapsed_s:.0f} s)"
    return None


def _one_row(config: BenchmarkConfig, precision: str, batch_size: int, device: torch.device,
             flops: dict[str, float] | None, step_fn: Callable[..., Any] | None,
             by_class: dict[str, float], progress: Progress) -> dict[str, Any]:
    """One configuration with its progress lines; an unexpected error becomes an ``error`` row."""
    label = row_label(precision, config.tf32)
    progress.start(f"{label} batch {batch_size}", steps=config.warmup + config.iterations)
    try:
        row = run_configuration(config, precision, batch_size, device, flops["total"] if flops else None,
                                step_fn, by_class, progress)
    except Exception as err:  # one broken configuration must not lose the others
        row = _empty_row(config, precision, batch_size, device)
        row.update(status="error", error=f"{type(err).__name__}: {' '.join(str(err).split())[:400]}")
    took = progress.finish()
    if row["status"] == "ok":
        progress.note(f"{label} batch {batch_size}: {row['samples_per_s']:.1f} samples/s, median step "
                      f"{row['median_step_ms']:.1f} ms ({took:.0f} s) [{MEASURED_MICROBENCHMARK}]")
    else:
        progress.note(f"{label} batch {batch_size}: {row['status']}: {row['error']}")
    return row


def run_benchmark(
    config: BenchmarkConfig,
    argv: list[str] | None = None,
    step_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
    progress: Progress | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every configuration of ``config`` (precision outer, batch size inner) and return the JSON document.

    Returns:
        ``{"schema", "evidence", "settings", "flops_per_sample", "flops_by_class", "flops_evidence" ("count"),
        "environment", "results", "amp_vs_fp32"}``; ``results`` has one row per configuration with
        ``precision``, ``batch_size``, ``status`` (``ok | oom | unsupported | error | skipped``), ``error``,
        ``step_times_ms`` (``iterations`` raw measured steps), ``warmup_step_times_ms``, ``median_step_ms``,
        ``p95_step_ms``, ``mean_step_ms``, ``min_step_ms``, ``max_step_ms``, ``samples_per_s`` (= batch / median s),
        ``peak_memory_gib`` and ``peak_memory_kind``, ``peak_reserved_gib`` (CUDA), ``flops_per_sample``,
        ``achieved_tflops``, ``peak_tflops`` (the attainable peak), ``dtypes_by_class``, ``mfu``, ``mfu_reason``,
        ``loss_scale_initial``,
        ``loss_scale_final`` (16-mixed only), ``nonfinite_steps`` (measured steps with a non-finite loss
        or gradient norm; under 16-mixed exactly the steps the scaler skipped), ``nonfinite_warmup_steps``,
        ``final_loss``, ``tf32``, ``autocast_dtype``, ``grad_scaler``, ``evidence``.

    Progress (configuration i of n, steps, time left) and configurations known to be slow go to stderr
    through ``progress`` (a new :class:`~cropscale.progress.Progress` when ``None``). ``on_row`` receives
    the document of the rows so far after each configuration (``main`` writes ``--output`` with it, so
    a run stopped by a time limit keeps what it measured).

    Raises:
        CropScaleError: a bad argument (see :meth:`BenchmarkConfig.validate`).
    """
    config.validate()
    device = resolve_device(config.device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    previous_tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    flops, flops_reason = _flops(config)
    by_class = _flops_by_class(config)
    environment = environment_record(Path(__file__), argv, device)
    rows: list[dict[str, Any]] = []
    progress = progress or Progress(len(config.precisions) * len(config.batch_sizes), "benchmark")
    for line in slow_notes(config, device):
        progress.note(line)
    started = time.monotonic()
    oom_at: dict[str, int] = {}
    try:
        for precision, batch_size in configurations(config):
            skip = _skip_reason(config, oom_at.get(precision), batch_size, time.monotonic() - started)
            if skip is not None:
                row = _empty_row(config, precision, batch_size, device)
                row.update(status="skipped", error=skip)
                progress.start(f"{row['precision_label']} batch {batch_size}")
                progress.finish()
                progress.note(f"{row['precision_label']} batch {batch_size}: {skip}")
            else:
                row = _one_row(config, precision, batch_size, device, flops, step_fn, by_class, progress)
                if flops is None:
                    row["mfu_reason"] = flops_reason
                if row["status"] == "oom" and batch_size < oom_at.get(precision, batch_size + 1):
                    oom_at[precision] = batch_size
            rows.append(row)
            if on_row is not None:
                on_row(_document(config, flops, by_class, flops_reason, environment, rows))
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous_tf32
    environment["host"]["load_average_1_5_15_min_end"] = load_average()
    return _document(config, flops, by_class, flops_reason, environment, rows)


def _document(config: BenchmarkConfig, flops: dict[str, float] | None, by_class: dict[str, float],
              flops_reason: str | None, environment: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON document of :func:`run_benchmark` for the rows measured so far."""
    settings = asdict(config)
    settings.update(
        optimizer="AdamW (fused)" if config.fused else "AdamW",
        loss="MultiTaskLoss (default weights)",
        clip_grad_norm=CLIP_NORM,
        timing="host perf_counter around each step; torch.cuda.synchronize() after every step on CUDA",
        p95="numpy.percentile(q=95, linear interpolation)",
        samples_per_s="batch_size / (median_step_ms / 1000)",
        tf32=f"{'on' if config.tf32 else 'off'} for matmul and cuDNN in every configuration",
    )
    return {
        "schema": SCHEMA,
        "evidence": MEASURED_MICROBENCHMARK,
        "settings": settings,
        "flops_per_sample": flops,
        "flops_by_class": by_class,
        "flops_evidence": COUNT,
        "flops_reason": flops_reason,
        "environment": environment,
        "results": list(rows),
        "amp_vs_fp32": amp_ratios(rows),
    }


def configurations(config: BenchmarkConfig) -> list[tuple[str, int]]:
    """``(precision, batch size)`` pairs in run order: precision outer (``order="precision"``) or batch outer."""
    if config.order == "batch":
        return [(p, int(b)) for b in config.batch_sizes for p in config.precisions]
    return [(p, int(b)) for p in config.precisions for b in config.batch_sizes]


# ---------------------------------------------------------------------------------------- output
def amp_ratios(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """AMP against FP32 at each batch size where both rows are ``ok``.

    Returns:
        one dict per (AMP precision, batch): ``precision``, ``batch_size``, ``speedup`` (AMP samples/s
        / FP32 samples/s), ``throughput_gain_pct`` (``100 (speedup - 1)``), ``memory_ratio`` (AMP peak /
        FP32 peak) and ``memory_saving_pct`` (``100 (1 - memory_ratio)``), ``evidence``.
    """
    fp32 = {r["batch_size"]: r for r in rows if r["precision"] == "32-true" and r["status"] == "ok"}
    out = []
    for r in rows:
        base = fp32.get(r["batch_size"])
        if r["precision"] == "32-true" or r["status"] != "ok" or base is None:
            continue
        speedup = r["samples_per_s"] / base["samples_per_s"]
        mem = (r["peak_memory_gib"] / base["peak_memory_gib"]
               if r["peak_memory_gib"] and base["peak_memory_gib"] else None)
        out.append({
            "precision": r["precision"],
            "batch_size": r["batch_size"],
            "speedup": speedup,
            "throughput_gain_pct": 100.0 * (speedup - 1.0),
            "memory_ratio": mem,
            "memory_saving_pct": 100.0 * (1.0 - mem) if mem is not None else None,
            "evidence": MEASURED_MICROBENCHMARK,
        })
    return out


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    if row["status"] != "ok":
        return {"oom": "OOM", "unsupported": "unsupported", "error": "error", "skipped": "not run"}[row["status"]]
    value = row.get(key)
    return "n/a" if value is None else format(value, fmt)


def format_table(doc: dict[str, Any]) -> str:
    """Format the study's table (Precision, Batch, Median step, p95 step, Samples/s, Peak GiB) as Markdown.

    The table is followed by the evidence label, the memory kind, and one AMP-vs-FP32 line per batch size.
    """
    rows = doc["results"]
    lines = [
        "| Precision | Batch | Median step | p95 step | Samples/s | Peak GiB |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        med = _cell(r, "median_step_ms", ".2f")
        p95 = _cell(r, "p95_step_ms", ".2f")
        lines.append(
            f"| {r['precision_label']} | {r['batch_size']} | {med}{' ms' if r['status'] == 'ok' else ''} | "
            f"{p95}{' ms' if r['status'] == 'ok' else ''} | {_cell(r, 'samples_per_s', '.1f')} | "
            f"{_cell(r, 'peak_memory_gib', '.2f')} |"
        )
    device = doc["environment"]["device"]
    kinds = sorted({r["peak_memory_kind"] for r in rows if r["peak_memory_kind"]})
    kind_text = {"cuda-max-allocated": "peak allocated GPU memory (torch.cuda.max_memory_allocated)",
                 "host-rss-process": "peak host RSS of the whole benchmark process (CPU run)"}
    lines.append("")
    host = doc["environment"].get("host", {})
    cpu = ""
    if device["type"] == "cpu":
        start, end = host.get("load_average_1_5_15_min"), host.get("load_average_1_5_15_min_end")
        load = f", 1-min load average {start[0]} -> {end[0]}" if start and end else ""
        cpu = f" {device.get('torch_threads')} torch thread(s) on {device.get('logical_cores')} logical cores{load};"
    lines.append(
        f"evidence: {MEASURED_MICROBENCHMARK} — {device.get('name')} ({device['type']}),{cpu} "
        f"{doc['settings']['warmup']} warm-up + {doc['settings']['iterations']} measured steps; "
        f"Peak GiB = {'; '.join(kind_text.get(k, k) for k in kinds) or 'n/a'}"
    )
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['precision_label']} batch {r['batch_size']}: {r['status']} — {r['error']}")
    base = "TF32" if str(doc["settings"].get("tf32", "")).startswith("on") else "FP32"
    for a in doc["amp_vs_fp32"]:
        mem = (f", peak memory x{a['memory_ratio']:.2f}" if a["memory_ratio"] is not None else "")
        lines.append(
            f"{PRECISION_LABELS[a['precision']]} vs {base} at batch {a['batch_size']}: "
            f"{a['speedup']:.2f}x samples/s ({a['throughput_gain_pct']:+.1f} %){mem} [{MEASURED_MICROBENCHMARK}]"
        )
    return "\n".join(lines)


def format_details(doc: dict[str, Any]) -> str:
    """Per-configuration FLOP rate, MFU, loss scale and non-finite counts (Markdown)."""
    lines = ["| Precision | Batch | TFLOP/s | MFU | Loss scale (start -> end) | Non-finite steps |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in doc["results"]:
        if r["status"] != "ok":
            continue
        mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else f"n/a ({r['mfu_reason']})"
        tflops = f"{r['achieved_tflops']:.3f}" if r["achieved_tflops"] is not None else "n/a"
        scale = (f"{r['loss_scale_initial']:g} -> {r['loss_scale_final']:g}" if r["loss_scale_final"] is not None
                 else "no scaler")
        lines.append(f"| {r['precision_label']} | {r['batch_size']} | {tflops} | {mfu} | {scale} | "
                     f"{r['nonfinite_steps']} (warm-up {r['nonfinite_warmup_steps']}) |")
    return "\n".join(lines)


@dataclass(kw_only=True)
class BenchmarkOptions(SampleShape, CropSize, Warmup, Device, Threads, Seed):
    """Compute-only training-step microbenchmark of the crop-mapping model.

    Synthetic tensors on the device; forward, MultiTaskLoss, backward, clip 1.0, AdamW.
    """

    ALIASES = {"output": "-o"}
    precision: list[Literal[PRECISIONS]] = field(default_factory=lambda: ["32-true", "16-mixed"])
    """precisions to measure"""
    batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4])
    """samples per step"""
    warmup: int = 10
    iterations: int = 30
    """measured steps per configuration"""
    channels_last: bool = False
    """model in torch.channels_last memory format"""
    compile: bool = False
    """torch.compile the model (compiles during warm-up)"""
    compile_mode: Literal[COMPILE_MODES] = "default"
    """torch.compile mode with --compile"""
    fused: bool = False
    """fused AdamW (torch.optim.AdamW(fused=True))"""
    tf32: bool = False
    """TF32 on for matmul and cuDNN (32-true rows labelled TF32); default off: true FP32"""
    stop_at_oom: bool = False
    """after an out-of-memory batch size, skip the larger ones of the same precision"""
    order: Literal["precision", "batch"] = "precision"
    """run order: precision outer or batch size outer"""
    max_seconds: float | None = None
    """do not start configurations after this many seconds (they are listed as not run)"""
    num_classes: int = 10
    """semantic classes C"""
    net_kwargs: str = "{}"
    """JSON object of further CropMappingNet arguments"""
    lr: float = 1e-3
    """AdamW learning rate"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    peak_tflops: float | None = None
    """dense peak TFLOP/s for MFU (overrides the peak table, all precisions)"""
    output: str | None = None
    """write the JSON document here"""
    details: bool = False
    """also print TFLOP/s, MFU, loss scale, non-finite counts"""

    def check(self) -> None:
        """Raises OptionError: ``--net-kwargs`` is not a JSON object."""
        try:
            net_kwargs = json.loads(self.net_kwargs)
        except json.JSONDecodeError as err:
            raise OptionError(f"--net-kwargs is not valid JSON: {err}") from None
        if not isinstance(net_kwargs, dict):
            raise OptionError(f"--net-kwargs must be a JSON object, got {self.net_kwargs!r}")

    def config(self) -> BenchmarkConfig:
        """The :class:`BenchmarkConfig` of these options (repeated precisions and batch sizes once)."""
        return BenchmarkConfig(
            precisions=list(dict.fromkeys(self.precision)), batch_sizes=list(dict.fromkeys(self.batch_sizes)),
            warmup=self.warmup, iterations=self.iterations, device=self.device_name(),
            num_classes=self.num_classes, t2=self.t2, t1=self.t1, crop_size=self.crop_size,
            net_kwargs=json.loads(self.net_kwargs), channels_last=self.channels_last, compile=self.compile,
            compile_mode=self.compile_mode, fused=self.fused, tf32=self.tf32, stop_at_oom=self.stop_at_oom,
            max_seconds=self.max_seconds, order=self.order, lr=self.lr, weight_decay=self.weight_decay,
            seed=self.seed, peak_tflops=self.peak_tflops)


def main(argv: list[str] | None = None) -> int:
    """``python -m cropscale benchmark ...``; prints the study table, writes ``--output``.

    Returns 0, or 1 if a configuration failed with an error other than out-of-memory.

    Raises:
        CropScaleError: bad arguments (unknown device, batch size < 1, bad ``--net-kwargs`` JSON).
    """
    args = parse_options(BenchmarkOptions, argv, "python -m cropscale benchmark")
    args.apply()
    config = args.config()
    out = Path(args.output) if args.output else None

    def write(document: dict[str, Any]) -> None:
        try:
            atomic_write_text(out, json.dumps(document, indent=2, allow_nan=False) + "\n")
        except OSError as err:
            raise CropScaleError(f"--output {out}: cannot write: {err}") from None

    if out is not None:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise CropScaleError(f"--output {out}: cannot create its folder: {err}") from None
    doc = run_benchmark(config, argv=list(sys.argv[1:] if argv is None else argv), on_row=write if out else None)
    if out is not None:
        write(doc)
    if args.details:
        print(format_details(doc))
        print()
    if args.output:
        print(f"wrote {args.output}")
    print(format_table(doc))
    return 1 if any(r["status"] == "error" for r in doc["results"]) else 0


if __name__ == "__main__":
    sys.exit(main())
