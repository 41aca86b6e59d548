"""Speed-up and efficiency against the device count, from runs of one configuration on 1 and N devices.

Two runs belong to one *device series* when their configurations differ only in the device knobs
(:data:`DEVICE_KNOBS`: devices, nodes, strategy, accumulation, local batch, LR, seed, logger) and they
share either the global batch (``equal-global``, strong scaling: the same optimisation, split over
more devices) or the local batch (``equal-local``, weak scaling: each device keeps its batch). A run
can be in one series of each kind.

Per device count the series takes the median samples/s of its runs (seeds), then

- speed-up ``S_N = samples/s on N / samples/s on 1`` (training samples/s, :func:`~cropscale.runs.rules.samples_per_s`;
  :func:`cropscale.numbers.speedup`, the study's definition too),
- efficiency ``E_N = S_N / N``,
- Karp-Flatt serial fraction ``e_N`` (:func:`~cropscale.scaling.amdahl.karp_flatt`, N > 1),
- the serial fraction fitted to all ``N > 1`` points (:func:`~cropscale.scaling.amdahl.fit_serial_fraction`).

Speed-up, efficiency and ``e_N`` are ``measured-run`` (identities of measurements on the device counts they
name); the fitted fraction (a parameter of Amdahl's law) and the Amdahl curve drawn from it are
``analytical-scenario`` (the rule of :mod:`cropscale.evidence`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from cropscale.evidence import MEASURED_RUN
from cropscale.numbers import median, speedup
from cropscale.runs.record import RunRecord, flatten_config
from cropscale.runs.rules import Figure
from cropscale.scaling.amdahl import fit_serial_fraction, karp_flatt

DEVICE_KNOBS = (
    "trainer.devices", "trainer.num_nodes", "trainer.strategy", "trainer.accumulate_grad_batches",
    "data.batch_size", "model.lr", "seed_everything", "trainer.logger", "trainer.default_root_dir",
    "trainer.enable_progress_bar", "trainer.enable_model_summary", "ckpt_path", "config", "trainer.precision",
    "trainer.accelerator",
)
"""Configuration keys that may differ within a device series (precision and accelerator are keyed from what
``run.json`` recorded: ``auto`` and ``cpu`` are the same accelerator on a machine without a GPU)."""


@dataclass
class DevicePoint:
    """One device count of a series: its runs, median samples/s and the figures against 1 device."""

    devices: int
    runs: list[str]
    samples_per_s: float
    speedup_vs_1_device: float | None = None
    efficiency: float | None = None
    karp_flatt: float | None = None


@dataclass
class DeviceSeries:
    """Runs of one configuration on several device counts (a 1-device base included)."""

    protocol: str
    batch: int
    precision: str
    points: list[DevicePoint] = field(default_factory=list)
    serial_fraction: float | None = None
    evidence: str = MEASURED_RUN

    @property
    def label(self) -> str:
        """E.g. ``FP32, equal-global batch 8``."""
        kind = "global" if self.protocol == "equal-global" else "local"
        return f"{self.precision}, {self.protocol} ({kind} batch {self.batch})"


def series_key(record: RunRecord) -> str | None:
    """What the runs of a device series share: the configuration without :data:`DEVICE_KNOBS`, precision, accelerator.

    None for a record without configuration or without a device count (benchmark rows included).
    """
    if record.kind != "run" or not record.config or record.devices is None:
        return None
    flat = {k: v for k, v in flatten_config(record.config, split_lists=False).items()
            if not k.startswith(DEVICE_KNOBS)}
    ran_on = (record.run_json.distributed.get("accelerator") if record.run_json is not None else None) \
        or (record.config.get("trainer") or {}).get("accelerator")
    return json.dumps({"precision": record.precision, "accelerator": ran_on, "config": flat}, sort_keys=True,
                      default=str)


def _local_batch(record: RunRecord) -> int | None:
    value = (record.config or {}).get("data", {}).get("batch_size")
    return value if isinstance(value, int) else None


def _usable(record: RunRecord) -> bool:
    diverged = record.divergence is not None and record.divergence.diverged
    return record.value("samples_per_s") is not None and record.status in (None, "finished") and not diverged


def device_series(records: Sequence[RunRecord]) -> list[DeviceSeries]:
    """The device series among ``records`` that hold a 1-device run and at least one other device count.

    Runs that failed, diverged or have no samples/s take no part.
    """
    groups: dict[tuple[str, str, int], list[RunRecord]] = {}
    for r in records:
        key = series_key(r)
        if key is None or not _usable(r):
            continue
        for protocol, batch in (("equal-global", r.global_batch), ("equal-local", _local_batch(r))):
            if batch is not None:
                groups.setdefault((key, protocol, batch), []).append(r)
    out: list[DeviceSeries] = []
    seen: list[set[str]] = []
    for (_, protocol, batch), runs in sorted(groups.items(), key=lambda kv: kv[0][1]):  # equal-global first
        by_n: dict[int, list[RunRecord]] = {}
        for r in runs:
            by_n.setdefault(int(r.devices), []).append(r)
        names = {r.name for r in runs}
        if 1 not in by_n or len(by_n) < 2 or names in seen:
            continue  # no base, one device count, or the same runs as a series already kept
        seen.append(names)
        points = [DevicePoint(n, [r.name for r in rs], median(r.value("samples_per_s") for r in rs))
                  for n, rs in sorted(by_n.items())]
        base = points[0].samples_per_s
        for p in points:
            p.speedup_vs_1_device = speedup(p.samples_per_s, base)
            p.efficiency = p.speedup_vs_1_device / p.devices
            p.karp_flatt = karp_flatt(p.speedup_vs_1_device, p.devices) if p.devices > 1 else None
        multi = [p for p in points if p.devices > 1]
        fraction = fit_serial_fraction([p.devices for p in multi], [p.speedup_vs_1_device for p in multi])
        out.append(DeviceSeries(protocol, batch, runs[0].precision_label, points, fraction))
    return sorted(out, key=lambda s: (s.precision, s.protocol, s.batch))


def efficiency_of(record: RunRecord, series: Sequence[DeviceSeries]) -> Figure:
    """The record's parallel efficiency in its device series (equal-global first), n/a with the reason."""
    for protocol in ("equal-global", "equal-local"):
        for s in series:
            if s.protocol != protocol:
                continue
            for p in s.points:
                if record.name in p.runs:
                    if p.devices == 1:
                        return Figure(1.0, note="1 device: the base of its device series")
                    return Figure(p.efficiency, note=f"speed-up {p.speedup_vs_1_device:.2f}x over 1 device /"
                                                     f" {p.devices} devices ({s.protocol}, median of {len(p.runs)}"
                                                     " run(s))")
    return Figure(None, why="no run of the same configuration on another device count among the inputs")
