"""Dense peak throughput (TFLOP/s) per GPU and dtype, for model FLOPs utilisation (MFU).

One table, dense figures only (NVIDIA publishes tensor-core figures "with sparsity"; the dense figure
is half of it). Source: NVIDIA product datasheets (H200, H100, A100, L40S, L4, A10, V100, T4). Lightning's
own table (``lightning.fabric.utilities.throughput``) has no "NVIDIA H200" entry and mixes dense and
sparse figures, so it is not used. A measured reference: about 790 TFLOP/s bf16 on an 8192-cube matrix
product on an H200 (``docs/measuring.md``, "Peak FLOP/s for MFU"), i.e. the datasheet peak is not
reached even by a large GEMM; MFU is reported beside the achieved TFLOP/s for that reason.

dtypes: ``fp64``, ``fp32`` (no TF32), ``tf32``, ``bf16``, ``fp16``, ``fp8``.

Attainable peak (``docs/measuring.md``, "Peak FLOP/s for MFU"): a step mixes operator classes whose math
runs in different dtypes. Under ``32-true`` on an Ampere-or-newer GPU, cuDNN convolutions follow
``torch.backends.cudnn.allow_tf32`` (on by default) while matmuls follow
``torch.get_float32_matmul_precision()`` / ``torch.backends.cuda.matmul.allow_tf32`` (off by default); under
``*-mixed`` autocast runs all three classes in its dtype. With ``f_c`` the FLOPs of class ``c`` (counted
by ``torch.utils.flop_counter``) and ``P_c`` the dense peak of its dtype, the step cannot run faster than
``sum_c f_c / P_c``, so the peak it could attain is ``P = sum_c f_c / sum_c (f_c / P_c)`` (a harmonic mean
weighted by FLOPs). :func:`class_dtypes` maps the settings to dtypes, :func:`tf32_settings` reads them at
run time and :func:`attainable_peak_tflops` computes ``P``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

DENSE_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # Hopper, SXM (H100 SXM5 and H200 share the compute figures)
    "H200 SXM": {"fp64": 67.0, "fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
    "H200 NVL": {"fp64": 60.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
    "H100 SXM": {"fp64": 67.0, "fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
    "H100 NVL": {"fp64": 60.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
    "H100 PCIe": {"fp64": 51.0, "fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5, "fp8": 1513.0},
    # Ampere / Ada
    "A100": {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
    "A10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
    # Volta / Turing (no bf16, no tf32)
    "V100 SXM2": {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0},
    "V100 PCIe": {"fp64": 7.0, "fp32": 14.0, "fp16": 112.0},
    "T4": {"fp32": 8.1, "fp16": 65.0},
}
"""Dense peak TFLOP/s per device family and dtype (fp64 on Hopper/A100: the tensor-core FP64 figure)."""

# ordered: the first pattern that matches ``torch.cuda.get_device_name()`` wins
_NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"\bH200\b.*\bNVL\b", "H200 NVL"),
    (r"\bH200\b", "H200 SXM"),
    (r"\bH100\b.*\bNVL\b", "H100 NVL"),
    (r"\bH100\b.*\bPCIE\b", "H100 PCIe"),
    (r"\bH100\b", "H100 SXM"),
    (r"\bA100\b", "A100"),
    (r"\bL40S\b", "L40S"),
    (r"\bL4\b", "L4"),
    (r"\bA10\b", "A10"),
    (r"\bV100\b.*\bPCIE\b", "V100 PCIe"),
    (r"\bV100\b", "V100 SXM2"),
    (r"\bT4\b", "T4"),
)

DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")


def device_family(device_name: str) -> str | None:
    """Table key for a device name such as ``"NVIDIA H200"`` or ``"NVIDIA A100-SXM4-80GB"``.

    ``None`` for a device not in the table (CPUs, unknown GPUs).
    """
    name = device_name.upper().replace("-", " ").replace("_", " ")
    for pattern, key in _NAME_RULES:
        if re.search(pattern, name):
            return key
    return None


def peak_tflops(device_name: str, dtype: str) -> float | None:
    """Dense peak TFLOP/s of ``device_name`` for ``dtype`` (one of :data:`DTYPES`), or ``None``."""
    family = device_family(device_name)
    if family is None:
        return None
    return DENSE_PEAK_TFLOPS[family].get(dtype)


def precision_dtype(precision: str, float32_matmul_precision: str = "highest") -> str:
    """Compute dtype of the matrix products for a Lightning ``precision`` string.

    ``"32-true"`` is ``tf32`` when ``torch.get_float32_matmul_precision()`` is ``"high"`` or
    ``"medium"``, else ``fp32``; ``"16-mixed"``/``"16-true"`` -> ``fp16``; ``"bf16-*"`` -> ``bf16``;
    ``"64-true"`` -> ``fp64``; ``"transformer-engine*"`` -> ``fp8``.
    """
    p = str(precision)
    if p.startswith("bf16"):
        return "bf16"
    if p.startswith("16"):
        return "fp16"
    if p.startswith("64"):
        return "fp64"
    if p.startswith("transformer-engine"):
        return "fp8"
    return "tf32" if float32_matmul_precision in ("high", "medium") else "fp32"


OPERATOR_CLASSES: tuple[str, ...] = ("convolution", "matmul", "attention")
"""The operator classes whose FLOPs ``torch.utils.flop_counter`` counts, each with its own dtype switch."""


def operator_class(op: Any) -> str:
    """Operator class of an op counted by ``FlopCounterMode`` (``str(op)``, e.g. ``"aten.convolution"``).

    ``convolution`` for the convolutions and their backward, ``attention`` for the fused
    ``scaled_dot_product_*attention*`` kernels and their backward, ``matmul`` for every other counted op
    (``mm``, ``addmm``, ``bmm``, ``baddbmm``: linear layers and matrix products; attention that ran as the
    math fallback is matrix products too and counts here).
    """
    name = str(op).lower()
    if "conv" in name:
        return "convolution"
    if "attention" in name:
        return "attention"
    return "matmul"


def flops_by_class(counts: Mapping[Any, int]) -> dict[str, int]:
    """FLOPs per operator class from ``FlopCounterMode.get_flop_counts()["Global"]`` (``{op: FLOPs}``).

    Returns:
        ``{"convolution": int, "matmul": int, "attention": int}`` (every class present, 0 when absent).
    """
    out = dict.fromkeys(OPERATOR_CLASSES, 0)
    for op, flops in counts.items():
        out[operator_class(op)] += int(flops)
    return out


def _legacy_or_new(legacy: Callable[[], bool], nodes: tuple[Any, ...]) -> bool:
    """A TF32 switch: the legacy flag, or else the first ``fp32_precision`` of ``nodes`` that is set.

    torch raises on the legacy flag when it and the new ``fp32_precision`` API were mixed; ``"tf32"`` -> True.
    """
    try:
        return bool(legacy())
    except RuntimeError:
        for node in nodes:
            value = getattr(node, "fp32_precision", None)
            if value not in (None, "", "none"):
                return value == "tf32"
        return False


def tf32_settings() -> dict[str, bool]:
    """Whether FP32 matmuls and FP32 cuDNN convolutions may run in TF32, read from torch's switches now.

    Returns:
        ``{"matmul": bool, "cudnn_conv": bool}``. ``matmul``: ``torch.backends.cuda.matmul.allow_tf32`` or
        ``torch.get_float32_matmul_precision()`` ``"high"``/``"medium"`` (both TF32 for cuBLAS);
        ``cudnn_conv``: ``torch.backends.cudnn.allow_tf32`` (on by default). Where the legacy flags cannot
        be read because the new ``fp32_precision`` API was mixed in, that API is read instead.
    """
    backends = torch.backends
    matmul = _legacy_or_new(
        lambda: backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() in ("high", "medium"),
        (backends.cuda.matmul, backends),
    )
    cudnn = backends.cudnn
    conv = _legacy_or_new(lambda: cudnn.allow_tf32, (getattr(cudnn, "conv", None), cudnn, backends))
    return {"matmul": matmul, "cudnn_conv": conv}


def class_dtypes(precision: str, matmul_tf32: bool, conv_tf32: bool) -> dict[str, str]:
    """The dtype each operator class computes in, for a Lightning ``precision`` and the TF32 switches.

    ``*-mixed`` / ``*-true`` other than 32: every class in the precision's dtype (autocast casts
    convolutions, matmuls and attention alike; :func:`precision_dtype`). ``32-true``: convolutions ``tf32``
    when ``conv_tf32`` (cuDNN) else ``fp32``; matmuls and attention ``tf32`` when ``matmul_tf32`` else
    ``fp32`` (attention kernels compute their products as matmuls).

    Returns:
        ``{"convolution": dtype, "matmul": dtype, "attention": dtype}`` with dtypes of :data:`DTYPES`.
    """
    p = str(precision)
    if not p.startswith("32"):
        dtype = precision_dtype(p)
        return dict.fromkeys(OPERATOR_CLASSES, dtype)
    matmul = "tf32" if matmul_tf32 else "fp32"
    return {"convolution": "tf32" if conv_tf32 else "fp32", "matmul": matmul, "attention": matmul}


def attainable_peak_tflops(device_name: str, flops: Mapping[str, float], dtypes: Mapping[str, str]) -> float | None:
    """Peak TFLOP/s a step with these FLOPs per class could attain: ``sum f_c / sum (f_c / P_c)``.

    Args:
        device_name: e.g. ``"NVIDIA H200"``.
        flops: FLOPs per operator class (any unit: only the proportions matter); classes with 0 are left out.
        dtypes: the dtype of each class (:func:`class_dtypes`).

    Returns:
        The peak in TFLOP/s, or ``None`` when no class has FLOPs or the table has no dense peak for the device
        and the dtype of a class with FLOPs.
    """
    used = {c: float(f) for c, f in flops.items() if f and f > 0}
    if not used:
        return None
    class_peaks = {cls: peak_tflops(device_name, dtypes.get(cls, "")) for cls in used}
    if any(p is None for p in class_peaks.values()):
        return None
    if len(set(class_peaks.values())) == 1:  # one dtype: its peak, exactly (no rounding of the weighted mean)
        return next(iter(class_peaks.values()))
    return sum(used.values()) / sum(f / class_peaks[cls] for cls, f in used.items())
