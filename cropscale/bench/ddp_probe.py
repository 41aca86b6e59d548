"""Strong-scaling probe: training step time of the real network on 1 vs N processes under DDP (compute only).

The runs go through Lightning's DDP strategy and its launcher; the two step times give the speed-up and the
Karp-Flatt serial fraction.

    python -m cropscale.bench.ddp_probe --devices 2 --global-batch 4 --json /tmp/ddp2.json

Each run trains :class:`cropscale.model.network.CropMappingNet` with
:class:`cropscale.model.losses.MultiTaskLoss`, AdamW and gradient clipping at 1.0 (the Trainer's
``gradient_clip_val``) on synthetic batches (:func:`cropscale.model.synthetic.synthetic_batch`,
prepared before training, so data loading is not in the timed window) with a fixed *global*
batch: ``global_batch / devices`` samples per rank (equal work per optimiser step for every
world size, the strong-scaling protocol). On CPU, ``devices`` processes communicate over gloo;
Lightning's subprocess launcher starts ranks 1..N-1 by re-running this module.

Timed window per step: ``Callback.on_train_batch_start`` -> ``on_train_batch_end`` (forward,
loss, backward with the gradient all-reduce, clipping, optimiser step; Lightning's per-step DDP
SIGTERM-flag broadcast is included for N > 1). The first ``warmup`` steps are excluded. Each rank
reports its median; the run's figure is the slowest rank's median. Evidence: ``measured-microbenchmark``
(a compute-only step on synthetic batches, timed by a dedicated command: not a training run).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from lightning.pytorch import Trainer, seed_everything

from cropscale.distributed import finish_distributed
from cropscale.errors import CropScaleError
from cropscale.evidence import MEASURED_MICROBENCHMARK
from cropscale.files import atomic_write_json
from cropscale.options import CropSize, OptionError, SampleShape, Seed, Threads, Warmup, parse_options
from cropscale.testing.probe import ProbeTask, StepTimer, SyntheticSamples


@dataclasses.dataclass(kw_only=True)
class ProbeOptions(SampleShape, CropSize, Warmup, Threads, Seed):
    """Strong-scaling probe: training step time of the real network on 1 vs N processes under DDP."""

    json: str
    """JSON file written by rank 0"""
    devices: int = 1
    """processes (CPU) or GPUs"""
    accelerator: str = "cpu"
    """Lightning accelerator (cpu, gpu)"""
    global_batch: int = 4
    """samples per optimiser step over all ranks"""
    steps: int = 6
    """timed steps"""
    warmup: int = 2
    crop_size: int = 16
    threads: int | None = 1

    AT_LEAST = {"devices": 1, "steps": 1}
    RENAMED = {"--out": "json"}

    def check(self) -> None:
        """Raises OptionError: ``--global-batch`` is not a positive multiple of ``--devices``."""
        if self.global_batch < 1 or self.global_batch % self.devices:
            raise OptionError(
                f"--global-batch ({self.global_batch}) must be a positive multiple of --devices ({self.devices})"
            )


def main(argv: list[str] | None = None) -> int:
    """Run one probe (all ranks); rank 0 writes ``--json``. Returns the exit status."""
    args = parse_options(ProbeOptions, argv, "python -m cropscale.bench.ddp_probe")
    args.apply()
    seed_everything(args.seed, workers=True, verbose=False)
    local = args.global_batch // args.devices
    total_steps = args.warmup + args.steps
    data = torch.utils.data.DataLoader(
        SyntheticSamples(total_steps * args.global_batch, pool=max(local, 1), t2=args.t2, t1=args.t1,
                         crop_size=args.crop_size, seed=args.seed), batch_size=local, shuffle=False,
        num_workers=0,
    )
    timer = StepTimer()
    trainer = Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_steps=total_steps,
        gradient_clip_val=1.0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[timer],
    )
    trainer.fit(ProbeTask(), train_dataloaders=data)
    measured = timer.times[args.warmup:]
    if not measured:
        raise CropScaleError(f"ddp_probe: only {len(timer.times)} steps ran; {total_steps} were asked for")
    mine = {"rank": trainer.global_rank, "median_step_s": statistics.median(measured), "step_times_s": measured}
    per_rank = [mine]
    if trainer.world_size > 1:
        per_rank = [None] * trainer.world_size
        dist.all_gather_object(per_rank, mine)
    if trainer.global_rank == 0:
        record = {
            "evidence": MEASURED_MICROBENCHMARK,
            "what": "training step time (forward, loss, backward + all-reduce, clipping, AdamW), strong scaling",
            "world_size": trainer.world_size,
            "accelerator": args.accelerator,
            "global_batch": args.global_batch,
            "local_batch": local,
            "crop_size": args.crop_size,
            "t2": args.t2,
            "t1": args.t1,
            "threads_per_process": args.threads,
            "warmup_steps": args.warmup,
            "timed_steps": len(measured),
            "median_step_s": max(r["median_step_s"] for r in per_rank),
            "slowest_rank": max(per_rank, key=lambda r: r["median_step_s"])["rank"],
            "per_rank": per_rank,
            "host": {"cpus": os.cpu_count(), "load_average_1m": os.getloadavg()[0],
                     "platform": platform.platform(), "python": platform.python_version(),
                     "torch": torch.__version__},
        }
        atomic_write_json(args.json, record)
    failed = finish_distributed(trainer)  # gloo group destroyed; rank 0 waits for the other ranks
    if failed:
        raise CropScaleError(f"ddp_probe: rank 0 finished but child ranks failed: {failed} (local rank, exit status)")
    return 0


def run_probe(devices: int, out: str | Path, *, timeout_s: float = 600, **options) -> dict:
    """Launch ``python -m cropscale.bench.ddp_probe`` in a subprocess and return its JSON record.

    Args:
        devices: processes / devices.
        out: JSON path for rank 0's record.
        timeout_s: wall-clock limit of the whole run (s).
        **options: further CLI options by their Python names (``global_batch=4``, ``steps=6`` ...).

    Raises:
        CropScaleError: the run failed or timed out (the message ends with its output tail).
    """
    cmd = [sys.executable, "-m", "cropscale.bench.ddp_probe", "--devices", str(devices), "--json", str(out)]
    for key, value in options.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(options.get("threads", 1)))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as err:
        raise CropScaleError(f"ddp_probe with {devices} device(s) exceeded {timeout_s:g} s") from err
    if proc.returncode != 0 or not Path(out).is_file():
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise CropScaleError(f"ddp_probe with {devices} device(s) failed (exit {proc.returncode}):\n{tail}")
    return json.loads(Path(out).read_text(encoding="utf-8"))


if __name__ == "__main__":
    raise SystemExit(main())
