"""One benchmark configuration measured (:mod:`cropscale.bench.step.command`).

A fresh model, loss, optimizer, scaler and synthetic batch; the timed warm-up and measured steps; the
row's time, memory, energy and MFU figures.

Timing: host ``time.perf_counter`` around each step, with ``torch.cuda.synchronize`` inside the timed
window after every step on CUDA. Times in ms, memory in GiB (2**30 bytes).
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from cropscale.batch import model_inputs
from cropscale.bench.step.config import AUTOCAST_DTYPE, CLIP_NORM, BenchmarkConfig
from cropscale.bench.step.energy import energy_end, energy_start
from cropscale.bench.step.mfu import mfu_figures
from cropscale.bench.step.rows import empty_row
from cropscale.env.host import current_rss_bytes
from cropscale.model.losses import MultiTaskLoss
from cropscale.model.network import CropMappingNet
from cropscale.model.synthetic import synthetic_batch
from cropscale.numbers import percentile
from cropscale.progress import Progress

__all__ = ["Setup", "build_setup", "run_configuration", "set_tf32", "train_step"]

GIB = 2**30


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



@dataclass
class Setup:
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


def build_setup(config: BenchmarkConfig, precision: str, batch_size: int, device: torch.device) -> Setup:
    """Model (seeded), loss, AdamW, scaler (enabled for ``16-mixed``) and the synthetic batch on ``device``."""
    torch.manual_seed(config.seed)
    model = CropMappingNet(num_classes=config.num_classes, **config.net_kwargs).to(device)
    if config.channels_last:
        model = model.to(memory_format=torch.channels_last)
    batch = synthetic_batch(
        batch_size, t2=config.t2, t1=config.t1, height=config.crop_size, width=config.crop_size,
        num_classes=config.num_classes, device=device, seed=config.seed,
    )
    return Setup(
        model=model,
        step_model=torch.compile(model, mode=config.compile_mode) if config.compile else model,
        loss_fn=MultiTaskLoss().to(device),
        optimizer=torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay,
                                    **({"fused": True} if config.fused else {})),
        scaler=torch.amp.GradScaler(device.type, enabled=precision == "16-mixed"),
        batch=batch,
    )


def _run_steps(setup: Setup, config: BenchmarkConfig, precision: str, device: torch.device,
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
            energy = energy_start(device, row)
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
    energy_end(energy, row, config.iterations * row["batch_size"])
    if config.warmup == 0:
        row["nonfinite_warmup_steps"] = 0
    row["nonfinite_steps"] = int(nonfinite.item())
    return times, loss, peak_rss



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
    row = empty_row(config, precision, batch_size, device)
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
    mfu_figures(row, config, precision, batch_size, device, flops_per_sample, flops_by_class)
    return row


