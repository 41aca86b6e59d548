"""Energy that cannot be measured is never reported as a measured figure (issues 27 and 38): an NVML energy counter
that fails mid-run, a power sampler whose readings fail or are too few (MLPerf's power rules), a MIG instance (NVML
reads the whole physical GPU).

One-process CPU fits of the tiny task with a fake NVML behind ``nvml.open_device_for`` (as in test_fit.py).
"""

from __future__ import annotations

import time

import pytest
from lightning.pytorch import Callback

from cropscale.callbacks import EnergyCallback
from cropscale.env import nvml
from cropscale.runs import rules
from cropscale.runs.schema import RunSummary
from cropscale.testing.toy import ToyTask
from tests.callbacks.test_fit import CountingNvml, make_trainer

pytestmark = [pytest.mark.filterwarnings("ignore:The number of training batches")]


class FailingCounter(CountingNvml):
    """The counter advances 5000 mJ per read and raises from read number ``fail_from`` on (1-based)."""

    def __init__(self, fail_from: int):
        super().__init__()
        self.reads = 0
        self.fail_from = fail_from

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        self.reads += 1
        if self.reads >= self.fail_from:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return super().nvmlDeviceGetTotalEnergyConsumption(h)


class FlakyPower(CountingNvml):
    """No energy counter; power 312.5 W, every reading failing when ``all_fail``, else every second one."""

    def __init__(self, all_fail: bool):
        super().__init__(counter_supported=False)
        self.all_fail = all_fail
        self.n = 0

    def nvmlDeviceGetPowerUsage(self, h):
        self.n += 1
        if self.all_fail or self.n % 2 == 0:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return 312_500


def _open(nv, is_mig=False):
    def open_device_for(device):
        return nvml.NvmlDevice(nv, ("dev", 0), "fake-uuid", is_mig), None

    return open_device_for


class _SlowSteps(Callback):
    """Each training step lasts at least ``seconds`` (a sleep, which leaves the CPU to the power sampler's thread)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def on_train_batch_end(self, *args, **kwargs):
        time.sleep(self.seconds)


def _fit(tmp_path, monkeypatch, nv, is_mig=False, step_s=0.0, **kw):
    monkeypatch.setattr(nvml, "open_device_for", _open(nv, is_mig))
    en = EnergyCallback(**kw)
    make_trainer(tmp_path, [en, _SlowSteps(step_s)], log_every_n_steps=1000).fit(ToyTask())
    return en.summary().to_json()


def test_counter_failing_mid_run_is_no_measured_zero(tmp_path, monkeypatch):
    # reads: probe 1, fit start 2, epoch 0 start 3 / end 4, epoch 1 start 5 (fails), epoch 1 end, fit end
    s = _fit(tmp_path, monkeypatch, FailingCounter(fail_from=5))
    assert s["available"] is False
    assert s.get("total_energy_j") is None and s.get("j_per_sample") is None
    assert [e["energy_j"] for e in s["epochs"]] == [5.0, None]  # epoch 0 measured (reads 3 -> 4), epoch 1 not
    assert s["training"]["energy_j"] is None
    assert "energy counter read failed at the start of epoch 1: RuntimeError: NVML_ERROR_GPU_IS_LOST" in s["reason"]
    assert "epoch 1: no energy from rank(s) [0]" in s["reason"]


def test_counter_that_never_fails_is_measured(tmp_path, monkeypatch):
    s = _fit(tmp_path, monkeypatch, FailingCounter(fail_from=10**9))
    assert s["available"] is True and s.get("reason") is None
    assert s["total_energy_j"] == 10.0  # two epochs of one 5 J step of the counter each


def test_power_sampler_failing_every_reading_is_unavailable(tmp_path, monkeypatch):
    s = _fit(tmp_path, monkeypatch, FlakyPower(all_fail=True), sample_interval_s=0.005)
    assert s["available"] is False and s.get("total_energy_j") is None
    assert all(e["energy_j"] is None for e in s["epochs"])
    assert "nvmlDeviceGetPowerUsage readings failed (first: RuntimeError: NVML_ERROR_UNKNOWN)" in s["reason"]


def test_power_sampler_failures_are_counted_and_named(tmp_path, monkeypatch):
    nv = FlakyPower(all_fail=False)
    s = _fit(tmp_path, monkeypatch, nv, sample_interval_s=0.005)
    assert s["available"] is True
    ep = s["epochs"][0]
    assert ep["energy_j"] == pytest.approx(312.5 * ep["seconds_per_rank"][0], rel=1e-9)  # the readings that worked
    failed, total = nv.n // 2, nv.n
    assert f"power sampler: {failed} of {total} nvmlDeviceGetPowerUsage readings failed" in s["reason"]


def test_mig_instance_energy_is_withheld(tmp_path, monkeypatch):
    nv = FailingCounter(fail_from=10**9)
    s = _fit(tmp_path, monkeypatch, nv, is_mig=True)
    assert s["available"] is False and s.get("total_energy_j") is None and not s.get("epochs")
    assert "MIG instance fake-uuid" in s["reason"] and "whole physical GPU" in s["reason"]
    assert s["devices"][0]["mig_instance"] is True and s["devices"][0]["name"] == "NVIDIA H200"
    assert nv.reads == 0  # the whole GPU's counter is never read for this rank


class CountedPower(CountingNvml):
    """No energy counter; power 312.5 W; every power reading counted."""

    def __init__(self):
        super().__init__(counter_supported=False)
        self.reads = 0

    def nvmlDeviceGetPowerUsage(self, h):
        self.reads += 1
        return super().nvmlDeviceGetPowerUsage(h)


def test_sampled_power_records_its_readings_and_too_few_are_refused(tmp_path, monkeypatch):
    """MLPerf's power rules: a sampled-power figure needs at least 60 readings per run, at least one a second. A
    short fit sampled every 0.5 s has a handful: the run.json records the count and the report refuses the figure."""
    nv = CountedPower()
    s = _fit(tmp_path, monkeypatch, nv, sample_interval_s=0.5)
    assert s["available"] is True and s["method"] == "sampled-power"
    n = s["power_samples"]
    assert 0 <= n <= nv.reads < 60  # readings inside the training window (the sampler starts just before it)
    assert s.get("power_sample_period_s") is None if n < 2 else 0.45 <= s["power_sample_period_s"] <= 1.0
    joules, per_sample = rules.energy(RunSummary.from_json({"energy": s}), 0)
    assert joules.value is None and per_sample.value is None
    assert f"sampled power from only {n} readings in the run (MLPerf's power rules" in joules.why


def test_sampled_power_period_is_measured(tmp_path, monkeypatch):
    nv = CountedPower()
    s = _fit(tmp_path, monkeypatch, nv, sample_interval_s=0.01, step_s=0.05)  # a window of many intervals, any load
    n, period = s["power_samples"], s["power_sample_period_s"]
    assert 2 <= n <= nv.reads and 0.01 <= period < 0.5  # the thread waits the interval between readings
    joules, _ = rules.energy(RunSummary.from_json({"energy": s}), 0)
    assert (joules.value is not None) == (n >= rules.MIN_POWER_SAMPLES)


def test_counter_energy_records_no_readings(tmp_path, monkeypatch):
    s = _fit(tmp_path, monkeypatch, FailingCounter(fail_from=10**9))
    assert "power_samples" not in s and "power_sample_period_s" not in s  # left out while None
