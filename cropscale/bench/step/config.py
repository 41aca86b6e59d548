"""What the compute-only benchmark (:mod:`cropscale.bench.step.command`) measures.

The precisions, their autocast dtypes, the gradient clip, and :class:`BenchmarkConfig`: the command's options
are its configuration (one declaration: a field per option, its docstring the ``--help`` text, its checks in
``__post_init__``, each an :class:`~cropscale.options.OptionError` naming the option).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from cropscale.errors import CropScaleError
from cropscale.model.speed import COMPILE_MODES, compile_unavailable_reason, fused_devices
from cropscale.options import CropSize, Device, JsonOut, OptionError, SampleShape, Seed, Threads, Warmup

__all__ = ["AUTOCAST_DTYPE", "CLIP_NORM", "PRECISIONS", "BenchmarkConfig", "resolve_device"]

PRECISIONS: tuple[str, ...] = ("32-true", "16-mixed", "bf16-mixed")
AUTOCAST_DTYPE: dict[str, torch.dtype | None] = {"32-true": None, "16-mixed": torch.float16,
                                                 "bf16-mixed": torch.bfloat16}
"""``torch.autocast`` dtype of each benchmarked precision (``None``: no autocast)."""
CLIP_NORM = 1.0
"""Gradient-norm clip of every benchmark step (``torch.nn.utils.clip_grad_norm_``)."""


@dataclass(kw_only=True)
class BenchmarkConfig(SampleShape, CropSize, Warmup, Device, Threads, Seed, JsonOut):
    """Compute-only training-step microbenchmark of the crop-mapping model.

    Synthetic tensors on the device; forward, MultiTaskLoss, backward, clip 1.0, AdamW.
    """

    RENAMED = {"--output": "json", "-o": "json"}
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
    net_kwargs: dict[str, Any] = field(default_factory=dict)
    """JSON object of further CropMappingNet arguments"""
    lr: float = 1e-3
    """AdamW learning rate"""
    weight_decay: float = 0.01
    """AdamW weight decay"""
    peak_tflops: float | None = None
    """dense peak TFLOP/s for MFU (overrides the peak table, all precisions)"""
    details: bool = False
    """also print TFLOP/s, MFU, loss scale, non-finite counts"""

    AT_LEAST = {"batch_sizes": 1, "iterations": 1, "num_classes": 1}

    def check(self) -> None:
        """Repeated precisions and batch sizes once; the checks that need more than a lowest value.

        Raises:
            OptionError: a crop that is no positive multiple of 4, or a peak or time budget that is not positive.
        """
        self.precision = list(dict.fromkeys(self.precision))
        self.batch_sizes = [int(b) for b in dict.fromkeys(self.batch_sizes)]
        if self.crop_size % 4:
            raise OptionError(f"--crop-size must be a positive multiple of 4 (two stride-2 stages); got "
                              f"{self.crop_size}")
        for name in ("peak_tflops", "max_seconds"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise OptionError(f"--{name.replace('_', '-')} must be > 0; got {value}")

    def torch_device(self) -> torch.device:
        """The device to measure on, checked on this machine when the measurement starts (not when parsing).

        Raises:
            CropScaleError: a device that is not here, or a ``--compile`` / ``--fused`` it cannot run (named).
        """
        device = resolve_device(self.device_name())
        if self.compile:
            reason = compile_unavailable_reason(device.type)
            if reason is not None:
                raise CropScaleError(f"--compile: torch.compile is unavailable on {device.type}: {reason}")
        if self.fused and device.type not in fused_devices():
            raise CropScaleError(f"--fused: torch {torch.__version__} has no fused AdamW kernel for {device.type}")
        return device


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
