"""Speed levers of a training step: ``torch.compile``, fused AdamW, ``channels_last``, pinned transfers.

Each lever is an option of the task (``model.compile``, ``model.compile_mode``, ``model.fused_optimizer``,
``model.channels_last``), of the datamodule (``data.pin_memory``) and of ``python -m cropscale benchmark``
(``--compile``, ``--compile-mode``, ``--fused``, ``--channels-last``); ``python -m cropscale lever-bench``
measures each against the eager step in one run.

- ``torch.compile`` (TorchDynamo + Inductor) needs a C++ compiler for CPU code and Triton for CUDA code;
  :func:`compile_unavailable_reason` says which is missing, :func:`compile_network` fails with one line
  (:class:`~cropscale.errors.CropScaleError`) instead of a traceback at the first step.
- Fused AdamW (``torch.optim.AdamW(fused=True)``: one kernel for the whole update) runs on the devices of
  :func:`fused_devices`. It unscales AMP gradients inside its own step, so under ``16-mixed`` Lightning
  refuses gradient clipping with it under its AMP plugin (``16-mixed`` and ``bf16-mixed``): :func:`choose_fused`
  leaves it off there.
- ``channels_last`` stores 4-D convolution weights as NHWC (``Module.to(memory_format=...)``).
- Pinned host memory (``DataLoader(pin_memory=True)``) lets Lightning's batch transfer, which passes
  ``non_blocking=True`` for CUDA, overlap the copy with compute.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from typing import Any

import torch

from cropscale.errors import CropScaleError

__all__ = ["COMPILE_MODES", "choose_fused", "compile_network", "compile_unavailable_reason", "fused_devices"]

COMPILE_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""``torch.compile(mode=...)`` values accepted by ``model.compile_mode`` and ``--compile-mode``."""


def compile_unavailable_reason(device_type: str) -> str | None:
    """Why ``torch.compile``'s default backend (Inductor) cannot build code for ``device_type`` here, or ``None``.

    Checks what Inductor needs and does not install itself: ``torch.compile`` in this torch and a
    supported Python; on ``cpu`` a C++ compiler (``$CXX``, else ``g++``, ``c++`` or ``clang++`` on the
    ``PATH``); on ``cuda`` the ``triton`` package.
    """
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    try:
        import torch._dynamo as dynamo  # heavy; only when a compile is asked for
    except ImportError as err:  # pragma: no cover - depends on the installation
        return f"torch._dynamo cannot be imported: {err}"
    if hasattr(dynamo, "is_dynamo_supported") and not dynamo.is_dynamo_supported():
        return (f"torch.compile does not support Python {sys.version.split()[0]} on {sys.platform} "
                f"in torch {torch.__version__}")
    if device_type == "cpu":
        names = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
        if not any(shutil.which(n) for n in names):
            return f"no C++ compiler for Inductor's CPU code ({' / '.join(names)} not on the PATH)"
    elif device_type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "the triton package (Inductor's GPU code generator) is not installed"
    return None


def compile_network(net: torch.nn.Module, mode: str = "default", device_type: str = "cpu", **kwargs: Any) -> Any:
    """``torch.compile(net, mode=mode, **kwargs)``, or one clear error where it cannot work.

    Compilation itself happens at the first call (the first training step).

    Raises:
        CropScaleError: ``mode`` is not in :data:`COMPILE_MODES`, or no compiler is available for
            ``device_type`` (:func:`compile_unavailable_reason`).
    """
    if mode not in COMPILE_MODES:
        raise CropScaleError(f"model.compile_mode must be one of {', '.join(COMPILE_MODES)}; got {mode!r}")
    reason = compile_unavailable_reason(device_type)
    if reason is not None:
        raise CropScaleError(f"model.compile=true: torch.compile is unavailable on {device_type}: {reason}")
    return torch.compile(net, mode=mode, **kwargs)


def fused_devices() -> tuple[str, ...]:
    """Device types whose fused AdamW kernel this torch has (``cuda``, ``cpu``, ``mps``, ... as torch lists them).

    Reads torch's own list (``torch.utils._foreach_utils``); falls back to ``("cuda", "cpu")``.
    """
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return tuple(_get_fused_kernels_supported_devices())
    except (ImportError, AttributeError):  # older or newer torch: the devices documented since torch 2.4
        return ("cuda", "cpu")


def choose_fused(requested: bool | None, device_type: str, precision: str, clipping: bool) -> tuple[bool, str]:
    """Whether AdamW runs fused, and why.

    Args:
        requested: ``True`` / ``False`` to force; ``None`` (auto): fused where the device has the kernel,
            except under a ``*-mixed`` precision with gradient clipping (Lightning's AMP plugin refuses to
            clip for an optimizer that could unscale gradients inside its step).
        device_type: the parameters' device type (``cpu``, ``cuda``, ...).
        precision: Lightning precision string.
        clipping: whether gradient clipping is on.

    Returns:
        ``(fused, reason)``.

    Raises:
        CropScaleError: ``requested`` is ``True`` where it cannot work (no kernel for the device, or
            ``*-mixed`` with clipping).
    """
    has_kernel = device_type in fused_devices()
    amp_clip = str(precision).endswith("-mixed") and clipping
    if requested is False:
        return False, "model.fused_optimizer=false"
    if not has_kernel:
        why = (f"torch {torch.__version__} has no fused AdamW kernel for {device_type!r} "
               f"(it has: {', '.join(fused_devices())})")
        if requested:
            raise CropScaleError(f"model.fused_optimizer=true: {why}")
        return False, why
    if amp_clip:
        why = (f"{precision} with gradient clipping: Lightning's AMP plugin refuses to clip for an optimizer that "
               "unscales inside its step (fused AdamW)")
        if requested:
            raise CropScaleError(f"model.fused_optimizer=true: {why}; set trainer.gradient_clip_val=null or "
                                 "precision 32-true")
        return False, why
    return True, f"fused AdamW kernel for {device_type}"
