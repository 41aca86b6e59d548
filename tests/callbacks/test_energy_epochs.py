"""EnergyCallback's figures per epoch, per log step and per run with two ranks that disagree, worked out by hand.

The hooks are driven by hand: a fake NVML whose energy counter returns the test's own readings (J), a fake host
clock, and gathers that hand back a second rank's row made by hand. The epochs differ (energy, time, samples),
the ranks differ (rank 1 uses more energy over more seconds), so sum / mean / max / rank 0 tell apart. Fits with
a fake NVML: test_fit.py, test_energy_failures.py, test_rank_arithmetic.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cropscale.callbacks import EnergyCallback
from cropscale.callbacks import energy as energy_module
from cropscale.env import nvml
from cropscale.errors import CropScaleError
from tests.callbacks.test_grad_norm_fused import ListLogger

# rank 1's rows per epoch: [joules, seconds, samples]; the fit window: [joules, seconds, power readings, their mean
# period] (the readings are None for an energy counter)
RANK1 = {0: [300.0, 12.0, 6.0], 1: [90.0, 1.5, 6.0], "fit": [400.0, 16.0, None, None]}


class ScriptedNvml:
    """The energy counter reads the next value of ``readings`` (J, cumulative); 250 W; an H200's name."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def __init__(self, readings):
        self.readings = list(readings)
        self.reads = 0

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        value = self.readings[min(self.reads, len(self.readings) - 1)]
        self.reads += 1
        return value * 1e3  # mJ

    def nvmlDeviceGetPowerUsage(self, h):
        return 250_000

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t


def _setup(monkeypatch, readings, world_size=2, other=RANK1, **kwargs):
    nv, clock = ScriptedNvml(readings), Clock()
    monkeypatch.setattr(nvml, "open_device_for", lambda device: (nvml.NvmlDevice(nv, ("dev", 0), "u0"), None))
    monkeypatch.setattr(energy_module, "time", clock)
    sent = []

    def gather_vectors(trainer, pl_module, values):
        sent.append(list(values))
        if world_size == 1:
            return [list(values)]
        key = "fit" if len(values) == 4 else trainer.current_epoch
        return [list(values), other[key]]

    def gather_objects(trainer, obj):
        return [obj] if world_size == 1 else [obj, {"rank": 1, "available": True, "name": "NVIDIA H200"}]

    monkeypatch.setattr(energy_module, "gather_vectors", gather_vectors)
    monkeypatch.setattr(energy_module, "gather_objects", gather_objects)
    trainer = SimpleNamespace(global_rank=0, world_size=world_size, log_every_n_steps=2, global_step=0,
                              current_epoch=0, loggers=[ListLogger()])
    module = SimpleNamespace(device=torch.device("cpu"))
    cb = EnergyCallback(**kwargs)
    return cb, trainer, module, clock, nv, sent


def _step(cb, trainer, module, clock, seconds, samples):
    clock.t += seconds
    cb.on_before_optimizer_step(trainer, module, None)
    trainer.global_step += 1
    cb.on_train_batch_end(trainer, module, None, {"s2": torch.zeros(samples, 1)}, 0)


# counter readings in the order the callback reads them (J): the probe, the fit start, epoch 0 start,
# the log steps 2 and 4, epoch 0 end, epoch 1 start, the log step 6, epoch 1 end, the fit end
READINGS = [0.0, 10.0, 20.0, 60.0, 140.0, 170.0, 180.0, 200.0, 215.0, 230.0]


def _two_epochs(cb, trainer, module, clock):
    cb.on_train_start(trainer, module)  # t = 0
    clock.t = 1.0
    cb.on_train_epoch_start(trainer, module)
    for seconds in (1.0, 1.0, 2.0, 2.0):  # steps end at 2, 3, 5, 7; log steps 2 (t 3) and 4 (t 7)
        _step(cb, trainer, module, clock, seconds, 2)
    clock.t = 9.0
    cb.on_train_epoch_end(trainer, module)  # epoch 0: 170 - 20 = 150 J over 8 s, 8 samples
    trainer.current_epoch, clock.t = 1, 10.0
    cb.on_train_epoch_start(trainer, module)
    for _ in range(2):  # steps end at 10.5, 11.0; log step 6 at t 11
        _step(cb, trainer, module, clock, 0.5, 3)
    clock.t = 12.0
    cb.on_train_epoch_end(trainer, module)  # epoch 1: 215 - 180 = 35 J over 2 s, 6 samples
    clock.t = 13.0
    cb.on_train_end(trainer, module)  # the fit: 230 - 10 = 220 J over 13 s


def test_epoch_energy_summed_over_ranks_power_over_the_longest_rank(monkeypatch):
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, READINGS, price_per_gpu_hour=3.6, currency="EUR")
    _two_epochs(cb, trainer, module, clock)
    assert sent == [[150.0, 8.0, 8.0], [35.0, 2.0, 6.0], [220.0, 13.0, None, None]]
    e0, e1 = cb.epochs
    assert (e0.epoch, e0.energy_j, e0.energy_j_per_rank, e0.seconds_per_rank) == (0, 450.0, [150.0, 300.0],
                                                                                 [8.0, 12.0])
    assert e0.avg_power_w == pytest.approx(450.0 / 12.0)  # the ranks run at the same time: over the longest
    assert e0.avg_power_w_per_rank == [pytest.approx(150.0 / 8.0), pytest.approx(25.0)]
    assert (e0.samples, e0.j_per_sample) == (14, pytest.approx(450.0 / 14))
    assert e0.gpu_hours == pytest.approx(20.0 / 3600) and e0.cost == pytest.approx(3.6 * 20.0 / 3600)
    # epoch 1: rank 0 is now the longest (2 s against 1.5 s) and every figure changes
    assert (e1.energy_j, e1.avg_power_w, e1.samples) == (125.0, pytest.approx(125.0 / 2.0), 12)
    assert e1.gpu_hours == pytest.approx(3.5 / 3600)
    s = cb.summary()
    assert (s.available, s.method, s.reason) == (True, "counter", None)
    assert (s.total_energy_j, s.total_samples) == (575.0, 26) and s.j_per_sample == pytest.approx(575.0 / 26)
    assert s.total_gpu_hours == pytest.approx(23.5 / 3600) and s.total_cost == pytest.approx(3.6 * 23.5 / 3600)
    assert (s.price_per_gpu_hour, s.currency) == (3.6, "EUR")
    assert (s.training.energy_j, s.training.energy_j_per_rank, s.training.seconds_per_rank) == (
        620.0, [220.0, 400.0], [13.0, 16.0])
    assert [d["rank"] for d in s.devices] == [0, 1] and s.devices[0]["method"] == "counter"


def test_power_is_logged_per_interval_and_energy_per_epoch(monkeypatch):
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, READINGS, price_per_gpu_hour=3.6)
    _two_epochs(cb, trainer, module, clock)
    rows = trainer.loggers[0].rows
    power = [(step, m["energy/power_w"]) for step, m in rows if "energy/power_w" in m]
    # from the fit start (t 0, 10 J) to log step 2 (t 3, 60 J); to log step 4 (t 7, 140 J); to 6 (t 11, 200 J)
    assert power == [(2, pytest.approx(50.0 / 3.0)), (4, pytest.approx(80.0 / 4.0)), (6, pytest.approx(60.0 / 4.0))]
    epoch = [m for _, m in rows if "energy/epoch_j" in m]
    assert [(m["energy/epoch_j"], m["energy/epoch_avg_w"], m["energy/j_per_sample"], m["energy/epoch_cost"])
            for m in epoch] == [(450.0, pytest.approx(37.5), pytest.approx(450.0 / 14), pytest.approx(0.02)),
                                (125.0, pytest.approx(62.5), pytest.approx(125.0 / 12), pytest.approx(0.0035))]


def test_a_rank_without_energy_leaves_the_totals_unmeasured(monkeypatch):
    other = {0: [None, 12.0, 6.0], 1: [90.0, 1.5, 6.0], "fit": [None, 16.0, None, None]}
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, READINGS, other=other)
    _two_epochs(cb, trainer, module, clock)
    e0, e1 = cb.epochs
    assert (e0.energy_j, e0.avg_power_w, e0.j_per_sample) == (None, None, None)
    assert e0.avg_power_w_per_rank == [pytest.approx(150.0 / 8.0), None] and e0.gpu_hours == pytest.approx(20 / 3600)
    assert e1.energy_j == 125.0
    s = cb.summary()
    assert s.available is False
    assert s.reason == "energy not measured over the whole run: epoch 0: no energy from rank(s) [1]"
    assert s.training.energy_j is None and s.total_energy_j is None
    assert cb.total_j == 125.0 and cb.total_samples == 26  # what was measured, kept apart from the summary


def test_no_gpu_no_collective_and_the_reason(monkeypatch):
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, READINGS, world_size=1)
    monkeypatch.setattr(nvml, "open_device_for", lambda device: (None, "the model runs on 'cpu'"))
    _two_epochs(cb, trainer, module, clock)
    assert sent == [] and cb.epochs == [] and not cb.available
    s = cb.summary()
    assert (s.available, s.reason, s.devices) == (False, "the model runs on 'cpu'", [
        {"rank": 0, "available": False, "reason": "the model runs on 'cpu'"}])
    assert not cb.wants_hook("on_train_batch_end")


def test_a_rank_without_a_gpu_joins_the_gathers_of_one_that_has_one(monkeypatch):
    """Rank 0 has no GPU, rank 1 has one: rank 0 must still take part in every gather (or rank 1 hangs)."""
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, READINGS)
    monkeypatch.setattr(nvml, "open_device_for", lambda device: (None, "no GPU on this rank"))
    _two_epochs(cb, trainer, module, clock)
    assert sent == [[None, None, 0.0], [None, None, 0.0], [None, None, None, None]]
    assert [e.energy_j for e in cb.epochs] == [None, None]  # never rank 1's alone as the run's total
    assert [e.energy_j_per_rank for e in cb.epochs] == [[None, 300.0], [None, 90.0]]
    assert cb.summary().available is False


def test_one_process_per_epoch_and_total(monkeypatch):
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, READINGS, world_size=1)
    _two_epochs(cb, trainer, module, clock)
    assert [(e.energy_j, e.avg_power_w, e.samples) for e in cb.epochs] == [
        (150.0, pytest.approx(150.0 / 8.0), 8), (35.0, pytest.approx(17.5), 6)]
    s = cb.summary()
    assert (s.total_energy_j, s.total_samples, s.total_cost, s.training.energy_j) == (185.0, 14, None, 220.0)
    assert cb.epochs[0].cost is None and cb.epochs[0].throttle_reasons_rank0_end is None


def test_a_counter_that_goes_backwards_gives_no_energy_for_that_window(monkeypatch):
    backwards = [0.0, 10.0, 20.0, 60.0, 140.0, 5.0, 180.0, 200.0, 215.0, 230.0]  # driver reload in epoch 0
    cb, trainer, module, clock, nv, sent = _setup(monkeypatch, backwards, world_size=1)
    _two_epochs(cb, trainer, module, clock)
    assert [e.energy_j for e in cb.epochs] == [None, 35.0]
    assert cb.summary().reason == "energy not measured over the whole run: epoch 0: no energy from rank(s) [0]"


def test_state_round_trip_and_an_empty_state():
    cb = EnergyCallback()
    cb.total_j, cb.total_gpu_s, cb.total_samples = 12.5, 7.0, 9
    back = EnergyCallback()
    back.load_state_dict(cb.state_dict())
    assert (back.total_j, back.total_gpu_s, back.total_samples, back.epochs) == (12.5, 7.0, 9, [])
    fresh = EnergyCallback()
    fresh.load_state_dict({})
    assert (fresh.total_j, fresh.total_gpu_s, fresh.total_samples, fresh.epochs) == (0.0, 0.0, 0, [])
    assert fresh.summary().reason == "not started"  # before on_train_start


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"price_per_gpu_hour": -0.01}, "EnergyCallback(price_per_gpu_hour=-0.01): must be >= 0"),
    ({"sample_interval_s": 0}, "EnergyCallback(sample_interval_s=0): must be > 0"),
])
def test_bad_arguments_name_the_call(kwargs, message):
    with pytest.raises(CropScaleError) as info:
        EnergyCallback(**kwargs)
    assert str(info.value) == message


def test_a_free_gpu_hour_is_a_price():
    cb = EnergyCallback(price_per_gpu_hour=0.0)
    assert (cb.price_per_gpu_hour, cb.currency, cb.sample_interval_s) == (0.0, "USD", 0.1)
