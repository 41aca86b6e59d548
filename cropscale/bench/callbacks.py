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
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import math
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch.callbacks as lightning_callbacks
import torch
import yaml
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import DeviceStatsMonitor, LearningRateMonitor, ThroughputMonitor
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins import MixedPrecision
from typing_extensions import override

import cropscale.callbacks as cropscale_callbacks
from cropscale.bench.counts import FIGURES, HookCostCounter
from cropscale.callbacks import CallbackGroup, StepTimingCallback, all_scaling_callbacks
from cropscale.commands import CropSize, JsonOut, OptionError, SampleShape, Threads, Warmup, parse_options
from cropscale.errors import CropScaleError
from cropscale.evidence import COUNT, MEASURED_MICROBENCHMARK
from cropscale.files import atomic_write_json
from cropscale.progress import Progress
from cropscale.testing.probe import ProbeTask, SyntheticSamples
from cropscale.testing.toy import ToyTask, toy_batches

TARGET_US = 100.0
TARGET_RATIO = 0.02  # --model network: at most 2 % of the study model's step
_DEFAULTS = {"steps": (1000, 30), "warmup": (100, 5), "log_every": (50, 10), "block": (20, 5)}  # (linear, network)
SETTLE_STEPS = 2
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"
_PSUTIL = importlib.util.find_spec("psutil") is not None
DEVICE_STATS = ("DeviceStatsMonitor with CPU stats (psutil)" if _PSUTIL
                else "DeviceStatsMonitor(cpu_stats=False): no psutil")
_CALLBACK_PACKAGES = (cropscale_callbacks, lightning_callbacks)  # frames of their modules can open a region
"""Steps at the start of each block left out: the first steps after a swap run on cold caches."""


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
"""``--clock``: wall time, or the CPU time of the process (all threads), in s."""


class Interleaver(Callback):
    """Alternates two sets of callbacks in blocks of optimizer steps within one fit and times every step.

    Put it last in the trainer's callbacks, after every callback of ``arms``. Until ``warmup`` steps have
    run, all of them are active; then the trainer's callback list goes round the arms, ``arms[0]``,
    ``arms[1]``, ... (plus this callback), ``block`` steps each, starting with ``arms[0]``; after ``last_step``
    every callback is active again, for the epoch-end and fit-end hooks. With the callback list it swaps
    the trainer's profiler: for an arm without callbacks the one the trainer had when :meth:`bind` was
    called (before a callback such as :class:`~cropscale.callbacks.StepTimingCallback` wrapped it), for the
    other the one found at ``on_train_start``.

    Args:
        arms: two or more ``(name, callbacks)`` pairs; the callbacks must be in the trainer too.
        block: optimizer steps per block (>= ``SETTLE_STEPS + 1``).
        warmup: optimizer steps before the first block.
        last_step: optimizer steps of the fit; later steps (none) are not timed.
        clock: a function returning seconds (``time.perf_counter`` or ``time.process_time``).

    ``periods[name]``: the measured step periods of each arm (s), i.e. the time between this callback's
    consecutive ``on_train_batch_end`` calls, leaving out the first :data:`SETTLE_STEPS` steps of each
    block.
    """

    def __init__(self, arms: list[tuple[str, list[Callback]]], block: int, warmup: int, last_step: int,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if len(arms) < 2 or block <= SETTLE_STEPS:
            raise CropScaleError(f"Interleaver: two arms or more and block > {SETTLE_STEPS} steps")
        self.arms = arms
        self.block, self.warmup, self.last_step = block, warmup, last_step
        self._now = clock
        self.periods: dict[str, list[float]] = {name: [] for name, _ in arms}
        self._steps = 0
        self._last: float | None = None
        self._arm: int | None = None  # index into arms; None during warm-up
        self._in_block = 0
        self._lists: list[list[Callback]] = []
        self._profilers: list[Any] = []
        self._all: list[Callback] = []
        self._profiler_off: Any = None
        self._profiler_on: Any = None

    def bind(self, trainer: Trainer) -> None:
        """Remember ``trainer``'s profiler before ``fit`` (before a callback wraps it)."""
        self._profiler_off = trainer.profiler

    @override
    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        self._all = list(trainer.callbacks)
        self._profiler_on = trainer.profiler
        if self._profiler_off is None:
            self._profiler_off = self._profiler_on
        in_arms = {id(cb) for _, cbs in self.arms for cb in cbs}
        for _, cbs in self.arms:
            mine = {id(cb) for cb in cbs}
            # the arm's callbacks, this callback and any the trainer added itself, in the trainer's order
            self._lists.append([cb for cb in self._all if id(cb) in mine or id(cb) not in in_arms])
            self._profilers.append(self._profiler_on if cbs else self._profiler_off)

    @override
    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        now = self._now()
        self._steps += 1
        if self._arm is not None and self._last is not None and self._in_block > SETTLE_STEPS:
            self.periods[self.arms[self._arm][0]].append(now - self._last)
        if self._steps >= self.last_step:
            trainer.callbacks, trainer.profiler = self._all, self._profiler_on
        elif self._steps >= self.warmup and (self._arm is None or self._in_block >= self.block):
            self._arm = 0 if self._arm is None else (self._arm + 1) % len(self.arms)
            self._in_block = 0
            trainer.callbacks, trainer.profiler = self._lists[self._arm], self._profilers[self._arm]
        self._in_block += 1
        self._last = self._now()  # the swap is in no period


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
    torch.set_num_threads(args.threads)
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


# ----------------------------------------------------------------------------- --count


LIGHTNING_ARM = "Lightning monitors"
"""The reference arm: Lightning's ``ThroughputMonitor`` + ``LearningRateMonitor`` + ``DeviceStatsMonitor``."""


def lightning_monitors() -> list[Callback]:
    """Lightning's own monitors, the reference for the group's cost.

    On a CPU run ``DeviceStatsMonitor`` logs CPU stats through ``psutil``; without ``psutil`` it is built with
    ``cpu_stats=False`` and logs nothing there (a cheaper reference: :data:`DEVICE_STATS` says which).
    """
    return [ThroughputMonitor(batch_size_fn=lambda b: int(b["s2"].shape[0])),
            LearningRateMonitor(logging_interval="step"), DeviceStatsMonitor(cpu_stats=None if _PSUTIL else False)]


def default_group() -> CallbackGroup:
    """The scaling callbacks as ``configs/default.yaml`` installs them (its ``CallbackGroup`` entry)."""
    config = yaml.safe_load(DEFAULT_CONFIG.read_text(encoding="utf-8"))
    for entry in config["trainer"]["callbacks"]:
        if entry["class_path"] == "cropscale.callbacks.CallbackGroup":
            members = [_instantiate(m) for m in entry["init_args"]["callbacks"]]
            return CallbackGroup(members)
    raise CropScaleError(f"callback-bench --count: no CallbackGroup in {DEFAULT_CONFIG}")


def _instantiate(entry: dict[str, Any]) -> Any:
    module, _, name = entry["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(**(entry.get("init_args") or {}))


class StepCounts(Callback):
    """Last callback of the counting fit: cuts the counter's totals into optimizer steps.

    At each ``on_train_batch_end`` after an optimizer step, the totals since the previous one become one
    step's counts, filed as a *log step* when ``global_step % log_every_n_steps == 0`` (Lightning's own rule,
    ``should_update_logs``), else an *ordinary step*. The first ``skip`` steps (one-off set-up) are left out.
    """

    def __init__(self, counter: HookCostCounter, skip: int) -> None:
        self.counter, self.skip = counter, skip
        self.steps: dict[str, list[dict[str, tuple[int, ...]]]] = {"ordinary": [], "log": []}
        self._last = counter.snapshot()
        self._seen = 0

    @override
    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        owner = getattr(trainer.profiler, "_owner", None)  # StepTimingCallback's profiler wrapper
        if owner is not None and id(owner) in self.counter.owners:
            self.counter.owners[id(trainer.profiler)] = self.counter.owners[id(owner)]
        self._last = self.counter.snapshot()

    @override
    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        if trainer.global_step == self._seen:  # accumulating: no optimizer step yet
            return
        self._seen = trainer.global_step
        now = self.counter.snapshot()
        delta = {k: tuple(a - b for a, b in zip(now[k], self._last[k], strict=True)) for k in now}
        self._last = now
        if self._seen > self.skip:
            every = trainer.log_every_n_steps
            self.steps["log" if every and self._seen % every == 0 else "ordinary"].append(delta)


def count_fit(precision: str, steps: int, log_every: int, root: str, features: int = 16) -> dict[str, Any]:
    """One fit of the tiny model with the group and Lightning's monitors side by side, counted per step.

    ``precision``: ``"32-true"``, or ``"16-mixed"`` (CPU autocast to FP16 with a real
    ``torch.amp.GradScaler("cpu")``, ``trainer.plugins``). Gradient norm clipped to 1.0 (as
    ``configs/default.yaml``). Returns ``{"arms": {arm: {kind: {figure: mean}, "max_...": ...}},
    "members": {...}}``: per arm (the group, with its members, and Lightning's monitors) and per kind of
    step, the mean of each :data:`~cropscale.bench.counts.FIGURES` per step and the largest torch ops and
    reads seen on one step.
    """
    group, monitors = default_group(), lightning_monitors()
    owners = {id(group): "CallbackGroup"}
    owners.update({id(cb): type(cb).__name__ for cb in group.callbacks})
    owners.update({id(cb): type(cb).__name__ for cb in monitors})
    files = {str(f) for pkg in _CALLBACK_PACKAGES for f in Path(pkg.__file__).parent.glob("*.py")}
    counter = HookCostCounter(owners, files, transparent={id(group)})
    cut = StepCounts(counter, skip=log_every if steps >= 3 * log_every else 0)  # the first interval: set-up
    plugins, prec = [], precision
    if precision == "16-mixed":
        plugins, prec = [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))], None
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=steps, max_epochs=1, precision=prec, plugins=plugins,
        callbacks=[group, *monitors, cut], logger=TensorBoardLogger(root, name=f"count-{precision}"),
        log_every_n_steps=log_every, gradient_clip_val=1.0, gradient_clip_algorithm="norm",
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        default_root_dir=root,
    )
    loader = torch.utils.data.DataLoader(toy_batches(steps + 1, 1, features), batch_size=None)
    with counter:
        trainer.fit(ToyTask(features=features), train_dataloaders=loader)
    arms = {"CallbackGroup": ["CallbackGroup", *(type(cb).__name__ for cb in group.callbacks)],
            LIGHTNING_ARM: [type(cb).__name__ for cb in monitors]}
    return {"precision": precision, "steps": {k: len(v) for k, v in cut.steps.items()},
            "arms": {arm: _kinds(cut.steps, names) for arm, names in arms.items()},
            "members": {arm: {n: _kinds(cut.steps, [n]) for n in names} for arm, names in arms.items()}}


def _kinds(steps: dict[str, list[dict[str, tuple[int, ...]]]], names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, rows in steps.items():
        per_step = [[sum(r[n][i] for n in names) for i in range(len(FIGURES))] for r in rows]
        out[kind] = {f: (statistics.fmean(s[i] for s in per_step) if per_step else None)
                     for i, f in enumerate(FIGURES)}
        out[kind]["max_torch_ops"] = max((s[2] for s in per_step), default=None)
        out[kind]["max_reads"] = max((s[3] for s in per_step), default=None)
    return out


def run_counts(args: CallbackBenchOptions) -> dict[str, Any]:
    """``--count``: :func:`count_fit` under 32-true and 16-mixed with a GradScaler."""
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="cropscale-callback-count-") as root:
        fits = [count_fit(p, args.steps, args.log_every, root, features=args.features)
                for p in ("32-true", "16-mixed")]
    return {"evidence": COUNT, "model": f"nn.Linear({args.features}, 1), batch 1, gradient norm clipped to 1.0",
            "log_every_n_steps": args.log_every, "device_stats": DEVICE_STATS, "fits": fits}


def _print_counts(result: dict[str, Any]) -> None:
    print(f"callback-bench --count ({result['evidence']}): {result['model']}, "
          f"log_every_n_steps={result['log_every_n_steps']}, {result['device_stats']}; per step, mean "
          "(max torch ops / reads on one step)")
    head = f"{'precision':<9} {'callback':<28} {'step':<8} {'Python calls':>12} {'C calls':>8} {'torch ops':>9} " \
           f"{'reads':>6} {'max ops':>7} {'max reads':>9}"
    print(head)
    for fit in result["fits"]:
        for arm, members in fit["members"].items():
            rows = [*members.items(), (f"= {arm}", fit["arms"][arm])]
            for name, kinds in rows:
                for kind in ("ordinary", "log"):
                    k = kinds[kind]
                    if k["python_calls"] is None:
                        continue
                    print(f"{fit['precision']:<9} {name:<28} {kind:<8} {k['python_calls']:>12.1f} "
                          f"{k['c_calls']:>8.1f} {k['torch_ops']:>9.2f} {k['reads']:>6.2f} "
                          f"{k['max_torch_ops']:>7d} {k['max_reads']:>9d}")
        print(f"  {fit['precision']}: {fit['steps']['ordinary']} ordinary and {fit['steps']['log']} log steps counted")


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
        result = run_counts(args)
        _print_counts(result)
    else:
        result = run_benchmark(args)
        _print(result)
    if args.json:
        atomic_write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
