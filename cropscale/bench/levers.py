"""``python -m cropscale lever-bench``: each speed lever against the eager step, as a ratio, in one run.

``python -m cropscale lever-bench [--precision 32-true] [--batch-size 2] [--device cpu]
[--levers channels_last fused compile pinned] [--warmup 3] [--iterations 10]``

One process, one seed, one batch size and precision. The compute-only step of
:mod:`cropscale.bench.step.command` is built once per variant (eager, and each lever on its own,
:mod:`cropscale.model.speed`), each variant is warmed up (compilation falls there), then the measured
steps are **interleaved**: step i of every variant runs before step i + 1 of any, so that the load of
other processes on a shared machine falls on every variant alike and the ratios stay meaningful:

- ``channels_last``: the model in ``torch.channels_last`` (``--channels-last``);
- ``fused``: fused AdamW (``--fused``);
- ``compile``: ``torch.compile`` of the network, ``--compile-mode`` (``--compile``; compilation falls in
  the warm-up steps, which are not measured);
- ``pinned``: the host-to-device copy of one synthetic batch, pageable and blocking against pinned and
  ``non_blocking=True`` (what ``data.pin_memory=true`` gives Lightning's transfer), median of
  ``--iterations`` copies; on a CPU-only run there is no such copy and the row says so.

Printed per lever: median step (ms), samples/s (batch / median step) and the ratio lever / eager
samples/s (> 1: faster), each ``measured-microbenchmark``; progress on stderr. The default sample
shape is smaller than the study's (T2 = 8, T1 = 2, 16 x 16) so that a CPU run, compilation included,
takes minutes; ``--t2 16 --t1 4 --crop-size 32`` gives the study's.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import torch

from cropscale.bench.step.config import AUTOCAST_DTYPE, PRECISIONS, BenchmarkConfig, resolve_device
from cropscale.bench.step.run import build_setup, set_tf32, train_step
from cropscale.env.host import environment_record
from cropscale.evidence import MEASURED_MICROBENCHMARK
from cropscale.files import atomic_write_json
from cropscale.model.speed import COMPILE_MODES, compile_unavailable_reason, fused_devices
from cropscale.model.synthetic import synthetic_batch
from cropscale.options import CropSize, Device, JsonOut, SampleShape, Seed, Threads, Warmup, parse_options
from cropscale.progress import Progress

__all__ = ["LEVERS", "main", "measure_transfer", "run"]

LEVERS: tuple[str, ...] = ("channels_last", "fused", "compile", "pinned")
"""The levers ``--levers`` accepts, in the order they run."""


def measure_transfer(batch: dict[str, torch.Tensor], device: torch.device, repeats: int) -> dict[str, Any]:
    """Median time (ms) to copy ``batch`` to ``device``: pageable + blocking vs pinned + ``non_blocking=True``.

    Each copy is synchronised before the clock stops. Returns ``{"pageable_ms", "pinned_ms", "ratio"}``
    (ratio = pageable / pinned: > 1 means the pinned copy is faster), or ``{"reason"}`` when ``device``
    is not a CUDA device (no host-to-device copy to measure).
    """
    if device.type != "cuda":
        return {"reason": f"no host-to-device copy on a {device.type} run (pinning matters for CUDA)"}
    host = {k: v.cpu() for k, v in batch.items()}
    pinned = {k: v.pin_memory() for k, v in host.items()}

    def timed(src: dict[str, torch.Tensor], non_blocking: bool) -> float:
        times = []
        for _ in range(repeats + 1):
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            for v in src.values():
                v.to(device, non_blocking=non_blocking)
            torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(times[1:])

    pageable_ms, pinned_ms = timed(host, False), timed(pinned, True)
    return {"pageable_ms": pageable_ms, "pinned_ms": pinned_ms, "ratio": pageable_ms / pinned_ms}


def _lever_config(base: BenchmarkConfig, lever: str, mode: str) -> BenchmarkConfig:
    return {"channels_last": replace(base, channels_last=True), "fused": replace(base, fused=True),
            "compile": replace(base, compile=True, compile_mode=mode)}[lever]


def _skip_reason(lever: str, device: torch.device) -> str | None:
    if lever == "compile":
        return compile_unavailable_reason(device.type)
    if lever == "fused" and device.type not in fused_devices():
        return f"no fused AdamW kernel for {device.type} in torch {torch.__version__}"
    return None


def _timed_step(setup: Any, precision: str, device: torch.device) -> float:
    """One training step of ``setup``, synchronised on CUDA; its duration in ms."""
    t0 = time.perf_counter()
    train_step(setup.step_model, setup.loss_fn, setup.optimizer, setup.scaler, setup.batch, device.type,
               AUTOCAST_DTYPE[precision])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 1e3 * (time.perf_counter() - t0)


def measure_interleaved(configs: dict[str, BenchmarkConfig], precision: str, batch_size: int, device: torch.device,
                        progress: Progress | None = None) -> dict[str, dict[str, Any]]:
    """Build every variant, warm each up, then run the measured steps round-robin; times in ms.

    Returns:
        per variant ``{"median_step_ms", "samples_per_s" (batch / median s), "warmup_s", "step_times_ms"}``.
    """
    first = next(iter(configs.values()))
    set_tf32(first.tf32)
    setups = {}
    warm: dict[str, float] = {}
    for name, config in configs.items():
        if progress is not None:
            progress.note(f"building and warming up {name} ({config.warmup} step(s))")
        setups[name] = build_setup(config, precision, batch_size, device)
        warm[name] = sum(_timed_step(setups[name], precision, device) for _ in range(config.warmup)) / 1e3
    times: dict[str, list[float]] = {name: [] for name in configs}
    for i in range(first.iterations):
        for name, setup in setups.items():
            times[name].append(_timed_step(setup, precision, device))
        if progress is not None:
            progress.step(i + 1)
    out = {}
    for name, t in times.items():
        median = statistics.median(t)
        out[name] = {"median_step_ms": median, "samples_per_s": batch_size / (median / 1e3), "warmup_s": warm[name],
                     "step_times_ms": t}
    return out


def run(args: LeverOptions) -> dict[str, Any]:
    """Measure eager and each lever, interleaved; returns the figures (times in ms, throughput in samples/s)."""
    device = resolve_device(args.device)
    base = BenchmarkConfig(precision=[args.precision], batch_sizes=[args.batch_size], warmup=args.warmup,
                           iterations=args.iterations, device=args.device, t2=args.t2, t1=args.t1,
                           crop_size=args.crop_size, seed=args.seed)
    configs = {"eager": base}
    rows = {"eager": {"lever": "eager", "status": "ok"}}
    for lever in args.levers:
        why = _skip_reason(lever, device)
        if why is not None:
            rows[lever] = {"lever": lever, "status": "unavailable", "reason": why}
        elif lever == "pinned":
            batch = synthetic_batch(args.batch_size, t2=args.t2, t1=args.t1, height=args.crop_size,
                                    width=args.crop_size, seed=args.seed)
            rows[lever] = {"lever": lever, "status": "ok", **measure_transfer(batch, device, args.iterations)}
        else:
            configs[lever] = _lever_config(base, lever, args.compile_mode)
            rows[lever] = {"lever": lever, "status": "ok"}
    progress = Progress(1, "lever-bench")
    progress.start(f"{', '.join(configs)} interleaved", steps=args.iterations)
    figures = measure_interleaved(configs, args.precision, args.batch_size, device, progress)
    progress.finish()
    eager = figures["eager"]["samples_per_s"]
    for name, fig in figures.items():
        rows[name].update(fig, ratio=fig["samples_per_s"] / eager)
    return {"evidence": MEASURED_MICROBENCHMARK,
            "setup": {"precision": args.precision, "batch_size": args.batch_size, "device": str(device),
                      "t2": args.t2, "t1": args.t1, "crop_size": args.crop_size, "warmup": args.warmup,
                      "iterations": args.iterations, "seed": args.seed, "compile_mode": args.compile_mode,
                      "torch_threads": torch.get_num_threads(), "order": "measured steps interleaved"},
            "levers": [rows["eager"], *(rows[lv] for lv in args.levers)]}


def format_result(result: dict[str, Any]) -> str:
    """One line per lever: median step, samples/s and the ratio to eager, with the evidence label."""
    s, ev = result["setup"], result["evidence"]
    lines = [f"lever-bench: {s['precision']}, batch {s['batch_size']}, {s['device']}, S2 [{s['t2']},10,"
             f"{s['crop_size']},{s['crop_size']}], seed {s['seed']}, {s['warmup']} warm-up + {s['iterations']} "
             f"measured steps interleaved across variants, {s['torch_threads']} torch thread(s); "
             "ratio = lever / eager samples/s (median steps)",
             "| Lever | Median step | Samples/s | Ratio vs eager | Evidence |", "| --- | --- | --- | --- | --- |"]
    for r in result["levers"]:
        if r["status"] != "ok":
            lines.append(f"| {r['lever']} | {r['status']} | | | {r.get('reason')} |")
        elif r["lever"] == "pinned" and "reason" in r:
            lines.append(f"| pinned + non_blocking | n/a | | | {r['reason']} |")
        elif r["lever"] == "pinned":
            lines.append(f"| pinned + non_blocking (batch copy) | {r['pinned_ms']:.3f} ms vs pageable "
                         f"{r['pageable_ms']:.3f} ms | | x{r['ratio']:.2f} | {ev} |")
        else:
            lines.append(f"| {r['lever']} | {r['median_step_ms']:.1f} ms | {r['samples_per_s']:.2f} | "
                         f"x{r['ratio']:.2f} | {ev} |")
    return "\n".join(lines)


@dataclasses.dataclass(kw_only=True)
class LeverOptions(SampleShape, CropSize, Warmup, Device, Threads, Seed, JsonOut):
    """Each speed lever against the eager step, as a ratio, in one run."""

    precision: Literal[PRECISIONS] = "32-true"
    """Lightning precision of every variant"""
    batch_size: int = 2
    """samples per step"""
    levers: list[Literal[LEVERS]] = dataclasses.field(default_factory=lambda: list(LEVERS))
    """the levers to measure against eager"""
    compile_mode: Literal[COMPILE_MODES] = "default"
    """torch.compile mode of the compile lever"""
    iterations: int = 10
    """measured steps"""
    t2: int = 8
    t1: int = 2
    crop_size: int = 16

    AT_LEAST = {"batch_size": 1, "iterations": 1}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m cropscale lever-bench``; prints the table, returns 0.

    Raises:
        CropScaleError: a bad argument (sizes < 1, unknown device).
    """
    args = parse_options(LeverOptions, argv, "python -m cropscale lever-bench", __doc__.split("\n\n")[0])
    args.apply()
    args.device = args.device_name()
    args.levers = list(dict.fromkeys(args.levers))
    result = run(args)
    print(format_result(result))
    if args.json:
        result["environment"] = environment_record(__file__, argv, resolve_device(args.device))
        atomic_write_json(Path(args.json), result, default=str)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
