"""What the compute-only benchmark (:mod:`cropscale.bench.step.command`) measures.

The precisions, their autocast dtypes, the gradient clip, and :class:`BenchmarkConfig` with its argument
checks (:class:`~cropscale.errors.CropScaleError` naming the option).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from cropscale.errors import CropScaleError
from cropscale.model.speed import COMPILE_MODES, compile_unavailable_reason, fused_devices

__all__ = ["AUTOCAST_DTYPE", "CLIP_NORM", "PRECISIONS", "BenchmarkConfig", "resolve_device"]

PRECISIONS: tuple[str, ...] = ("32-true", "16-mixed", "bf16-mixed")
AUTOCAST_DTYPE: dict[str, torch.dtype | None] = {"32-true": None, "16-mixed": torch.float16,
                                                 "bf16-mixed": torch.bfloat16}
"""``torch.autocast`` dtype of each benchmarked precision (``None``: no autocast)."""
CLIP_NORM = 1.0
"""Gradient-norm clip of every benchmark step (``torch.nn.utils.clip_grad_norm_``)."""


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

