"""Figures combined over ranks and their units, against hand-worked numbers (issue 27).

The energy of an epoch over ranks: sum of the ranks' joules; its average power: that sum over the slowest
rank's seconds (the ranks run at the same time), not over the sum of the seconds. A one-process CPU fit with
a fake NVML; the epoch-end gather hands the callback this rank's row and a second rank's row made by hand.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import pytest

from cropscale.callbacks import EnergyCallback
from cropscale.callbacks import energy as energy_module
from cropscale.callbacks.memory import host_peak_rss_gib
from cropscale.env import nvml
from cropscale.testing.toy import ToyTask
from tests.callbacks.test_fit import CountingNvml, make_trainer

pytestmark = [pytest.mark.filterwarnings("ignore:The number of training batches")]

OTHER_RANK = [40.0, 4.0, 16.0]  # rank 1: 40 J over 4 s, 16 samples


def test_epoch_energy_over_ranks_is_sum_of_joules_over_max_seconds(tmp_path, monkeypatch):
    nv = CountingNvml()
    monkeypatch.setattr(nvml, "open_device_for", lambda device: (nvml.NvmlDevice(nv, ("dev", 0), "u0"), None))
    real = energy_module.gather_vectors

    def two_ranks(trainer, pl_module, values):
        mine = real(trainer, pl_module, values)[0]
        return [mine, OTHER_RANK[:len(values)]]

    monkeypatch.setattr(energy_module, "gather_vectors", two_ranks)
    en = EnergyCallback()
    make_trainer(tmp_path, [en], max_epochs=1, log_every_n_steps=1000).fit(ToyTask())
    ep = en.summary().to_json()["epochs"][0]
    s0 = ep["seconds_per_rank"][0]
    assert s0 < 4.0  # the premise: rank 1 (4 s) is the slowest of a sub-second toy epoch
    # rank 0: 5 J (one 5000 mJ step of the fake counter per read), 16 samples
    assert ep["energy_j_per_rank"] == [5.0, 40.0] and ep["energy_j"] == 45.0
    assert ep["avg_power_w"] == pytest.approx(45.0 / 4.0)  # not 45 / (s0 + 4)
    assert ep["avg_power_w_per_rank"] == [pytest.approx(5.0 / s0), pytest.approx(10.0)]
    assert ep["samples"] == 32 and ep["j_per_sample"] == pytest.approx(45.0 / 32)
    assert ep["gpu_hours"] == pytest.approx((s0 + 4.0) / 3600)  # GPU-hours do add over ranks


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux /proc/self/status (VmHWM)")
def test_host_peak_rss_matches_the_kernels_high_water_mark():
    _ = bytearray(64 * 2**20)  # a 64 MiB allocation, so that the peak is well above interpreter start-up
    vm_hwm_kib = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                      if line.startswith("VmHWM:"))
    assert sys.platform != "darwin" and resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0
    assert host_peak_rss_gib() == pytest.approx(vm_hwm_kib / 2**20, rel=0.02)  # kB -> GiB
