"""NVML energy of a benchmark configuration's measured steps (:mod:`cropscale.bench.step.command`).

The GPU's total-energy counter (matched by UUID, :mod:`cropscale.env.nvml`) read just before the first
measured step and just after the last one (both synchronised): J, J/sample, W over the window (s).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from cropscale.env import nvml

__all__ = ["energy_end", "energy_start"]


def energy_start(device: torch.device, row: dict[str, Any]) -> tuple[nvml.NvmlDevice, float, float] | None:
    """``(NVML device, counter J, perf_counter s)`` now, or ``None`` with ``energy_reason`` set in ``row``."""
    dev, why = nvml.open_device_for(device)
    ok, why = dev.has_energy_counter() if dev is not None else (False, why)
    if not ok:
        row["energy_reason"] = why
        return None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return dev, dev.energy_j(), time.perf_counter()


def energy_end(start: tuple[nvml.NvmlDevice, float, float] | None, row: dict[str, Any], samples: int) -> None:
    """Energy of the measured steps from the counter readings around them: J, J/sample, W, window (s)."""
    if start is None:
        return
    dev, e0, t0 = start
    joules = nvml.counter_delta_j(e0, dev.energy_j())
    seconds = time.perf_counter() - t0
    if joules is None:
        row["energy_reason"] = "the NVML energy counter went backwards (driver reload)"
        return
    row.update(energy_j=joules, energy_window_s=seconds, energy_method="nvml-counter",
               energy_j_per_sample=joules / samples if samples else None,
               avg_power_w=joules / seconds if seconds > 0 else None)
    if seconds < 1.0:
        row["energy_reason"] = (f"window {seconds:.3f} s: under a second the counter's update interval makes "
                                "the energy coarse")


