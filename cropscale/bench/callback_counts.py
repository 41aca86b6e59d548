"""``callback-bench --count``: what the scaling callbacks cost per step, counted instead of timed.

One fit of the tiny model (:class:`~cropscale.testing.toy.ToyTask`) with the default group
(``configs/default.yaml``'s :class:`~cropscale.callbacks.CallbackGroup`) and Lightning's monitors side by
side; :class:`~cropscale.bench.counts.HookCostCounter` counts per callback Python calls, C calls, torch ops and
device-to-host reads, and :class:`StepCounts` cuts the totals into ordinary and log steps
(``docs/measuring.md``, "Cost of the callbacks"). Evidence ``count``.

Two references: Lightning's three monitors as a CPU run has them (:data:`LIGHTNING_ARM`; ``DeviceStatsMonitor``
reads CPU stats through ``psutil`` when it is installed, about 770 C calls a log step), and the same three with
``DeviceStatsMonitor(cpu_stats=False)`` (:data:`LIGHTNING_NO_CPU_ARM`, in the same fit: what a run without
``psutil`` has, and the smaller of the two).
"""

from __future__ import annotations

import importlib
import importlib.util
import statistics
import tempfile
from pathlib import Path
from typing import Any

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
from cropscale.callbacks import CallbackGroup
from cropscale.errors import CropScaleError
from cropscale.evidence import COUNT
from cropscale.files import DEFAULT_CONFIG
from cropscale.testing.toy import ToyTask, toy_batches

__all__ = ["DEVICE_STATS", "LIGHTNING_ARM", "LIGHTNING_NO_CPU_ARM", "StepCounts", "count_fit", "default_group",
           "lightning_monitors", "print_counts", "run_counts"]

_PSUTIL = importlib.util.find_spec("psutil") is not None
DEVICE_STATS = ("DeviceStatsMonitor with CPU stats (psutil)" if _PSUTIL
                else "DeviceStatsMonitor(cpu_stats=False): no psutil")
_CALLBACK_PACKAGES = (cropscale_callbacks, lightning_callbacks)  # frames of their modules can open a region


LIGHTNING_ARM = "Lightning monitors"
"""The reference arm: Lightning's ``ThroughputMonitor`` + ``LearningRateMonitor`` + ``DeviceStatsMonitor``."""

LIGHTNING_NO_CPU_ARM = "Lightning monitors, no CPU stats"
"""The smaller reference: the same three with ``DeviceStatsMonitor(cpu_stats=False)`` (no ``psutil`` reads)."""


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
    "members": {...}}``: per arm (the group, with its members; Lightning's monitors; the same with
    ``DeviceStatsMonitor(cpu_stats=False)``, :data:`LIGHTNING_NO_CPU_ARM`) and per kind of step, the mean of
    each :data:`~cropscale.bench.counts.FIGURES` per step and the largest torch ops and reads seen on one step.
    """
    group, monitors = default_group(), lightning_monitors()
    no_cpu = DeviceStatsMonitor(cpu_stats=False) if _PSUTIL else monitors[-1]  # without psutil: the same one
    owners = {id(group): "CallbackGroup"}
    owners.update({id(cb): type(cb).__name__ for cb in group.callbacks})
    owners.update({id(cb): type(cb).__name__ for cb in monitors})
    owners.setdefault(id(no_cpu), "DeviceStatsMonitor(cpu_stats=False)")
    files = {str(f) for pkg in _CALLBACK_PACKAGES for f in Path(pkg.__file__).parent.glob("*.py")}
    counter = HookCostCounter(owners, files, transparent={id(group)})
    cut = StepCounts(counter, skip=log_every if steps >= 3 * log_every else 0)  # the first interval: set-up
    plugins, prec = [], precision
    if precision == "16-mixed":
        plugins, prec = [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))], None
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=steps, max_epochs=1, precision=prec, plugins=plugins,
        callbacks=[group, *monitors, *([no_cpu] if no_cpu not in monitors else []), cut],
        logger=TensorBoardLogger(root, name=f"count-{precision}"),
        log_every_n_steps=log_every, gradient_clip_val=1.0, gradient_clip_algorithm="norm",
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        default_root_dir=root,
    )
    loader = torch.utils.data.DataLoader(toy_batches(steps + 1, 1, features), batch_size=None)
    with counter:
        trainer.fit(ToyTask(features=features), train_dataloaders=loader)
    arms = {"CallbackGroup": ["CallbackGroup", *(type(cb).__name__ for cb in group.callbacks)],
            LIGHTNING_ARM: [type(cb).__name__ for cb in monitors],
            LIGHTNING_NO_CPU_ARM: [owners[id(cb)] for cb in (*monitors[:-1], no_cpu)]}
    shown = {"CallbackGroup": arms["CallbackGroup"], LIGHTNING_ARM: arms[LIGHTNING_ARM],  # members printed once
             LIGHTNING_NO_CPU_ARM: [n for n in arms[LIGHTNING_NO_CPU_ARM] if n not in arms[LIGHTNING_ARM]]}
    return {"precision": precision, "steps": {k: len(v) for k, v in cut.steps.items()},
            "arms": {arm: _kinds(cut.steps, names) for arm, names in arms.items()},
            "members": {arm: {n: _kinds(cut.steps, [n]) for n in names} for arm, names in shown.items()}}


def _kinds(steps: dict[str, list[dict[str, tuple[int, ...]]]], names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, rows in steps.items():
        per_step = [[sum(r[n][i] for n in names) for i in range(len(FIGURES))] for r in rows]
        out[kind] = {f: (statistics.fmean(s[i] for s in per_step) if per_step else None)
                     for i, f in enumerate(FIGURES)}
        out[kind]["max_torch_ops"] = max((s[2] for s in per_step), default=None)
        out[kind]["max_reads"] = max((s[3] for s in per_step), default=None)
    return out


def run_counts(steps: int, log_every: int, features: int = 16) -> dict[str, Any]:
    """``--count``: :func:`count_fit` under 32-true and 16-mixed with a GradScaler (``steps`` optimizer steps each)."""
    with tempfile.TemporaryDirectory(prefix="cropscale-callback-count-") as root:
        fits = [count_fit(p, steps, log_every, root, features=features) for p in ("32-true", "16-mixed")]
    return {"evidence": COUNT, "model": f"nn.Linear({features}, 1), batch 1, gradient norm clipped to 1.0",
            "log_every_n_steps": log_every, "device_stats": DEVICE_STATS, "fits": fits}


def print_counts(result: dict[str, Any]) -> None:
    """Print :func:`run_counts`'s figures, one line per fit, callback and kind of step.

    Then, per fit, the log step's Python + C calls of the group against both references.
    """
    print(f"callback-bench --count ({result['evidence']}): {result['model']}, "
          f"log_every_n_steps={result['log_every_n_steps']}, {result['device_stats']}; per step, mean "
          "(max torch ops / reads on one step)")
    head = f"{'precision':<9} {'callback':<36} {'step':<8} {'Python calls':>12} {'C calls':>8} {'torch ops':>9} " \
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
                    print(f"{fit['precision']:<9} {name:<36} {kind:<8} {k['python_calls']:>12.1f} "
                          f"{k['c_calls']:>8.1f} {k['torch_ops']:>9.2f} {k['reads']:>6.2f} "
                          f"{k['max_torch_ops']:>7d} {k['max_reads']:>9d}")
        print(f"  {fit['precision']}: {fit['steps']['ordinary']} ordinary and {fit['steps']['log']} log steps counted")
        calls = {arm: k["log"]["python_calls"] + k["log"]["c_calls"] for arm, k in fit["arms"].items()
                 if k["log"]["python_calls"] is not None}
        if len(calls) == len(fit["arms"]):
            print(f"  {fit['precision']}: log step, Python + C calls: CallbackGroup {calls['CallbackGroup']:,.0f}; "
                  f"{LIGHTNING_ARM} {calls[LIGHTNING_ARM]:,.0f}; {LIGHTNING_NO_CPU_ARM} "
                  f"{calls[LIGHTNING_NO_CPU_ARM]:,.0f}")
