"""``python -m cropscale callback-bench``: per-step overhead of the scaling callbacks (microbenchmark).

The overhead of host-side callback code hides in the noise of a real CPU step (hundreds of ms) but
not on a GPU, where a step takes a few ms. So it is measured where it shows: a tiny model (one
``nn.Linear``, batch 1, one CPU thread, FP32, gradient norm clipped to 1.0 as in ``configs/default.yaml``),
a few thousand optimizer steps, the median step period after warm-up. Configurations:

- ``off``: Lightning with a TensorBoardLogger (``log_every_n_steps`` as given), no cropscale callback;
- ``on``: the same plus every scaling callback in one :class:`~cropscale.callbacks.CallbackGroup`
  (what ``callbacks/scaling.yaml`` installs);
- ``separate`` (``--separate``): the same callbacks as eight separate Lightning callbacks;
- ``lightning`` (default with the linear model, ``--no-lightning`` leaves it out): Lightning's own
  ``ThroughputMonitor`` + ``LearningRateMonitor`` + ``DeviceStatsMonitor``, interleaved in the same fits as
  ``on``; printed: the ratio of the mean overheads over all steps (log steps included), group / Lightning;
- ``trace`` (``--trace``): the group with the step trace on, in the same fits.

``--count`` counts instead of timing (:func:`count_fit`): per callback, ordinary and log steps apart,
Python calls, C calls, torch ops and device-to-host reads, for the default group and Lightning's monitors
in one fit, under ``32-true`` and ``16-mixed`` with a GradScaler (``docs/measuring.md``).

**Interleaved in one fit.** On a shared machine the speed of a core drifts by tens of percent within
a second, so two configurations run one after the other differ by more than the 100 µs looked for.
Each fit therefore alternates two configurations in blocks of ``--block`` optimizer steps (``off``,
``on``, ``off``, ...): between two blocks the trainer's callback list (and the profiler, which
:class:`~cropscale.callbacks.StepTimingCallback` wraps) is swapped, so that a block runs exactly the
code of its configuration, and the drift hits both alike. The first ``--warmup`` steps run with every
callback and are left out, and so are the first two steps of each block (caches warm up again). The
callbacks themselves see gaps in their steps; their figures are not used here. ``--repeats`` fits
(``separate`` has fits of its own, against ``off``).

The step period is the time between consecutive ``on_train_batch_end`` hooks, read by the last callback
of the trainer: wall time (``time.perf_counter``, default) or, with ``--clock cpu``, the CPU time of the
process (``time.process_time``: every thread of the process, the TensorBoard writer's included). Printed:
median step per configuration over all measured steps (µs), overhead ``on - off`` in µs and as a ratio,
the mean step (which keeps the log steps, where scalars are read from the device and written), the
per-repeat medians and the median of the per-repeat differences, all labelled
``measured-microbenchmark``. Target: at most 100 µs per step. ``--json`` also writes the figures.

``--model network`` runs the same comparison on the study's model instead (default
:class:`~cropscale.model.network.CropMappingNet`, multi-task loss, AdamW, gradient norm clipped to
1.0, synthetic samples prepared before training; default crop 16 so that a CPU run takes about a
minute): there the figure is the ratio to a real step, target at most 2 %.

``--device cuda`` runs the fits on one GPU (default ``cpu``). The step period is still read on the host
clock between ``on_train_batch_end`` hooks: with no per-step sync, the host's steps settle to the device's
pace only once the launch queue is full, so for a small model it is the host-side (launch and callback)
cost of a step, which is what the callbacks add to.

Modules: the blocks of callbacks swapped within one fit in :mod:`~cropscale.bench.interleave`; ``--count`` in
:mod:`~cropscale.bench.callback_counts`; the options, the interleaved fits and the printed figures here.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import statistics
import tempfile
import warnings
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from cropscale.bench.callback_counts import lightning_monitors, print_counts, run_counts
from cropscale.bench.interleave import CLOCKS, SETTLE_STEPS, Interleaver
from cropscale.callbacks import CallbackGroup, StepTimingCallback, all_scaling_callbacks
from cropscale.errors import CropScaleError
from cropscale.evidence import MEASURED_MICROBENCHMARK
from cropscale.files import atomic_write_json
from cropscale.options import CropSize, JsonOut, OptionError, SampleShape, Threads, Warmup, parse_options
from cropscale.progress import Progress
from cropscale.testing.probe import ProbeTask, SyntheticSamples
from cropscale.testing.toy import ToyTask, toy_batches

TARGET_US = 100.0
TARGET_RATIO = 0.02  # --model network: at most 2 % of the study model's step
_DEFAULTS = {"steps": (1000, 30), "warmup": (100, 5), "log_every": (50, 10), "block": (20, 5)}  # (linear, network)


@dataclasses.dataclass(kw_only=True)
class CallbackBenchOptions(SampleShape, CropSize, Warmup, Threads, JsonOut):
    """Per-step overhead of the scaling callbacks (``None`` defaults depend on ``--model``, see ``_DEFAULTS``)."""

    steps: int | None = None
    """optimizer steps per configuration and repeat, rounded up to whole blocks (default 1000; 30 with --model
    network; 300 with --count)"""
    warmup: int | None = None
    """warm-up steps left out (default 100; 5 with --model network)"""
    repeats: int = 3
    """alternating runs per configuration"""
    threads: int | None = 1
    model: Literal["linear", "network"] = "linear"
    """linear: one nn.Linear, where host overhead shows; network: the study's CropMappingNet with AdamW and
    clipping, where the ratio to a real step shows"""
    features: int = 16
    """input features of the nn.Linear"""
    crop_size: int = 16
    batch: int = 1
    """batch size"""
    log_every: int | None = None
    """trainer.log_every_n_steps (default 50; 10 with --model network)"""
    block: int | None = None
    """optimizer steps per block of one configuration (default 20; 5 with --model network; at least 3)"""
    separate: bool = False
    """also run the callbacks as 8 separate callbacks"""
    lightning: bool | None = None
    """also interleave Lightning's ThroughputMonitor + LearningRateMonitor + DeviceStatsMonitor in the same fits
    and print the ratio of the mean overheads, group / Lightning (default: on with --model linear, off with
    --model network)"""
    trace: bool = False
    """also interleave the group with the step trace on (StepTimingCallback trace_path), to weigh the trace
    against the rest of the group"""
    count: bool = False
    """count instead of timing: per callback, ordinary and log steps apart, Python calls, C calls, torch ops and
    device-to-host reads, for the group and Lightning's monitors, under 32-true and 16-mixed with a GradScaler"""
    clock: Literal["wall", "cpu"] = "wall"
    """wall: time.perf_counter; cpu: CPU time of the process, steadier on a loaded machine"""
    device: Literal["cpu", "cuda"] = "cpu"
    """where the fits run; cuda: one GPU, step periods on the host clock"""

    AT_LEAST = {"steps": 1, "repeats": 1, "features": 1, "batch": 1, "log_every": 1}

    def check(self) -> None:
        """Fill the ``--model``-dependent defaults, then check the options together.

        Raises:
            OptionError: ``--count`` with ``--model network``, a ``--block`` of at most ``SETTLE_STEPS`` steps.
        """
        if self.count and self.model != "linear":
            raise OptionError("callback-bench: --count runs the linear model only (leave out --model network)")
        if self.count and self.steps is None:
            self.steps = 300
        for name, (linear, network) in _DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, network if self.model == "network" else linear)
        if self.lightning is None:
            self.lightning = self.model == "linear"
        if self.block <= SETTLE_STEPS:
            raise OptionError(f"callback-bench: --block must be >= {SETTLE_STEPS + 1} (the first {SETTLE_STEPS}"
                              " steps of each block are left out)")


def _network(args: CallbackBenchOptions, steps: int) -> tuple[Any, Any]:
    """Build the study's network and a loader of pre-generated synthetic samples.

    The network is the default CropMappingNet with the multi-task loss and AdamW; the samples come from
    :mod:`cropscale.testing.probe`.
    """
    data = SyntheticSamples(steps * args.batch, pool=args.batch, t2=args.t2, t1=args.t1,
                            crop_size=args.crop_size, seed=0)
    return ProbeTask(), torch.utils.data.DataLoader(data, batch_size=args.batch, shuffle=False)


def _fit_steps(args: CallbackBenchOptions, arms: int = 2) -> int:
    """Optimizer steps of one interleaved fit: warm-up, then ``steps`` per arm in whole blocks."""
    return args.warmup + arms * args.block * math.ceil(args.steps / args.block)


def _arm_callbacks(config: str) -> list[Callback]:
    if config == "on":
        return [CallbackGroup(all_scaling_callbacks())]
    if config == "separate":
        return list(all_scaling_callbacks())
    if config == "lightning":
        return lightning_monitors()
    if config == "trace":  # the group with the step trace on (callbacks/step_timing.yaml's trace_path)
        cbs = all_scaling_callbacks()
        cbs[0] = StepTimingCallback(trace_path="step_trace.rank{rank}.jsonl")
        return [_TracedGroup(cbs)]
    return []


class _TracedGroup(CallbackGroup):
    """A :class:`CallbackGroup` of its own class: a state key apart from the ``on`` arm's group in the same fit."""


def _one_fit(configs: list[str], args: CallbackBenchOptions, root: str) -> dict[str, list[float]]:
    """One fit going round ``off`` and ``configs``; returns the step periods of each (s)."""
    arms = [("off", [])] + [(c, _arm_callbacks(c)) for c in configs]
    cbs = [cb for _, arm in arms for cb in arm]
    steps = _fit_steps(args, len(arms))
    switch = Interleaver(arms, block=args.block, warmup=args.warmup, last_step=steps, clock=CLOCKS[args.clock])
    if args.model == "network":
        module, loader = _network(args, steps + 1)
    else:
        module = ToyTask(features=args.features)
        loader = torch.utils.data.DataLoader(toy_batches(steps + 1, args.batch, args.features), batch_size=None)
    trainer = Trainer(
        accelerator="gpu" if args.device == "cuda" else "cpu", devices=1, max_steps=steps, max_epochs=1,
        callbacks=[*cbs, switch],
        logger=TensorBoardLogger(root, name="-".join(configs)), log_every_n_steps=args.log_every,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, gradient_clip_val=1.0,  # clipped by norm, as configs/default.yaml
    )
    switch.bind(trainer)
    trainer.fit(module, train_dataloaders=loader)
    return switch.periods


def run_benchmark(args: CallbackBenchOptions) -> dict[str, Any]:
    """Run the interleaved fits; returns the figures (seconds inside, µs in the report)."""
    args.apply()
    first = ["on"] + (["lightning"] if args.lightning else []) + (["trace"] if args.trace else [])
    configs = first + (["separate"] if args.separate else [])
    fits = [first] + ([["separate"]] if args.separate else [])
    per_config: dict[str, list[float]] = {"off": [], **{c: [] for c in configs}}
    medians: dict[str, list[float]] = {"off": [], **{c: [] for c in configs}}
    off_of: dict[str, list[float]] = {c: [] for c in configs}  # the off periods of each configuration's fits
    diffs: dict[str, list[float]] = {c: [] for c in configs}
    mean_diffs: dict[str, list[float]] = {c: [] for c in configs}  # per fit: mean step of c - mean off step
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    progress = Progress(args.repeats * len(fits), "callback-bench")
    with tempfile.TemporaryDirectory(prefix="cropscale-callback-bench-") as root:
        for r in range(args.repeats):
            for fit in fits:
                progress.start(f"repeat {r + 1}, off and {' and '.join(fit)} interleaved")
                periods = _one_fit(fit, args, root)
                progress.finish()
                for c in fit:
                    per_config[c].extend(periods[c])
                    off_of[c].extend(periods["off"])
                    medians[c].append(statistics.median(periods[c]))
                    diffs[c].append(statistics.median(periods[c]) - statistics.median(periods["off"]))
                    mean_diffs[c].append(statistics.fmean(periods[c]) - statistics.fmean(periods["off"]))
                if "on" in fit:
                    per_config["off"].extend(periods["off"])
                    medians["off"].append(statistics.median(periods["off"]))
    result: dict[str, Any] = {
        "evidence": MEASURED_MICROBENCHMARK,
        "setup": {"model": _model_name(args), "batch": args.batch, "threads": args.threads,
                  "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats, "block": args.block,
                  "design": (f"off and each configuration interleaved in blocks of {args.block} steps within one "
                             f"fit (first {SETTLE_STEPS} of each block left out)"),
                  "log_every_n_steps": args.log_every, "precision": "32-true", "device": args.device,
                  "clock": {"wall": "time.perf_counter (wall)", "cpu": "time.process_time (CPU time of the process)"}[
                      args.clock],
                  "optimizer": ("AdamW" if args.model == "network" else "SGD") + ", gradient norm clipped to 1.0"},
        "median_step_us": {c: 1e6 * statistics.median(v) for c, v in per_config.items()},
        # the mean keeps the log steps (1 in log_every_n_steps), where the scalars are read and written
        "mean_step_us": {c: 1e6 * statistics.fmean(v) for c, v in per_config.items()},
        "median_step_us_per_repeat": {c: [1e6 * m for m in v] for c, v in medians.items()},
        "measured_steps": {c: len(v) for c, v in per_config.items()},
        # each configuration's overhead is taken against the off blocks of its own fits
        "median_off_step_us_of": {c: 1e6 * statistics.median(off_of[c]) for c in configs},
        "load_average_1min": [load_before, os.getloadavg()[0] if hasattr(os, "getloadavg") else None],
        "cpu_count": os.cpu_count(),
    }
    off_us = result["median_off_step_us_of"]
    result["overhead_us"] = {c: result["median_step_us"][c] - off_us[c] for c in configs}
    result["overhead_ratio"] = {c: result["overhead_us"][c] / off_us[c] for c in configs}
    result["overhead_mean_us"] = {c: 1e6 * (statistics.fmean(per_config[c]) - statistics.fmean(off_of[c]))
                                  for c in configs}
    result["overhead_mean_us_per_fit"] = {c: [1e6 * d for d in v] for c, v in mean_diffs.items()}
    if args.lightning:  # the group's overhead against Lightning's monitors', mean over all steps, same fits
        result["ratio_to_lightning"] = result["overhead_mean_us"]["on"] / result["overhead_mean_us"]["lightning"]
        result["ratio_to_lightning_per_fit"] = [g / m for g, m in zip(mean_diffs["on"], mean_diffs["lightning"],
                                                                       strict=True)]
    # each repeat's difference comes from one fit: the median over repeats is less exposed to a bad fit
    result["overhead_us_paired_median"] = {c: 1e6 * statistics.median(d) for c, d in diffs.items()}
    if args.model == "network":
        result["target_ratio"] = TARGET_RATIO
        result["within_target"] = result["overhead_ratio"]["on"] <= TARGET_RATIO
    else:
        result["target_us"] = TARGET_US
        result["within_target"] = result["overhead_us"]["on"] <= TARGET_US
    result["below_noise"] = result["overhead_us"]["on"] < 0  # a negative overhead is noise, not a result
    return result


def _model_name(args: CallbackBenchOptions) -> str:
    if args.model == "network":
        return (f"CropMappingNet (default config), S2 [{args.t2},10,{args.crop_size},{args.crop_size}],"
                f" S1A/S1D [{args.t1},2,{args.crop_size},{args.crop_size}], synthetic samples")
    return f"nn.Linear({args.features}, 1)"


def _print(result: dict[str, Any]) -> None:
    s = result["setup"]
    steps = ", ".join(f"{c} {n}" for c, n in result["measured_steps"].items())
    print(f"callback-bench ({result['evidence']}): {s['model']}, batch {s['batch']}, {s['threads']} thread(s), "
          f"{s['repeats']} fit(s) per configuration after {s['warmup']} warm-up steps each, "
          f"log_every_n_steps={s['log_every_n_steps']}, clock {s['clock']}")
    print(f"  {s['design']}; measured steps: {steps}")
    print(f"{'configuration':<34} {'median step (µs)':>17} {'overhead (µs)':>14} {'ratio':>8}")
    names = {"off": "Lightning + TensorBoard (off)", "on": "+ scaling callbacks, grouped (on)",
             "separate": "+ scaling callbacks, 8 separate", "lightning": "+ Lightning's 3 monitors",
             "trace": "+ grouped, step trace on"}
    for c, us in result["median_step_us"].items():
        over = result["overhead_us"].get(c)
        ratio = result["overhead_ratio"].get(c)
        print(f"{names[c]:<34} {us:>17.1f} {'' if over is None else f'{over:+.1f}':>14} "
              f"{'' if ratio is None else f'{100 * ratio:+.1f}%':>8}")
    if "separate" in result["overhead_us"]:
        print(f"  separate: overhead against the off blocks of its own fits (median off step "
              f"{result['median_off_step_us_of']['separate']:.1f} µs)")
    for c, reps in result["median_step_us_per_repeat"].items():
        print(f"  {c:<9} per-fit medians (µs): " + ", ".join(f"{x:.0f}" for x in reps))
    la = result["load_average_1min"]
    if la[0] is not None:
        print(f"  1-min load average before/after: {la[0]:.2f} / {la[1]:.2f} on {result['cpu_count']} CPUs "
              "(other processes inflate and scatter the figures)")
    over_mean = result["overhead_mean_us"]
    means = ", ".join(f"{c} {us:.1f}" + (f" ({over_mean[c]:+.1f})" if c in over_mean else "")
                      for c, us in result["mean_step_us"].items())
    print(f"  mean step incl. log steps (µs): {means}")
    paired = result["overhead_us_paired_median"]
    print("  overhead, median of the per-fit differences (µs): "
          + ", ".join(f"{c} {v:+.1f}" for c, v in paired.items()))
    if "ratio_to_lightning" in result:
        per_fit = ", ".join(f"{r:.2f}" for r in result["ratio_to_lightning_per_fit"])
        group, lightning = result["overhead_mean_us"]["on"], result["overhead_mean_us"]["lightning"]
        noise = " (a negative overhead: below the noise of this machine)" if min(group, lightning) <= 0 else ""
        print(f"  mean overhead over all steps (log steps included), group / Lightning's monitors, interleaved "
              f"in the same fits: {group:+.1f} / {lightning:+.1f} µs = {result['ratio_to_lightning']:.2f} "
              f"(per fit: {per_fit}){noise} [{result['evidence']}]")
    if "trace" in result["overhead_mean_us"]:
        over = result["overhead_mean_us"]
        print(f"  step trace: {over['trace'] - over['on']:+.1f} µs per step (mean, trace arm - on arm) against "
              f"{over['on']:+.1f} µs for the rest of the group [{result['evidence']}]")
    print(f"overhead of the grouped callbacks: {result['overhead_us']['on']:+.1f} µs/step "
          f"({100 * result['overhead_ratio']['on']:+.1f} %), {verdict(result)} [{result['evidence']}]")


def verdict(result: dict[str, Any]) -> str:
    """What the grouped callbacks' overhead says against the target.

    A negative overhead (the run with callbacks was faster) is noise, not a result: it reads "below the
    noise of this machine", never a pass or fail.
    """
    over = result["overhead_us"]["on"]
    target = f"{100 * TARGET_RATIO:.0f} %" if "target_ratio" in result else f"{TARGET_US:.0f} µs"
    if over < 0:
        return (f"below the noise of this machine (the steps with the callbacks were the faster ones; "
                f"target {target}: repeat the command, or use --clock cpu)")
    return f"{'within' if result['within_target'] else 'ABOVE'} the {target} target"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m cropscale callback-bench``; returns the exit status.

    Raises:
        OptionError: a bad option (named).
    """
    args = parse_options(CallbackBenchOptions, argv, "python -m cropscale callback-bench",
                         __doc__.split("\n\n")[0])
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CropScaleError("callback-bench: --device cuda, but torch sees no CUDA GPU")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if args.count:
        args.apply()
        result = run_counts(args.steps, args.log_every, features=args.features)
        print_counts(result)
    else:
        result = run_benchmark(args)
        _print(result)
    if args.json:
        atomic_write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
