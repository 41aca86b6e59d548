"""``python -m cropscale pipeline-bench``: end-to-end training samples/s over compute-only samples/s.

``python -m cropscale pipeline-bench [--root DIR] [--batch-size 4] [--precision 32-true] [--device cpu]
[--workers 0] [--steps 20] [--warmup 3] [--json FILE]``

Three measurements in one process, at the same batch size, precision, sample shape and seed:

1. **compute-only**: the benchmark's step (:func:`cropscale.bench.step.run_configuration`: synthetic
   tensors already on the device, forward, loss, backward, clipping, AdamW, synchronised), samples/s =
   batch x measured steps / their summed time;
2. **end-to-end**: ``Trainer.fit`` of :class:`~cropscale.model.task.CropMappingTask` on
   :class:`~cropscale.data.datamodule.PastisHDDataModule` (real patches: reads, crops, augmentation,
   collate, transfer, Lightning's loop; no validation, logger or checkpoint), samples/s = batch x
   measured steps / the time between the ``on_train_batch_end`` of the last warm-up step and of the last
   step;
3. **data only**: the same training DataLoader iterated alone (:func:`cropscale.bench.loader.measure_loader`).

Printed: the three samples/s, the ratio end-to-end / compute-only (1.0 = the input pipeline and the
loop cost nothing), and the share of the end-to-end step that is not compute (``1 - ratio``), with the
data-only step beside it to say whether loading dominates. The fused-AdamW choice of the task
(:func:`cropscale.model.speed.choose_fused`) is used for the compute-only step too. Every figure is
``measured-microbenchmark``; progress goes to stderr.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, Trainer

from cropscale.bench.loader import default_root, measure_loader
from cropscale.bench.step.config import PRECISIONS, BenchmarkConfig, resolve_device
from cropscale.bench.step.run import run_configuration
from cropscale.data.datamodule import PastisHDDataModule
from cropscale.data.layout import resolve_layout
from cropscale.env.host import environment_record
from cropscale.errors import CropScaleError
from cropscale.evidence import MEASURED_MICROBENCHMARK
from cropscale.files import atomic_write_json
from cropscale.model.task import CropMappingTask
from cropscale.options import CropSize, Device, JsonOut, SampleShape, Seed, Threads, Warmup, parse_options
from cropscale.progress import Progress

__all__ = ["main", "measure_end_to_end", "run"]


class _BatchEnds(Callback):
    """``time.perf_counter()`` (s) at every ``on_train_batch_end`` (synchronised on CUDA first)."""

    def __init__(self, progress: Progress | None = None) -> None:
        self.ends: list[float] = []
        self._progress = progress

    def on_train_batch_end(self, trainer: Trainer, pl_module: Any, *args: Any) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self.ends.append(time.perf_counter())
        if self._progress is not None:
            self._progress.step(len(self.ends))


def _datamodule(args: PipelineOptions, steps: int) -> PastisHDDataModule:
    """The training data of the end-to-end run, with enough crops per patch for ``steps`` batches."""
    patches = [r for r in resolve_layout(args.root).records if r.fold in args.train_folds]
    return PastisHDDataModule(args.root, train_folds=args.train_folds, batch_size=args.batch_size,
                              crop_size=args.crop_size, t2=args.t2, t1=args.t1,
                              samples_per_patch=-(-steps * args.batch_size // max(len(patches), 1)),
                              num_workers=args.workers, pin_memory=args.pin_memory,
                              persistent_workers=args.workers > 0, seed=args.seed, allow_fold_overlap=True)


def measure_end_to_end(args: PipelineOptions, progress: Progress | None = None) -> dict[str, Any]:
    """Train ``warmup + steps`` steps with Lightning on the real data; samples/s over the measured steps.

    Returns:
        ``{"samples_per_s", "mean_step_ms", "steps", "fused_optimizer"}``.
    """
    total = args.warmup + args.steps + 1
    dm = _datamodule(args, total)
    torch.manual_seed(args.seed)
    task = CropMappingTask(num_classes=dm.num_classes, ignore_index=None, val_window=args.crop_size,
                           compile=args.compile, t2=args.t2, t1=args.t1, crop_size=args.crop_size)
    probe = _BatchEnds(progress)
    trainer = Trainer(accelerator="gpu" if args.device.startswith("cuda") else "cpu", devices=1,
                      precision=args.precision, max_steps=total, max_epochs=1, limit_val_batches=0,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, num_sanity_val_steps=0, gradient_clip_val=1.0,
                      callbacks=[probe])
    trainer.fit(task, datamodule=dm)
    ends = probe.ends[args.warmup:]
    if len(ends) < 2:
        raise CropScaleError(f"pipeline-bench: only {len(probe.ends)} steps ran; lower --warmup or --steps")
    elapsed = ends[-1] - ends[0]
    n = len(ends) - 1
    return {"samples_per_s": n * args.batch_size / elapsed, "mean_step_ms": 1e3 * elapsed / n, "steps": n,
            "fused_optimizer": list(task.fused_optimizer_used or (False, "not set"))}


def measure_compute(args: PipelineOptions, num_classes: int, fused: bool,
                    progress: Progress | None = None) -> dict[str, Any]:
    """The benchmark's compute-only step at the same batch, precision and shape; samples/s over the measured steps."""
    config = BenchmarkConfig(precision=[args.precision], batch_sizes=[args.batch_size], warmup=args.warmup,
                             iterations=args.steps, device=args.device, num_classes=num_classes, t2=args.t2,
                             t1=args.t1, crop_size=args.crop_size, fused=fused, compile=args.compile,
                             seed=args.seed)
    row = run_configuration(config, args.precision, args.batch_size, config.torch_device(), progress=progress)
    if row["status"] != "ok":
        raise CropScaleError(f"pipeline-bench: the compute-only step failed: {row['status']}: {row['error']}")
    total_s = sum(row["step_times_ms"]) / 1e3
    return {"samples_per_s": len(row["step_times_ms"]) * args.batch_size / total_s,
            "mean_step_ms": row["mean_step_ms"], "median_samples_per_s": row["samples_per_s"],
            "steps": len(row["step_times_ms"])}


def run(args: PipelineOptions) -> dict[str, Any]:
    """The three measurements and the ratio (see the module docstring)."""
    progress = Progress(3, "pipeline-bench")
    progress.start("end-to-end (Lightning fit on the real data)", steps=args.warmup + args.steps + 1)
    e2e = measure_end_to_end(args, progress)
    progress.finish()
    fused = bool(e2e["fused_optimizer"][0])
    progress.start("compute-only (synthetic tensors on the device)", steps=args.warmup + args.steps)
    dm = _datamodule(args, 1 + args.warmup + args.steps)
    compute = measure_compute(args, dm.num_classes, fused, progress)
    progress.finish()
    progress.start("data only (the training DataLoader alone)")
    dm.setup("fit")
    data = measure_loader(dm, args.steps, args.warmup)
    progress.finish()
    ratio = e2e["samples_per_s"] / compute["samples_per_s"]
    return {
        "evidence": MEASURED_MICROBENCHMARK,
        "setup": {"root": str(args.root), "batch_size": args.batch_size, "precision": args.precision,
                  "device": args.device, "workers": args.workers, "pin_memory": args.pin_memory,
                  "crop_size": args.crop_size, "t2": args.t2, "t1": args.t1, "steps": args.steps,
                  "warmup": args.warmup, "compile": args.compile, "torch_threads": torch.get_num_threads()},
        "end_to_end": e2e,
        "compute_only": compute,
        "data_only": {k: v for k, v in data.items() if k != "batches"},
        "ratio": ratio,
        "not_compute_share": 1.0 - ratio,
    }


def format_result(result: dict[str, Any]) -> str:
    """The figures as lines a person reads, each with its evidence label."""
    s, ev = result["setup"], result["evidence"]
    e2e, comp, data = result["end_to_end"], result["compute_only"], result["data_only"]
    data_step_ms = 1e3 * s["batch_size"] / data["samples_per_s"]
    lines = [
        f"pipeline-bench: batch {s['batch_size']}, {s['precision']}, {s['device']}, {s['workers']} worker(s), "
        f"crop {s['crop_size']}, T2 {s['t2']}, T1 {s['t1']}, {s['steps']} steps after {s['warmup']} warm-up, "
        f"{s['torch_threads']} torch thread(s)",
        f"  end-to-end (Lightning fit, real data)   {e2e['samples_per_s']:8.2f} samples/s  "
        f"{e2e['mean_step_ms']:8.1f} ms/step  [{ev}]",
        f"  compute-only (synthetic, on the device)  {comp['samples_per_s']:8.2f} samples/s  "
        f"{comp['mean_step_ms']:8.1f} ms/step  [{ev}]",
        f"  data only (DataLoader alone)             {data['samples_per_s']:8.2f} samples/s  "
        f"{data_step_ms:8.1f} ms/batch [{ev}]",
        f"ratio end-to-end / compute-only: {result['ratio']:.2f} (target on a GPU >= 0.9); "
        f"{100 * result['not_compute_share']:.0f} % of the end-to-end step is not compute [{ev}]",
    ]
    if s["workers"] == 0:
        lines.append(f"  with 0 workers the data step ({data_step_ms:.1f} ms) runs inside every training step")
    return "\n".join(lines)


@dataclasses.dataclass(kw_only=True)
class PipelineOptions(SampleShape, CropSize, Warmup, Device, Threads, Seed, JsonOut):
    """End-to-end and compute-only training samples/s of the same batch (the input pipeline's share)."""

    root: str | None = None
    """dataset root (default: the bundled sample)"""
    batch_size: int = 4
    """samples per step"""
    precision: Literal[PRECISIONS] = "32-true"
    """Lightning precision of both runs"""
    workers: int = 0
    """DataLoader workers"""
    pin_memory: bool | None = None
    """pinned host batches (default: on with cuda)"""
    steps: int = 20
    """measured steps"""
    train_folds: list[int] = dataclasses.field(default_factory=lambda: [1, 2])
    """folds of the training loader"""
    compile: bool = False
    """torch.compile the network in both runs"""

    AT_LEAST = {"batch_size": 1, "steps": 1, "workers": 0}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m cropscale pipeline-bench``; prints the figures, returns 0.

    Raises:
        CropScaleError: a bad argument (sizes < 1, negative workers, an unknown device, a missing root).
    """
    args = parse_options(PipelineOptions, argv, "python -m cropscale pipeline-bench", __doc__.split("\n\n")[0])
    args.apply()
    args.device = args.device_name()
    device = resolve_device(args.device)
    args.root = args.root or default_root()
    if args.pin_memory is None:
        args.pin_memory = device.type == "cuda"
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    result = run(args)
    print(format_result(result))
    if args.json:
        result["environment"] = environment_record(__file__, argv, device)
        atomic_write_json(Path(args.json), result, default=str)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
