"""Dense peak TFLOP/s, FLOPs per sample and MFU of one benchmark row (:mod:`cropscale.bench.step.command`).

Achieved TFLOP/s = FLOPs per sample x batch / median step (s) / 1e12; MFU = achieved / the attainable dense
peak of the math that ran (:func:`cropscale.env.peaks.attainable_peak_tflops`).
"""

from __future__ import annotations

from typing import Any

import torch

from cropscale.bench.step.config import BenchmarkConfig
from cropscale.env import peaks
from cropscale.errors import CropScaleError
from cropscale.model.flops import flops_per_sample, flops_per_sample_by_class
from cropscale.model.network import CropMappingNet

__all__ = ["mfu_figures", "peak_tflops", "sample_flops", "sample_flops_by_class"]


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



def mfu_figures(row: dict[str, Any], config: BenchmarkConfig, precision: str, batch_size: int,
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


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def sample_flops(config: BenchmarkConfig) -> tuple[dict[str, float] | None, str | None]:
    """FLOPs of one sample of the configured model and shape, and the reason they are missing (``None``).

    Forward + backward, :func:`~cropscale.model.flops.flops_per_sample`; FLOP.
    """
    torch.manual_seed(config.seed)
    net = CropMappingNet(num_classes=config.num_classes, **config.net_kwargs)
    counts = flops_per_sample(net, t2=config.t2, t1=config.t1, height=config.crop_size, width=config.crop_size)
    return {k: float(v) for k, v in counts.items()}, None


def sample_flops_by_class(config: BenchmarkConfig) -> dict[str, float]:
    """FLOPs of one sample by operator class (:func:`~cropscale.model.flops.flops_per_sample_by_class`)."""
    torch.manual_seed(config.seed)
    net = CropMappingNet(num_classes=config.num_classes, **config.net_kwargs)
    split = flops_per_sample_by_class(net, t2=config.t2, t1=config.t1, height=config.crop_size,
                                      width=config.crop_size)
    return {k: float(v) for k, v in split.items()}


