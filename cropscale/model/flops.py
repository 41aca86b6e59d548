"""FLOPs per training sample of the network, counted with ``torch.utils.flop_counter.FlopCounterMode``.

The counter adds up the floating-point operations of the matrix products, convolutions and
attention that run (2 FLOPs per multiply-add; element-wise ops, normalisation and the optimiser are
not counted, as in the usual MFU convention of Chowdhery et al. 2022 / torchtitan). Attention is run
with the math SDPA backend while counting so that its matrix products are counted on every device
(the fused CPU kernel has no FLOP formula registered); the count is the same as the fused kernels'
formula. The throughput callback divides ``total`` x samples/s by the device peak to get MFU.

:func:`flops_per_sample_by_class` splits the count by operator class (convolution, matmul, attention:
:func:`cropscale.env.peaks.operator_class`), whose math runs in different dtypes under ``32-true``; the
throughput callback weights the device peaks by it (the attainable peak). For that split attention runs
as the fused kernel the device would choose (the CPU flash kernel gets the formula FlopCounterMode has for
the CUDA flash kernel), so it is counted as attention, its backward with the formula's recomputation of
the scores: the split's sum is slightly above :func:`flops_per_sample`'s total (0.3 % for the default
network), which does not change the proportions that the peak uses.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from cropscale.batch import model_inputs
from cropscale.env.peaks import flops_by_class
from cropscale.model.losses import MultiTaskLoss
from cropscale.model.synthetic import synthetic_batch

__all__ = ["flops_per_sample", "flops_per_sample_by_class"]

_aten = torch.ops.aten
# the CPU flash-attention kernels have no FLOP formula in torch.utils.flop_counter: the CUDA flash kernel's
# formula (same arguments in the same places: query, key, value first; grad_out first in the backward)
_CPU_ATTENTION_FORMULAS = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _aten._scaled_dot_product_flash_attention,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _aten._scaled_dot_product_flash_attention_backward,
}


def flops_per_sample(net: nn.Module, t2: int = 16, t1: int = 4, height: int = 32, width: int = 32) -> dict[str, int]:
    """Forward, backward and total FLOPs of ONE training sample (batch of 1).

    Runs ``net`` on :func:`cropscale.model.synthetic.synthetic_batch` (both Sentinel-1 orbits
    present) on the device of its parameters, then the backward of the summed
    :class:`~cropscale.model.losses.MultiTaskLoss` with ``torch.autograd.grad`` (``.grad`` of the
    parameters is left untouched). Counts are exact for the given shapes; they scale linearly with
    the batch size.

    Args:
        net: a :class:`~cropscale.model.network.CropMappingNet` (needs ``num_classes`` and ``hr_scale``).
        t2: Sentinel-2 dates.
        t1: Sentinel-1 dates per orbit.
        height: crop height in 10 m pixels (a multiple of the network stride).
        width: crop width in 10 m pixels (a multiple of the network stride).

    Returns:
        ``{"forward": int, "backward": int, "total": int}`` FLOPs, ``total = forward + backward``.
    """
    fwd, bwd = _count(net, t2, t1, height, width, math_attention=True)
    forward = int(fwd.get_total_flops())
    backward = int(bwd.get_total_flops())
    return {"forward": forward, "backward": backward, "total": forward + backward}


def flops_per_sample_by_class(net: nn.Module, t2: int = 16, t1: int = 4, height: int = 32,
                              width: int = 32) -> dict[str, int]:
    """Forward + backward FLOPs of ONE training sample per operator class (see the module docstring).

    Same run as :func:`flops_per_sample`, with attention as the fused kernel.

    Args:
        net: a :class:`~cropscale.model.network.CropMappingNet`.
        t2: Sentinel-2 dates.
        t1: Sentinel-1 dates per orbit.
        height: 10 m crop height (a multiple of the network stride).
        width: 10 m crop width.

    Returns:
        ``{"convolution": int, "matmul": int, "attention": int}`` FLOPs.
    """
    fwd, bwd = _count(net, t2, t1, height, width, math_attention=False)
    out = flops_by_class(fwd.get_flop_counts().get("Global", {}))
    for cls, flops in flops_by_class(bwd.get_flop_counts().get("Global", {})).items():
        out[cls] += flops
    return out


def _count(net: nn.Module, t2: int, t1: int, height: int, width: int,
           math_attention: bool) -> tuple[FlopCounterMode, FlopCounterMode]:
    """Count the forward (network + loss) and the backward of one synthetic sample; returns both counters."""
    param = next(net.parameters())
    batch = synthetic_batch(1, t2=t2, t1=t1, height=height, width=width,
                            num_classes=int(getattr(net, "num_classes", 10)),
                            hr_scale=int(getattr(net, "hr_scale", 10)), device=param.device)
    batch = {k: (v.to(param.dtype) if v.is_floating_point() else v) for k, v in batch.items()}
    params = [p for p in net.parameters() if p.requires_grad]
    loss_fn = MultiTaskLoss()
    mapping = {op: getattr(flop_registry[ref], "__wrapped__", flop_registry[ref])
               for op, ref in _CPU_ATTENTION_FORMULAS.items() if ref in flop_registry}
    with sdpa_kernel(SDPBackend.MATH) if math_attention else contextlib.nullcontext():
        with FlopCounterMode(display=False, custom_mapping=mapping) as fwd:
            outputs = net(**model_inputs(batch))
            loss, _ = loss_fn(outputs, batch)
        with FlopCounterMode(display=False, custom_mapping=mapping) as bwd:
            torch.autograd.grad(loss, params, allow_unused=True)
    return fwd, bwd
