"""``python -m cropscale tiling-bench``: tiled validation time per patch vs tiles x one-tile forward.

Measures, in one run and on one device, (a) the wall time of
:func:`~cropscale.tiling.sliding_window_inference` over ``--patches`` whole patches (tiles of all
patches batched ``--tile-batch-size`` per network call, blending included) divided by the number of
patches, and (b) the median time of one network forward on a single ``window x window`` tile
(batch 1). It prints (a), ``tiles per patch x (b)`` and their ratio: below 1 means batching tiles
amortises per-call overhead faster than cutting and blending cost; above 1 means the tiling
overhead dominates. Timings are wall-clock (``time.perf_counter``) with ``torch.cuda.synchronize``
around each timed region on a GPU; the median over ``--repeats`` runs after ``--warmup`` runs.

Model: ``CropMappingNet`` (default config, ``--num-classes``) on ``synthetic_batch`` inputs
(``--model cropmapping``, the default when ``cropscale.model.network`` imports), or ``--model conv``: a
stand-in (one 3x3 convolution on the S2 time mean, nearest x10 upsampling for the high grid) for a
quick check, or ``--model zeros``: a network that returns zeros, so the tiled time is the tiler's own
cost (cutting, padding, blending). Every number printed is labelled ``measured-microbenchmark``.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from cropscale.batch import HR_SCALE, model_inputs
from cropscale.bench.step.config import AUTOCAST_DTYPE, resolve_device
from cropscale.env.host import environment_record
from cropscale.errors import CropScaleError
from cropscale.evidence import MEASURED_MICROBENCHMARK
from cropscale.files import atomic_write_json
from cropscale.model.network import CropMappingNet
from cropscale.model.synthetic import synthetic_batch
from cropscale.options import Device, JsonOut, OptionError, SampleShape, Threads, Warmup, parse_options
from cropscale.precision import normalise
from cropscale.progress import Progress
from cropscale.tiling import TilingStats, sliding_window_inference


class ConvStandIn(torch.nn.Module):
    """Stand-in network: 3x3 conv of the S2 time mean -> semantic / parcel; hr = nearest upsampling."""

    def __init__(self, num_classes: int, hr_scale: int = HR_SCALE) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(10, num_classes + 3, 3, padding=1)
        self.num_classes, self.hr_scale = num_classes, hr_scale

    def forward(self, s2: torch.Tensor, **_: Any) -> dict[str, torch.Tensor]:
        """Map ``s2`` ``[N, T, 10, H, W]`` to ``semantic``, ``parcel`` and ``hr`` outputs; other inputs are ignored.

        ``semantic`` is ``[N, C, H, W]``, ``parcel`` ``[N, 3, H, W]``; ``hr`` is ``[N, 3, hr_scale H, hr_scale W]``,
        the sigmoid of the nearest-upsampled parcel logits.
        """
        y = self.conv(s2.mean(1))
        hr = torch.sigmoid(F.interpolate(y[:, -3:], scale_factor=self.hr_scale, mode="nearest"))
        return {"semantic": y[:, :self.num_classes], "parcel": y[:, self.num_classes:], "hr": hr}


class ZerosStandIn(torch.nn.Module):
    """Stand-in network that returns zeros of the right shapes, so the tiled time is the tiler's own cost.

    The tiler's own cost is cutting, padding and blending, not the network's.
    """

    def __init__(self, num_classes: int, hr_scale: int = HR_SCALE) -> None:
        super().__init__()
        self.num_classes, self.hr_scale = num_classes, hr_scale

    def forward(self, s2: torch.Tensor, **_: Any) -> dict[str, torch.Tensor]:
        """Return zero ``semantic``, ``parcel`` and ``hr`` outputs for ``s2`` ``[N, T, 10, H, W]``.

        ``semantic`` is ``[N, C, H, W]``, ``parcel`` ``[N, 3, H, W]``, ``hr`` ``[N, 3, hr_scale H, hr_scale W]``;
        inputs other than ``s2`` are ignored.
        """
        n, h, w, s = s2.shape[0], s2.shape[-2], s2.shape[-1], self.hr_scale
        return {"semantic": s2.new_zeros(n, self.num_classes, h, w), "parcel": s2.new_zeros(n, 3, h, w),
                "hr": s2.new_zeros(n, 3, s * h, s * w)}


def _synthetic(patches: int, t2: int, t1: int, height: int, width: int, num_classes: int,
               device: torch.device) -> dict[str, torch.Tensor]:
    batch = synthetic_batch(patches, t2=t2, t1=t1, height=height, width=width, num_classes=num_classes,
                            device=device)
    return model_inputs(batch)


def _build_model(name: str, num_classes: int) -> tuple[torch.nn.Module, str]:
    if name in ("auto", "cropmapping"):
        net = CropMappingNet(num_classes=num_classes)
        params = sum(p.numel() for p in net.parameters())
        return net, f"CropMappingNet (default config, num_classes={num_classes}, {params:,} parameters)"
    if name == "zeros":
        return ZerosStandIn(num_classes), "zeros stand-in (returns zeros: the tiled time is the tiler's own cost)"
    return ConvStandIn(num_classes), "conv stand-in (one 3x3 Conv2d + nearest x10 upsampling; not the real network)"


def _timed(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int,
           progress: Progress | None = None) -> list[float]:
    for i in range(warmup):
        fn()
        if progress is not None:
            progress.step(i + 1)
    times = []
    for i in range(repeats):
        if progress is not None and i:
            progress.step(warmup + i)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return times


@dataclasses.dataclass(kw_only=True)
class TilingOptions(SampleShape, Warmup, Device, Threads, JsonOut):
    """Tiled validation time against the tile count times one tile's forward."""

    model: Literal["auto", "cropmapping", "conv", "zeros"] = "auto"
    """network: CropMappingNet (auto = if it imports), the conv stand-in, or the zeros stand-in (tiler overhead
    alone)"""
    patches: int = 2
    """whole patches per tiled call"""
    height: int = 128
    """patch height, 10 m pixels (128: PASTIS)"""
    width: int = 128
    """patch width, 10 m pixels"""
    window: int = 32
    """tile size, 10 m pixels"""
    stride: int | None = None
    """tile stride (default window // 2)"""
    tile_batch_size: int = 16
    """tiles per network call"""
    num_classes: int = 20
    """semantic classes (20: PASTIS)"""
    precision: Literal["32", "16-mixed", "bf16-mixed"] = "32"
    """FP32 or autocast FP16 / BF16"""
    warmup: int = 1
    repeats: int = 3
    """measured runs (one-tile: max(5, repeats))"""
    RENAMED = {"--output": "json"}
    AT_LEAST = {"patches": 1, "height": 1, "width": 1, "window": 1, "tile_batch_size": 1, "repeats": 1}

    def check(self) -> None:
        """Raises OptionError: a ``--window`` larger than the patch."""
        if self.window > min(self.height, self.width):
            raise OptionError(f"--window {self.window} is larger than the patch {self.height}x{self.width} "
                              f"(the one-tile forward needs a whole window inside the patch)")


def _one_tile(inputs: dict[str, Any], height: int, width: int, window: int) -> dict[str, Any]:
    """The first patch's top-left ``window x window`` tile of ``inputs`` (non-spatial inputs: row 0)."""
    return {k: (v[:1, ..., :window, :window] if v is not None and v.dim() >= 3
                and tuple(v.shape[-2:]) == (height, width) else (None if v is None else v[:1]))
            for k, v in inputs.items()}


def _measure(args: TilingOptions, net: torch.nn.Module, device: torch.device) -> dict[str, Any]:
    """Time the tiled inference of ``--patches`` patches and the one-tile forward; the figures in s."""
    inputs = _synthetic(args.patches, args.t2, args.t1, args.height, args.width, args.num_classes, device)
    tile = _one_tile(inputs, args.height, args.width, args.window)
    amp_dtype = AUTOCAST_DTYPE.get(normalise(args.precision))

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype) if amp_dtype is not None else nullcontext()

    stats = TilingStats()

    def tiled() -> None:
        with torch.inference_mode(), autocast():
            sliding_window_inference(net, inputs, window=args.window, stride=args.stride,
                                     tile_batch_size=args.tile_batch_size, stats=stats)

    def one_tile() -> None:
        with torch.inference_mode(), autocast():
            net(**tile)

    progress = Progress(2, "tiling-bench")
    progress.start(f"tiled validation of {args.patches} patch(es)", steps=args.warmup + args.repeats)
    tiled_s = _timed(tiled, device, args.warmup, args.repeats, progress)
    progress.finish()
    progress.start("one-tile forward", steps=max(args.warmup, 1) + max(args.repeats, 5))
    tile_s = _timed(one_tile, device, max(args.warmup, 1), max(args.repeats, 5), progress)
    progress.finish()
    per_patch = statistics.median(tiled_s) / args.patches
    one = statistics.median(tile_s)
    predicted = stats.tiles_per_patch * one
    return {
        "stride": args.stride if args.stride is not None else max(args.window // 2, 1),
        "tiles_per_patch": stats.tiles_per_patch, "net_calls": stats.num_net_calls,
        "tiled_s": tiled_s, "one_tile_s": tile_s, "tiled_per_patch_s": per_patch, "one_tile_s_median": one,
        "tiles_x_one_tile_s": predicted, "ratio": per_patch / predicted,
    }


def _print_figures(args: TilingOptions, fig: dict[str, Any], model_desc: str, device: torch.device) -> None:
    window, label = args.window, MEASURED_MICROBENCHMARK
    print(f"model: {model_desc}; device {device}; precision {args.precision}; "
          f"torch threads {torch.get_num_threads()}")
    print(f"{label}  tiled validation: {fig['tiled_per_patch_s'] * 1e3:.1f} ms per patch ({args.height}x{args.width} "
          f"patch, T2={args.t2}, window {window}, stride {fig['stride']}, {fig['tiles_per_patch']} tiles/patch, "
          f"tile batch {args.tile_batch_size}, {fig['net_calls']} net calls for {args.patches} patches; "
          f"median of {args.repeats})")
    print(f"{label}  one-tile forward: {fig['one_tile_s_median'] * 1e3:.2f} ms (batch 1, {window}x{window}; median of "
          f"{len(fig['one_tile_s'])}); {fig['tiles_per_patch']} tiles x one-tile = "
          f"{fig['tiles_x_one_tile_s'] * 1e3:.1f} ms per patch")
    print(f"{label}  ratio tiled / (tiles x one-tile) = {fig['ratio']:.3f}")


def _write_output(args: TilingOptions, fig: dict[str, Any], model_desc: str, device: torch.device,
                  argv: list[str] | None) -> None:
    doc = {
        "evidence": MEASURED_MICROBENCHMARK, "model": model_desc, "precision": args.precision,
        "settings": {k: getattr(args, k) for k in ("patches", "height", "width", "window", "tile_batch_size",
                                                    "t2", "t1", "num_classes", "warmup", "repeats")},
        **fig,
        "environment": environment_record(__file__, list(sys.argv[1:] if argv is None else argv), device),
    }
    out = Path(args.json)
    try:
        atomic_write_json(out, doc)
    except CropScaleError as err:
        raise CropScaleError(f"--json {out}: {err}") from None
    print(f"wrote {out}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the three labelled figures; return 0.

    Raises:
        CropScaleError: a bad argument (sizes < 1, unknown device, unwritable ``--json``).
    """
    args = parse_options(TilingOptions, argv, "python -m cropscale tiling-bench", __doc__.split("\n\n")[0])
    args.apply()
    device = resolve_device(args.device_name())
    torch.manual_seed(0)
    net, model_desc = _build_model(args.model, args.num_classes)
    fig = _measure(args, net.to(device).eval(), device)
    _print_figures(args, fig, model_desc, device)
    if args.json:
        _write_output(args, fig, model_desc, device, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
