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

import argparse
import statistics
import time

import torch

from cropscale.batch import model_inputs
from cropscale.errors import CropScaleError
from cropscale.evidence import COUNT, MEASURED_MICROBENCHMARK
from cropscale.model.flops import flops_per_sample
from cropscale.model.losses import MultiTaskLoss
from cropscale.model.network import CropMappingNet, count_parameters
from cropscale.model.synthetic import synthetic_batch

STUDY_PARAMETERS = 1_947_456
"""Parameter count of the study's model as the study reports it (the reference of the printed difference)."""


def _time_step(net: CropMappingNet, batch_size: int, args: argparse.Namespace) -> list[float]:
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
    """Entry point of ``python -m cropscale summary``; returns the exit status (0)."""
    p = argparse.ArgumentParser(prog="cropscale summary", description=__doc__.splitlines()[0])
    p.add_argument("--num-classes", type=int, default=10, help="semantic classes (10 bundled sample, 20 PASTIS)")
    p.add_argument("--t2", type=int, default=16, help="Sentinel-2 dates per sample")
    p.add_argument("--t1", type=int, default=4, help="Sentinel-1 dates per orbit")
    p.add_argument("--height", type=int, default=32, help="crop height at 10 m (multiple of 4)")
    p.add_argument("--width", type=int, default=32, help="crop width at 10 m (multiple of 4)")
    p.add_argument("--time", type=int, nargs="*", default=[], metavar="B",
                   help="also time forward+backward at these batch sizes")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for the timing")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    for name in ("num_classes", "t2", "t1", "height", "width", "iterations"):
        if getattr(args, name) < 1:
            raise CropScaleError(f"summary: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.threads:
        torch.set_num_threads(args.threads)
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
        if b < 1:
            raise CropScaleError(f"summary: --time batch sizes must be >= 1, got {b}")
        times = _time_step(net, b, args)
        med = statistics.median(times)
        print(f"  forward+backward, batch {b}, {args.device}, {torch.get_num_threads()} threads: median "
              f"{1e3 * med:.1f} ms, min {1e3 * min(times):.1f} ms over {len(times)} steps, {b / med:.2f} samples/s, "
              f"{b * f['total'] / med / 1e9:.1f} GFLOP/s [{MEASURED_MICROBENCHMARK}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
