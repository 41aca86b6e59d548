"""``python -m cropscale summary``: parameters and FLOPs per sample of the default network.

Prints the exact parameter count of :class:`~cropscale.model.network.CropMappingNet` with its
default hyper-parameters (and ``--num-classes``), its relative difference to the study's
1,947,456, and the forward, backward and total FLOPs of one training sample counted by
:func:`~cropscale.model.flops.flops_per_sample`. With ``--time B [B ...]`` it also times a
forward + backward of the summed loss at those batch sizes on a synthetic batch (median of
``--iterations`` after ``--warmup``; the optimiser step is not included).

Example::

    python -m cropscale summary --num-classes 20 --time 1 4
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch

from cropscale.batch import model_inputs
from cropscale.evidence import COUNT, MEASURED_MICROBENCHMARK
from cropscale.model.flops import flops_per_sample
from cropscale.model.losses import MultiTaskLoss
from cropscale.model.network import CropMappingNet, count_parameters
from cropscale.model.synthetic import synthetic_batch
from cropscale.options import SampleShape, Threads, Warmup, parse_options

STUDY_PARAMETERS = 1_947_456
"""Parameter count of the study's model as the study reports it (the reference of the printed difference)."""


@dataclasses.dataclass(kw_only=True)
class SummaryOptions(SampleShape, Warmup, Threads):
    """Parameters and FLOPs per sample of the default network, optionally timed."""

    num_classes: int = 10
    """semantic classes (10 bundled sample, 20 PASTIS)"""
    height: int = 32
    """crop height at 10 m (multiple of 4)"""
    width: int = 32
    """crop width at 10 m (multiple of 4)"""
    time: list[int] = dataclasses.field(default_factory=list)
    """also time forward+backward at these batch sizes"""
    iterations: int = 5
    """measured forward+backward steps per batch size"""
    warmup: int = 2
    device: str = "cpu"
    """device of the timing (cpu, cuda, cuda:i)"""

    AT_LEAST = {"num_classes": 1, "height": 1, "width": 1, "iterations": 1, "time": 1}


def _time_step(net: CropMappingNet, batch_size: int, args: SummaryOptions) -> list[float]:
    batch = synthetic_batch(batch_size, t2=args.t2, t1=args.t1, height=args.height, width=args.width,
                            num_classes=args.num_classes, device=args.device)
    loss_fn = MultiTaskLoss()
    sync = torch.cuda.synchronize if torch.device(args.device).type == "cuda" else (lambda: None)
    times = []
    for _ in range(args.warmup + args.iterations):
        sync()
        t0 = time.perf_counter()
        loss, _ = loss_fn(net(**model_inputs(batch)), batch)
        loss.backward()
        sync()
        times.append(time.perf_counter() - t0)
        net.zero_grad(set_to_none=True)
    return times[args.warmup:]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m cropscale summary``; returns the exit status (0).

    Raises:
        OptionError: a bad option (named).
    """
    args = parse_options(SummaryOptions, argv, "python -m cropscale summary", __doc__.splitlines()[0])
    args.apply()
    torch.manual_seed(0)
    net = CropMappingNet(num_classes=args.num_classes).to(args.device)
    n = count_parameters(net)
    print(f"CropMappingNet(num_classes={args.num_classes}), default hyper-parameters")
    print(f"  parameters: {n:,} ({100.0 * (n - STUDY_PARAMETERS) / STUDY_PARAMETERS:+.3f} % vs the study's "
          f"{STUDY_PARAMETERS:,}) [{COUNT}: parameters of the instantiated model]")
    f = flops_per_sample(net, t2=args.t2, t1=args.t1, height=args.height, width=args.width)
    print(f"  FLOPs per training sample (S2 [{args.t2},10,{args.height},{args.width}], S1A/S1D "
          f"[{args.t1},2,{args.height},{args.width}], hr {net.hr_scale * args.height}x{net.hr_scale * args.width}) "
          f"[{COUNT}: torch.utils.flop_counter.FlopCounterMode, synthetic batch of 1]:")
    for key in ("forward", "backward", "total"):
        print(f"    {key:<8} {f[key] / 1e9:10.3f} GFLOP")
    for b in args.time:
        times = _time_step(net, b, args)
        med = statistics.median(times)
        print(f"  forward+backward, batch {b}, {args.device}, {torch.get_num_threads()} threads: median "
              f"{1e3 * med:.1f} ms, min {1e3 * min(times):.1f} ms over {len(times)} steps, {b / med:.2f} samples/s, "
              f"{b * f['total'] / med / 1e9:.1f} GFLOP/s [{MEASURED_MICROBENCHMARK}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
