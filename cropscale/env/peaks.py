"""Dense peak throughput (TFLOP/s) per GPU and dtype, for model FLOPs utilisation (MFU).

One table, dense figures only (NVIDIA publishes tensor-core figures "with sparsity"; the dense figure
is half of it). Source: NVIDIA product datasheets (H200, H100, A100, L40S, L4, A10, V100, T4). Lightning's
own table (``lightning.fabric.utilities.throughput``) has no "NVIDIA H200" entry and mixes dense and
sparse figures, so it is not used. A measured reference: about 790 TFLOP/s bf16 on an 8192-cube matrix
product on an H200 (``docs/measuring.md``, "Peak FLOP/s for MFU"), i.e. the datasheet peak is not
reached even by a large GEMM; MFU is reported beside the achieved TFLOP/s for that reason.

dtypes: ``fp64``, ``fp32`` (no TF32), ``tf32``, ``bf16``, ``fp16``, ``fp8``.
"""

from __future__ import annotations

import re

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
