"""FLOPs per training sample of the network, counted with ``torch.utils.flop_counter.FlopCounterMode``.

The counter adds up the floating-point operations of the matrix products, convolutions and
attention that run (2 FLOPs per multiply-add; element-wise ops, normalisation and the optimiser are
not counted, as in the usual MFU convention of Chowdhery et al. 2022 / torchtitan). Attention is run
with the math SDPA backend while counting so that its matrix products are counted on every device
(the fused CPU kernel has no FLOP formula registered); the count is the same as the fused kernels'
formula. The throughput callback divides ``total`` x samples/s by the device peak to get MFU.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from cropscale.batch import model_inputs
from cropscale.model.losses import MultiTaskLoss
from cropscale.model.synthetic import synthetic_batch

__all__ = ["flops_per_sample"]


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
    param = next(net.parameters())
    batch = synthetic_batch(1, t2=t2, t1=t1, height=height, width=width,
                            num_classes=int(getattr(net, "num_classes", 10)),
                            hr_scale=int(getattr(net, "hr_scale", 10)), device=param.device)
    batch = {k: (v.to(param.dtype) if v.is_floating_point() else v) for k, v in batch.items()}
    params = [p for p in net.parameters() if p.requires_grad]
    loss_fn = MultiTaskLoss()
    with sdpa_kernel(SDPBackend.MATH):
        with FlopCounterMode(display=False) as fwd:
            outputs = net(**model_inputs(batch))
            loss, _ = loss_fn(outputs, batch)
        with FlopCounterMode(display=False) as bwd:
            torch.autograd.grad(loss, params, allow_unused=True)
    forward = int(fwd.get_total_flops())
    backward = int(bwd.get_total_flops())
    return {"forward": forward, "backward": backward, "total": forward + backward}
