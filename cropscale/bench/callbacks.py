"""``python -m cropscale callback-bench``: per-step overhead of the scaling callbacks (microbenchmark).

The overhead of host-side callback code hides in the noise of a real CPU step (hundreds of ms) but
not on a GPU, where a step takes a few ms. So it is measured where it shows: a tiny model (one
``nn.Linear``, batch 1, one CPU thread, FP32), a few hundred optimizer steps, the median step period
after warm-up. Configurations, run alternately in ONE process, ``--repeats`` times each:

- ``off``: Lightning with a TensorBoardLogger (``log_every_n_steps`` as given), no cropscale callback;
- ``on``: the same plus every scaling callback in one :class:`~cropscale.callbacks.CallbackGroup`
  (what ``callbacks/scaling.yaml`` installs);
- ``separate`` (``--separate``): the same callbacks as eight separate Lightning callbacks.

The step period is the time between consecutive ``on_train_batch_end`` hooks, read by a probe callback
present in every configuration: wall time (``time.perf_counter``, default) or, with ``--clock cpu``, the
CPU time of the process (``time.process_time``: every thread of the process, the TensorBoard writer's
included), which other processes on a shared machine do not inflate while they only take CPUs away.
Printed: median step per configuration over all measured steps (µs), overhead ``on - off`` in µs and as
a ratio, the mean step (which keeps the log steps, where scalars are read from the device and written),
the per-repeat medians, and the median of the per-repeat differences (runs of one repeat are adjacent in
time, so that figure is less exposed to the load of other processes on a shared machine), all labelled
``measured-microbenchmark``. Target: at most 100 µs
per step. ``--json`` also writes the figures.

``--model network`` runs the same comparison on the study's model instead (default
:class:`~cropscale.model.network.CropMappingNet`, multi-task loss, AdamW, gradient norm clipped to
1.0, synthetic samples prepared before training; default crop 16 so that a CPU run takes about a
minute): there the figure is the ratio to a real step, target at most 2 %.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
import warnings
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from cropscale.callbacks import CallbackGroup, all_scaling_callbacks
from cropscale.errors import CropScaleError
from cropscale.evidence import MEASURED_MICROBENCHMARK
from cropscale.testing.probe import ProbeTask, SyntheticSamples
from cropscale.testing.toy import ToyTask, toy_batches

TARGET_US = 100.0
TARGET_RATIO = 0.02  # --model network: at most 2 % of the study model's step
_DEFAULTS = {"steps": (400, 30), "warmup": (100, 5), "log_every": (50, 10)}  # (linear, network)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
"""``--clock``: wall time, or the CPU time of the process (all threads), in s."""


class _Probe(Callback):
    """Clock reading (s) at every ``on_train_batch_end``."""

    def __init__(self, clock: str = "wall") -> None:
        self.ends: list[float] = []
        self._now = CLOCKS[clock]

    def on_train_batch_end(self, *a: Any) -> None:
        self.ends.append(self._now())


def _network(args: argparse.Namespace, steps: int) -> tuple[Any, Any]:
    """Build the study's network and a loader of pre-generated synthetic samples.

    The network is the default CropMappingNet with the multi-task loss and AdamW; the samples come from
    :mod:`cropscale.testing.probe`.
    """
    data = SyntheticSamples(steps * args.batch, pool=args.batch, t2=args.t2, t1=args.t1,
                            crop_size=args.crop_size, seed=0)
    return ProbeTask(), torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=False)


def _one_run(config: str, args: argparse.Namespace, root: str) -> list[float]:
    probe = _Probe(args.clock)
    callbacks: list[Any] = [probe]
    if config == "on":
        callbacks.append(CallbackGroup(all_scaling_callbacks()))
    elif config == "separate":
        callbacks.extend(all_scaling_callbacks())
    steps = args.warmup + args.steps + 1
    if args.model == "network":
        module, loader = _network(args, steps)
    else:
        module = ToyTask(features=args.features)
        loader = torch.utils.data.DataLoader(toy_batches(steps, args.batch, args.features), batch_size=None)
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=steps, max_epochs=1, callbacks=callbacks,
        logger=TensorBoardLogger(root, name=config), log_every_n_steps=args.log_every,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, gradient_clip_val=1.0 if args.model == "network" else None,
    )
    trainer.fit(module, train_dataloaders=loader)
    ends = probe.ends
    periods = [b - a for a, b in zip(ends[:-1], ends[1:], strict=False)]
    return periods[args.warmup:]


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Run the alternating configurations; returns the figures (seconds inside, µs in the report)."""
    torch.set_num_threads(args.threads)
    configs = ["off", "on"] + (["separate"] if args.separate else [])
    per_config: dict[str, list[float]] = {c: [] for c in configs}
    medians: dict[str, list[float]] = {c: [] for c in configs}
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with tempfile.TemporaryDirectory(prefix="cropscale-callback-bench-") as root:
        for _ in range(args.repeats):
            for c in configs:
                periods = _one_run(c, args, root)
                per_config[c].extend(periods)
                medians[c].append(statistics.median(periods))
    result: dict[str, Any] = {
        "evidence": MEASURED_MICROBENCHMARK,
        "setup": {"model": _model_name(args), "batch": args.batch, "threads": args.threads,
                  "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
                  "log_every_n_steps": args.log_every, "precision": "32-true",
                  "clock": {"wall": "time.perf_counter (wall)", "cpu": "time.process_time (CPU time of the process)"}[
                      args.clock],
                  "optimizer": "AdamW, gradient norm clipped to 1.0" if args.model == "network" else "SGD"},
        "median_step_us": {c: 1e6 * statistics.median(v) for c, v in per_config.items()},
        # the mean keeps the log steps (1 in log_every_n_steps), where the scalars are read and written
        "mean_step_us": {c: 1e6 * statistics.fmean(v) for c, v in per_config.items()},
        "median_step_us_per_repeat": {c: [1e6 * m for m in v] for c, v in medians.items()},
        "load_average_1min": [load_before, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
        "cpu_count": os.cpu_count(),
    }
    off = result["median_step_us"]["off"]
    result["overhead_us"] = {c: result["median_step_us"][c] - off for c in configs if c != "off"}
    result["overhead_ratio"] = {c: result["overhead_us"][c] / off for c in configs if c != "off"}
    result["overhead_mean_us"] = {c: result["mean_step_us"][c] - result["mean_step_us"]["off"]
                                  for c in configs if c != "off"}
    # runs of one repeat are adjacent in time: their difference is less exposed to drifting machine load
    per = result["median_step_us_per_repeat"]
    result["overhead_us_paired_median"] = {
        c: statistics.median(a - b for a, b in zip(per[c], per["off"], strict=True)) for c in configs if c != "off"
    }
    if args.model == "network":
        result["target_ratio"] = TARGET_RATIO
        result["within_target"] = result["overhead_ratio"]["on"] <= TARGET_RATIO
    else:
        result["target_us"] = TARGET_US
        result["within_target"] = result["overhead_us"]["on"] <= TARGET_US
    return result


def _model_name(args: argparse.Namespace) -> str:
    if args.model == "network":
        return (f"CropMappingNet (default config), S2 [{args.t2},10,{args.crop_size},{args.crop_size}],"
                f" S1A/S1D [{args.t1},2,{args.crop_size},{args.crop_size}], synthetic samples")
    return f"nn.Linear({args.features}, 1)"


def _print(result: dict[str, Any]) -> None:
    s = result["setup"]
    print(f"callback-bench ({result['evidence']}): {s['model']}, batch {s['batch']}, {s['threads']} thread(s), "
          f"{s['steps']} steps after {s['warmup']} warm-up, {s['repeats']} alternating repeats, "
          f"log_every_n_steps={s['log_every_n_steps']}, clock {s['clock']}")
    print(f"{'configuration':<34} {'median step (µs)':>17} {'overhead (µs)':>14} {'ratio':>8}")
    names = {"off": "Lightning + TensorBoard (off)", "on": "+ scaling callbacks, grouped (on)",
             "separate": "+ scaling callbacks, 8 separate"}
    for c, us in result["median_step_us"].items():
        over = result["overhead_us"].get(c)
        ratio = result["overhead_ratio"].get(c)
        print(f"{names[c]:<34} {us:>17.1f} {'' if over is None else f'{over:+.1f}':>14} "
              f"{'' if ratio is None else f'{100 * ratio:+.1f}%':>8}")
    for c, reps in result["median_step_us_per_repeat"].items():
        print(f"  {c:<9} per-repeat medians (µs): " + ", ".join(f"{x:.0f}" for x in reps))
    la = result["load_average_1min"]
    if la[0] is not None:
        print(f"  1-min load average before/after: {la[0]:.2f} / {la[1]:.2f} on {result['cpu_count']} CPUs "
              "(other processes inflate and scatter the figures)")
    over_mean = result["overhead_mean_us"]
    means = ", ".join(f"{c} {us:.1f}" + (f" ({over_mean[c]:+.1f})" if c in over_mean else "")
                      for c, us in result["mean_step_us"].items())
    print(f"  mean step incl. log steps (µs): {means}")
    paired = result["overhead_us_paired_median"]
    print("  overhead, median of the per-repeat differences (µs): "
          + ", ".join(f"{c} {v:+.1f}" for c, v in paired.items()))
    verdict = "within" if result["within_target"] else "ABOVE"
    target = f"{100 * TARGET_RATIO:.0f} %" if "target_ratio" in result else f"{TARGET_US:.0f} µs"
    print(f"overhead of the grouped callbacks: {result['overhead_us']['on']:+.1f} µs/step "
          f"({100 * result['overhead_ratio']['on']:+.1f} %), {verdict} the {target} target "
          f"[{result['evidence']}]")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m cropscale callback-bench``; returns the exit status."""
    p = argparse.ArgumentParser(prog="cropscale callback-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=None, help="measured optimizer steps per run (default 400; 30 "
                   "with --model network)")
    p.add_argument("--warmup", type=int, default=None,
                   help="warm-up steps left out (default 100; 5 with --model network)")
    p.add_argument("--repeats", type=int, default=3, help="alternating runs per configuration (default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--model", choices=("linear", "network"), default="linear",
                   help="linear: one nn.Linear, where host overhead shows (default); network: the study's "
                        "CropMappingNet with AdamW and clipping, where the ratio to a real step shows")
    p.add_argument("--features", type=int, default=16, help="input features of the nn.Linear (default 16)")
    p.add_argument("--crop-size", type=int, default=16, help="--model network: 10 m crop side (default 16)")
    p.add_argument("--t2", type=int, default=16, help="--model network: Sentinel-2 dates (default 16)")
    p.add_argument("--t1", type=int, default=4, help="--model network: Sentinel-1 dates per orbit (default 4)")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--log-every", type=int, default=None, help="trainer.log_every_n_steps (default 50; 10 with "
                   "--model network)")
    p.add_argument("--separate", action="store_true", help="also run the callbacks as 8 separate callbacks")
    p.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                   help="wall: time.perf_counter (default); cpu: CPU time of the process, steadier on a loaded machine")
    p.add_argument("--json", type=str, default=None, help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    for name, (linear, network) in _DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, network if args.model == "network" else linear)
    for name in ("steps", "repeats", "threads", "features", "batch", "log_every", "crop_size", "t2", "t1"):
        if getattr(args, name) < 1:
            raise CropScaleError(f"callback-bench: --{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        raise CropScaleError("callback-bench: --warmup must be >= 0")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    result = run_benchmark(args)
    _print(result)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
